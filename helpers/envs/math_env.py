"""MathEnv: one question, one answer, reward 1 if the number is right.

    env = make_env("math")                         # Episode(MathEnv())
    messages = env.reset(task)                     # task.prompt
    result = env.step("... so the answer is <answer>18</answer>")
    result.reward, result.info["verdict"]          # 1.0, "correct"

The smallest environment on TRL's contract: a ``reset`` and nothing else. It has no tools, so
the first turn is the answer, and the adapter (``helpers.envs.episode.Episode``) judges it with
``helpers.formats.judge_answer`` against the task's answer: the ``<answer>N</answer>`` tag the
prompt asks for (``helpers.formats.ANSWER_INSTRUCTION``), read leniently as GSM8K scoring usually
is (without a tag, ``\\boxed{N}``, ``#### N`` or the last number counts, and ``$1,000.00`` equals
``1000``). ``info["strict_format"]`` says whether the answer came in the tag exactly once, so a
run can report both numbers.

``info["verdict"]`` says *why* an answer was judged wrong. When every reward in a
batch is 0, this is where you look: "no_answer" everywhere means a format problem
(the model never writes a number we can find), "wrong_number" means it answers
but is wrong.

In TRL the same class gives no reward of its own (no ``get_reward``): the answer is the final
text, which a reward function reads (``helpers.ecosystem.trl_bridge.reward_funcs``).

Taught in notebooks/02_environment.ipynb.
"""

from __future__ import annotations


class MathEnv:
    """Single-turn math: no tools, so the first assistant turn is the answer."""

    def reset(self, **row) -> None:
        """Nothing to set up: the row's prompt is the whole task."""
        return None
