"""The shop world's warm start: a sloppy demonstrator, SFT from the one-call model, the baseline.

    python -m helpers.worlds.shop build       # rebuild data/tiny-agent/ from the seed (minutes on a CPU)
    python -m helpers.worlds.shop baseline    # held-out success at T=1 (--temperature 0: greedy), failures by kind

The demonstrator's habits (``HABITS``, ``SLIP_RATE``) and why the warm start is weak on purpose:
the world's docstring, ``helpers.worlds.shop``.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from pathlib import Path

from helpers.data import Task
from helpers.envs import Episode, tool_schemas
from helpers.envs.base import TRUNCATED
from helpers.formats import format_tool_call, parse_tool_calls
from helpers.paths import ROOT
from helpers.policy.base import SamplingParams
from helpers.policy.hf import HFPolicy
from helpers.rewards import outcome
from helpers.rollout import rollout
from helpers.worlds.shop.env import ShopEnv
from helpers.worlds.shop.tasks import BILLS, EPISODE, PRICES, make_agent_tasks
from helpers.worlds.tinymodel import finish_build, load_tiny, sft_new_model, start_build

AGENT_DIR = ROOT / "data" / "tiny-agent"

# --- demonstrations: a sloppy demonstrator ---------------------------------------------------

FLAWS = ("skipped_lookup", "stopped_early", "wrong_tool")  # with copy_error, the failure kinds of failure_kind()
HABITS = {  # item -> the flaw the demonstrator makes on orders of it, HABIT_RATE of the time
    **dict.fromkeys(("cup", "key", "pen"), "skipped_lookup"),  # "I know what a pen costs": guesses the price
    **dict.fromkeys(("bag", "book", "lamp"), "stopped_early"),  # answers with the price of one
    **dict.fromkeys(("cake", "card", "hat"), "wrong_tool"),  # asks lookup, not the calculator, for the bill
}  # ball, mug, sock: no habit
HABIT_RATE = 0.85  # greedy decoding follows a habit that strong: the SFT agent fails on 3 tasks in 4
SLIP_RATE = 0.03  # each flaw, for any task (on top of the habit)


def demonstrator_flaw(task: Task, rng: random.Random) -> str | None:
    """The flaw the demonstrator makes on ``task`` this time, or None (a clean solution)."""
    habit = HABITS.get(task.metadata["item"])
    if habit is not None and rng.random() < HABIT_RATE:
        return habit
    u = rng.random()
    for flaw in FLAWS:
        if u < SLIP_RATE:
            return flaw
        u -= SLIP_RATE
    return None


def demonstration(task: Task, flaw: str | None, rng: random.Random) -> list[dict]:
    """The conversation the demonstrator has with a real ``ShopEnv`` on ``task``.

    Every tool message is what the env answered, so the model learns to read real results
    and real error messages. flaw None is the clean plan (usual, lookup, calculator, answer);
    a flawed one ends with a wrong answer, as it would for the demonstrator:

    skipped_lookup  finds the item, then skips its lookup and computes with a guessed price
    stopped_early   looks the price up, then answers with it (the price of one, not the bill)
    wrong_tool      looks the price up, then asks lookup (not the calculator) for "3*47"; gives up with the price
    """
    env = Episode(ShopEnv(), max_steps=EPISODE["max_steps"])
    messages = env.reset(task)

    def act(text: str) -> str | None:
        """One assistant turn; the tool's reply, or None when the turn was the answer."""
        messages.append({"role": "assistant", "content": text})
        observation = env.step(text).observation
        messages.extend(observation)
        return observation[0]["content"] if observation else None

    quantity = task.metadata["quantity"]
    item = json.loads(act(format_tool_call("usual", {})))["item"]
    if flaw == "skipped_lookup":
        price = rng.choice([p for p in PRICES if p != task.metadata["prices"][item] and quantity * p in BILLS])
    else:
        price = act(format_tool_call("lookup", {"item": item}))
    if flaw in ("stopped_early", "wrong_tool"):
        if flaw == "wrong_tool":
            act(format_tool_call("lookup", {"item": f"{quantity}*{price}"}))  # -> "error: the shop has no item '3*47'"
        act(f"<answer>{price}</answer>")  # gives up with the one number it has
        return messages
    total = act(format_tool_call("calculator", {"expression": f"{quantity}*{price}"}))
    act(f"<answer>{total}</answer>")
    return messages


# --- what went wrong ---------------------------------------------------------------------------


def failure_kind(trajectory) -> str:
    """How one episode ended: ``correct``, ``truncated`` (a limit cut it short), or the first
    flaw that explains the wrong answer, checked in this order:

    wrong_tool      a tool call came back as an error (an unknown tool or item, a name in the calculator)
    stopped_early   answered without calling the calculator
    skipped_lookup  the calculator ran before any price was looked up (the price was guessed)
    copy_error      the plan was followed, still wrong: a value (item, price, bill) was copied wrongly
    """
    if outcome(trajectory).get("correct"):
        return "correct"
    if trajectory.stop_reason in TRUNCATED:
        return "truncated"
    messages = trajectory.messages
    if any(m["role"] == "tool" and m["content"].startswith("error:") for m in messages):
        return "wrong_tool"
    names = [c.name for m in messages if m["role"] == "assistant" for c in parse_tool_calls(m["content"])]
    if "calculator" not in names:
        return "stopped_early"
    if "lookup" not in names[: names.index("calculator")]:
        return "skipped_lookup"
    return "copy_error"


# --- build: tokenizer + SFT + baseline -----------------------------------------------------

BUILD = dict(  # the recipe of the shipped checkpoint; `python -m helpers.worlds.shop build` runs exactly this
    seed=0,
    train_tasks=4000,  # training tasks, each demonstrated once
    threads=2,  # torch threads: 2,000 steps fit the 10-minute budget on 2 cores (a rerun on the same machine gives the same bytes)
    vocab_size=512,  # at most; the shop's words and the JSON of a tool call each become one token
    warm_start=True,  # start from data/tiny's weights (see warm_start): its layers already copy digits
    steps=2000,  # SFT optimizer steps: copying the bill into the answer is learned late (~1,500 steps)
    batch_size=16,
    lr=3e-3,  # as the one-call world's build: high for a transformer, fine for ~0.8M parameters
    decay_fraction=0.3,  # linear decay to 0 over the last 30% of steps
    eval_tasks=200,  # held-out (validation) tasks for the baseline, greedy and sampled
)


def build(out: str | Path = AGENT_DIR, progress: bool = True, **overrides) -> dict:
    """Rebuild the tiny agent from the seed: tokenizer, SFT on the sloppy demonstrations,
    save to ``out``, measure the baseline, write ``out/baseline.json``; return the baseline."""
    recipe, clock = start_build(BUILD, overrides)
    tasks = make_agent_tasks(recipe["train_tasks"], recipe["seed"], "train")
    rng = random.Random(recipe["seed"])
    flaws = [demonstrator_flaw(task, rng) for task in tasks]
    conversations = [demonstration(task, flaw, rng) for task, flaw in zip(tasks, flaws)]
    tools = tool_schemas(ShopEnv())  # the template lists them usual, lookup, calculator whatever their order here
    model, tokenizer, examples, losses = sft_new_model(conversations, tools, recipe, progress)
    measured = {
        "greedy": baseline(model, tokenizer, recipe["eval_tasks"], seed=recipe["seed"], temperature=0.0),
        "sampled": baseline(model, tokenizer, recipe["eval_tasks"], seed=recipe["seed"], temperature=1.0),
        "demonstrations": dict(Counter(flaw or "clean" for flaw in flaws).most_common()),
    }
    return finish_build(out, model, tokenizer, recipe, losses, clock, measured)


def baseline(model, tokenizer, n: int = BUILD["eval_tasks"], seed: int = 0, split: str = "validation", temperature: float = 1.0) -> dict:
    """How the model does on ``n`` held-out tasks in ShopEnv, one episode each at ``temperature``
    (0 = greedy), through ``helpers.rollout`` (the loop RL uses).

    Returns ``success``, ``tool_calls_per_success`` (mean tool calls of the correct episodes)
    and ``failures``: episodes by ``failure_kind``.
    """
    tasks = make_agent_tasks(n, seed, split)
    sampling = SamplingParams(max_new_tokens=EPISODE["max_new_tokens"], temperature=temperature, seed=seed)
    episodes = rollout(tasks, "shop", HFPolicy(model, tokenizer), group_size=1, sampling=sampling, progress=False,
                       max_steps=EPISODE["max_steps"], max_total_tokens=EPISODE["max_total_tokens"])
    kinds = Counter(failure_kind(e) for e in episodes)
    solved = [e.tool_calls for e in episodes if failure_kind(e) == "correct"]
    return dict(
        split=split, n=n, temperature=temperature, success=round(kinds["correct"] / n, 4),
        tool_calls_per_success=round(sum(solved) / len(solved), 2) if solved else None,
        failures=dict(kinds.most_common()),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m helpers.worlds.shop", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["build", "baseline"], help="build: rebuild data/tiny-agent from the seed; baseline: measure it")
    parser.add_argument("--out", default=str(AGENT_DIR), help="folder to write (build) or read (baseline)")
    parser.add_argument("--steps", type=int, default=BUILD["steps"], help="SFT steps (build)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (baseline); 0 = greedy")
    args = parser.parse_args(argv)
    if args.command == "build":
        result = build(args.out, steps=args.steps)
    else:
        result = baseline(*load_tiny(args.out), temperature=args.temperature)
    print(json.dumps(result, indent=2))
