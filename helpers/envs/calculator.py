"""CalculatorEnv: arithmetic problems, solved by calling a ``calculator`` tool.

The tool-use env of the tiny world and of GSM8K-with-tools. The class is TRL's environment
contract at its simplest: ``reset`` and one public method, ``calculator(expression)``, whose type
hints and docstring are its JSON schema. The multi-turn machinery (tool-call parsing, error
messages, timeouts, limits, judging the answer) is the adapter's, ``helpers.envs.episode.Episode``;
the arithmetic is ``helpers.calculator.calculate``, an ``ast`` evaluator that never runs the
model's text as code.

    env = make_env("calculator", max_steps=5)
    tokenizer.apply_chat_template(messages, tools=env.tools, ...)   # the calculator's schema
    GRPOTrainer(..., environment_factory=CalculatorEnv)              # the same class, in TRL

Taught in notebooks/02_environment.ipynb.
"""

from __future__ import annotations

from helpers.calculator import calculate


class CalculatorEnv:
    """Arithmetic word problems with a ``calculator`` tool. Subclasses add tools as methods (the shop does)."""

    def reset(self, **row) -> None:
        """Nothing to set up: the calculator keeps no state."""
        return None

    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression exactly, e.g. 47*86 or (12+3)/4. Supports + - * / // % ** (^ also means power) and parentheses.

        Args:
            expression: the arithmetic expression to evaluate
        """
        return calculate(expression)
