"""The one-call world's tasks: "What is 47*86?", answered by copying the question into the calculator.

    tasks = make_tiny_tasks(64, seed=0, split="test")   # or load_dataset("tiny", "test", 64)

The question writes the expression exactly as the calculator takes it (``47*86``), so a tool
call is a token-for-token copy. Splits are by a hash of the expression (``split_of``): the same
problem is always in the same split, whatever the seed.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from functools import cache

from helpers.data import Task, register_dataset
from helpers.envs import CalculatorEnv, tool_schemas
from helpers.formats import format_tool_call

TINY_SYSTEM = "A calculator tool is available. Answer as <answer>N</answer>."
SPLITS = {"train": 0.8, "validation": 0.1, "test": 0.1}  # share of all problems in each split

# One kind of problem, a two-digit by two-digit product with a four-digit answer (32..99
# squared is 1024..9801): too hard for the tiny model to compute in its head, but only
# copying for the calculator. Every question has the same length in tokens, so the
# digits to copy always sit at the same distance back: the easiest copy a small
# transformer can learn (a fixed-offset attention head), which keeps the SFT short.
# The question writes the expression exactly as the calculator takes it ("47*86").
LOW, HIGH = 32, 99


def split_of(expression: str) -> str:
    """The split a problem belongs to, from a hash of its text: the same problem is
    always in the same split, whatever the seed or the number of tasks asked for."""
    u = int(hashlib.sha256(expression.encode()).hexdigest()[:8], 16) / 16**8  # uniform in [0, 1)
    edge = 0.0
    for name, share in SPLITS.items():
        edge += share
        if u < edge:
            return name
    return name


@cache
def split_sizes() -> dict[str, int]:
    """How many distinct problems each split holds: the 68**2 = 4,624 products ``LOW..HIGH`` x ``LOW..HIGH``
    counted by ``split_of`` (about ``SPLITS``' shares of them, as a hash splits them)."""
    return dict(Counter(split_of(f"{a}*{b}") for a in range(LOW, HIGH + 1) for b in range(LOW, HIGH + 1)))


def make_tiny_tasks(n: int, seed: int = 0, split: str = "train") -> list[Task]:
    """``n`` distinct arithmetic tasks of one split, drawn from ``seed``.

    Each task's prompt is [system, user]; ``answer`` is the exact integer as text;
    ``metadata`` holds the ``expression`` a calculator needs ("47*86").
    A split holds ``split_sizes()[split]`` distinct problems; asking for more is refused.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {list(SPLITS)}")
    if n > split_sizes()[split]:
        raise ValueError(f"asked for {n} {split} tasks; the split has only {split_sizes()[split]}")
    rng = random.Random(f"tiny-{seed}-{split}")
    tasks, seen = [], set()
    while len(tasks) < n:
        a, b = rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)
        expression = f"{a}*{b}"
        if expression in seen or split_of(expression) != split:
            continue
        seen.add(expression)
        prompt = [{"role": "system", "content": TINY_SYSTEM}, {"role": "user", "content": f"What is {expression}?"}]
        tasks.append(Task(f"tiny-{split}-{expression}", prompt, str(a * b), {"expression": expression}))
    return tasks


@register_dataset("tiny")
def tiny_dataset(split: str, n: int | None, seed: int) -> list[Task]:
    """The dataset registry's view of the one-call world (``config.dataset = "tiny"``):
    ``n`` tasks of ``split`` (None: 2,000 for train, 64 otherwise)."""
    return make_tiny_tasks(n if n is not None else (2000 if split == "train" else 64), seed=seed, split=split)


def calculator_tools() -> list[dict]:
    """The calculator's JSON schema, from the environment that runs it (as TRL renders it)."""
    return tool_schemas(CalculatorEnv())


def demonstration(task: Task, use_tool: bool) -> list[dict]:
    """A full conversation solving ``task``: with a calculator call, or answered directly.

    Direct answers are the true answer: the model is taught to try, and fails,
    because it cannot multiply two-digit numbers in its head.
    """
    final = {"role": "assistant", "content": f"<answer>{task.answer}</answer>"}
    if not use_tool:
        return task.prompt + [final]
    call = {"role": "assistant", "content": format_tool_call("calculator", {"expression": task.metadata["expression"]})}
    return task.prompt + [call, {"role": "tool", "content": task.answer}, final]
