"""ShopEnv: look prices up, then compute the bill (the multi-step tiny world, ``helpers.tiny_agent``).

Two tools, and the prompt shows neither price:

    lookup(item)             the price of one item in THIS task's shop (held in ``task.metadata["prices"]``)
    calculator(expression)   exact arithmetic (``helpers.calculator.calculate``)

    env = make_env("shop", max_steps=5)
    env.reset(task)      # "What do 3 pens and 2 cups cost?"; the shop: {"pen": 47, "cup": 86, ...}
    env.step(format_tool_call("lookup", {"item": "pen"}))                  # -> tool message "47"
    env.step(format_tool_call("lookup", {"item": "cup"}))                  # -> tool message "86"
    env.step(format_tool_call("calculator", {"expression": "3*47+2*86"}))  # -> tool message "313"
    env.step("<answer>313</answer>")                                       # answered, reward 1.0

Everything else (parsing calls, error messages, limits, judging the answer) is
``ToolEnv``'s; this env only holds the prices and answers ``lookup``. What bad input gives:

* a tool the env does not offer (``search``): ``error: unknown tool 'search'; available: lookup, calculator``
* an item the shop does not sell (``pens``, ``3*47``): ``error: the shop has no 'pens'; it sells: bag, ...``
* a tool result the model never reads: nothing to catch. Answering without it is judged
  like any answer (``verdict`` ``"wrong_number"``), and calling on and on ends the episode
  with stop reason ``"max_steps"``.

Simplification, named: an item is looked up by its exact (singular, lower-case) name;
"Pens" or "a pen" is an unknown item, and the error lists the right names.
"""

from __future__ import annotations

from helpers.envs.calculator import CALCULATOR
from helpers.envs.registry import register_env
from helpers.envs.tools import Tool, ToolEnv


def _lookup_tool(fn) -> Tool:
    return Tool(
        name="lookup",
        description="The price of one item in this shop, e.g. pen.",
        parameters={"item": "the item's name, singular"},
        fn=fn,
    )


class ShopEnv(ToolEnv):
    """Tasks whose answer needs prices only the env knows: ``lookup`` them, then ``calculator``.

    A task must carry ``metadata["prices"]``: item name -> price (an int), as
    ``helpers.tiny_agent.make_agent_tasks`` writes it.
    """

    name = "shop"
    tools = [_lookup_tool(None).schema, CALCULATOR.schema]  # lookup first: the order an episode uses them

    def __init__(self, **limits):
        super().__init__([_lookup_tool(self._price), CALCULATOR], **limits)
        self.prices: dict[str, int] = {}

    def reset(self, task) -> list[dict]:
        messages = super().reset(task)
        prices = task.metadata.get("prices")
        if not isinstance(prices, dict) or not prices:
            raise ValueError(f"ShopEnv needs a task with metadata['prices'] (item -> price); task {task.id!r} has none")
        self.prices = dict(prices)  # this task's hidden values; the lookup tool reads only these
        return messages

    def _price(self, item: str) -> str:
        name = str(item)  # the model may write a number or a list; str() keeps the dict look-up safe
        if name in self.prices:
            return str(self.prices[name])
        return f"error: the shop has no {name!r}; it sells: {', '.join(sorted(self.prices))}"


register_env("shop", ShopEnv)
