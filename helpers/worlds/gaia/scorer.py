"""GAIA's own answer check: the ``question_scorer`` of the GAIA leaderboard, ported function for function.

Source: ``scorer.py`` of the leaderboard space, https://huggingface.co/spaces/gaia-benchmark/leaderboard
(blob/main/scorer.py). The space itself is not reachable from where this was written; the port follows
the copies other projects vendor with that attribution (found with the workbook's code search), which
agree with each other line for line. A GAIA answer is compared by the kind of the *ground truth*:

* a **number** (``float(truth)`` works): the answer, with ``$``, ``%`` and ``,`` removed, must be that
  float exactly. ``"$1,000"`` equals ``1000``; ``"17 km"`` is not a number (no units are stripped but
  those three), so it is wrong, as on the leaderboard.
* a **list** (the truth holds ``,`` or ``;``): both are split on ``,`` and ``;``; the lists must be as
  long, and each element is compared in its place: as a number where the truth's element is one, else
  as a string without whitespace, lowercased (punctuation kept: list elements may need it).
* a **string**: without whitespace and punctuation, lowercased: ``"Sea gull."`` equals ``"seagull"``.

    question_scorer("$1,000", "1000")             # True
    question_scorer("3; b, C", "3, b, c")         # True
    question_scorer("The Seagull", "the seagull") # True

Simplifications, named: the original prints a line per answer ("Evaluating ... as a number.") and warns
when two lists differ in length; this port is silent (a score file of 165 lines would be mostly that
noise). The rules are unchanged, quirks included: ``"1e3"`` and ``"1_000"`` are numbers to ``float``.
"""

from __future__ import annotations

import re
import string


def normalize_number_str(number_str: str) -> float:
    """The answer as a float after removing the units GAIA allows (``$``, ``%``) and thousands commas;
    ``inf`` when it is still not a number (so it equals no ground truth)."""
    for char in ["$", "%", ","]:
        number_str = number_str.replace(char, "")
    try:
        return float(number_str)
    except ValueError:
        return float("inf")


def split_string(s: str, char_list: tuple[str, ...] = (",", ";")) -> list[str]:
    """A list answer's elements: ``s`` split on every comma and semicolon."""
    return re.split(f"[{''.join(char_list)}]", s)


def normalize_str(input_str: str, remove_punct: bool = True) -> str:
    """Lowercase, every whitespace removed ("sea gull" is "seagull"), and punctuation too unless asked to keep it."""
    no_spaces = re.sub(r"\s", "", input_str)
    if remove_punct:
        return no_spaces.lower().translate(str.maketrans("", "", string.punctuation))
    return no_spaces.lower()


def is_float(element: str) -> bool:
    """Whether ``float(element)`` works: how the scorer decides that a ground truth is a number."""
    try:
        float(element)
        return True
    except ValueError:
        return False


def question_scorer(model_answer: str, ground_truth: str) -> bool:
    """Is ``model_answer`` GAIA's ``ground_truth``? As a number, a list or a string (the module docstring)."""
    if is_float(ground_truth):
        return normalize_number_str(model_answer) == float(ground_truth)
    if any(char in ground_truth for char in [",", ";"]):
        gt_elems, ma_elems = split_string(ground_truth), split_string(model_answer)
        if len(gt_elems) != len(ma_elems):
            return False
        comparisons = []
        for ma_elem, gt_elem in zip(ma_elems, gt_elems):
            if is_float(gt_elem):
                comparisons.append(normalize_number_str(ma_elem) == float(gt_elem))
            else:  # punctuation kept: a list's elements may differ only by it
                comparisons.append(normalize_str(ma_elem, remove_punct=False) == normalize_str(gt_elem, remove_punct=False))
        return all(comparisons)
    return normalize_str(model_answer) == normalize_str(ground_truth)
