"""MathEnv: one question, one answer, reward 1 if the number is right.

    env = MathEnv()
    messages = env.reset(task)                     # task.prompt
    result = env.step("... so the answer is <answer>18</answer>")
    result.reward, result.info["verdict"]          # 1.0, "correct"

The expected format is the ``<answer>N</answer>`` tag the prompt asks for
(``helpers.formats.ANSWER_INSTRUCTION``). Judging is lenient, as GSM8K scoring
usually is: without a tag, ``\\boxed{N}``, ``#### N`` or the last number counts,
and ``$1,000.00`` equals ``1000``. ``info["strict_format"]`` says whether the
answer came in the tag exactly once, so a run can report both numbers.

``info["verdict"]`` says *why* an answer was judged wrong. When every reward in a
batch is 0, this is where you look: "no_answer" everywhere means a format problem
(the model never writes a number we can find), "wrong_number" means it answers
but is wrong.
"""

from __future__ import annotations

import threading

from helpers.envs.base import Env, StepResult
from helpers.formats import ANSWER_CLOSE, ANSWER_OPEN, answers_match, extract_answer, format_number, to_number

MATH_VERIFY_MAX_CHARS = 100  # longer "answers" are not sent to sympy (parsing can be slow)


def _math_verify_equal(reference: str, predicted: str) -> bool:
    """math-verify's symbolic check (``\\frac{1}{2}`` == ``0.5``); False if it cannot decide.

    math-verify times out with ``signal.alarm``, which only works in the main thread; in
    a worker thread we turn its timeout off and rely on the short-input cap instead.
    """
    from math_verify import parse, verify  # sympy is slow to import: only when needed

    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        gold = parse(f"${reference}$", parsing_timeout=timeout)
        pred = parse(f"${predicted}$", parsing_timeout=timeout)
        return bool(gold and pred and verify(gold, pred, timeout_seconds=timeout))
    except Exception:  # math-verify is a best-effort second opinion, never a crash
        return False


def judge_answer(text: str, reference: str | None) -> dict:
    """Read the final answer in ``text`` and compare it with ``reference``.

    Returns ``correct``, ``predicted`` (the answer text found, or None), ``verdict`` and
    ``strict_format`` (the answer sits in one ``<answer>`` tag, the only one). Verdicts:

    * ``"correct"``
    * ``"wrong_number"``: a number was found and it is not the reference
    * ``"wrong_answer"``: an answer was found that is not a plain number and math-verify
      did not find it equal to the reference (``"x+1"``, ``"forty"``)
    * ``"no_answer"``: nothing that looks like an answer
    """
    found = extract_answer(text, lenient=True)
    if found.how == "none" or not found.text:
        return {"correct": False, "predicted": None, "verdict": "no_answer", "strict_format": False}
    strict = found.strict and text.count(ANSWER_OPEN) == 1 and text.count(ANSWER_CLOSE) == 1
    judged = {"correct": False, "predicted": found.text, "verdict": "no_answer", "strict_format": strict}
    reference_value = to_number(reference) if reference is not None else None
    if found.value is not None and reference_value is not None:
        correct = answers_match(found.value, reference_value)
    elif reference is not None and len(found.text) <= MATH_VERIFY_MAX_CHARS:
        correct = _math_verify_equal(reference, found.text)  # "1/2" vs "0.5", "\\frac{3}{4}", non-numeric golds
    else:
        correct = False
    if found.value is not None:
        judged["predicted"] = format_number(found.value)  # canonical: "$1,000.00" -> "1000"
    judged["correct"] = correct
    judged["verdict"] = "correct" if correct else ("wrong_number" if found.value is not None else "wrong_answer")
    return judged


class MathEnv(Env):
    """Single-turn math: the first assistant turn is the answer.

    Reward 1.0 if correct, else 0.0; the episode always ends ``"answered"`` after one step.
    The per-step work is tiny (a regex and a comparison), so there is no timeout here.
    ``max_steps`` is accepted so that ``make_env(name, max_steps=...)`` works for every env,
    and ignored: one turn is what this env means.
    """

    name = "math"
    tools = None

    def __init__(self, max_steps: int = 1):
        super().__init__(max_steps=1)
        self.info["strict_format"] = False

    def reset(self, task) -> list[dict]:
        messages = self._begin_episode(task)
        self.info["strict_format"] = False
        return messages

    def step(self, action: str) -> StepResult:
        self._check_can_step()
        self.steps += 1
        text = action if isinstance(action, str) else str(action)
        self.info.update(judge_answer(text, self.task.answer))
        return self._end("answered", reward=1.0 if self.info["correct"] else 0.0)
