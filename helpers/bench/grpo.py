"""One GRPO step, ours vs TRL's ``GRPOTrainer``, side by side: ``python -m helpers.bench grpo``.

Same tiny model, same LoRA (rank, alpha, target modules), same B tasks x G samples,
single turn, same generation length and temperature, same loss (dapo, beta = 0), same
optimizer settings, same torch threads. Two comparisons, each timed over the same
number of steps after one warm-up step:

* **full step**: sample G completions per task, score them, one optimizer step.
  Ours: ``helpers.rollout.rollout`` (``HFPolicy``, env "math") + ``LoRAGRPO.train_step``.
  TRL: ``GRPOTrainer.train()`` (its ``_generate_and_score_completions`` + training step).
* **update only**: the *same* batch (the last one TRL sampled) fed to both trainers,
  so the comparison is not blurred by how many tokens each side happened to sample.

Rewards do not change the cost (no group is skipped), so TRL keeps a placeholder
reward while ours uses the env's; the tiny model is untrained and rarely stops early,
so both sides generate close to ``max_new_tokens`` per completion (printed).
Ratios > 1 mean ours is faster.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time

import torch


def _timed(fn, sink: list):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        sink.append(time.perf_counter() - start)
        return out

    return wrapper


def run(num_tasks: int = 8, group_size: int = 8, max_new_tokens: int = 32, steps: int = 6, threads: int = 1,
        seed: int = 0, verbose: bool = True, profile: bool = False) -> dict:
    """Time ``steps`` GRPO steps of each trainer (the first is a warm-up); return medians, spreads and ratios.

    ``profile``: also print where one of our updates spends its time (cProfile, by function).
    """
    from transformers import PrinterCallback, TrainerCallback

    from helpers.config import get_preset
    from helpers.grpo import (
        LoRAGRPO,
        collate,
        group_advantages,
        group_rewards,
        lora_config,
    )
    from helpers.policy.base import SamplingParams
    from helpers.policy.hf import HFPolicy
    from helpers.rollout import rollout
    from helpers.trl_compat import trajectories_from_trl, trl_trainer
    from helpers.worlds.arithmetic.tasks import make_tiny_tasks
    from helpers.worlds.tinymodel import load_tiny

    torch.set_num_threads(threads)
    say = print if verbose else (lambda *a, **k: None)
    model, tokenizer = load_tiny()
    tasks = make_tiny_tasks(num_tasks, seed=seed, split="test")
    config = get_preset("tiny-cpu", tasks_per_step=num_tasks, num_generations=group_size, grad_accum=1,
                        max_new_tokens=max_new_tokens, temperature=1.0, beta=0.0, loss_type="dapo",
                        steps=steps, seed=seed, gradient_checkpointing=False,
                        skip_zero_spread=False)  # TRL trains on every group: so do we, for a like-for-like time
    say(f"tiny model, {threads} torch thread(s), {num_tasks} tasks x G={group_size}, max_new_tokens={max_new_tokens}, "
        f"LoRA r={config.lora_r} on {len(config.lora_target_modules)} module types, {steps} steps (first = warm-up)")

    # --- TRL: full steps through GRPOTrainer.train() -----------------------------------------
    torch.manual_seed(seed)
    tmp = tempfile.TemporaryDirectory()
    trl = trl_trainer(copy.deepcopy(model), tokenizer, config, [t.prompt for t in tasks], max_new_tokens, tmp.name,
                      peft_config=lora_config(config))
    trl.remove_callback(PrinterCallback)  # no per-step log dicts on stdout
    trl_steps, trl_sample, batches = [], [], []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            trl_steps.append(time.perf_counter() - self.start)

    trl.add_callback(StepTimer())
    generate_and_score = trl._generate_and_score_completions

    def keep_batch(rows):
        out = generate_and_score(rows)
        batches.append(out)
        return out

    trl._generate_and_score_completions = _timed(keep_batch, trl_sample)
    trl.train()
    trl_tokens = int(batches[-1]["completion_mask"].sum())

    # --- ours: full steps: rollout + train_step -----------------------------------------------
    torch.manual_seed(seed)
    ours = LoRAGRPO(copy.deepcopy(model), config)
    policy = HFPolicy(ours.model, tokenizer)
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, stop_token_ids=[tokenizer.eos_token_id])
    our_steps, our_sample, our_tokens = [], [], 0
    for step in range(steps):
        start = time.perf_counter()
        trajs = rollout(tasks, "math", policy, group_size=group_size, sampling=sampling, max_steps=1,
                        max_total_tokens=10_000, progress=False)
        our_sample.append(time.perf_counter() - start)
        ours.train_step(trajs)
        our_steps.append(time.perf_counter() - start)
        our_tokens = sum(sum(t.mask) for t in trajs)

    # --- update only, on the same batch -------------------------------------------------------
    fixed = batches[-1]
    rewards = torch.randint(0, 2, (len(fixed["advantages"]),), generator=torch.Generator().manual_seed(seed)).float().tolist()
    same = trajectories_from_trl(fixed, tasks, rewards)
    batch = collate(same, group_advantages(group_rewards(same)))
    with torch.no_grad():  # on-policy old log-probs, as TRL uses when num_iterations == 1
        old = ours.logprobs(batch.input_ids, batch.mask)
    for n, t in enumerate(same):
        t.logprobs = old[n, : len(t.token_ids)].tolist()
    our_update = []
    for _ in range(steps):
        start = time.perf_counter()
        ours.update(collate(same, group_advantages(group_rewards(same))))
        our_update.append(time.perf_counter() - start)
    trl._generate_and_score_completions = lambda rows: dict(fixed)  # TRL's step without sampling
    trl.args.max_steps = steps  # train() starts a fresh run of `steps` steps
    trl_steps_before = len(trl_steps)
    trl.train()
    trl_update = trl_steps[trl_steps_before:]
    tmp.cleanup()

    def spread(xs):  # (median, min, max) after dropping the warm-up step
        kept = xs[1:] if len(xs) > 1 else xs
        return statistics.median(kept), min(kept), max(kept)

    result = {
        "ours_step_s": spread(our_steps), "trl_step_s": spread(trl_steps[:trl_steps_before]),
        "ours_sample_s": spread(our_sample), "trl_sample_s": spread(trl_sample[:trl_steps_before]),
        "ours_update_s": spread(our_update), "trl_update_s": spread(trl_update),
        "ours_tokens": our_tokens, "trl_tokens": trl_tokens,
    }
    # ratios of the medians, and their range over pairing every kept step with every other
    for name in ("step", "update"):
        ours_t = (our_steps if name == "step" else our_update)[1:]
        trl_t = (trl_steps[:trl_steps_before] if name == "step" else trl_update)[1:]
        ratios = [t / o for t in trl_t for o in ours_t]
        result[f"ratio_{name}"] = result[f"trl_{name}_s"][0] / result[f"ours_{name}_s"][0]
        result[f"ratio_{name}_range"] = (min(ratios), max(ratios))

    def row(label, key):
        (om, olo, ohi), (tm, tlo, thi) = result[f"ours_{key}"], result[f"trl_{key}"]
        return f"{label:28s} {om:6.2f} [{olo:.2f}-{ohi:.2f}] {tm:6.2f} [{tlo:.2f}-{thi:.2f}]"

    say(f"{'median [min-max] over ' + str(steps - 1) + ' steps':28s} {'ours':>17s} {'TRL':>17s}")
    say(row("full step (s)", "step_s"))
    say(row("  of which sampling (s)", "sample_s"))
    say(f"{'  generated tokens (last)':28s} {our_tokens:17d} {trl_tokens:17d}")
    say(row("update only, same batch (s)", "update_s"))
    for name, label in (("step", "full step"), ("update", "update only")):
        lo, hi = result[f"ratio_{name}_range"]
        say(f"RATIO TRL / ours, {label}: {result[f'ratio_{name}']:.2f}x median (pairwise range {lo:.2f}-{hi:.2f}; > 1: ours is faster)")
    if profile:  # where our update's time goes, by function (cumulative seconds)
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.runcall(ours.update, collate(same, group_advantages(group_rewards(same))))
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(15)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m helpers.bench grpo", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=6, help="steps per contender; the first is a warm-up, the median is over the rest")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for the tiny model)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="print where our update spends its time")
    args = parser.parse_args(argv)
    run(args.tasks, args.group_size, args.max_new_tokens, args.steps, args.threads, args.seed, profile=args.profile)


if __name__ == "__main__":
    main()
