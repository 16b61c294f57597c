"""CalculatorEnv: arithmetic problems, solved by calling a ``calculator`` tool.

The tool-use env of the tiny world and of GSM8K-with-tools. All the multi-turn
machinery (tool-call parsing, error messages, timeouts, limits) is ``ToolEnv``;
this module only names the tool: ``helpers.calculator.calculate``, an ``ast``
evaluator that never runs the model's text as code.

    env = make_env("calculator", max_steps=5)
    tokenizer.apply_chat_template(messages, tools=env.tools, ...)   # the tool schema below
"""

from __future__ import annotations

from helpers.calculator import calculate
from helpers.envs.tools import Tool, ToolEnv


CALCULATOR = Tool(
    name="calculator",
    description="Evaluate an arithmetic expression exactly, e.g. 47*86 or (12+3)/4. Supports + - * / // % ** (^ also means power) and parentheses.",
    parameters={"expression": "the arithmetic expression to evaluate"},
    fn=calculate,
)


class CalculatorEnv(ToolEnv):
    """Arithmetic word problems with a ``calculator`` tool (``helpers.calculator.calculate``).

    ``extra_tools`` adds more tools next to the calculator (the tests add a slow one).
    """

    name = "calculator"
    tools = [CALCULATOR.schema]

    def __init__(self, extra_tools: list[Tool] = (), **limits):
        super().__init__([CALCULATOR, *extra_tools], **limits)
