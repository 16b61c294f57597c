"""TRL's own GRPOTrainer on a mix of worlds: ``environment_factory`` as a dict, each row routed by its
``environment`` column (TRL 1.16's multi-environment training), built by the workbook's bridge from a mixed
dataset (``helpers.data.mix_datasets``) exactly as the loop's rollout gets it (``helpers.loop.env_factory``).

One step of 8 tasks x 2 episodes, the shop and the one-call world mixed; each env class counts its calls. Then:
each environment was reset on its own rows only (and on all of them), and each prompt listed its own env's tools only.
"""

from collections import Counter

import pytest
import torch
from transformers import set_seed

from helpers.config import get_preset
from helpers.data import load_dataset
from helpers.ecosystem.trl_bridge import environment_factory, grpo_trainer, import_trl, trl_dataset
from helpers.envs import CalculatorEnv
from helpers.policy import load_model
from helpers.worlds.shop.env import ShopEnv

MIX = "tiny-agent@shop+tiny@calculator"


def counting(env_class, log: list):
    """A subclass of ``env_class`` whose reset records the row's question in ``log``, and whose tools record
    their names there: ``(class name, what)``."""

    def reset(self, **row):
        log.append((env_class.__name__, "reset", row["prompt"][-1]["content"]))
        return env_class.reset(self, **row)

    def calculator(self, expression: str) -> str:
        log.append((env_class.__name__, "calculator", expression))
        return env_class.calculator(self, expression)

    calculator.__doc__ = env_class.calculator.__doc__  # TRL reads the tool's schema from its docstring and hints
    return type(f"Counted{env_class.__name__}", (env_class,), {"reset": reset, "calculator": calculator})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    config = get_preset("tiny-mix", dataset=MIX, steps=1, tasks_per_step=8, num_generations=2, grad_accum=1, num_iterations=1)
    set_seed(config.seed)
    model, tokenizer = load_model(config)
    tasks = load_dataset(config.dataset, "train", 32, seed=config.seed)
    log: list = []
    factories = environment_factory(config)  # the bridge's dict for the mix: {"shop": ..., "calculator": ...}
    environments = {"shop": counting(ShopEnv, log), "calculator": counting(CalculatorEnv, log)}
    trainer = grpo_trainer(config, model, tokenizer, tasks, tmp_path_factory.mktemp("trl"), environment=environments)
    rows = []
    generate_and_score = trainer._generate_and_score_completions

    def recorded(inputs):
        rows.extend(inputs)
        return generate_and_score(inputs)

    trainer._generate_and_score_completions = recorded
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer.train()
    finally:
        torch.set_num_threads(threads)
    return dict(trainer=trainer, tasks=tasks, log=log, rows=rows, factories=factories)


def test_the_bridge_hands_trl_a_dict_and_rows_that_name_their_environment(run):
    assert sorted(run["factories"]) == ["calculator", "shop"]
    assert type(run["factories"]["shop"]()) is ShopEnv and type(run["factories"]["calculator"]()) is CalculatorEnv
    dataset = trl_dataset(run["tasks"])
    assert [row["environment"] for row in dataset][:4] == ["shop", "calculator", "shop", "calculator"]
    assert type(run["trainer"]) is import_trl().GRPOTrainer


def test_each_environment_was_called_on_its_own_rows(run):
    rows, log = run["rows"], run["log"]
    by_env = Counter(row["environment"] for row in rows)
    assert by_env["shop"] > 0 and by_env["calculator"] > 0  # the step mixed both worlds
    resets = Counter((name, question) for name, what, question in log if what == "reset")
    wanted = Counter(({"shop": "ShopEnv", "calculator": "CalculatorEnv"}[row["environment"]],
                      row["prompt"][-1]["content"]) for row in rows)
    assert resets == wanted  # every row reset exactly its own environment, and no other
    assert all(q.startswith("What do") for name, q in resets if name == "ShopEnv")
    assert all(q.startswith("What is") for name, q in resets if name == "CalculatorEnv")


def test_each_prompt_lists_its_own_environments_tools(run):
    tools = run["trainer"]._env_tools
    assert sorted(tool.__name__ for tool in tools["shop"]) == ["calculator", "lookup", "usual"]
    assert [tool.__name__ for tool in tools["calculator"]] == ["calculator"]


def test_a_three_world_dataset_keeps_every_worlds_columns():
    """TRL's rows of the tiny market: the union of the worlds' columns (``Dataset.from_list`` would keep only the
    first row's, and the reasoning-gym rows would lose what their verifier reads)."""
    tasks = load_dataset(get_preset("tiny-mix").dataset, "train", 6)
    dataset = trl_dataset(tasks)
    assert {"item", "prices", "expression", "generator", "config", "entry", "environment"} <= set(dataset.column_names)
    rows = list(dataset)
    assert [row["environment"] for row in rows[:3]] == ["shop", "calculator", "reasoning_gym_calculator"]
    assert rows[2]["entry"]["answer"] == rows[2]["answer"] and rows[0]["entry"] is None and rows[2]["item"] is None
