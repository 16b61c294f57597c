"""The one-call world's warm start, built from the seed: tokenizer, SFT on a tool/no-tool mixture, baseline.

    python -m helpers.worlds.arithmetic build       # rebuild data/tiny/ from the seed
    python -m helpers.worlds.arithmetic baseline    # its held-out success, with and without the tool

Half the demonstrations call the calculator, half answer "in the head" (the true answer, which
the model cannot compute): the warm start learns both, and RL finds out which one pays.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from helpers.evaluation import task_record
from helpers.paths import TINY_DIR
from helpers.policy.base import SamplingParams
from helpers.policy.hf import HFPolicy
from helpers.rollout import rollout
from helpers.worlds.arithmetic.tasks import (
    calculator_tools,
    demonstration,
    make_tiny_tasks,
)
from helpers.worlds.tinymodel import finish_build, load_tiny, sft_new_model, start_build

BUILD = dict(  # the recipe of the shipped checkpoint; `python -m helpers.worlds.arithmetic build` runs exactly this
    seed=0,
    train_tasks=3000,  # distinct training problems (of ~3700), each demonstrated once
    tool_fraction=0.5,  # share of demonstrations that call the calculator; the rest answer "in the head"
    steps=900,  # SFT optimizer steps; copying the digits "clicks" around step 450-500
    batch_size=16,
    lr=3e-3,  # high for a transformer, fine for a model this small trained from scratch
    decay_fraction=0.3,  # linear decay over the last 30% of steps (train_sft's default when the shipped checkpoint was built)
    eval_tasks=400,  # held-out (validation) tasks for the baseline
)


def build(out: str | Path = TINY_DIR, progress: bool = True, **overrides) -> dict:
    """Rebuild the tiny model from the seed: tokenizer, SFT on a tool/no-tool mixture,
    save to ``out``, measure the baseline, write ``out/baseline.json``; return the baseline."""
    recipe, clock = start_build(BUILD, overrides)
    tools = calculator_tools()
    tasks = make_tiny_tasks(recipe["train_tasks"], recipe["seed"], "train")
    coin = random.Random(recipe["seed"])
    conversations = [demonstration(task, use_tool=coin.random() < recipe["tool_fraction"]) for task in tasks]
    model, tokenizer, _, losses = sft_new_model(conversations, tools, recipe, progress)
    measured = baseline(model, tokenizer, recipe["eval_tasks"], seed=recipe["seed"])
    measured["greedy"] = baseline(model, tokenizer, recipe["eval_tasks"], seed=recipe["seed"], temperature=0.0)
    return finish_build(out, model, tokenizer, recipe, losses, clock, measured, loss_every=25)


def baseline(model, tokenizer, n: int = BUILD["eval_tasks"], seed: int = 0, split: str = "validation", temperature: float = 1.0) -> dict:
    """How the model does on ``n`` held-out tasks in CalculatorEnv, sampled at ``temperature``.

    Returns rates: ``success``, ``tool_use`` (episodes with a calculator call),
    ``success_with_tool`` and ``success_without_tool`` (success among each kind).
    One episode per task through ``helpers.rollout`` (the same loop RL uses).
    """
    tasks = make_tiny_tasks(n, seed, split)
    sampling = SamplingParams(max_new_tokens=48, temperature=temperature, seed=seed)
    episodes = rollout(tasks, "calculator", HFPolicy(model, tokenizer), group_size=1, sampling=sampling,
                       max_steps=4, max_total_tokens=256, progress=False)
    records = [task_record(e) for e in episodes]
    used = [r for r in records if r["tool_calls"] > 0]
    unused = [r for r in records if r["tool_calls"] == 0]

    def rate(rows):
        return round(sum(r["correct"] for r in rows) / len(rows), 4) if rows else None

    return dict(
        split=split, n=n, temperature=temperature,
        success=rate(records), tool_use=round(len(used) / n, 4),
        success_with_tool=rate(used), success_without_tool=rate(unused),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m helpers.worlds.arithmetic", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["build", "baseline"], help="build: rebuild data/tiny from the seed; baseline: measure it")
    parser.add_argument("--out", default=str(TINY_DIR), help="folder to write (build) or read (baseline)")
    parser.add_argument("--steps", type=int, default=BUILD["steps"], help="SFT steps (build)")
    args = parser.parse_args(argv)
    if args.command == "build":
        result = build(args.out, steps=args.steps)
    else:
        result = baseline(*load_tiny(args.out))
    print(json.dumps(result, indent=2))

