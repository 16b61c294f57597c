"""MathEnv: one question, one answer, reward 1 if the number is right.

    env = MathEnv()
    messages = env.reset(task)                     # task.prompt
    result = env.step("... so the answer is <answer>18</answer>")
    result.reward, result.info["verdict"]          # 1.0, "correct"

The expected format is the ``<answer>N</answer>`` tag the prompt asks for
(``helpers.formats.ANSWER_INSTRUCTION``). Judging is ``helpers.formats.judge_answer``,
lenient as GSM8K scoring usually is: without a tag, ``\\boxed{N}``, ``#### N`` or the
last number counts, and ``$1,000.00`` equals ``1000``. ``info["strict_format"]`` says
whether the answer came in the tag exactly once, so a run can report both numbers.

``info["verdict"]`` says *why* an answer was judged wrong. When every reward in a
batch is 0, this is where you look: "no_answer" everywhere means a format problem
(the model never writes a number we can find), "wrong_number" means it answers
but is wrong.
"""

from __future__ import annotations

from helpers.envs.base import Env, StepResult


class MathEnv(Env):
    """Single-turn math: the first assistant turn is the answer.

    Reward 1.0 if correct, else 0.0; the episode always ends ``"answered"`` after one step.
    The per-step work is a linear scan of the text and a comparison (``helpers.formats``),
    so there is no timeout here. ``max_steps`` is accepted so that ``make_env(name,
    max_steps=...)`` works for every env, and ignored: one turn is what this env means.
    """

    name = "math"
    tools = None
    info_defaults = {"strict_format": False}

    def __init__(self, max_steps: int = 1):
        super().__init__(max_steps=1)

    def _step(self, text: str) -> StepResult:
        return self._answered(text)
