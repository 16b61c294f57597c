"""ShopEnv: find what the customer buys, look its price up, compute the bill (the multi-step tiny world,
``helpers.worlds.shop``).

An environment on TRL's contract (``helpers.envs.base``): ``reset(**row)`` reads the task's hidden
``item`` and ``prices``, and three public methods are the tools, in TRL's order (by name):

    calculator(expression)   exact arithmetic (``helpers.calculator.calculate``, from ``CalculatorEnv``)
    lookup(item)             the price of one item in THIS task's shop (the row's ``prices``)
    usual()                  the item the customer asking always buys, in THIS task (the row's ``item``), as JSON

    env = make_env("shop", max_steps=5)           # Episode(ShopEnv()): the workbook's loop
    env.reset(task)      # "What do 3 of my usual items cost?"; hidden: the customer buys pens, a pen costs 47
    env.step(format_tool_call("usual", {}))                              # -> tool message '{"item": "pen"}'
    env.step(format_tool_call("lookup", {"item": "pen"}))                # -> tool message "47"
    env.step(format_tool_call("calculator", {"expression": "3*47"}))     # -> tool message "141"
    env.step("<answer>141</answer>")                                     # answered, reward 1.0
    GRPOTrainer(..., environment_factory=ShopEnv)                        # the same class, in TRL

The argument of the second call is the first call's result, and the third call's is built from
the second's: each step depends on the one before, so the agent cannot skip ahead.

Everything else (parsing calls, error messages, limits, judging the answer) is the adapter's,
``helpers.envs.episode.Episode``; this env only holds the hidden values and answers the calls.
What bad input gives:

* a tool the env does not offer (``search``): ``error: unknown tool 'search'; available: calculator, lookup, usual``
* an item the shop does not know (``pens``): ``error: the shop has no item 'pens'``
* an argument a tool does not take (``usual(customer="Ann")``):
  ``error: usual: got an unexpected keyword argument 'customer'``
* a tool result the model never reads: nothing to catch. Answering without it is judged
  like any answer (``verdict`` ``"wrong_number"``), and calling on and on ends the episode
  with stop reason ``"max_steps"``.

Simplifications, named: items are matched exactly (by the singular, lower-case name);
``usual`` knows who is asking (as a real API knows the logged-in user) and answers in the JSON
the next call takes (``{"item": "pen"}``), as many real APIs do. An unknown item is an error
*text*, not an exception, so TRL does not count it in ``tools/failure_frequency`` (this workbook
counts it in ``info["tool_errors"]``).

Taught in notebooks/02_environment.ipynb (the contract) and notebooks/06_training_loop.ipynb (the world).
"""

from __future__ import annotations

import json

from helpers.envs.calculator import CalculatorEnv
from helpers.envs.anchors import register_anchor, tool_history
from helpers.envs.registry import register_env


class ShopEnv(CalculatorEnv):
    """Tasks whose answer needs values only the env knows: ``usual``, then ``lookup``, then ``calculator``.

    A task's row must carry ``item`` (what the customer buys) and ``prices`` (item -> price, an int,
    the item among them), as ``helpers.worlds.shop.tasks.make_agent_tasks`` writes them in its metadata.
    """

    def __init__(self):
        self.item = ""
        self.prices: dict[str, int] = {}

    def reset(self, **row) -> None:
        """Keep this task's hidden values: what the customer buys and every price."""
        item, prices = row.get("item"), row.get("prices")
        if not isinstance(prices, dict) or item not in prices:
            raise ValueError(f"ShopEnv needs a row with 'item' (what the customer buys) and 'prices' (item -> price, "
                             f"the item among them); got item={item!r}, prices={prices!r}")
        self.item, self.prices = item, dict(prices)
        return None

    def lookup(self, item: str) -> str:
        """The price of one item in this shop.

        Args:
            item: the item's name, singular
        """
        key = str(item)  # the model may write a number or a list; str() keeps the dict look-up safe
        return str(self.prices[key]) if key in self.prices else f"error: the shop has no item {key!r}"

    def usual(self) -> str:
        """The item the customer asking always buys, e.g. {"item": "pen"}."""
        return json.dumps({"item": self.item})


register_env("shop", ShopEnv)
register_anchor("shop", tool_history)  # the calls so far and their results: the shop's state
