"""ShopEnv: find what a customer buys, look its price up, compute the bill (the multi-step tiny world,
``helpers.tiny_agent``).

Three tools, and the prompt shows neither the item nor its price:

    usual(customer)          the item this customer always buys, in THIS task (``task.metadata["usual"]``), as JSON
    lookup(item)             the price of one item in THIS task's shop (``task.metadata["prices"]``)
    calculator(expression)   exact arithmetic (``helpers.calculator.calculate``)

    env = make_env("shop", max_steps=5)
    env.reset(task)      # 'What do 3 of the usual items cost? {"customer": "Ann"}'; hidden: Ann -> pen -> 47
    env.step(format_tool_call("usual", {"customer": "Ann"}))             # -> tool message '{"item": "pen"}'
    env.step(format_tool_call("lookup", {"item": "pen"}))                # -> tool message "47"
    env.step(format_tool_call("calculator", {"expression": "3*47"}))     # -> tool message "141"
    env.step("<answer>141</answer>")                                     # answered, reward 1.0

The argument of the second call is the first call's result, and the third call's is built from
the second's: each step depends on the one before, so the agent cannot skip ahead.

Everything else (parsing calls, error messages, limits, judging the answer) is ``ToolEnv``'s;
this env only holds the hidden values and answers ``usual`` and ``lookup``. What bad input gives:

* a tool the env does not offer (``search``): ``error: unknown tool 'search'; available: usual, lookup, calculator``
* a customer or an item the shop does not know (``pens``, or a customer as an item):
  ``error: the shop has no item 'Ann'``
* a tool result the model never reads: nothing to catch. Answering without it is judged
  like any answer (``verdict`` ``"wrong_number"``), and calling on and on ends the episode
  with stop reason ``"max_steps"``.

Simplifications, named: names are matched exactly (an item by its singular, lower-case name);
``usual`` answers in the JSON the next call takes (``{"item": "pen"}``), as many real APIs do.
"""

from __future__ import annotations

import json

from helpers.envs.calculator import CALCULATOR
from helpers.envs.registry import register_env
from helpers.envs.tools import Tool, ToolEnv


def _shop_tools(usual=None, lookup=None) -> list[Tool]:
    return [
        Tool(name="usual", description="The item a customer always buys, e.g. {\"item\": \"pen\"}.",
             parameters={"customer": "the customer's name"}, fn=usual),
        Tool(name="lookup", description="The price of one item in this shop.",
             parameters={"item": "the item's name, singular"}, fn=lookup),
    ]


class ShopEnv(ToolEnv):
    """Tasks whose answer needs values only the env knows: ``usual``, then ``lookup``, then ``calculator``.

    A task must carry ``metadata["usual"]`` (customer -> item) and ``metadata["prices"]``
    (item -> price, an int), as ``helpers.tiny_agent.make_agent_tasks`` writes them.
    """

    name = "shop"
    tools = [tool.schema for tool in _shop_tools()] + [CALCULATOR.schema]  # the order an episode uses them

    def __init__(self, **limits):
        super().__init__([*_shop_tools(self._usual, self._price), CALCULATOR], **limits)
        self.usual: dict[str, str] = {}
        self.prices: dict[str, int] = {}

    def reset(self, task) -> list[dict]:
        messages = super().reset(task)
        for key, what in [("usual", "customer -> item"), ("prices", "item -> price")]:
            if not isinstance(task.metadata.get(key), dict) or not task.metadata[key]:
                raise ValueError(f"ShopEnv needs a task with metadata[{key!r}] ({what}); task {task.id!r} has none")
        self.usual, self.prices = dict(task.metadata["usual"]), dict(task.metadata["prices"])  # this task's hidden values
        return messages

    def _usual(self, customer: str) -> str:
        item = _find(self.usual, customer, "customer")
        return item if item.startswith("error:") else json.dumps({"item": item})

    def _price(self, item: str) -> str:
        return _find(self.prices, item, "item")


def _find(table: dict, name, kind: str) -> str:
    """``table[name]`` as text, or an error message naming what the shop does not have."""
    key = str(name)  # the model may write a number or a list; str() keeps the dict look-up safe
    if key in table:
        return str(table[key])
    return f"error: the shop has no {kind} {key!r}"


register_env("shop", ShopEnv)
