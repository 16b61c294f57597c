"""ShopEnv: find what the customer buys, look its price up, compute the bill (the multi-step tiny world,
``helpers.worlds.shop``).

Three tools, and the prompt shows neither the item nor its price:

    usual()                  the item the customer asking always buys, in THIS task (``task.metadata["item"]``), as JSON
    lookup(item)             the price of one item in THIS task's shop (``task.metadata["prices"]``)
    calculator(expression)   exact arithmetic (``helpers.calculator.calculate``)

    env = make_env("shop", max_steps=5)
    env.reset(task)      # "What do 3 of my usual items cost?"; hidden: the customer buys pens, a pen costs 47
    env.step(format_tool_call("usual", {}))                              # -> tool message '{"item": "pen"}'
    env.step(format_tool_call("lookup", {"item": "pen"}))                # -> tool message "47"
    env.step(format_tool_call("calculator", {"expression": "3*47"}))     # -> tool message "141"
    env.step("<answer>141</answer>")                                     # answered, reward 1.0

The argument of the second call is the first call's result, and the third call's is built from
the second's: each step depends on the one before, so the agent cannot skip ahead.

Everything else (parsing calls, error messages, limits, judging the answer) is ``ToolEnv``'s;
this env only holds the hidden values and answers ``usual`` and ``lookup``. What bad input gives:

* a tool the env does not offer (``search``): ``error: unknown tool 'search'; available: usual, lookup, calculator``
* an item the shop does not know (``pens``): ``error: the shop has no item 'pens'``
* an argument a tool does not take (``usual(customer="Ann")``): ``error: usual got unexpected argument 'customer'``
* a tool result the model never reads: nothing to catch. Answering without it is judged
  like any answer (``verdict`` ``"wrong_number"``), and calling on and on ends the episode
  with stop reason ``"max_steps"``.

Simplifications, named: items are matched exactly (by the singular, lower-case name);
``usual`` knows who is asking (as a real API knows the logged-in user) and answers in the JSON
the next call takes (``{"item": "pen"}``), as many real APIs do.
"""

from __future__ import annotations

import json

from helpers.envs.calculator import CALCULATOR
from helpers.envs.registry import register_env
from helpers.envs.tools import Tool, ToolEnv


def _shop_tools(usual=None, lookup=None) -> list[Tool]:
    return [
        Tool(name="usual", description="The item the customer asking always buys, e.g. {\"item\": \"pen\"}.",
             parameters={}, fn=usual),
        Tool(name="lookup", description="The price of one item in this shop.",
             parameters={"item": "the item's name, singular"}, fn=lookup),
    ]


class ShopEnv(ToolEnv):
    """Tasks whose answer needs values only the env knows: ``usual``, then ``lookup``, then ``calculator``.

    A task must carry ``metadata["item"]`` (what the customer buys) and ``metadata["prices"]``
    (item -> price, an int, the item among them), as ``helpers.worlds.shop.tasks.make_agent_tasks`` writes them.
    """

    name = "shop"
    tools = [CALCULATOR.schema] + [tool.schema for tool in reversed(_shop_tools())]  # TRL's order: by name

    def __init__(self, **limits):
        super().__init__([CALCULATOR, *reversed(_shop_tools(self._usual, self._price))], **limits)
        self.item = ""
        self.prices: dict[str, int] = {}

    def reset(self, task) -> list[dict]:
        messages = super().reset(task)
        item, prices = task.metadata.get("item"), task.metadata.get("prices")
        if not isinstance(prices, dict) or item not in prices:
            raise ValueError(f"ShopEnv needs a task with metadata['item'] (what the customer buys) and metadata['prices'] "
                             f"(item -> price, the item among them); task {task.id!r} has item={item!r}, prices={prices!r}")
        self.item, self.prices = item, dict(prices)  # this task's hidden values
        return messages

    def _usual(self) -> str:
        return json.dumps({"item": self.item})

    def _price(self, item: str) -> str:
        key = str(item)  # the model may write a number or a list; str() keeps the dict look-up safe
        return str(self.prices[key]) if key in self.prices else f"error: the shop has no item {key!r}"


register_env("shop", ShopEnv)
