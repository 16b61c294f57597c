"""GSM8K as a benchmark: its 1,319 test problems, each reply judged as the training reward judges it.

    python -m helpers.evaluate --benchmark gsm8k --preset gsm8k-24gb                  # a model on the hub's test split
    python -m helpers.evaluate --benchmark gsm8k --answers outputs.jsonl             # a file of replies, no model
    python -m helpers.evaluate --benchmark gsm8k-sample --answers outputs.jsonl      # the same on the shipped sample (no hub)

A benchmark's tasks are the test split of the dataset of its name (``helpers.benchmarks.Benchmark``),
so the world registers the benchmark twice: ``gsm8k`` on the hub's test split, and ``gsm8k-sample``
on the held-out 20 % of ``data/gsm8k_sample.jsonl``, which scores the same way where no hub is
reachable (tests, CI, a first look).

The env is the world's ``math`` env (one turn, no tools) and the judge is the one the world trains
with, ``helpers.formats.judge_answer``: the reply's final answer (the ``<answer>`` tag; without one,
``\\boxed{}``, ``#### N`` or the last number) against the number after ``####`` in the reference
solution, compared as numbers, and by math-verify where the answer is not a plain number. A line
of an answers file is ``{"task_id": "gsm8k-test-00000", "completion": the model's reply}``; the
reference solution itself, ``... #### 72``, is a reply that scores 1.

Simplification, named: the judge is lenient, as GSM8K scoring usually is (``judge_answer``'s
``strict_format`` says whether the answer came in the asked-for tag; the file score does not use it).
"""

from __future__ import annotations

from helpers.data import Task
from helpers.benchmarks import Benchmark, register_benchmark
from helpers.formats import judge_answer


def judge_output(task: Task, output: str) -> dict:
    """One line of an answers file: ``output`` is the model's reply, judged against the task's gold number."""
    judged = judge_answer(output, task.answer)
    return {**judged, "score": float(judged["correct"])}


GSM8K = Benchmark(
    env="math",
    judge=judge_output,
    answers_format='{"task_id": "gsm8k-test-00000", "completion": the reply, its final answer in <answer>...</answer> (or after ####)}',
    max_steps=1,
    max_new_tokens=512,
    max_total_tokens=768,  # as gsm8k-24gb: up to 256 prompt tokens + 512 of reply
)

register_benchmark("gsm8k", GSM8K)  # the hub's test split: load_dataset("gsm8k", "test")
register_benchmark("gsm8k-sample", GSM8K)  # the shipped sample's held-out 20 %: load_dataset("gsm8k-sample", "test")
