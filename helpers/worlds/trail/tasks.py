"""The trail world's tasks: six rooms in a row, three doors in each, a sign naming the one that opens, a code at the exit.

    tasks = make_trail_tasks(64, seed=0, split="test")    # or load_dataset("tiny-trail", "test", 64)

Every room's doors (three colours), its sign and the exit's code are drawn per task and kept in
``task.metadata``; the agent sees room 1 in the question and each next room in the reply to its
``go`` call (``TrailEnv``), so nothing can be memorised. The split is a hash of the whole trail.
"""

from __future__ import annotations

import random

from helpers.data import Task, register_dataset
from helpers.worlds.arithmetic.tasks import SPLITS, split_of

SYSTEM = "In each room go through the door the sign names. At the exit answer its code as <answer>N</answer>."
COLOURS = ("blue", "gold", "green", "grey", "pink", "red")
ROOMS = 6  # six go() calls and the answer: seven decisions in the shortest episode
CODES = range(10, 100)  # two digits, copied from the exit's reply into the answer
EPISODE = dict(max_steps=9, max_new_tokens=32, max_total_tokens=480)  # seven turns needed, two to spare; ~330 tokens at most


def describe(number: int, room: dict) -> str:
    """What the agent sees of a room: 'room 3: gold red blue. sign: red'."""
    return f"room {number}: {' '.join(room['doors'])}. sign: {room['sign']}"


def make_trail_tasks(n: int, seed: int = 0, split: str = "train") -> list[Task]:
    """``n`` trails of one split, drawn from ``seed``: ``metadata["rooms"]`` (each ``{"doors": [3 colours],
    "sign": one of them}``) and ``metadata["code"]``, the answer."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {list(SPLITS)}")
    rng = random.Random(f"tiny-trail-{seed}-{split}")
    tasks = []
    while len(tasks) < n:
        rooms = []
        for _ in range(ROOMS):
            doors = rng.sample(COLOURS, 3)
            rooms.append({"doors": doors, "sign": rng.choice(doors)})
        code = rng.choice(CODES)
        if split_of(" / ".join(describe(i + 1, r) for i, r in enumerate(rooms)) + f" / {code}") != split:
            continue
        prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Find the exit code. {describe(1, rooms[0])}"}]
        tasks.append(Task(f"tiny-trail-{split}-{seed}-{len(tasks):05d}", prompt, str(code), {"rooms": rooms, "code": code}))
    return tasks


@register_dataset("tiny-trail")
def tiny_trail_dataset(split: str, n: int | None, seed: int) -> list[Task]:
    """The dataset registry's view of this world (``config.dataset = "tiny-trail"``):
    ``n`` tasks of ``split`` (None: 4,000 for train, 64 otherwise)."""
    return make_trail_tasks(n if n is not None else (4000 if split == "train" else 64), seed=seed, split=split)
