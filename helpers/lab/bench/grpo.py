"""One GRPO step, ours vs TRL's ``GRPOTrainer``, interleaved step by step: ``python -m helpers.lab.bench grpo``.

Same tiny model, same LoRA (rank, alpha, target modules), same B tasks x G samples,
single turn, same generation length and temperature, same loss (dapo, beta = 0, one update
per batch), same optimizer settings, same torch threads. Two comparisons:

* **full step**: sample G completions per task, score them, compute the loss, backward, one
  optimizer step. Ours: ``helpers.rollout.rollout`` (``HFPolicy``, env "math") +
  ``LoRAGRPO.train_step``. TRL: one step of ``GRPOTrainer.train()``, timed from its
  ``on_step_begin`` callback to its ``on_step_end``: generation and scoring
  (``_generate_and_score_completions``), loss, backward, gradient clipping, optimizer and
  scheduler step, as ``train()`` runs them.
* **update only**: the *same* batch (the last one TRL sampled) fed to both trainers, step
  after step, so the comparison is not blurred by how many tokens each side happened to sample.
  TRL runs ``train()`` again with its generation replaced by that batch; ours runs ``update``.

**Interleaved, A B A B.** TRL's ``train()`` cannot be paused from outside, so our step runs
inside it: a ``TrainerCallback`` runs one of our steps (timed on its own) at each of TRL's
``on_step_end``, after TRL's step is timed and before its next one begins. The pairs run
back to back, so a change in the machine's load hits both sides of a pair alike. The first
pair is a warm-up and is dropped; each reported ratio, TRL's time / ours, is the median of
the ratios within each remaining pair, with their spread (min-max). Ratios > 1 mean ours is
faster. The load average is printed before and after.

Simplifications, named: rewards do not change the cost (no group is skipped), so TRL keeps a
placeholder reward while ours uses the env's; the tiny model often stops before
``max_new_tokens``, so the two sides' full steps sample different numbers of tokens (printed;
the update-only comparison feeds both the same batch). What
``train()`` does between steps, after ``on_step_end`` (its logging), is in neither side's
time; ours logs nothing there.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import os
import pstats
import statistics
import tempfile
import time

import torch
from transformers import PrinterCallback, TrainerCallback

from helpers.config import get_preset
from helpers.ecosystem.trl_bridge import trajectories_from_trl, trl_trainer
from helpers.grpo import LoRAGRPO, collate, group_advantages, group_rewards, lora_config
from helpers.policy.base import SamplingParams
from helpers.policy.hf import HFPolicy
from helpers.rollout import rollout
from helpers.worlds.arithmetic.tasks import make_tiny_tasks
from helpers.worlds.tinymodel import load_tiny


def _timed(fn, sink: list):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        sink.append(time.perf_counter() - start)
        return out

    return wrapper


def spread(xs: list[float]) -> tuple[float, float, float]:
    """``(median, min, max)`` after dropping the warm-up (the first value)."""
    kept = xs[1:] if len(xs) > 1 else xs
    return statistics.median(kept), min(kept), max(kept)


def interleaved(trainer, ours, order: list[str]) -> tuple[list[float], list]:
    """Run ``trainer.train()`` with ``ours()`` after each of its steps: A B A B ...

    Returns TRL's step times and what ``ours()`` returned at each step; ``order`` gets "trl" and
    "ours" appended as each one finishes.
    """
    trl_s, ours_out = [], []

    class Interleave(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            trl_s.append(time.perf_counter() - self.start)
            order.append("trl")
            ours_out.append(ours())
            order.append("ours")

    callback = Interleave()
    trainer.add_callback(callback)
    try:
        trainer.train()
    finally:
        trainer.remove_callback(callback)
    return trl_s, ours_out


def run(num_tasks: int = 8, group_size: int = 8, max_new_tokens: int = 32, steps: int = 6, threads: int = 1,
        seed: int = 0, verbose: bool = True, profile: bool = False) -> dict:
    """Time ``steps`` interleaved pairs of GRPO steps (the first pair is a warm-up); return medians, spreads and ratios.

    ``profile``: also print where one of our updates spends its time (cProfile, by function).
    """
    if steps < 2:
        raise ValueError(f"steps must be >= 2 (the first pair is a warm-up), got {steps}")
    torch.set_num_threads(threads)
    say = print if verbose else (lambda *a, **k: None)
    model, tokenizer = load_tiny()
    tasks = make_tiny_tasks(num_tasks, seed=seed, split="test")
    config = get_preset("tiny-cpu", tasks_per_step=num_tasks, num_generations=group_size, grad_accum=1,
                        max_new_tokens=max_new_tokens, temperature=1.0, beta=0.0, loss_type="dapo",
                        num_iterations=1, steps=steps, seed=seed, gradient_checkpointing=False,
                        skip_zero_spread=False)  # TRL trains on every group: so do we, for a like-for-like time
    load_before = os.getloadavg()[0]
    say(f"tiny model, {threads} torch thread(s), {num_tasks} tasks x G={group_size}, max_new_tokens={max_new_tokens}, "
        f"LoRA r={config.lora_r} on {len(config.lora_target_modules)} module types, {steps} interleaved pairs of steps "
        f"(first = warm-up); load average {load_before:.2f}")

    torch.manual_seed(seed)
    tmp = tempfile.TemporaryDirectory()
    trl = trl_trainer(copy.deepcopy(model), tokenizer, config, [t.prompt for t in tasks], max_new_tokens, tmp.name,
                      peft_config=lora_config(config))
    trl.remove_callback(PrinterCallback)  # no per-step log dicts on stdout
    ours = LoRAGRPO(copy.deepcopy(model), config)
    policy = HFPolicy(ours.model, tokenizer)
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, stop_token_ids=[tokenizer.eos_token_id])
    order: list[str] = []

    # --- full steps: TRL's train() step, then ours (rollout + train_step) ---------------------
    trl_sample, batches = [], []
    generate_and_score = trl._generate_and_score_completions

    def keep_batch(rows):
        out = generate_and_score(rows)
        batches.append(out)
        return out

    trl._generate_and_score_completions = _timed(keep_batch, trl_sample)

    def our_step() -> tuple[float, float, int]:
        """(step seconds, of which sampling, generated tokens)"""
        start = time.perf_counter()
        trajs = rollout(tasks, "math", policy, group_size=group_size, sampling=sampling, max_steps=1,
                        max_total_tokens=10_000, progress=False)
        sampled = time.perf_counter() - start
        ours.train_step(trajs)
        return time.perf_counter() - start, sampled, sum(sum(t.mask) for t in trajs)

    trl_steps, our_full = interleaved(trl, our_step, order)
    our_steps, our_sample, our_tokens = (list(column) for column in zip(*our_full))
    trl_tokens = int(batches[-1]["completion_mask"].sum())

    # --- update only, on the same batch: TRL's train() step without sampling, then ours.update ---
    fixed = batches[-1]
    draws = torch.randint(0, 2, (len(fixed["advantages"]),), generator=torch.Generator().manual_seed(seed))
    rewards = draws.float().tolist()
    same = trajectories_from_trl(fixed, tasks, rewards)
    batch = collate(same, group_advantages(group_rewards(same)))
    with torch.no_grad():  # on-policy old log-probs, as TRL uses when num_iterations == 1
        old = ours.logprobs(batch.input_ids, batch.mask)
    for n, t in enumerate(same):
        t.logprobs = old[n, : len(t.token_ids)].tolist()

    def our_update() -> float:
        start = time.perf_counter()
        ours.update(collate(same, group_advantages(group_rewards(same))))
        return time.perf_counter() - start

    trl._generate_and_score_completions = lambda rows: dict(fixed)  # TRL's step without sampling
    trl_update, our_update_s = interleaved(trl, our_update, order)  # train() starts a fresh run of `steps` steps
    tmp.cleanup()

    result = {
        "ours_step_s": spread(our_steps), "trl_step_s": spread(trl_steps),
        "ours_sample_s": spread(our_sample), "trl_sample_s": spread(trl_sample),
        "ours_update_s": spread(our_update_s), "trl_update_s": spread(trl_update),
        "ours_tokens": our_tokens[-1], "trl_tokens": trl_tokens, "order": order,
        "load_average": (load_before, os.getloadavg()[0]),
    }
    for name, trl_t, ours_t in (("step", trl_steps, our_steps), ("update", trl_update, our_update_s)):
        pairs = [t / o for t, o in zip(trl_t[1:], ours_t[1:])]  # within each pair, the warm-up pair dropped
        result[f"ratios_{name}"] = pairs
        result[f"ratio_{name}"] = statistics.median(pairs)
        result[f"ratio_{name}_range"] = (min(pairs), max(pairs))

    def row(label, key):
        (om, olo, ohi), (tm, tlo, thi) = result[f"ours_{key}"], result[f"trl_{key}"]
        return f"{label:28s} {om:6.2f} [{olo:.2f}-{ohi:.2f}] {tm:6.2f} [{tlo:.2f}-{thi:.2f}]"

    say(f"{'median [min-max] over ' + str(steps - 1) + ' steps':28s} {'ours':>17s} {'TRL':>17s}")
    say(row("full step (s)", "step_s"))
    say(row("  of which sampling (s)", "sample_s"))
    say(f"{'  generated tokens (last)':28s} {result['ours_tokens']:17d} {trl_tokens:17d}")
    say(row("update only, same batch (s)", "update_s"))
    for name, label in (("step", "full step"), ("update", "update only")):
        lo, hi = result[f"ratio_{name}_range"]
        say(f"RATIO TRL / ours, {label}: {result[f'ratio_{name}']:.2f}x (median of {steps - 1} interleaved pairs, "
            f"spread {lo:.2f}-{hi:.2f}; > 1: ours is faster)")
    say(f"(load average before {load_before:.2f}, after {result['load_average'][1]:.2f})")
    if profile:  # where our update's time goes, by function (cumulative seconds)
        profiler = cProfile.Profile()
        profiler.runcall(ours.update, collate(same, group_advantages(group_rewards(same))))
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(15)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m helpers.lab.bench grpo", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=6,
                        help="interleaved pairs of steps; the first is a warm-up, the median is over the rest "
                             "(default 6)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for the tiny model)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="print where our update spends its time")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first pair is a warm-up)")
    if args.threads < 1:
        parser.error("--threads must be >= 1")
    run(args.tasks, args.group_size, args.max_new_tokens, args.steps, args.threads, args.seed, profile=args.profile)


if __name__ == "__main__":
    main()
