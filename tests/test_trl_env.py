"""TRL's own GRPOTrainer trains the shop world through ``environment_factory``: the env contract is real.

The ShopEnv class our loop drives goes to ``trl.GRPOTrainer(environment_factory=ShopEnv)`` (a subclass that only counts calls)
(built by ``helpers.ecosystem.trl_bridge.grpo_trainer``). TRL renders the prompt, samples each turn, parses the
tool calls, calls the env's methods, masks the tool replies out of the loss and scores the episodes
with our reward function. Two GRPO steps of the tiny agent on a CPU (a few seconds), then:

* TRL reset the env for every episode and called its tools (counted by a subclass), as many times
  as TRL's ``tools/call_frequency`` says (less the calls that failed);
* the reward in TRL's logs (``rewards/correct/mean``) is what our judge
  (``helpers.rewards.check_answer``) gives those completions;
* the tool replies, and only they, are masked out of the loss (``tool_mask`` 0);
* the prompt TRL renders is, token for token, the one our loop renders: the tools in the same order.
"""

import functools
import itertools
from collections import Counter

import pytest

from helpers.config import get_preset
from helpers.data import load_dataset
from helpers.ecosystem.trl_bridge import grpo_trainer, import_trl, trl_dataset
from helpers.envs.base import tool_methods
from helpers.policy import load_model
from helpers.policy.base import SamplingParams
from helpers.policy.hf import HFPolicy
from helpers.rewards import check_answer
from helpers.rollout import rollout
from helpers.worlds.shop.env import ShopEnv

# tiny-agent, made small: 2 tasks x 4 episodes a step, each step sampled anew (one update per batch)
CONFIG = dict(steps=2, tasks_per_step=2, num_generations=4, grad_accum=1, num_iterations=1)


def counting(env_class):
    """A subclass of ``env_class`` that counts the calls of ``reset`` and of each tool that returned, in ``calls``.
    ``functools.wraps`` keeps each tool's name, type hints and docstring: TRL reads the tool's
    schema from them."""
    calls = Counter()

    def counted(name):
        method = getattr(env_class, name)

        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            result = method(self, *args, **kwargs)
            calls[name] += 1  # after the call: one that raised (a bad argument) is a failure in TRL's count
            return result

        return wrapper

    methods = {name: counted(name) for name in ["reset", *tool_methods(env_class())]}
    return type(f"Counted{env_class.__name__}", (env_class,), {**methods, "calls": calls})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Two steps of TRL's GRPOTrainer on the shop world, recording each step's batch (the rows TRL
    drew and what it made of them), the calls of the env, and what the reward function was given."""
    import torch
    from transformers import set_seed

    config = get_preset("tiny-agent", **CONFIG)
    set_seed(config.seed)
    model, tokenizer = load_model(config)
    tasks = load_dataset(config.dataset, "train", 16, seed=config.seed)
    env_class = counting(ShopEnv)
    trainer = grpo_trainer(config, model, tokenizer, tasks, tmp_path_factory.mktemp("trl"), environment=env_class)

    steps = []  # per step: rows, TRL's batch, env calls made while sampling it, the reward function's inputs
    generate_and_score = trainer._generate_and_score_completions

    def recorded(rows):
        before = Counter(env_class.calls)
        batch = generate_and_score(rows)
        steps[-1].update(rows=rows, batch=batch, calls=env_class.calls - before)
        return batch

    correct = trainer.reward_funcs[0]

    def recorded_reward(completions, answer, **kwargs):
        steps.append(dict(completions=completions, answer=answer))  # scored before the batch is returned
        return correct(completions=completions, answer=answer, **kwargs)

    trainer._generate_and_score_completions = recorded
    trainer.reward_funcs[0] = recorded_reward
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the one_thread fixture, which is per test: tiny matrices, a shared CPU
    try:
        trainer.train()
    finally:
        torch.set_num_threads(threads)
    logs = [entry for entry in trainer.state.log_history if "rewards/correct/mean" in entry]
    return dict(trainer=trainer, tokenizer=tokenizer, tasks=tasks, steps=steps, logs=logs, model=model)


def test_it_is_trls_own_trainer_with_the_envs_tools(run):
    trainer = run["trainer"]
    assert type(trainer) is import_trl().GRPOTrainer
    assert [tool.__name__ for tool in trainer.tools] == ["calculator", "lookup", "usual"]
    assert len(run["steps"]) == len(run["logs"]) == 2


def test_trl_called_the_envs_tools(run):
    """TRL reset the env for every episode, and every tool call TRL counted (less the ones that
    failed: an unknown tool, a bad argument) reached the env's methods."""
    for step, log in zip(run["steps"], run["logs"]):
        episodes = len(step["rows"])
        assert step["calls"]["reset"] == episodes
        made = sum(n for name, n in step["calls"].items() if name != "reset")
        counted = log["tools/call_frequency"] * episodes  # TRL: calls per episode; failures per call
        assert made == pytest.approx(counted * (1 - log["tools/failure_frequency"]))
    assert all(log["tools/call_frequency"] > 0 for log in run["logs"])
    assert sum((step["calls"] for step in run["steps"]), Counter())["lookup"] > 0  # the shop's own tool, not only the calculator


def test_the_shops_reward_reached_trls_logs(run):
    """TRL logs, per step, the mean of what our judge gives the final text of each episode
    (all assistant turns, as ``Trajectory.completion_text``; tool-call turns have no text)."""
    for step, log in zip(run["steps"], run["logs"]):
        judged = [check_answer("\n".join(m["content"] for m in completion if m["role"] == "assistant"), answer)["correct"]
                  for completion, answer in zip(step["completions"], step["answer"])]
        assert log["rewards/correct/mean"] == pytest.approx(sum(judged) / len(judged))
    assert any(log["rewards/correct/mean"] > 0 for log in run["logs"])  # some episodes were solved


def test_tool_replies_are_masked_out_of_the_loss(run):
    """In each episode, tool_mask is 0 on exactly the tokens TRL appended for a tool's reply (the
    reply's turn and the opening of the next assistant turn), 1 on the model's own tokens."""
    tokenizer = run["tokenizer"]
    replies = 0
    for step in run["steps"]:
        batch = step["batch"]
        for ids, kept, tool in zip(batch["completion_ids"], batch["completion_mask"], batch["tool_mask"]):
            tokens = zip(ids[kept.bool()].tolist(), tool[kept.bool()].tolist())
            for flag, span in itertools.groupby(tokens, key=lambda token: token[1]):  # runs of equal tool_mask
                text = tokenizer.decode([token for token, _ in span])
                if flag == 0:
                    assert text.startswith("\n<|im_start|>user\n<tool_response>\n"), text
                    assert text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n"), text
                    replies += 1
                else:
                    assert "<tool_response>" not in text, text
    assert replies > 0


def test_trl_renders_the_prompt_our_loop_renders(run):
    """The first prompt of the first step, as TRL tokenised it and as our rollout does with the same
    class: the same ids, so the tools are listed in the same order (the warm start stops calling
    tools when they are not)."""
    tokenizer, tasks = run["tokenizer"], run["tasks"]
    step = run["steps"][0]
    rows = [dict(row) for row in trl_dataset(tasks)]
    task = tasks[rows.index(step["rows"][0])]
    trl_ids = step["batch"]["prompt_ids"][0][step["batch"]["prompt_mask"][0].bool()].tolist()

    episode = rollout([task], ShopEnv, HFPolicy(run["model"], tokenizer), group_size=1,
                      sampling=SamplingParams(max_new_tokens=1), max_steps=1, progress=False)[0]
    assert episode.token_ids[: episode.prompt_len] == trl_ids
    assert "Tools: usual(), lookup(item), calculator(expression)" in tokenizer.decode(trl_ids)  # the template's fixed order
