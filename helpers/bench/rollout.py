"""Rollout benchmark: why the rollout batches every live episode into one generate call.

    python -m helpers.bench rollout                       # G=8 samples of 8 tasks, calculator env, 2 threads
    python -m helpers.bench rollout --naive-tasks 2 --no-trl

Three contenders, measured one after the other in the same process, on the tiny model:

1. **batched**: ``rollout(tasks, "calculator", policy, group_size=G)``, all G x tasks
   episodes in one batch per turn (the real loop).
2. **one at a time**: the *same* function, called once per episode
   (``rollout([task], ..., group_size=1)``): same code path, batch size 1.
3. **TRL**: ``GRPOTrainer._generate`` (TRL's own generation, ``model.generate`` with left
   padding) on the same prompts, G completions each, against our rollout in the single-turn
   ``math`` env with the same token budget and the same stop token (the eos). TRL's tool loop
   needs a tokenizer ``response_schema`` the tiny tokenizer does not have, so this comparison is
   single-turn.

Reported: generated (policy) tokens per second and episodes per second, as ratios.
The one-at-a-time loop may run on fewer tasks (``--naive-tasks``): a rate does not depend
on how many episodes it is measured over, and the slow loop is slow.

Threads: one torch thread by default. The tiny model's matrices are too small for
intra-op parallelism to pay, and on a shared 2-core machine two OpenMP threads per op
spin-wait on each other: we measured 20x *slower* sampling with 2 threads under load.
``--threads 2`` is there to try.

Simplifications, named: the tiny model is untrained or barely trained, so episodes
differ in length between contenders; tokens/s is the fair measure, episodes/s is shown
for completeness. One run each, after one small warm-up call; no repetitions.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass, replace

import torch

from helpers.policy import HFPolicy, SamplingParams
from helpers.rollout import RolloutStats, rollout
from helpers.tiny import load_tiny, make_tiny_tasks


@dataclass
class Result:
    name: str
    episodes: int
    tokens: int  # policy-generated tokens
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / self.seconds


def _from_stats(name: str, stats: RolloutStats) -> Result:
    return Result(name, stats.episodes, stats.generated_tokens, stats.total_s)


def bench_batched(policy, tasks, group_size, sampling, env="calculator", **limits) -> tuple[Result, RolloutStats]:
    trajs = rollout(tasks, env, policy, group_size=group_size, sampling=sampling, progress=False, **limits)
    return _from_stats(f"ours, batched ({env} env)", trajs.stats), trajs.stats


def bench_one_at_a_time(policy, tasks, group_size, sampling, env="calculator", **limits) -> Result:
    total = RolloutStats()
    for task in tasks:
        for _ in range(group_size):
            stats = rollout([task], env, policy, group_size=1, sampling=sampling, progress=False, **limits).stats
            total.episodes += stats.episodes
            total.generated_tokens += stats.generated_tokens
            total.total_s += stats.total_s
    return _from_stats(f"ours, one at a time ({env} env)", total)


def bench_trl(model, tokenizer, tasks, group_size, max_new_tokens, temperature) -> Result:
    """TRL ``GRPOTrainer``'s own generation of G completions per task (single turn)."""
    from helpers.config import get_preset
    from helpers.grpo import trl_trainer

    config = get_preset("tiny-cpu", tasks_per_step=len(tasks), num_generations=group_size, grad_accum=1, temperature=temperature)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = trl_trainer(model, tokenizer, config, [t.prompt for t in tasks], max_new_tokens, tmp)
    rows = [t.prompt for t in tasks for _ in range(group_size)]  # TRL repeats each prompt G times
    start = time.perf_counter()
    _, completion_ids, *_ = trainer._generate(rows)
    seconds = time.perf_counter() - start
    return Result("TRL GRPOTrainer._generate (1 turn)", len(rows), sum(len(c) for c in completion_ids), seconds)


def run(num_tasks: int = 8, group_size: int = 8, max_new_tokens: int = 48, naive_tasks: int | None = None,
        trl: bool = True, threads: int = 1, seed: int = 0, verbose: bool = True) -> dict:
    """Run the benchmark; return the results and the ratios (and print them when ``verbose``)."""
    torch.set_num_threads(threads)
    model, tokenizer = load_tiny()
    model = model.float().eval()
    policy = HFPolicy(model, tokenizer)
    tasks = make_tiny_tasks(num_tasks, seed=seed, split="test")
    naive = tasks[: naive_tasks or num_tasks]
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=seed)
    limits = dict(max_steps=4, max_total_tokens=256)
    policy.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))  # warm-up (first-call overhead)

    say = print if verbose else (lambda *a, **k: None)
    say(f"tiny model, {threads} torch threads, {num_tasks} tasks x G={group_size}, max_new_tokens={max_new_tokens}")
    batched, stats = bench_batched(policy, tasks, group_size, sampling, **limits)
    say(f"  multi-turn batched:        {batched.tokens:6d} tokens in {batched.seconds:6.2f} s")
    one = bench_one_at_a_time(policy, naive, group_size, sampling, **limits)
    say(f"  multi-turn one at a time:  {one.tokens:6d} tokens in {one.seconds:6.2f} s  ({len(naive)} tasks)")
    out = {"batched": batched, "one_at_a_time": one, "stats": stats,
           "speedup_vs_one_at_a_time": batched.tokens_per_s / one.tokens_per_s}

    if trl:
        single = replace(sampling, stop_token_ids=[tokenizer.eos_token_id])  # TRL stops on the eos only
        ours, _ = bench_batched(policy, tasks, group_size, single, env="math", max_steps=1, max_total_tokens=10_000)
        theirs = bench_trl(model, tokenizer, tasks, group_size, max_new_tokens, sampling.temperature)
        say(f"  single-turn ours:          {ours.tokens:6d} tokens in {ours.seconds:6.2f} s")
        say(f"  single-turn TRL:           {theirs.tokens:6d} tokens in {theirs.seconds:6.2f} s")
        out.update(single_turn_ours=ours, trl=theirs, speedup_vs_trl=ours.tokens_per_s / theirs.tokens_per_s)

    say("\n" + table(out))
    return out


def table(out: dict) -> str:
    """The results as a text table plus the ratios."""
    rows = [out["batched"], out["one_at_a_time"]] + ([out["single_turn_ours"], out["trl"]] if "trl" in out else [])
    lines = [f"{'':40s} {'tokens/s':>10s} {'episodes/s':>11s}"]
    lines += [f"{r.name:40s} {r.tokens_per_s:10.1f} {r.episodes_per_s:11.2f}" for r in rows]
    s = out["stats"]
    lines.append(f"batched time split: generate {s.generate_s:.2f} s, env {s.env_s:.2f} s, chat template {s.render_s:.2f} s, "
                 f"total {s.total_s:.2f} s")
    lines.append(f"RATIO batched / one-at-a-time (tokens/s): {out['speedup_vs_one_at_a_time']:.1f}x")
    if "trl" in out:
        lines.append(f"RATIO ours / TRL generation, single turn (tokens/s): {out['speedup_vs_trl']:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m helpers.bench rollout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=8, help="distinct tasks (default 8)")
    parser.add_argument("--group-size", type=int, default=8, help="G, samples per task (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="per assistant turn (default 48)")
    parser.add_argument("--naive-tasks", type=int, default=None, help="tasks for the one-at-a-time loop (default: all)")
    parser.add_argument("--no-trl", action="store_true", help="skip the TRL comparison")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, see the module docstring)")
    args = parser.parse_args(argv)
    run(args.tasks, args.group_size, args.max_new_tokens, args.naive_tasks, not args.no_trl, args.threads)


if __name__ == "__main__":
    main()
