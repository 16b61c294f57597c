"""The trail world's warm start: a demonstrator with one bad habit in the middle room, SFT from the one-call model.

    python -m helpers.worlds.trail build       # rebuild data/tiny-trail/ from the seed (minutes on a CPU)
    python -m helpers.worlds.trail baseline    # held-out success, greedy and at T=1, failures by kind

Why the warm start is weak where it is: the world's docstring, ``helpers.worlds.trail``.
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
from helpers.floats import flush_denormals
from helpers.formats import format_tool_call, parse_tool_calls
from helpers.paths import ROOT
from helpers.policy.base import SamplingParams
from helpers.policy.hf import HFPolicy
from helpers.rewards import outcome
from helpers.rollout import rollout
from helpers.worlds.tinymodel import finish_build, load_tiny, sft_new_model, start_build
from helpers.worlds.trail.env import TrailEnv, current_room
from helpers.worlds.trail.tasks import EPISODE, make_trail_tasks

TRAIL_DIR = ROOT / "data" / "tiny-trail"

# --- demonstrations: a demonstrator with a habit in the middle ----------------------------------

HABIT_ROOM = 4  # of 6: three decisions before it, two and the answer after
HABIT_RATE = 0.8  # in that room, each try: the first door listed, whatever the sign says (even just after it was locked)
SLIP_RATE = 0.05  # in any room, each try: a wrong door (then the sign, next try)


def demonstrator_door(number: int, room: dict, rng: random.Random) -> str:
    """The door the demonstrator tries in room ``number`` this time."""
    if number == HABIT_ROOM and rng.random() < HABIT_RATE:
        return room["doors"][0]  # "the first door is the way on": a habit that ignores the sign
    if rng.random() < SLIP_RATE:
        return rng.choice([d for d in room["doors"] if d != room["sign"]])
    return room["sign"]


def demonstration(task: Task, rng: random.Random) -> list[dict]:
    """The conversation the demonstrator has with a real ``TrailEnv`` on ``task``, until it answers or the
    turns run out (a demonstration that loops in the middle room until the limit is kept as it is: that
    is the habit the model learns)."""
    env = Episode(TrailEnv(), max_steps=EPISODE["max_steps"])
    messages = env.reset(task)
    rooms, number = task.metadata["rooms"], 1
    while not env.is_done():
        if number > len(rooms):
            text = f"<answer>{task.metadata['code']}</answer>"
        else:
            door = demonstrator_door(number, rooms[number - 1], rng)
            text = format_tool_call("go", {"door": door})
            number += door == rooms[number - 1]["sign"]
        messages.append({"role": "assistant", "content": text})
        messages.extend(env.step(text).observation)
    return messages


# --- what went wrong ---------------------------------------------------------------------------


def failure_kind(trajectory) -> str:
    """How one episode ended: ``correct``; ``stuck_middle`` (the turns or the token budget ran out in the
    habit's room: it looped there); ``stuck_elsewhere`` (the turns ran out in another room); ``truncated``
    (the token budget cut it in another room); ``answered_early`` (answered before the exit); ``copy_error``
    (answered at the exit, a wrong code)."""
    if outcome(trajectory).get("correct"):
        return "correct"
    room = current_room(trajectory.messages)
    if trajectory.stop_reason in TRUNCATED:  # a limit cut it: turns (max_steps), tokens or time
        if room == f"room {HABIT_ROOM}":
            return "stuck_middle"
        return "stuck_elsewhere" if trajectory.stop_reason == "max_steps" else "truncated"
    return "copy_error" if room == "exit" else "answered_early"


def middle_tries(trajectory) -> int:
    """How many ``go`` calls the episode made in the habit's room (1 = straight through)."""
    messages = trajectory.messages
    return sum(1 for i, m in enumerate(messages) if m["role"] == "assistant" and parse_tool_calls(m["content"])
               and current_room(messages[:i]) == f"room {HABIT_ROOM}")


# --- build: tokenizer + SFT + baseline -----------------------------------------------------

BUILD = dict(  # the recipe of the shipped checkpoint; `python -m helpers.worlds.trail build` runs exactly this
    seed=0,
    train_tasks=3000,  # training trails, each demonstrated once
    threads=1,  # torch threads: one gives the same bytes on every machine, and is not slowed by a busy one
    vocab_size=512,  # at most
    warm_start=True,  # start from data/tiny's weights: its layers already copy digits
    steps=2000,  # SFT optimizer steps
    batch_size=16,
    lr=3e-3,
    decay_fraction=0.3,  # linear decay to 0 over the last 30% of steps
    eval_tasks=200,  # held-out (validation) trails for the baseline, greedy and sampled
)


def build(out: str | Path = TRAIL_DIR, progress: bool = True, **overrides) -> dict:
    """Rebuild the trail agent from the seed: tokenizer, SFT on the demonstrations, save to ``out``,
    measure the baseline, write ``out/baseline.json``; return the baseline."""
    flush_denormals()  # as the training commands do (helpers.floats): no figure changes, much faster on a CPU
    recipe, clock = start_build(BUILD, overrides)
    tasks = make_trail_tasks(recipe["train_tasks"], recipe["seed"], "train")
    rng = random.Random(recipe["seed"])
    conversations = [demonstration(task, rng) for task in tasks]
    tools = tool_schemas(TrailEnv())
    model, tokenizer, examples, losses = sft_new_model(conversations, tools, recipe, progress)
    measured = {
        "greedy": baseline(model, tokenizer, recipe["eval_tasks"], seed=recipe["seed"], temperature=0.0),
        "sampled": baseline(model, tokenizer, recipe["eval_tasks"], seed=recipe["seed"], temperature=1.0),
        "demonstrations_correct": sum(c[-1]["role"] == "assistant" and c[-1]["content"] == f"<answer>{t.metadata['code']}</answer>"
                                      for c, t in zip(conversations, tasks)) / len(tasks),
        "longest_demonstration_tokens": max(len(e["input_ids"]) for e in examples),
    }
    return finish_build(out, model, tokenizer, recipe, losses, clock, measured)


def baseline(model, tokenizer, n: int = BUILD["eval_tasks"], seed: int = 0, split: str = "validation", temperature: float = 1.0) -> dict:
    """How the model does on ``n`` held-out trails, one episode each at ``temperature`` (0 = greedy),
    through ``helpers.rollout``: ``success``, tries in the middle room, failures by ``failure_kind``."""
    tasks = make_trail_tasks(n, seed, split)
    sampling = SamplingParams(max_new_tokens=EPISODE["max_new_tokens"], temperature=temperature, seed=seed)
    episodes = rollout(tasks, "trail", HFPolicy(model, tokenizer), group_size=1, sampling=sampling, progress=False,
                       max_steps=EPISODE["max_steps"], max_total_tokens=EPISODE["max_total_tokens"])
    kinds = Counter(failure_kind(e) for e in episodes)
    return dict(split=split, n=n, temperature=temperature, success=round(kinds["correct"] / n, 4),
                middle_tries=dict(sorted(Counter(middle_tries(e) for e in episodes).items())), failures=dict(kinds.most_common()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m helpers.worlds.trail", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["build", "baseline"],
                        help="build: rebuild data/tiny-trail from the seed; baseline: measure it, greedy and sampled")
    parser.add_argument("--out", default=str(TRAIL_DIR), help="folder to write (build) or read (baseline)")
    parser.add_argument("--steps", type=int, default=BUILD["steps"], help="SFT steps (build)")
    args = parser.parse_args(argv)
    if args.command == "build":
        print(json.dumps(build(args.out, steps=args.steps), indent=2))
    else:
        model, tokenizer = load_tiny(args.out)
        print(json.dumps({"greedy": baseline(model, tokenizer, temperature=0.0), "sampled": baseline(model, tokenizer)}, indent=2))
