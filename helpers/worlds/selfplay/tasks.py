"""The solver's tasks: products of two numbers of 2-3 digits ("What is 47*86?"), in the one-call world's grammar.

    tasks = make_selfplay_tasks(256, seed=0, split="test")   # or load_dataset("selfplay", "test", 256): the fixed held-out set

Difficulty is the operands' digits together (4..6). The held-out set is fixed for every run seed;
the ``train`` split (2,000 tasks) is what the fixed-dataset comparison trains on. Splits are the
one-call world's hash split (``split_of``).
"""

from __future__ import annotations

import random

from helpers.data import Task, register_dataset
from helpers.worlds.arithmetic.tasks import TINY_SYSTEM, split_of
from helpers.worlds.selfplay.env import difficulty

SOLVER_DIGITS = {2: 0.5, 3: 0.5}  # share of operands with 2 and 3 digits in solver tasks (held-out set, fixed dataset)


def solver_task(expression: str, task_id: str | None = None) -> Task:
    """A task of the one-call world's grammar, as the solver sees it ("What is 47*86?")."""
    a, b = (int(x) for x in expression.split("*"))
    prompt = [{"role": "system", "content": TINY_SYSTEM}, {"role": "user", "content": f"What is {expression}?"}]
    return Task(task_id or f"selfplay-{expression}", prompt, str(a * b), {"expression": expression, "difficulty": difficulty(expression)})


def draw_expression(rng: random.Random, digit_weights: dict[int, float] = SOLVER_DIGITS) -> str:
    """``"A*B"`` with each operand's number of digits drawn from ``digit_weights`` (digits -> weight)."""
    a_digits, b_digits = rng.choices(list(digit_weights), weights=list(digit_weights.values()), k=2)
    a, b = (rng.randint(10 ** (d - 1), 10**d - 1) for d in (a_digits, b_digits))
    return f"{a}*{b}"


def make_selfplay_tasks(n: int, seed: int = 0, split: str = "test", digit_weights: dict[int, float] = SOLVER_DIGITS) -> list[Task]:
    """``n`` distinct solver tasks of one split (the tiny world's hash split), difficulty 4..6."""
    rng = random.Random(f"selfplay-{seed}-{split}")
    tasks, seen = [], set()
    while len(tasks) < n:
        expression = draw_expression(rng, digit_weights)
        if expression not in seen and split_of(expression) == split:
            seen.add(expression)
            tasks.append(solver_task(expression, f"selfplay-{split}-{expression}"))
    return tasks


@register_dataset("selfplay")
def selfplay_dataset(split: str, n: int | None, seed: int) -> list[Task]:
    """The self-play world's fixed tasks: ``test`` is the held-out set the solver is measured on
    (256 tasks: one task is 0.004 of its success rate); ``train`` (2,000) is what the fixed-dataset
    comparison run trains on."""
    return make_selfplay_tasks(n if n is not None else (2000 if split == "train" else 256), seed=seed, split=split)
