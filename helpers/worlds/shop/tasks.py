"""The shop world's tasks: "What do 3 of my usual items cost?", with the item and every price hidden in the task.

    tasks = make_agent_tasks(64, seed=0, split="test")    # or load_dataset("tiny-agent", "test", 64)

What the customer buys (``item``) and what every item costs (``prices``) are drawn per task and
kept in ``task.metadata``; only the env reads them (``ShopEnv.reset(**row)``), so nothing can be
memorised. The split is by what decides the answer (quantity, item, price), not by the question's
text, which is the same for every task with the same quantity.
"""

from __future__ import annotations

import random

from helpers.data import Task, register_dataset
from helpers.worlds.arithmetic.tasks import SPLITS, split_of

SYSTEM = "Find the customer's item, look up its price, then use the calculator. Answer as <answer>N</answer>."
ITEMS = ("bag", "ball", "book", "cake", "card", "cup", "hat", "key", "lamp", "mug", "pen", "sock")
QUANTITIES = range(2, 10)  # one digit
PRICES = range(10, 100)  # two digits
BILLS = range(100, 1000)  # three digits (the price is redrawn until the bill fits): too much for a 1M model's "head"
EPISODE = dict(max_steps=5, max_new_tokens=40, max_total_tokens=320)  # the canonical episode: 4 turns, ~170 tokens


def question(quantity: int) -> str:
    """'What do 3 of my usual items cost?' (who is asking, the env knows: see ``ShopEnv``)."""
    return f"What do {quantity} of my usual items cost?"


def make_agent_tasks(n: int, seed: int = 0, split: str = "train") -> list[Task]:
    """``n`` shop tasks of one split, drawn from ``seed``.

    A task is the question and the shop behind it: what the customer buys (``metadata["item"]``)
    and what every item costs (``metadata["prices"]``), both drawn per task and read only by the
    env. The split is a hash of what decides the answer, the quantity, the item and its price
    (``helpers.worlds.arithmetic.tasks.split_of``): a task the model is tested on is never one it trained on,
    whatever the seed (of the 8 x 12 x 90 combinations, 7,368 give a three-digit bill: 5,887 /
    740 / 741). The held-out splits hold every item equally often (in turn: bag, ball, ...), so
    one item the agent gets wrong costs the same share of the success rate in every draw.
    ``metadata`` also holds the ``quantity`` and the ``expression`` that solves it.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {list(SPLITS)}")
    rng = random.Random(f"tiny-agent-{seed}-{split}")
    tasks = []
    while len(tasks) < n:
        quantity = rng.choice(QUANTITIES)
        # Held-out splits take the items in turn, each as often as training draws it: a free draw of 200
        # tasks from seed 0 held 29 orders of one item (1/12 is 17), and that item alone then moved success by 0.06.
        item = rng.choice(ITEMS) if split == "train" else ITEMS[len(tasks) % len(ITEMS)]
        prices = {name: rng.choice(PRICES) for name in ITEMS}
        if quantity * prices[item] not in BILLS or split_of(f"{quantity}*{item}={prices[item]}") != split:
            continue
        text, expression = question(quantity), f"{quantity}*{prices[item]}"
        prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
        metadata = {"quantity": quantity, "item": item, "prices": prices, "expression": expression}
        tasks.append(Task(f"tiny-agent-{split}-{seed}-{len(tasks):05d}", prompt, str(quantity * prices[item]), metadata))
    return tasks


@register_dataset("tiny-agent")
def tiny_agent_dataset(split: str, n: int | None, seed: int) -> list[Task]:
    """The dataset registry's view of this world (``config.dataset = "tiny-agent"``):
    ``n`` tasks of ``split`` (None: 4,000 for train, 64 otherwise)."""
    return make_agent_tasks(n if n is not None else (4000 if split == "train" else 64), seed=seed, split=split)
