"""Evaluation: how good is the policy on tasks it never trained on?

    result = evaluate(policy, test_tasks, "calculator", k=4)
    result.metrics        # {"success": 0.31, "pass@4": 0.62, "tool_use": 0.45, "mean_turns": 1.4, ...}
    result.records[0]     # {"task_id": ..., "predicted": "4042", "verdict": "correct", "stop_reason": "answered", ...}
    breakdown(result.records)                 # {"correct": 20, "wrong_number": 30, "no_answer": 10, "truncated": 4}
    save_records("runs/x/eval-final.jsonl", result.records)

The same function runs before training, every ``eval_every`` steps and at the end,
so every run reports *before -> after* on the same tasks with the same settings.

Two ways of asking "can it solve this task?":

* **greedy success**: one episode per task at temperature 0; the policy's single best
  guess. This is the headline number (deterministic, so two evaluations differ only
  because the policy changed).
* **pass@k**: ``n = k`` episodes per task at the sampling temperature; a task passes
  if any of them is correct. We use the unbiased estimator of Chen et al. (2021),
  ``1 - C(n - c, k) / C(n, k)`` for ``c`` correct out of ``n``, which with ``n == k``
  is simply "any correct". pass@k minus greedy success is the headroom RL can turn
  into greedy success: answers the policy *can* find but does not prefer yet.

Simplifications, named: pass@k uses exactly ``n = k`` samples (the estimator is
unbiased but noisy; more samples per task would lower its variance); the tool-use
rate and mean turns are measured on the greedy episodes only.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from helpers.policy.base import SamplingParams
from helpers.rewards import count_tool_calls, outcome
from helpers.rollout import Trajectory, rollout

TRUNCATED = ("max_steps", "max_tokens", "timeout")  # stop reasons that mean "a limit cut it short"


@dataclass
class EvalResult:
    metrics: dict[str, float]  # success, pass@k, tool_use, mean_turns, truncated, ...
    records: list[dict]  # one per task (the greedy episode), for error analysis
    trajectories: list[Trajectory]  # the greedy episodes, for the viewer

    def __str__(self) -> str:
        m = self.metrics
        text = f"success {m['success']:.3f} | tool use {m['tool_use']:.2f} | mean turns {m['mean_turns']:.2f} | truncated {m['truncated']:.2f}"
        passes = [key for key in m if key.startswith("pass@")]
        return text + "".join(f" | {key} {m[key]:.3f}" for key in passes) + f" | n={m['n']}"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``c`` correct out of ``n`` samples (Chen et al. 2021).

    >>> pass_at_k(4, 0, 4), pass_at_k(4, 1, 4), pass_at_k(10, 5, 1)
    (0.0, 1.0, 0.5)
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every set of k samples contains a correct one
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def task_record(traj: Trajectory) -> dict:
    """What one episode did, as a flat JSON-ready dict (one row of an eval JSONL)."""
    judged = outcome(traj)  # the env's verdict (or the reward module's check when there is none)
    return {
        "task_id": traj.task_id,
        "answer": traj.task.answer,
        "predicted": judged.get("predicted"),
        "verdict": judged.get("verdict"),
        "correct": bool(judged.get("correct")),
        "stop_reason": traj.stop_reason,
        "tool_calls": count_tool_calls(traj),
        "tool_errors": int((traj.info or {}).get("tool_errors", 0)),
        "turns": traj.turns,
        "completion_tokens": traj.num_generated,
        "strict_format": judged.get("strict_format"),
        "completion": traj.completion_text,
    }


def category(record: dict) -> str:
    """The breakdown category of one record: correct, truncated (a limit cut it short),
    or the verdict of a finished but wrong episode (wrong_number, no_answer, ...)."""
    if record["correct"]:
        return "correct"
    if record["stop_reason"] in TRUNCATED:
        return "truncated"
    return record["verdict"]


def breakdown(records: list[dict]) -> dict[str, int]:
    """How many tasks ended each way: ``{"correct": 20, "wrong_number": 30, "no_answer": 10, "truncated": 4}``."""
    counts = Counter(category(r) for r in records)
    return dict(counts.most_common())


def summarize(records: list[dict]) -> dict[str, float]:
    """Rates over records: success, tool use, mean turns, truncation, completion length (and strict format if known)."""
    if not records:
        raise ValueError("summarize needs at least one record")
    n = len(records)
    metrics = {
        "success": sum(r["correct"] for r in records) / n,
        "tool_use": sum(r["tool_calls"] > 0 for r in records) / n,
        "mean_turns": sum(r["turns"] for r in records) / n,
        "truncated": sum(r["stop_reason"] in TRUNCATED for r in records) / n,
        "completion_tokens": sum(r["completion_tokens"] for r in records) / n,
        "n": n,
    }
    strict = [r["strict_format"] for r in records if r.get("strict_format") is not None]
    if strict:
        metrics["strict_format"] = sum(map(bool, strict)) / len(strict)
        # strict accuracy: right AND in the asked-for format; "success" is the lenient accuracy (GSM8K, issue 9)
        metrics["strict_success"] = sum(bool(r["correct"]) and bool(r.get("strict_format")) for r in records) / n
    return metrics


def evaluate(
    policy,
    tasks: list,
    env_factory: Callable[[], object] | str,
    *,
    k: int = 0,
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    max_steps: int = 4,
    max_total_tokens: int = 256,
    seed: int = 0,
    progress: bool = False,
) -> EvalResult:
    """Greedy success (one episode per task) and, if ``k > 0``, pass@k from k sampled episodes per task.

    ``env_factory`` and the limits are passed to ``helpers.rollout.rollout`` unchanged, so an
    evaluation episode is exactly a training episode, only sampled greedily. ``seed`` fixes
    the pass@k samples: two evaluations of the same policy give the same numbers.
    """
    if not tasks:
        raise ValueError("evaluate needs at least one task")
    limits = dict(max_steps=max_steps, max_total_tokens=max_total_tokens, progress=progress)
    greedy = rollout(tasks, env_factory, policy, group_size=1, sampling=SamplingParams(max_new_tokens, temperature=0.0), **limits)
    records = [task_record(t) for t in greedy]
    metrics = summarize(records)
    if k > 0:
        sampling = SamplingParams(max_new_tokens, temperature=temperature, seed=seed)
        sampled = rollout(tasks, env_factory, policy, group_size=k, sampling=sampling, **limits)
        correct = Counter(t.task_id for t in sampled if outcome(t).get("correct"))
        metrics[f"pass@{k}"] = sum(pass_at_k(k, correct[t.id], k) for t in tasks) / len(tasks)
        for record in records:
            record[f"correct_of_{k}"] = correct[record["task_id"]]
    return EvalResult(metrics, records, list(greedy))


def save_records(path: str | Path, records: list[dict]) -> Path:
    """Write records as JSONL, one task per line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for record in records:
            f.write(json.dumps(record, default=str) + "\n")
    return path


def load_records(path: str | Path) -> list[dict]:
    with Path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]
