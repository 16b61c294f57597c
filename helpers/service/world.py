"""The served shop: the tiny shop world (``helpers.worlds.shop``) as a live service whose customers ask, and which drifts.

    world = ServedShop(seed=0)
    task = world.task("ep-1", user="ann", question="What do 3 of my usual items cost?", lookup_format="plain")
    task.metadata   # {"item": "pen", "prices": {...}, "quantity": 3, "lookup_format": "plain", ...}; task.answer = "141"
    env = DriftingShopEnv()   # ShopEnv whose lookup replies in the row's format

In training every task was drawn from a dataset; here a request is a customer's question, and the
world behind it is the server's: who the customer is (``user``) decides their usual item, and the
shop's price list is redrawn for every request (prices change all day; and a fresh list keeps any
answer from being memorised, as ``make_agent_tasks`` does). The row the env was reset with is stored
with the episode, so the trainer can replay exactly that request.

Drift. ``lookup`` answers in one of ``LOOKUP_FORMATS``: ``"plain"`` (``"47"``, what the agent was
trained on) or, after the shop updates its software, ``"receipt"`` (``"pen: 47 yuan"``). The agent's
habit of pasting lookup's reply into the calculator then breaks, which is the point: the world changed,
the frozen agent stays wrong, and only feedback can teach the new format. The switch is a setting in
the store (``WORLD_FORMAT_KEY``), so the server and the trainer see the same world.

Simplifications, named: a customer's usual item is a hash of their name (no habits change in time);
a question that is not the world's one question (``QUESTION``) is still served, with no known answer.
"""

from __future__ import annotations

import hashlib
import random
import re

from helpers.data import Task
from helpers.worlds.shop.env import ShopEnv
from helpers.worlds.shop.tasks import BILLS, ITEMS, PRICES, QUANTITIES, SYSTEM, question

LOOKUP_FORMATS = {
    "plain": lambda item, price: str(price),  # "47": the format the agent was trained on
    "receipt": lambda item, price: f"{item}: {price} yuan",  # "pen: 47 yuan": the shop's new software
}
WORLD_FORMAT_KEY = "world.lookup_format"  # the store setting holding the current format
QUESTION = re.compile(r"^\s*What do (\d+) of my usual items cost\?\s*$")


class DriftingShopEnv(ShopEnv):
    """``ShopEnv`` whose ``lookup`` replies in the format named by the row's ``lookup_format``.

    The tools' names, arguments and docstrings are ShopEnv's, so the prompt the agent sees is the same
    token for token; only what ``lookup`` returns changes.
    """

    def __init__(self):
        super().__init__()
        self.lookup_format = "plain"

    def reset(self, **row) -> None:
        super().reset(**row)
        self.lookup_format = row.get("lookup_format", "plain")
        if self.lookup_format not in LOOKUP_FORMATS:
            raise ValueError(f"unknown lookup_format {self.lookup_format!r}; choose from {list(LOOKUP_FORMATS)}")

    def lookup(self, item: str) -> str:
        reply = super().lookup(item)
        if reply.startswith("error:"):
            return reply
        return LOOKUP_FORMATS[self.lookup_format](str(item), int(reply))

    lookup.__doc__ = ShopEnv.lookup.__doc__  # the tool's schema (and so the prompt) is unchanged


def usual_item(user: str) -> str:
    """A customer's usual item: a stable hash of their name (the same in every process)."""
    return ITEMS[int(hashlib.sha256(user.encode()).hexdigest(), 16) % len(ITEMS)]


class ServedShop:
    """The world behind the server: makes the task of one request (module docstring)."""

    def __init__(self, seed: int = 0):
        self.rng = random.Random(f"served-shop-{seed}")

    def task(self, episode_id: str, user: str, question_text: str, lookup_format: str) -> Task:
        """The task of one request: the world's system prompt and the customer's question, the hidden row, and
        the world's answer (None when the question is not the world's question)."""
        item = usual_item(user)
        match = QUESTION.match(question_text)
        quantity = int(match.group(1)) if match else None
        while True:  # the price list of this moment; a known quantity gets a bill in the world's range
            prices = {name: self.rng.choice(PRICES) for name in ITEMS}
            if quantity is None or quantity * prices[item] in BILLS or quantity not in QUANTITIES:
                break
        prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question_text}]
        truth = None if quantity is None else str(quantity * prices[item])
        metadata = {"item": item, "prices": prices, "quantity": quantity, "lookup_format": lookup_format}
        return Task(episode_id, prompt, truth, metadata)


def random_question(rng: random.Random) -> str:
    """A customer's question: ``question(quantity)`` with a quantity of the world's range."""
    return question(rng.choice(QUANTITIES))
