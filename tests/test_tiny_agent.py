"""The multi-step tiny world: tasks and splits, the shop env and its bad input, the sloppy
demonstrations and how failures are told apart, the shipped checkpoint."""

import json
import random
from collections import Counter

import pytest

from helpers.calculator import calculate
from helpers.data import Task, load_dataset
from helpers.envs import check_env, make_env
from helpers.formats import format_tool_call
from helpers.paths import ROOT
from helpers.policy.base import ScriptedPolicy
from helpers.rollout import rollout
from helpers.worlds.arithmetic.tasks import SPLITS, split_of
from helpers.worlds.shop.build import (
    AGENT_DIR,
    FLAWS,
    HABITS,
    build,
    demonstration,
    demonstrator_flaw,
    failure_kind,
)
from helpers.worlds.shop.env import ShopEnv
from helpers.worlds.shop.tasks import EPISODE, ITEMS, make_agent_tasks
from helpers.worlds.tinymodel import load_tokenizer


def usual():
    return format_tool_call("usual", {})


def lookup(item):
    return format_tool_call("lookup", {"item": item})


def calculator(expression):
    return format_tool_call("calculator", {"expression": expression})


def solution(task):
    """The clean plan: usual, lookup, calculator, answer."""
    meta = task.metadata
    return [usual(), lookup(meta["item"]), calculator(meta["expression"]), f"<answer>{task.answer}</answer>"]


@pytest.fixture(scope="module")
def task():
    return make_agent_tasks(1, seed=0, split="test")[0]


# --- tasks -----------------------------------------------------------------------------------


def test_tasks_are_seeded_and_priced_per_task():
    tasks = make_agent_tasks(50, seed=3, split="train")
    assert [t.id for t in tasks] == [t.id for t in make_agent_tasks(50, seed=3, split="train")]
    assert [t.id for t in tasks] != [t.id for t in make_agent_tasks(50, seed=4, split="train")]
    assert len({t.id for t in tasks}) == 50
    for t in tasks:
        meta = t.metadata
        assert set(meta["prices"]) == set(ITEMS) and meta["item"] in ITEMS
        assert t.prompt[-1]["content"] == f'What do {meta["quantity"]} of my usual items cost?'
        assert calculate(meta["expression"]) == t.answer == str(meta["quantity"] * meta["prices"][meta["item"]])
        # the question (checked above) is the quantity alone: the item and its price are never shown
    assert len({json.dumps(t.metadata["prices"], sort_keys=True) for t in tasks}) == 50  # drawn per task: nothing to memorise
    assert len({t.metadata["item"] for t in tasks}) > len(ITEMS) // 2  # and so is what the customer buys


def test_splits_never_overlap_across_seeds():
    """What decides the answer (quantity, item, price) is never shared between splits, whatever the seed."""
    def key(t):
        return f'{t.metadata["quantity"]}*{t.metadata["item"]}={t.metadata["prices"][t.metadata["item"]]}'

    keys = {split: {key(t) for seed in (0, 1) for t in make_agent_tasks(400, seed, split)} for split in SPLITS}
    assert not keys["train"] & keys["validation"]
    assert not keys["train"] & keys["test"]
    assert not keys["validation"] & keys["test"]
    assert all(split_of(k) == split for split in SPLITS for k in keys[split])


@pytest.mark.parametrize("split", ["validation", "test"])
def test_held_out_splits_hold_every_item_equally_often(split):
    """A free draw gave one item 1.7 times its share (29 of 200 test tasks at seed 0, not 17); held-out draws take items in turn."""
    for seed in (0, 1234):
        counts = Counter(t.metadata["item"] for t in make_agent_tasks(200, seed, split))
        assert set(counts) == set(ITEMS) and set(counts.values()) == {200 // len(ITEMS), 200 // len(ITEMS) + 1}
    train = Counter(t.metadata["item"] for t in make_agent_tasks(200, 0, "train"))
    assert max(train.values()) - min(train.values()) > 1  # training still draws freely (the shipped build's data)


def test_bad_split_says_so():
    with pytest.raises(ValueError, match="unknown split"):
        make_agent_tasks(3, split="dev")


def test_every_bill_has_three_digits():
    """So every canonical episode has the same length in tokens (the numbers sit at fixed distances)."""
    assert {len(t.answer) for t in make_agent_tasks(500, seed=0, split="train")} == {3}


def test_registered_dataset():
    assert [t.id for t in load_dataset("tiny-agent", "test", 8, seed=0)] == [t.id for t in make_agent_tasks(8, 0, "test")]


# --- the env ---------------------------------------------------------------------------------


def play(env, task, actions):
    """Step ``actions`` until the episode ends; the results."""
    env.reset(task)
    results = []
    for action in actions:
        results.append(env.step(action))
        if results[-1].done:
            break
    return results


def test_the_plan_earns_the_reward(task):
    env = make_env("shop", max_steps=EPISODE["max_steps"])
    results = play(env, task, solution(task))
    item = task.metadata["item"]
    assert [r.observation[0]["content"] for r in results[:3]] == [f'{{"item": "{item}"}}', str(task.metadata["prices"][item]), task.answer]
    assert results[-1].reward == 1.0 and results[-1].info["stop_reason"] == "answered" and results[-1].info["tool_calls"] == 3
    assert check_env(env, make_agent_tasks(4, seed=0, split="test"), solver=solution) == []


def test_the_prompt_lists_the_tools_in_the_trained_order_whatever_order_they_come_in(task):
    """TRL lists an env's tools by name; the template lists them as the warm start was trained, so both loops agree."""
    env = make_env("shop")
    assert [schema["function"]["name"] for schema in env.tools] == ["calculator", "lookup", "usual"]  # TRL's order
    tokenizer = load_tokenizer(AGENT_DIR)
    for tools in (env.tools, env.tools[::-1]):
        assert "Tools: usual(), lookup(item), calculator(expression)" in tokenizer.apply_chat_template(task.prompt, tools=tools, tokenize=False)


def test_a_tool_the_env_does_not_offer(task):
    result = play(make_env("shop"), task, [format_tool_call("search", {"query": "pen price"})])[0]
    assert not result.done
    assert result.observation[0]["content"] == "error: unknown tool 'search'; available: calculator, lookup, usual"
    assert result.info["tool_errors"] == 1


def test_an_item_the_shop_does_not_sell(task):
    for item in ["pens", "3*47", 12, "Ann"]:
        result = play(make_env("shop"), task, [format_tool_call("lookup", {"item": item})])[0]
        assert result.observation[0]["content"] == f"error: the shop has no item {str(item)!r}"
        assert not result.done and result.info["tool_errors"] == 1
        assert result.info["tool_failures"] == 0  # an error text the tool returns: TRL would not count it as failed
    text = play(make_env("shop"), task, [format_tool_call("usual", {"customer": "Ann"})])[0].observation[0]["content"]
    assert text == "error: usual: got an unexpected keyword argument 'customer'"


def test_tool_results_never_read_end_cleanly(task):
    a = task.metadata["item"]
    # a call and an answer in one turn: the answer is ignored (the model has not seen the result yet)
    first = play(make_env("shop"), task, [lookup(a) + f"\n<answer>{task.answer}</answer>"])[0]
    assert not first.done and first.observation[0]["role"] == "tool"
    # answering without the looked-up price: judged as any answer, a named verdict
    last = play(make_env("shop"), task, [lookup(a), "<answer>123</answer>"])[-1]
    assert last.info["stop_reason"] == "answered" and last.info["verdict"] == "wrong_number" and last.reward == 0.0
    # calling again and again, never answering: the step limit ends it
    last = play(make_env("shop", max_steps=3), task, [lookup(a)] * 10)[-1]
    assert last.truncated and last.info["stop_reason"] == "max_steps" and last.info["verdict"] == "no_answer"


def test_a_task_without_hidden_values_is_a_caller_error():
    with pytest.raises(ValueError, match=r"needs a row with 'item'") as raised:
        make_env("shop").reset(Task("no-shop", [{"role": "user", "content": "What do 2 pens cost?"}], "10"))
    assert "of task 'no-shop'" in raised.value.__notes__[0]  # the adapter says which task
    with pytest.raises(ValueError, match=r"got item='pen', prices=None"):
        ShopEnv().reset(item="pen")  # the class alone, as TRL calls it: reset(**row)
    with pytest.raises(ValueError, match="the item among them"):
        make_env("shop").reset(Task("unpriced", [{"role": "user", "content": "?"}], "10", {"item": "pen", "prices": {"cup": 3}}))


def test_the_env_class_plays_without_the_adapter(task):
    """What TRL does with the class: construct it once, reset(**row), call the tool methods."""
    env = ShopEnv()
    assert env.reset(**task.row()) is None
    item = json.loads(env.usual())["item"]
    assert item == task.metadata["item"] and env.lookup(item) == str(task.metadata["prices"][item])
    assert env.calculator(task.metadata["expression"]) == task.answer


# --- demonstrations and failure kinds ----------------------------------------------------------


def test_habits_make_the_flaws():
    rng = random.Random(0)
    tasks = make_agent_tasks(2000, seed=0, split="train")
    flaws = [(HABITS.get(t.metadata["item"]), demonstrator_flaw(t, rng)) for t in tasks]
    with_habit = [kind == flaw for kind, flaw in flaws if kind is not None]
    assert 0.8 < sum(with_habit) / len(with_habit) < 0.92
    clean = [flaw is None for kind, flaw in flaws if kind is None]
    assert 0.85 < sum(clean) / len(clean) < 0.95


@pytest.mark.parametrize("flaw", [None, *FLAWS])
def test_each_demonstration_fails_as_its_flaw(task, flaw):
    """Replay a demonstration through the real rollout loop; failure_kind names the flaw it was made with."""
    messages = demonstration(task, flaw, random.Random(1))
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    policy = ScriptedPolicy(load_tokenizer(AGENT_DIR), replies)
    (episode,) = rollout([task], "shop", policy, group_size=1, progress=False,
                         max_steps=EPISODE["max_steps"], max_total_tokens=EPISODE["max_total_tokens"])
    assert episode.messages == messages  # the demonstration is exactly what the env answers
    assert failure_kind(episode) == (flaw or "correct")


def test_a_looping_agent_is_truncated(task):
    """The env class itself as the factory (as TRL's environment_factory): rollout wraps it in an Episode with its limits."""
    policy = ScriptedPolicy(load_tokenizer(AGENT_DIR), [lookup("pen")])
    (episode,) = rollout([task], ShopEnv, policy, group_size=1, progress=False, max_steps=EPISODE["max_steps"], max_total_tokens=320)
    assert episode.stop_reason == "max_steps" and failure_kind(episode) == "truncated"
    assert episode.turns == EPISODE["max_steps"] and episode.info["tool_calls"] == EPISODE["max_steps"]


# --- the shipped checkpoint --------------------------------------------------------------------


def test_shipped_baseline_is_a_weak_agent():
    result = json.loads((AGENT_DIR / "baseline.json").read_text())
    for mode in ("greedy", "sampled"):
        assert result[mode]["split"] == "validation"
        assert result[mode]["success"] <= 0.35, (mode, result[mode])
        assert sum(result[mode]["failures"].values()) == result[mode]["n"]
    assert result["greedy"]["temperature"] == 0.0 and result["sampled"]["temperature"] == 1.0
    assert set(FLAWS) <= set(result["sampled"]["failures"])  # the SFT agent makes every kind of mistake
    assert result["recipe"]["threads"] == 2 and result["build_wall_s"] < 600  # the budget: 10 minutes on 2 cores


def test_data_folder_is_small():
    """Six tiny worlds ship a model each (~3.3 MB: 0.8M float32 parameters) beside small task files: 20 MB in all."""
    size = sum(f.stat().st_size for f in (ROOT / "data").rglob("*") if f.is_file())
    assert size <= 20e6, f"data/ is {size / 1e6:.1f} MB"
    for folder in (ROOT / "data").glob("tiny*"):
        assert sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) <= 3.5e6, folder


def test_build_is_deterministic(tmp_path, one_thread):
    small = dict(train_tasks=40, steps=2, batch_size=4, eval_tasks=2, progress=False)
    first, second = build(tmp_path / "a", **small), build(tmp_path / "b", **small)
    assert first["sft_loss_every_50_steps"] == second["sft_loss_every_50_steps"]
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
