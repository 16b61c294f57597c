"""Tests for helpers.formats: number parsing, answer extraction, tool-call parsing."""

import json
from fractions import Fraction

import pytest

from helpers.formats import (
    ANSWER_INSTRUCTION,
    answers_match,
    extract_answer,
    format_number,
    format_tool_call,
    parse_tool_calls,
    to_number,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("42", 42),
        ("1,000", 1000),
        ("1,234,567.5", Fraction(2469135, 2)),
        ("-15", -15),
        (" -3 ", -3),
        ("0", 0),
        ("2.50", Fraction(5, 2)),
        (".5", Fraction(1, 2)),
        ("1000.", 1000),
        ("$1,000.00", 1000),
        ("-$5", -5),
        ("$-5", -5),
        ("12.5%", Fraction(25, 2)),
        ("\\boxed{1000}", 1000),
        ("\\$18", 18),
    ],
)
def test_to_number_accepts(text, expected):
    assert to_number(text) == expected


@pytest.mark.parametrize("text", [None, "", "twelve", "1,00", "12,3456", "4/5", "1.2.3", "5 apples", "$"])
def test_to_number_rejects(text):
    assert to_number(text) is None


def test_to_number_is_exact():
    assert to_number("0.1") + to_number("0.2") == to_number("0.3")


@pytest.mark.parametrize("value, text", [(Fraction(1000), "1000"), (Fraction(-3), "-3"), (Fraction(5, 2), "2.5"), (Fraction(0), "0"), (Fraction(-1, 2), "-0.5")])
def test_format_number_canonical(value, text):
    assert format_number(value) == text
    assert to_number(text) == value


@pytest.mark.parametrize(
    "completion, text, value, how",
    [
        ("Work... <answer>1,000</answer>", "1,000", 1000, "tag"),
        ("<answer>1</answer> no wait <answer>-2</answer>", "-2", -2, "tag"),
        ("so \\boxed{$12.50}", "$12.50", Fraction(25, 2), "boxed"),
        ("steps\n#### 72", "72", 72, "hash"),
        ("It costs $3 and then $4.50.", "$4.50", Fraction(9, 2), "last_number"),
        ("The answer is 42, which is right", "42", 42, "last_number"),  # trailing comma is not part of the number
        ("We have 1,000, so", "1,000", 1000, "last_number"),
        ("A drop of 15% overall", "15%", 15, "last_number"),
        ("The temperature fell to -7", "-7", -7, "last_number"),
        ("no numbers here", None, None, "none"),
    ],
)
def test_extract_answer_lenient(completion, text, value, how):
    found = extract_answer(completion)
    assert (found.text, found.value, found.how) == (text, value, how)
    assert found.strict == (how == "tag")


def test_extract_answer_strict_needs_tag():
    assert extract_answer("#### 5", lenient=False).how == "none"
    assert extract_answer("the answer is 5", lenient=False).value is None
    assert extract_answer("<answer>5</answer>", lenient=False).value == 5


def test_tag_with_words_has_no_value():
    found = extract_answer("<answer>about five</answer>")
    assert found.how == "tag" and found.value is None


def test_answers_match():
    assert answers_match(to_number("2.50"), "2.5")
    assert answers_match(to_number("$1,000"), Fraction(1000))
    assert not answers_match(to_number("0.333333"), Fraction(1, 3), rel_tol=0)
    assert not answers_match(None, "5")
    assert not answers_match(Fraction(5), None)
    assert not answers_match(Fraction(5), "five")
    assert not answers_match(Fraction(-5), "5")


def test_answer_instruction_shows_the_tag():
    assert "<answer>42</answer>" in ANSWER_INSTRUCTION


def test_tool_call_round_trip():
    text = "Let me compute.\n" + format_tool_call("calculator", {"expression": "47*86"})
    assert text.endswith('<tool_call>\n{"name": "calculator", "arguments": {"expression": "47*86"}}\n</tool_call>')
    (call,) = parse_tool_calls(text)
    assert (call.name, call.arguments, call.error) == ("calculator", {"expression": "47*86"}, None)


def test_parse_tool_calls_never_raises():
    text = (
        "<tool_call>{not json}</tool_call>"
        '<tool_call>["calculator"]</tool_call>'
        '<tool_call>{"name": "calculator", "arguments": 5}</tool_call>'
        + "<tool_call>" + json.dumps({"name": "calculator", "arguments": json.dumps({"expression": "1+1"})}) + "</tool_call>"
    )
    calls = parse_tool_calls(text)
    assert [c.error is None for c in calls] == [False, False, False, True]
    assert "malformed JSON" in calls[0].error
    assert calls[2].name == "calculator" and calls[2].arguments is None
    assert calls[3].arguments == {"expression": "1+1"}  # double-encoded arguments are decoded
    assert parse_tool_calls("no calls") == []
