"""The self-play warm start: SFT on both roles (solver and proposer), from the one-call world's model.

    python -m helpers.worlds.selfplay build       # rebuild data/tiny-selfplay/ (~7 min CPU, 1 thread)
    python -m helpers.worlds.selfplay baseline    # held-out success by difficulty, proposer validity

The solver is shown more 3-digit operands than the held-out set has, so that it sometimes solves
difficulty 6: a task it never solves pays the proposer nothing, and a curriculum needs a next
level that pays.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from helpers.evaluation import evaluate
from helpers.paths import ROOT, TINY_DIR
from helpers.policy.base import SamplingParams
from helpers.policy.hf import HFPolicy
from helpers.rollout import rollout
from helpers.sft import encode_conversations, train_sft
from helpers.worlds.arithmetic.tasks import calculator_tools, demonstration, split_of
from helpers.worlds.selfplay.env import ProposerEnv, difficulty, proposer_task
from helpers.worlds.selfplay.tasks import (
    draw_expression,
    make_selfplay_tasks,
    selfplay_dataset,
)
from helpers.worlds.tinymodel import finish_build, load_tiny, start_build

SELFPLAY_DIR = ROOT / "data" / "tiny-selfplay"

BUILD = dict(  # the recipe of data/tiny-selfplay; `python -m helpers.worlds.selfplay build` runs exactly this
    seed=0,
    solver_demos=4000,  # solver conversations on the train split
    solver_digits={2: 0.4, 3: 0.6},  # their operands' digits (digits -> share): more 3-digit ones than the held-out set's 0.5
    tool_fraction=0.9,  # share of solver demonstrations calling the calculator; the rest answer "in the head"
    proposer_demos=1500,  # proposer conversations: "<task>A*B</task>"
    proposer_digits={2: 0.8, 3: 0.2},  # mostly easy tasks (difficulty 4.4 on average), a few longer ones
    steps=2000,  # SFT steps, starting from data/tiny (it already calls the calculator on 2-digit tasks)
    batch_size=16,
    lr=3e-3,
    decay_fraction=0.3,
)


def demonstrations(recipe: dict) -> tuple[list[list[dict]], list[list[dict]]]:
    """(solver conversations, proposer conversations) of the warm start, drawn from ``recipe["seed"]``."""
    rng = random.Random(recipe["seed"])
    solver_digits, proposer_digits = ({int(d): w for d, w in recipe[key].items()} for key in ("solver_digits", "proposer_digits"))
    solver = [demonstration(task, use_tool=rng.random() < recipe["tool_fraction"])
              for task in make_selfplay_tasks(recipe["solver_demos"], recipe["seed"], "train", solver_digits)]
    proposer = []
    while len(proposer) < recipe["proposer_demos"]:
        expression = draw_expression(rng, proposer_digits)
        if split_of(expression) == "train":  # the proposer is shown training tasks only
            proposer.append(proposer_task().prompt + [{"role": "assistant", "content": f"<task>{expression}</task>"}])
    return solver, proposer


def build(out: str | Path = SELFPLAY_DIR, progress: bool = True, **overrides) -> dict:
    """Rebuild data/tiny-selfplay from data/tiny and the seed: SFT on both roles, save, measure."""
    recipe, clock = start_build(BUILD, overrides)  # one seeded thread: BUILD sets no "threads"
    model, tokenizer = load_tiny(TINY_DIR)  # the one-call world's model and tokenizer (byte level: the proposer's text encodes)
    solver, proposer = demonstrations(recipe)
    examples = encode_conversations(tokenizer, solver, calculator_tools()) + encode_conversations(tokenizer, proposer, None)
    losses = train_sft(model, examples, recipe["steps"], recipe["batch_size"], lr=recipe["lr"], seed=recipe["seed"],
                       decay_fraction=recipe["decay_fraction"], pad_id=tokenizer.pad_token_id, progress=progress)
    return finish_build(out, model, tokenizer, recipe, losses, clock, baseline(model, tokenizer))


def success_by_difficulty(records: list[dict]) -> dict[int, float]:
    """Held-out success per difficulty, from evaluation records (a task id ends in its expression)."""
    rows: dict[int, list[bool]] = {}
    for record in records:
        rows.setdefault(difficulty(record["task_id"].rsplit("-", 1)[1]), []).append(record["correct"])
    return {d: round(sum(v) / len(v), 3) for d, v in sorted(rows.items())}


def baseline(model, tokenizer, proposals: int = 64) -> dict:
    """The warm start, measured: greedy held-out success (overall and by difficulty) and, at T = 1,
    the share of valid proposals and their mean difficulty."""
    policy = HFPolicy(model, tokenizer)
    held_out = evaluate(policy, selfplay_dataset("test", None, 0), "calculator", max_new_tokens=48, max_steps=4, max_total_tokens=192)
    proposed = rollout([proposer_task()], ProposerEnv, policy, group_size=proposals, progress=False,
                       sampling=SamplingParams(max_new_tokens=24, temperature=1.0, seed=0), max_steps=1, max_total_tokens=192)
    valid = [t.info for t in proposed if t.info.get("valid")]
    return dict(held_out_greedy_success=held_out.metrics["success"], held_out_by_difficulty=success_by_difficulty(held_out.records),
                proposer_validity=len(valid) / proposals, proposer_difficulty=sum(v["difficulty"] for v in valid) / len(valid) if valid else None,
                parameters=sum(p.numel() for p in model.parameters()))


def main(argv: list[str] | None = None) -> None:

    parser = argparse.ArgumentParser(prog="python -m helpers.worlds.selfplay", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["build", "baseline"], help="build: rebuild data/tiny-selfplay; baseline: measure it "
                        "(train: python -m helpers.train --preset tiny-selfplay)")
    parser.add_argument("--out", default=str(SELFPLAY_DIR), help="folder to write (build) or read (baseline)")
    parser.add_argument("--steps", type=int, default=BUILD["steps"], help="SFT steps (build)")
    args = parser.parse_args(argv)
    result = build(args.out, steps=args.steps) if args.command == "build" else baseline(*load_tiny(args.out))
    print(json.dumps(result, indent=2))
