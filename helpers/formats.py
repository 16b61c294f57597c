"""What the text looks like: the answer tag, the tool-call format, number parsing.

Every module that reads model output (environments, rewards, evaluation) goes
through these functions, so "what counts as an answer" is decided in one place.

Formats (the same for the tiny model and for Qwen2.5-Instruct):

    final answer   <answer>42</answer>                        (strict format)
    tool call      <tool_call>
                   {"name": "calculator", "arguments": {"expression": "6*7"}}
                   </tool_call>                                (Qwen2.5's own format)
    tool result    a message with role "tool"; Qwen's chat template renders it as
                   <tool_response>\n42\n</tool_response> inside a user turn.

Lenient answer extraction (used for GSM8K-style checking) falls back from the
tag to ``\\boxed{...}``, to ``#### N``, to the last number in the text, and says
which rule fired, so a run can report strict-format and lenient accuracy apart.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from fractions import Fraction

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"

ANSWER_INSTRUCTION = (
    "Think step by step, then write the final answer as a number inside "
    f"{ANSWER_OPEN}{ANSWER_CLOSE} tags, for example {ANSWER_OPEN}42{ANSWER_CLOSE}."
)

_NUMBER = r"-?\$?\s?\d(?:[\d,]*\d)?(?:\.\d+)?%?|-?\$?\.\d+%?"  # a number never ends in a comma: "42, so"
_NUMBER_RE = re.compile(_NUMBER)
_TAG_RE = re.compile(re.escape(ANSWER_OPEN) + r"(.*?)" + re.escape(ANSWER_CLOSE), re.S)
_BOXED_RE = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_HASH_RE = re.compile(r"####\s*(" + _NUMBER + r")")
_TOOL_CALL_RE = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.S)


def to_number(text: str | None) -> Fraction | None:
    """Parse a written number to an exact Fraction, or None if it is not one.

    Lenient about how people and models write numbers:
    ``"1,000"``, ``"$1000.00"``, ``"1000."``, ``" -3 "``, ``"12.5%"`` (-> 12.5),
    ``"\\boxed{1000}"``. Exact fractions avoid float surprises (0.1 + 0.2).

    >>> to_number("$1,000.00") == 1000
    True
    >>> to_number("-0.5") == Fraction(-1, 2)
    True
    >>> to_number("twelve") is None
    True
    """
    if text is None:
        return None
    s = text.strip()
    boxed = _BOXED_RE.fullmatch(s)
    if boxed:
        s = boxed.group(1).strip()
    s = s.replace("\\$", "$").replace("\\%", "%").rstrip(".").strip()
    s = s.replace(" ", "")
    s = s.replace("$-", "-$")  # "$-5" and "-$5" are the same number
    negative = s.startswith("-")
    s = s.lstrip("-").lstrip("$").rstrip("%")
    if not re.fullmatch(r"(\d{1,3}(,\d{3})+|\d+)(\.\d+)?|\.\d+", s):
        return None
    value = Fraction(s.replace(",", ""))
    return -value if negative else value


def format_number(value: Fraction) -> str:
    """Canonical text of a number: ``1000``, ``-3``, ``2.5`` (no commas, no trailing zeros)."""
    if value.denominator == 1:
        return str(value.numerator)
    as_float = float(value)
    text = f"{as_float:.10f}".rstrip("0").rstrip(".")
    return text


@dataclass
class ExtractedAnswer:
    """An answer found in model output: its text, its value and the rule that found it.

    ``how`` is one of ``"tag"`` (strict format), ``"boxed"``, ``"hash"``,
    ``"last_number"``, or ``"none"`` when nothing that looks like a number was found.
    """

    text: str | None
    value: Fraction | None
    how: str

    @property
    def strict(self) -> bool:
        return self.how == "tag"


def extract_answer(text: str, lenient: bool = True) -> ExtractedAnswer:
    """Find the final answer in a completion.

    Strict: the last ``<answer>...</answer>`` tag. Lenient (default) then tries
    the last ``\\boxed{}``, a GSM8K-style ``#### N`` line, and the last number.
    """
    for how, regex in [("tag", _TAG_RE), ("boxed", _BOXED_RE), ("hash", _HASH_RE)]:
        found = regex.findall(text)
        if found:
            answer = found[-1].strip()
            return ExtractedAnswer(answer, to_number(answer), how)
        if not lenient:
            return ExtractedAnswer(None, None, "none")
    numbers = _NUMBER_RE.findall(text)
    if numbers:
        last = numbers[-1].strip()
        return ExtractedAnswer(last, to_number(last), "last_number")
    return ExtractedAnswer(None, None, "none")


def answers_match(predicted: Fraction | None, reference: Fraction | str | None, rel_tol: float = 1e-9) -> bool:
    """Numeric equality with a tiny relative tolerance (0.333333 vs 1/3 is not equal; 2.50 vs 2.5 is).

    The tolerance is 1e-9, not 1e-6: with 1e-6, 1,000,001 would "equal" a gold answer of 1,000,000."""
    if predicted is None or reference is None:
        return False
    if isinstance(reference, str):
        reference = to_number(reference)
        if reference is None:
            return False
    if predicted == reference:
        return True
    return abs(predicted - reference) <= rel_tol * max(1, abs(reference))


@dataclass
class ToolCall:
    """One parsed ``<tool_call>`` block. ``error`` is set (and name/arguments may be
    None) when the block is not valid JSON of the form {"name": str, "arguments": dict}."""

    name: str | None
    arguments: dict | None
    raw: str
    error: str | None = None


def parse_tool_calls(text: str) -> list[ToolCall]:
    """All tool calls in an assistant message, in order. Never raises on bad JSON."""
    calls = []
    for raw in _TOOL_CALL_RE.findall(text):
        try:
            obj = json.loads(raw.strip())
        except json.JSONDecodeError as e:
            calls.append(ToolCall(None, None, raw, f"malformed JSON in tool call: {e.msg}"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            calls.append(ToolCall(None, None, raw, 'tool call needs {"name": ..., "arguments": {...}}'))
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models double-encode the arguments
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        if not isinstance(args, dict):
            calls.append(ToolCall(obj["name"], None, raw, "tool call arguments must be a JSON object"))
            continue
        calls.append(ToolCall(obj["name"], args, raw))
    return calls


def format_tool_call(name: str, arguments: dict) -> str:
    """The text of one tool call exactly as Qwen2.5-Instruct writes it."""
    return f"{TOOL_CALL_OPEN}\n" + json.dumps({"name": name, "arguments": arguments}) + f"\n{TOOL_CALL_CLOSE}"
