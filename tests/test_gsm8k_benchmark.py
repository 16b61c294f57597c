"""Tests for the GSM8K benchmark (helpers/worlds/gsm8k/benchmark.py): a file of replies scored without a model
through the command, on the shipped sample (``gsm8k-sample``: no hub here or in CI). The reference solutions
written as replies score 100 %; the same solutions given to the wrong tasks score only where two answers happen
to be equal; the judge is the world's own (``judge_answer``, math-verify for answers that are not plain numbers).
"""

import json
import random
import subprocess
import sys

import pytest

import helpers.worlds  # noqa: F401  (registers the benchmarks)
from helpers.data import load_dataset
from helpers.evaluate import main as evaluate_main
from helpers.benchmarks import get_benchmark
from helpers.formats import to_number
from helpers.worlds.gsm8k.benchmark import GSM8K, judge_output


@pytest.fixture(scope="module")
def tasks():
    return load_dataset("gsm8k-sample", "test")


def write_answers(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_gsm8k_and_its_sample_are_one_benchmark_on_the_math_env():
    assert get_benchmark("gsm8k") is GSM8K and get_benchmark("gsm8k-sample") is GSM8K
    assert GSM8K.env == "math" and GSM8K.max_steps == 1


def test_the_reference_solutions_score_100_percent_through_the_command(tasks, tmp_path):
    path = write_answers(tmp_path / "reference.jsonl", [{"task_id": t.id, "completion": t.metadata["solution"]} for t in tasks])
    run = subprocess.run([sys.executable, "-m", "helpers.evaluate", "--benchmark", "gsm8k-sample", "--answers", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    line = json.loads(run.stdout.strip().splitlines()[-1])
    assert (line["tasks"], line["of"], line["samples"], line["pass@1"], line["score"]) == (len(tasks), len(tasks), len(tasks), 1.0, 1.0)
    assert line["failures"] == {"correct": len(tasks)}


def test_shuffled_solutions_score_only_where_two_answers_are_equal(tasks, tmp_path):
    order = list(range(len(tasks)))
    random.Random(0).shuffle(order)
    rows = [{"task_id": t.id, "completion": tasks[j].metadata["solution"]} for t, j in zip(tasks, order)]
    line = evaluate_main(["--benchmark", "gsm8k-sample", "--answers", str(write_answers(tmp_path / "shuffled.jsonl", rows))])
    same = sum(to_number(t.answer) == to_number(tasks[j].answer) for t, j in zip(tasks, order)) / len(tasks)
    assert line["score"] == pytest.approx(same) and line["score"] <= 0.2
    assert set(line["failures"]) <= {"correct", "wrong_number"}


def test_the_judge_reads_the_reply_as_training_does(tasks):
    task = tasks[0]
    assert judge_output(task, f"so the answer is <answer>{task.answer}</answer>")["verdict"] == "correct"
    assert judge_output(task, f"\\boxed{{{task.answer}}}")["score"] == 1.0
    wrong = judge_output(task, f"<answer>{int(task.answer) + 1}</answer>")
    assert (wrong["correct"], wrong["score"], wrong["verdict"]) == (False, 0.0, "wrong_number")
    assert judge_output(task, "I do not know")["verdict"] == "no_answer"
