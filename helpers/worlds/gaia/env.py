"""GaiaEnv: answer a GAIA question in one turn; GAIA's own scorer decides. The benchmark "gaia".

    env = make_env("gaia", max_steps=1)                   # Episode(GaiaEnv())
    env.reset(task)                                       # a task of load_dataset("gaia", "test")
    result = env.step("... so it is 3. FINAL ANSWER: 3")
    result.reward, result.info["verdict"]                 # 1.0, "correct" (or 0.0: "wrong_answer", "no_answer")

The reply's final answer is what follows its last ``FINAL ANSWER:`` (the template of GAIA's system
prompt), or, without one, the whole reply; it is compared with the task's ``Final answer`` by
``question_scorer`` (``scorer.py``, the leaderboard's). An answers file for
``python -m helpers.evaluate --benchmark gaia --answers FILE`` holds one ``{"task_id", "completion"}``
per line, ``completion`` being the final answer string (a whole reply with its ``FINAL ANSWER:``
line is read the same way). GAIA's leaderboard files name that key ``model_answer``: rename it.

Simplification, named: no tools. GAIA is a benchmark for assistants that browse the web, read
attached files and run code; here the model answers from what it knows (the world's ``__init__``
says which questions that leaves out).
"""

from __future__ import annotations

import re

from helpers.data import Task
from helpers.envs.anchors import register_anchor, tool_history
from helpers.envs.registry import register_env
from helpers.benchmarks import Benchmark, register_benchmark
from helpers.worlds.gaia.scorer import question_scorer

_FINAL = re.compile(r"FINAL ANSWER:", re.IGNORECASE)
MAX_PREDICTED_CHARS = 300  # what the record keeps of a long "answer" (a reply with no FINAL ANSWER line)


def final_answer(text: str) -> str:
    """What follows the last ``FINAL ANSWER:`` in ``text`` (its first line), or the whole text; stripped."""
    parts = _FINAL.split(text)
    if len(parts) > 1 and parts[-1].strip():
        return parts[-1].strip().splitlines()[0].strip()
    return text.strip()


def judge_answer_string(output: str, truth: str) -> dict:
    """``output`` (a reply or a bare answer) against GAIA's ``truth``: the keys an episode's info and a record take."""
    answer = final_answer(output)
    if not answer:
        return {"predicted": None, "verdict": "no_answer", "correct": False, "score": 0.0}
    correct = question_scorer(answer, truth)
    return {"predicted": answer[:MAX_PREDICTED_CHARS], "verdict": "correct" if correct else "wrong_answer",
            "correct": correct, "score": float(correct)}


class GaiaEnv:
    """One GAIA question, no tools: the first turn is the answer, reward 1.0 when GAIA's scorer accepts it."""

    def __init__(self):
        self.truth = ""

    def reset(self, **row) -> None:
        """Keep the row's ``answer`` (GAIA's ``Final answer``)."""
        if not isinstance(row.get("answer"), str):
            raise ValueError("GaiaEnv needs a row whose 'answer' is GAIA's final answer: a task of load_dataset('gaia', 'test')")
        self.truth = row["answer"]
        return None

    def _judge(self, text: str) -> dict:
        """The final turn, judged by GAIA's scorer; its verdict is the reward."""
        judged = judge_answer_string(text, self.truth)
        return {**judged, "reward": judged["score"]}


register_env("gaia", GaiaEnv)
register_anchor("gaia", tool_history)  # the searches and reads so far and their results: the state


def judge_output(task: Task, output: str) -> dict:
    """One line of an answers file: ``output`` is the final answer string (or a reply ending in one)."""
    return judge_answer_string(output, task.answer)


register_benchmark("gaia", Benchmark(
    env="gaia",
    judge=judge_output,
    answers_format='final answer string: {"task_id": GAIA\'s task_id, "completion": the final answer, e.g. "17" or "a, b"}',
    max_steps=1,
    max_new_tokens=1024,
    max_total_tokens=2048,
))
