"""The served shop: the tiny shop world (``helpers.worlds.shop``) as a live service whose customers ask, and which drifts.

    world = ServedShop(seed=0)
    task = world.task("ep-1", user="ann", question_text="What do 3 of my usual items cost?", items=None)
    task.metadata   # {"item": "pen", "prices": {...}, "quantity": 3}; task.answer = "141"; the env: ShopEnv

In training every task was drawn from a dataset; here a request is a customer's question, and the
world behind it is the server's: who the customer is (``user``) decides their usual item, and the
shop's price list is redrawn for every request (prices change all day; and a fresh list keeps any
answer from being memorised, as ``make_agent_tasks`` does). The row the env was reset with is stored
with the episode, so the trainer can replay exactly that request.

Drift: customers' habits change. The store setting ``WORLD_ITEMS_KEY`` lists the items customers buy now
(None: all twelve); a customer's usual item is a stable hash of their name into that list. The
simulation moves every customer to the items the starting agent handles worst (``helpers.serve.simulate.worst_items``): the
frozen agent's success falls and stays down, and only its users' feedback can teach the agent the new
traffic. (A drift in the tools' reply format would not do: the 1M-parameter agent then almost never
succeeds, not even in a sampled group, so GRPO has no signal to learn from.) The setting is in the store,
so the server and the trainer see the same world.

Seeded: a request's price list is drawn from (the world's seed, the customer, how many requests they made
before), not from one stream shared by all requests, so concurrent requests get the same rows in every
run whatever order they reach the server in.

Simplifications, named: a customer's usual item is a hash of their name into the current item list; a
question that is not the world's one question (``QUESTION``) is still served, with no known answer; the
count of requests per customer is kept in memory (one number per customer; a restart begins it again).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter

from helpers.data import Task
from helpers.worlds.shop.tasks import BILLS, ITEMS, PRICES, QUANTITIES, SYSTEM, question

WORLD_ITEMS_KEY = "world.items"  # the store setting: the items customers buy now (None: all of ITEMS)
QUESTION = re.compile(r"^\s*What do (\d+) of my usual items cost\?\s*$")


def usual_item(user: str, items: list[str] | None = None) -> str:
    """A customer's usual item: a stable hash of their name (the same in every process) into ``items`` (None: all)."""
    items = items or ITEMS
    return items[int(hashlib.sha256(user.encode()).hexdigest(), 16) % len(items)]


class ServedShop:
    """The world behind the server: makes the task of one request (module docstring)."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.asked: Counter = Counter()  # requests per customer so far

    def prices_rng(self, user: str) -> random.Random:
        """The draws of ``user``'s next request: seeded by (seed, user, how many times they asked before), so a
        request's price list does not depend on the order in which concurrent requests reach the server."""
        count = self.asked[user]
        self.asked[user] += 1
        return random.Random(f"served-shop-{self.seed}-{user}-{count}")

    def task(self, episode_id: str, user: str, question_text: str, items: list[str] | None = None) -> Task:
        """The task of one request: the world's system prompt and the customer's question, the hidden row, and
        the world's answer (None when the question is not the world's question)."""
        item = usual_item(user, items)
        match = QUESTION.match(question_text)
        quantity = int(match.group(1)) if match else None
        rng = self.prices_rng(user)
        while True:  # the price list of this moment; a known quantity gets a bill in the world's range
            prices = {name: rng.choice(PRICES) for name in ITEMS}
            if quantity is None or quantity * prices[item] in BILLS or quantity not in QUANTITIES:
                break
        prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question_text}]
        truth = None if quantity is None else str(quantity * prices[item])
        metadata = {"item": item, "prices": prices, "quantity": quantity}
        return Task(episode_id, prompt, truth, metadata)


def random_question(rng: random.Random) -> str:
    """A customer's question: ``question(quantity)`` with a quantity of the world's range."""
    return question(rng.choice(QUANTITIES))
