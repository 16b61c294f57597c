"""A safe calculator: arithmetic parsed with ``ast``, never ``eval``.

This is the tool behind ``CalculatorEnv``. The model sends a string it wrote
itself, so the string is untrusted: ``eval("__import__('os').system('rm -rf ~')")``
would run it. Instead we parse the text into a syntax tree and walk it, allowing
only number literals and a handful of operators. Anything else (a name, an
attribute, a call, a lambda, a comprehension, ...) is refused with a one-line reason.

    >>> calculate("47*86")
    '4042'
    >>> calculate("(1 + 2) / 4")
    '0.75'
    >>> calculate("__import__('os').system('id')")
    'error: function calls are not allowed'

Allowed: ``+ - * / // % **``, unary ``-`` and ``+``, parentheses, integers and
decimals (``2.5``, ``1e3``). Also accepted as written by people: ``×`` and ``÷``,
the minus sign ``−``, and ``^`` for a power (in Python ``^`` is XOR, which nobody
means on a calculator).

Simplifications, named:

* Exact arithmetic: every value is a ``fractions.Fraction``, so ``0.1 + 0.2`` is
  exactly ``0.3`` and ``1/3*3`` is ``1``. A non-integer result is shown with up to
  10 decimals (``helpers.formats.format_number``), like a pocket calculator.
* Powers need an integer exponent (no square roots), at most ``MAX_EXPONENT``.
* Every intermediate value must fit in ``MAX_DIGITS`` digits (numerator and
  denominator), so ``9**9**9`` or ``10**999 * 10**999`` is refused up front instead
  of eating the CPU. Checking each step keeps every single operation cheap: with
  at most ``MAX_EXPRESSION_CHARS`` characters, the slowest input we found (a unary
  chain 199 deep, fractions of 1,000 digits) takes under 1 ms
  (``tests/test_calculator.py::test_every_input_is_judged_within_milliseconds``).
"""

from __future__ import annotations

import ast
import math
import operator
from fractions import Fraction

from helpers.formats import format_number

MAX_EXPRESSION_CHARS = 200  # longer tool input is refused (a real expression is short)
MAX_EXPONENT = 1000  # |b| in a**b
MAX_DIGITS = 1000  # digits of any intermediate numerator or denominator

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_SPELLINGS = {"×": "*", "÷": "/", "−": "-", "^": "**"}  # how people write operators -> Python

# Node types a model might try, with the reason we give back (the rest get a generic message).
_REFUSED = {
    ast.Attribute: "attribute access is not allowed",
    ast.Call: "function calls are not allowed",
    ast.Lambda: "lambda is not allowed",
    ast.Subscript: "indexing is not allowed",
    ast.Compare: "comparisons are not allowed",
    ast.BoolOp: "boolean operators are not allowed",
    ast.Tuple: "tuples are not allowed (write 1000, not 1,000)",
}


class CalculatorError(ValueError):
    """Input the calculator refuses; the message is what the model reads after ``error: ``."""


def _check_size(value: Fraction) -> Fraction:
    # bit_length * log10(2) ~ digits; comparing bits avoids converting huge ints to text
    limit_bits = int(MAX_DIGITS / math.log10(2))
    if value.numerator.bit_length() > limit_bits or value.denominator.bit_length() > limit_bits:
        raise CalculatorError(f"result too large (more than {MAX_DIGITS} digits)")
    return value


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise CalculatorError("only integer powers are supported")
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponent too large (limit {MAX_EXPONENT})")
    if base == 0 and exponent < 0:
        raise CalculatorError("division by zero")
    # estimate the size before computing: digits(base**n) = n * log10(base), numerator and denominator
    digits = abs(int(exponent)) * max(math.log10(abs(base.numerator) or 1), math.log10(base.denominator))
    if digits > MAX_DIGITS:
        raise CalculatorError(f"result too large (more than {MAX_DIGITS} digits)")
    return _check_size(base ** int(exponent))


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CalculatorError(f"only numbers are allowed, not {type(value).__name__} {value!r}"[:120])
        if isinstance(value, float) and not math.isfinite(value):
            raise CalculatorError("number too large")
        return _check_size(Fraction(repr(value)) if isinstance(value, float) else Fraction(value))  # repr: 0.1 -> 1/10 exactly
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        if type(node.op) not in _BINARY:
            raise CalculatorError(f"operator {type(node.op).__name__} is not allowed")
        if right == 0 and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
            raise CalculatorError("division by zero")
        return _check_size(Fraction(_BINARY[type(node.op)](left, right)))
    if isinstance(node, ast.Name):
        raise CalculatorError(f"names are not allowed: {node.id[:30]!r}")
    reason = _REFUSED.get(type(node), f"{type(node).__name__} is not allowed in arithmetic")
    raise CalculatorError(reason)


def evaluate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression; raises ``CalculatorError`` with the reason."""
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    text = expression.strip()
    for written, python in _SPELLINGS.items():
        text = text.replace(written, python)
    if not text:
        raise CalculatorError("empty expression")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):  # ValueError: null bytes, lone surrogates
        raise CalculatorError(f"not an arithmetic expression: {expression.strip()[:60]!r}") from None
    return _eval(tree)


def calculate(expression) -> str:
    """The tool: the result as plain text (``"4042"``, ``"2.5"``, ``"-3"``) or ``"error: <reason>"``.

    Never raises. Numbers given instead of a string (``{"expression": 12}``) are accepted.
    """
    try:
        if isinstance(expression, (int, float)) and not isinstance(expression, bool):
            expression = repr(expression)  # ValueError for an int of over 4,300 digits (Python's limit)
        value = evaluate(expression)
    except CalculatorError as e:
        return f"error: {e}"
    except ValueError:
        return f"error: number too large (more than {MAX_DIGITS} digits)"
    return format_number(value)
