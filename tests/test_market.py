"""One run over several worlds, TRL's way: a mixed dataset names each task's environment, the loop plays each row
in its own env (the rollout takes TRL's dict of factories), and the run is reported per environment too."""

import json

import pytest

import helpers.train
from helpers.data import DatasetError, load_dataset, parse_mix
from helpers.envs import make_env
from helpers.paths import ROOT
from helpers.policy.hf import HFPolicy
from helpers.rollout import load_trajectories, rollout
from helpers.train import main
from helpers.worlds.market.presets import MIX
from helpers.worlds.tinymodel import load_tiny

FIXTURES = ROOT / "tests" / "fixtures"  # my_calculator.py: a calculator that imports nothing from helpers


def test_a_mix_names_its_parts_and_each_tasks_environment():
    assert parse_mix(MIX) == [("tiny-agent", "shop"), ("tiny", "calculator"), ("tiny-products", "reasoning_gym_calculator")]
    # a reasoning-gym config may hold "+" and ","; a class by name is an environment too
    assert parse_mix('reasoning_gym/basic_arithmetic:operators=["+","-"]@reasoning_gym+tiny@mypkg.calc:Calc') == [
        ('reasoning_gym/basic_arithmetic:operators=["+","-"]', "reasoning_gym"), ("tiny", "mypkg.calc:Calc")]
    for bad in ("tiny", "tiny@calculator+", "@shop", "tiny@calculator+tiny-agent"):
        with pytest.raises(DatasetError, match="expected dataset@environment"):
            parse_mix(bad)
    tasks = load_dataset(MIX, "test", 7)
    assert [t.environment for t in tasks] == ["shop", "calculator", "reasoning_gym_calculator"] * 2 + ["shop"]
    assert [t.id for t in tasks[::3]] == [t.id for t in load_dataset("tiny-agent", "test", 3)]  # each part's own tasks, in order
    assert "environment" not in tasks[0].row()  # routing, not a column reset(**row) receives (as TRL leaves it out)


def test_the_rollout_plays_each_task_in_the_environment_it_names():
    model, tokenizer = load_tiny("data/tiny-market")
    tasks = load_dataset(MIX, "test", 3)
    made = []

    def factory(name):
        return lambda: made.append(name) or make_env(name, max_steps=2)

    trajs = rollout(tasks, {name: factory(name) for _, name in parse_mix(MIX)}, HFPolicy(model, tokenizer), group_size=2,
                    max_steps=2, max_total_tokens=320, progress=False)
    assert made == ["shop", "shop", "calculator", "calculator", "reasoning_gym_calculator", "reasoning_gym_calculator"]
    assert trajs[4].info["verdict"] in ("correct", "wrong_answer", "no_answer", "partial")  # judged by reasoning-gym's verifier


SMALL = ["--preset", "tiny-mix", "--steps", "1", "--tasks-per-step", "6", "--num-generations", "2", "--eval-tasks", "6",
         "--pass-k", "2", "--max-train-tasks", "30"]


def test_a_mixed_run_reports_each_environment_and_a_users_class_plays_one(tmp_path, monkeypatch, one_thread):
    monkeypatch.syspath_prepend(str(FIXTURES))
    result = main([*SMALL, "--env-class", "calculator=my_calculator:MyCalculator", "--out-dir", str(tmp_path / "run")])
    config = json.loads((result.run_dir / "config.json").read_text())
    assert config["env_classes"] == {"calculator": "my_calculator:MyCalculator"}
    step = result.history[1]
    worlds = ("shop", "calculator", "reasoning_gym_calculator")
    played = [world for world in worlds if f"{world}/success" in step]
    assert played and all(f"rewards/{world}/mean" in step for world in played)
    for record in (result.history[0], step):
        assert all(f"eval/{world}/success" in record and record[f"eval/{world}/n"] == 2 for world in worlds)
        assert record["eval/success"] == pytest.approx(sum(record[f"eval/{w}/success"] for w in worlds) / 3)
    episodes = load_trajectories(result.run_dir / "eval" / "step-0001.trajectories.jsonl")
    by_world = {world: [t for t in episodes if t.task.environment == world] for world in worlds}
    assert all(set(t.info["env_reward"]) == {"MyCalculator"} for t in by_world["calculator"])  # its get_reward: its rows only
    assert not any("env_reward" in t.info for t in by_world["shop"] + by_world["reasoning_gym_calculator"])
    records = [json.loads(line) for line in (result.run_dir / "eval" / "step-0001.jsonl").read_text().splitlines()]
    assert [r["environment"] for r in records[:3]] == list(worlds)
    assert "calculator " in result.line() and "reasoning_gym_calculator " in result.line()


@pytest.mark.parametrize("flags, message", [
    (["--env-class", "my_calculator:MyCalculator"], "--env-class my_calculator:MyCalculator: the dataset mixes environments "
                                                    "(shop, calculator, reasoning_gym_calculator); name the one the class "
                                                    "replaces, --env-class NAME=my_calculator:MyCalculator"),
    (["--env-class", "kitchen=my_calculator:MyCalculator"], "--env-class kitchen=...: the dataset has no environment 'kitchen'"),
    (["--env-class", "shop=broken_shops:NoHints"], "environment class broken_shops:NoHints refused: NoHints: Argument item is missing"),
])
def test_a_mixed_run_refuses_a_class_that_names_no_world_or_breaks_the_contract(flags, message, monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.setattr(helpers.train, "train", lambda *args, **kwargs: pytest.fail("the run started"))
    with pytest.raises(SystemExit) as refused:
        main([*SMALL, *flags])
    assert message in str(refused.value) and "\n" not in str(refused.value)
