"""The training loop: the design's seven steps as one function and one command.

    python -m helpers.train --preset tiny-cpu                  # the tiny world on a CPU, a few minutes
    python -m helpers.train --preset tiny-cpu --seed 1 --steps 20 --lr 1e-4
    python -m helpers.train --preset tiny-cpu --resume true    # continue a killed run from its last checkpoint

    from helpers.train import train
    result = train(get_preset("tiny-cpu"), preset_name="tiny-cpu")
    print(result.line())                                       # before -> after

One step of the loop, each arrow a call into the module that owns it:

    tasks  = sampler.next_batch()                       # 1. data      helpers.data.TaskSampler
    trajs  = rollout(tasks, env_factory, policy, G)     # 2-3. env + rollout: G episodes per task
    score_trajectories(trajs, reward)                   # 4. reward    helpers.rewards (+ reward_report)
    stats  = trainer.train_step(trajs)                  # 5. GRPO      helpers.grpo.LoRAGRPO
    if step % eval_every == 0: evaluate(policy, ...)    # 6. evaluate  helpers.evaluate (held-out, greedy)
    log, warn, checkpoint                               # 7. repeat

The run folder (``runs/<preset>-seed<seed>/`` by default) gets:

    config.json          the full config of the run
    metrics.jsonl        one line per step (step 0 = the evaluation before training)
    trajectories/        sampled training episodes every ``log_trajectories_every`` steps (JSONL)
    eval/                per-task evaluation records (and the greedy episodes) before, during and after
    curves.png           the live curves, saved at the end
    summary.json         before, after, wall-clock and CPU time
    checkpoint-<step>/   adapter + optimizer + RNG + data position (the last two are kept)

Health checks (``check_health``) watch the metrics for the classic failures and print a
warning (and count it in the metrics as ``warn/<kind>``): a KL spike, entropy collapse,
reward collapse, an all-zero-reward batch (no learning signal at all), and many
truncated episodes (a limit is cutting the agent off).

Resume: a checkpoint holds everything the next step depends on (adapter, optimizer,
scheduler, data position, metrics so far), and every step's sampling seed is a
function of ``(seed, step)``, so a run killed after a checkpoint and resumed gives the
same numbers as a run that was never killed (on CPU; GPU kernels may not be bit-exact).

Simplifications, named:
- One process, one device; rollout and update alternate (no asynchronous rollouts).
- ``kl`` is measured on the sampled batch *before* the update (policy at sampling time vs
  the reference), with one extra no-grad forward pass, counted in ``t_update``. With
  ``beta > 0`` the trainer's own KL (during the update) is logged instead.
- Evaluations between the first and the last are greedy only (pass@k costs k episodes per
  task, k times the greedy evaluation); pass@k is measured before and after.
- The evaluation tasks are fixed (the same for every seed) so seeds compare; they are a
  held-out split that training never samples from.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
import types
import typing
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from helpers.config import PRESETS, TrainConfig, get_preset
from helpers.paths import GSM8K_SAMPLE, ROOT

TRAJECTORY_DIR, EVAL_DIR = "trajectories", "eval"
KEEP_CHECKPOINTS = 2  # older checkpoint folders are deleted (a GSM8K adapter + optimizer is ~200 MB)

# --- health thresholds (check_health); each is a rule of thumb, named so the pitfalls notebook can cite it ---
KL_SPIKE_FACTOR = 5.0  # KL jumps to 5x its median over the previous steps...
KL_SPIKE_MIN = 0.1  # ...and is above 0.1 nats/token (small KLs wobble by large factors)
ENTROPY_FLOOR = 0.01  # nats/token: the policy samples (almost) one answer; exploration is over
REWARD_COLLAPSE_WINDOW = 3  # steps averaged when comparing the reward with its best so far
REWARD_COLLAPSE_FRACTION = 0.5  # reward window below half of its best window...
REWARD_COLLAPSE_MIN_BEST = 0.2  # ...after the run had reached at least this reward
TRUNCATION_LIMIT = 0.25  # more than a quarter of the episodes cut short by max_steps/max_tokens/timeout
HEALTH_KINDS = ("kl_spike", "entropy_collapse", "reward_collapse", "all_zero_reward", "truncation")


# ----------------------------------------------------------------------------------------------
# Building blocks: model, tasks, env factory (each one call into the module that owns it)
# ----------------------------------------------------------------------------------------------


def resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def load_model(config: TrainConfig):
    """``(model, tokenizer)`` from a local folder (relative to the repo root) or a hub id."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = ROOT / config.model
    source = str(local) if local.exists() else config.model
    model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, config.dtype))
    return model, AutoTokenizer.from_pretrained(source)


def load_tasks(config: TrainConfig) -> tuple[list, list]:
    """(training tasks, held-out evaluation tasks) for ``config.dataset``.

    tiny:          generated arithmetic; training tasks drawn with the run's seed from the
                   train split, evaluation tasks always the first ``eval_tasks`` of the test
                   split (seed 0), so every seed is measured on the same tasks
    gsm8k:         the hub's train and test splits
    gsm8k-sample:  data/gsm8k_sample.jsonl, split 80/20 by task id (plumbing only: ~50 problems)
    """
    from helpers.data import load_gsm8k, train_val_split

    if config.dataset == "tiny":
        from helpers.tiny import make_tiny_tasks

        train = make_tiny_tasks(config.max_train_tasks or 2000, seed=config.seed, split="train")
        return train, make_tiny_tasks(config.eval_tasks, seed=0, split="test")
    if config.dataset == "gsm8k":
        return (load_gsm8k("train", "hub", max_samples=config.max_train_tasks),
                load_gsm8k("test", "hub", max_samples=config.eval_tasks))
    if config.dataset == "gsm8k-sample":
        train, held_out = train_val_split(load_gsm8k("sample", GSM8K_SAMPLE), val_fraction=0.2, seed=0)
        return train[: config.max_train_tasks], held_out[: config.eval_tasks]
    raise ValueError(f"unknown dataset {config.dataset!r}; choose tiny, gsm8k or gsm8k-sample")


def env_factory(config: TrainConfig):
    """A function making one fresh env per episode, from the registry name in the config."""
    from helpers.envs import make_env

    make_env(config.env, max_steps=config.env_max_steps)  # fail now, with the registry's message, if the name is wrong
    return lambda: make_env(config.env, max_steps=config.env_max_steps)


def make_policy(config: TrainConfig, model, tokenizer):
    """The rollout backend: transformers on the trainer's own model, or vLLM (GPU)."""
    if config.backend == "hf":
        from helpers.policy import HFPolicy

        return HFPolicy(model, tokenizer)
    if config.backend == "vllm":
        from helpers.policy.vllm import VLLMPolicy

        policy = VLLMPolicy.from_config(config, tokenizer)
        policy.load_adapter(model)  # the freshly initialised adapter (B = 0: the base model's outputs)
        return policy
    raise ValueError(f"unknown backend {config.backend!r}; choose hf or vllm")


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def step_seed(seed: int, step: int) -> int:
    """The sampling seed of one step: a function of (run seed, step) only, so a resumed run
    samples exactly what the uninterrupted run sampled at that step."""
    return seed * 1_000_003 + step


# ----------------------------------------------------------------------------------------------
# Metrics and health checks
# ----------------------------------------------------------------------------------------------


def rollout_metrics(trajs, report) -> dict[str, float]:
    """What the sampled batch looked like: reward, success, tool use, lengths, truncation, signal."""
    from helpers.evaluate import TRUNCATED
    from helpers.rewards import count_tool_calls, outcome

    n = len(trajs)
    metrics = {
        "reward": sum(t.reward for t in trajs) / n,
        "success": sum(bool(outcome(t).get("correct")) for t in trajs) / n,
        "tool_use": sum(count_tool_calls(t) > 0 for t in trajs) / n,
        "completion_len": sum(t.num_generated for t in trajs) / n,
        "turns": sum(t.turns for t in trajs) / n,
        "truncated": sum(t.stop_reason in TRUNCATED for t in trajs) / n,
        "flat_groups": report.flat_fraction,  # groups with all-equal rewards: zero advantage, no signal
        "all_zero_reward": float(report.all_zero),
        "reward_errors": float(len(report.errors)),
    }
    for name, values in report.parts.items():
        metrics[f"reward/{name}"] = sum(values) / len(values)
    return metrics


def sampled_kl(trainer, trajs) -> float:
    """Mean k3 KL(sampling policy || reference) per generated token, from one no-grad forward
    of the reference (the adapter switched off) over the sampled batch."""
    import torch

    from helpers.grpo import collate

    batch = collate(trajs)
    mask = batch.mask.to(trainer.device)
    with torch.no_grad():
        ref = trainer.logprobs(batch.input_ids.to(trainer.device), mask, reference=True)  # (N, T)
    delta = ref - batch.old_logps.to(trainer.device)  # (N, T) log pi_ref - log pi_old
    kl = (torch.exp(delta) - delta - 1).clamp(min=0)  # (N, T) k3 estimator, >= 0 (clamp: float rounding near 0)
    return ((kl * mask).sum() / mask.sum().clamp(min=1)).item()


def check_health(history: list[dict]) -> list[tuple[str, str]]:
    """Warnings for the newest entry of ``history`` (a list of step metrics), as (kind, message).

    A pure function of the history, so a resumed run re-derives the same warnings.
    """
    now, past = history[-1], [m for m in history[:-1] if "reward" in m]
    found = []
    kl, past_kl = now.get("kl"), sorted(m["kl"] for m in past[-10:] if m.get("kl") is not None)
    if kl is not None and past_kl:
        median = past_kl[len(past_kl) // 2]
        if kl > KL_SPIKE_MIN and kl > KL_SPIKE_FACTOR * max(median, 1e-6):
            found.append(("kl_spike", f"KL spike: {kl:.3f} vs median {median:.3f} over the last steps (learning rate too high?)"))
    entropy = now.get("entropy")
    if entropy is not None and entropy < ENTROPY_FLOOR:
        found.append(("entropy_collapse", f"entropy collapse: {entropy:.4f} nats/token, the policy has stopped exploring"))
    rewards = [m["reward"] for m in past] + [now["reward"]]
    w = REWARD_COLLAPSE_WINDOW
    if len(rewards) >= 2 * w:
        windows = [sum(rewards[i : i + w]) / w for i in range(len(rewards) - w + 1)]
        best, last = max(windows[:-1]), windows[-1]
        if best >= REWARD_COLLAPSE_MIN_BEST and last < REWARD_COLLAPSE_FRACTION * best:
            found.append(("reward_collapse", f"reward collapse: last {w} steps average {last:.3f}, best was {best:.3f}"))
    if now.get("all_zero_reward"):
        found.append(("all_zero_reward", "every reward in the batch is 0: no learning signal (see reward_report for why)"))
    if now.get("truncated", 0) > TRUNCATION_LIMIT:
        found.append(("truncation", f"{now['truncated']:.0%} of episodes were cut short (max_steps/max_tokens/timeout)"))
    return found


# ----------------------------------------------------------------------------------------------
# The run folder
# ----------------------------------------------------------------------------------------------


def run_dir_for(config: TrainConfig, preset_name: str | None) -> Path:
    path = Path(config.out_dir.format(preset=preset_name or "custom", seed=config.seed))
    return path if path.is_absolute() else ROOT / path


def clear_run_dir(run_dir: Path) -> None:
    """A fresh (non-resumed) run replaces what an earlier run wrote in the same folder."""
    for name in ["metrics.jsonl", "summary.json", "curves.png", "config.json"]:
        (run_dir / name).unlink(missing_ok=True)
    for folder in [run_dir / TRAJECTORY_DIR, run_dir / EVAL_DIR, *run_dir.glob("checkpoint-*")]:
        shutil.rmtree(folder, ignore_errors=True)


def write_jsonl(path: Path, rows: list[dict], mode: str = "a") -> None:
    with path.open(mode) as f:
        for row in rows:
            f.write(json.dumps(row, default=str) + "\n")


def save_checkpoint(trainer, run_dir: Path, step: int, extra_state: dict) -> None:
    trainer.save_checkpoint(run_dir / f"checkpoint-{step}", extra_state=extra_state)
    done = sorted(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    for old in done[:-KEEP_CHECKPOINTS]:
        shutil.rmtree(old, ignore_errors=True)


class Reporters:
    """Optional TensorBoard / trackio logging, used only when asked for and installed."""

    def __init__(self, names: list[str], run_dir: Path, config: TrainConfig):
        self.tb = self.trackio = None
        for name in names:
            try:
                if name == "tensorboard":
                    from torch.utils.tensorboard import SummaryWriter

                    self.tb = SummaryWriter(str(run_dir / "tensorboard"))
                elif name == "trackio":
                    import trackio

                    trackio.init(project="agentic-rl-workbook", name=run_dir.name, config=asdict(config))
                    self.trackio = trackio
                else:
                    raise ValueError(f"unknown reporter {name!r}; choose tensorboard or trackio")
            except ImportError:
                print(f"report_to: {name} is not installed, skipping it (pip install {name})")

    def log(self, metrics: dict) -> None:
        numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and k != "step"}
        if self.tb is not None:
            for key, value in numbers.items():
                self.tb.add_scalar(key, value, metrics["step"])
        if self.trackio is not None:
            self.trackio.log(numbers, step=metrics["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.trackio is not None:
            self.trackio.finish()


# ----------------------------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    run_dir: Path
    config: TrainConfig
    before: dict  # held-out evaluation before training (step 0)
    after: dict  # held-out evaluation after the last step
    history: list[dict]  # metrics of every step (step 0: the evaluation before training)
    warnings: list[str] = field(default_factory=list)  # health warnings, "step N: message"
    wall_s: float = 0.0  # wall-clock seconds of this call (a resumed run: since the resume)
    cpu_s: float = 0.0  # CPU seconds of this process, all threads (on a shared machine, wall time lies)

    def line(self) -> str:
        """The before -> after line every run ends with."""
        b, a = self.before, self.after
        text = (f"before -> after (held-out, n={a.get('n')}): greedy success {b['success']:.3f} -> {a['success']:.3f} | "
                f"tool use {b['tool_use']:.2f} -> {a['tool_use']:.2f} | mean turns {b['mean_turns']:.2f} -> {a['mean_turns']:.2f}")
        for key in a:
            if key.startswith("pass@") and key in b:
                text += f" | {key} {b[key]:.3f} -> {a[key]:.3f}"
        return text + f" | {self.wall_s:.0f} s wall, {self.cpu_s:.0f} s CPU"


def train(config: TrainConfig, preset_name: str | None = None, live=None) -> RunResult:
    """Run GRPO as ``config`` says; return before/after evaluation, the metric history and the run folder.

    live: a ``helpers.live.LiveCurves`` (or anything with ``update(step, metrics)``, ``record(step,
          metrics)`` and ``save(path)``); None makes one that picks notebook curves or console lines.
    """
    import torch

    from helpers.data import TaskSampler
    from helpers.evaluate import evaluate, save_records
    from helpers.grpo import LoRAGRPO, latest_checkpoint
    from helpers.live import LiveCurves
    from helpers.policy import SamplingParams
    from helpers.rewards import combine, reward_report, score_trajectories
    from helpers.rollout import rollout, save_trajectories

    t_start, cpu_start = time.perf_counter(), time.process_time()
    config = replace(config, device=resolve_device(config.device))  # a copy: the caller's config is not changed
    run_dir = run_dir_for(config, preset_name)
    checkpoint = latest_checkpoint(run_dir) if config.resume and run_dir.exists() else None
    if config.resume and checkpoint is None:
        print(f"resume: no checkpoint in {run_dir}, starting from scratch")
    if checkpoint is None:
        clear_run_dir(run_dir)
    (run_dir / TRAJECTORY_DIR).mkdir(parents=True, exist_ok=True)
    (run_dir / EVAL_DIR).mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps({"preset": preset_name, **asdict(config)}, indent=2))
    seed_everything(config.seed)

    # Data, environment, reward, model + LoRA trainer, rollout policy.
    train_tasks, eval_tasks = load_tasks(config)
    sampler = TaskSampler(train_tasks, config.tasks_per_step, seed=config.seed)
    make_env = env_factory(config)
    reward = combine(config.rewards)
    model, tokenizer = load_model(config)
    trainer = LoRAGRPO(model, config, skip_zero_spread=config.skip_zero_spread)
    policy = make_policy(config, trainer.model, tokenizer)
    limits = dict(max_steps=config.env_max_steps, max_total_tokens=config.max_total_tokens)
    live = live if live is not None else LiveCurves(run_dir, total_steps=config.steps)
    reporters = Reporters(config.report_to, run_dir, config)

    def run_eval(step: int) -> dict:
        k = config.pass_k if step in (0, config.steps) else 0  # pass@k (k samples per task) only before and after
        result = evaluate(policy, eval_tasks, make_env, k=k, temperature=config.temperature,
                          max_new_tokens=config.max_new_tokens, seed=config.seed, **limits)
        save_records(run_dir / EVAL_DIR / f"step-{step:04d}.jsonl", result.records)
        save_trajectories(run_dir / EVAL_DIR / f"step-{step:04d}.trajectories.jsonl", result.trajectories)
        return result.metrics

    def log(metrics: dict) -> None:
        history.append(metrics)
        write_jsonl(run_dir / "metrics.jsonl", [metrics])
        reporters.log(metrics)
        live.update(metrics["step"], metrics)

    history: list[dict] = []
    warned: list[str] = []
    if checkpoint is not None:  # continue a killed run exactly where its last checkpoint left it
        extra = trainer.load_checkpoint(checkpoint)
        sampler.load_state_dict(extra["sampler"])
        history, warned = extra["history"], extra["warnings"]
        write_jsonl(run_dir / "metrics.jsonl", history, mode="w")  # drop lines of steps after the checkpoint
        for metrics in history:
            live.record(metrics["step"], metrics)
        print(f"resumed from {checkpoint.relative_to(run_dir.parent)} at step {trainer.step}")
    else:
        t0 = time.perf_counter()
        log({"step": 0, **{f"eval/{k}": v for k, v in run_eval(0).items()}, "t_eval": time.perf_counter() - t0})
    before = {k[len("eval/"):]: v for k, v in history[0].items() if k.startswith("eval/")}

    for step in range(trainer.step + 1, config.steps + 1):
        seed_everything(step_seed(config.seed, step))
        t0 = time.perf_counter()
        tasks = sampler.next_batch()
        sampling = SamplingParams(config.max_new_tokens, config.temperature, config.top_p, seed=step_seed(config.seed, step))
        trajs = rollout(tasks, make_env, policy, group_size=config.num_generations, sampling=sampling, progress=False, **limits)
        t1 = time.perf_counter()
        score_trajectories(trajs, reward)
        report = reward_report(trajs)
        t2 = time.perf_counter()
        if config.backend == "vllm":
            policy.sleep()  # free the card for the update
        stats = trainer.train_step(trajs)
        if "kl" not in stats and config.log_kl:
            stats["kl"] = sampled_kl(trainer, trajs)
        if config.backend == "vllm":
            policy.load_adapter(trainer.model)
        t3 = time.perf_counter()

        metrics = {"step": step, **rollout_metrics(trajs, report),
                   "kl": stats.get("kl"), "entropy": stats.get("entropy"), "clip_frac": stats.get("clip_region"),
                   "loss": stats.get("loss"), "grad_norm": stats.get("grad_norm"), "lr": stats.get("lr"),
                   "skipped_steps": stats["skipped_steps"], "tokens_per_s": trajs.stats.tokens_per_s,
                   "t_rollout": t1 - t0, "t_reward": t2 - t1, "t_update": t3 - t2}
        if config.log_trajectories_every > 0 and step % config.log_trajectories_every == 0:
            save_trajectories(run_dir / TRAJECTORY_DIR / f"step-{step:04d}.jsonl", trajs)
        if step == config.steps or (config.eval_every > 0 and step % config.eval_every == 0):
            t4 = time.perf_counter()
            metrics.update({f"eval/{k}": v for k, v in run_eval(step).items()})
            metrics["t_eval"] = time.perf_counter() - t4
        last_counts = history[-1] if history else {}
        for kind in HEALTH_KINDS:
            metrics[f"warn/{kind}"] = last_counts.get(f"warn/{kind}", 0)
        for kind, message in check_health(history + [metrics]):
            metrics[f"warn/{kind}"] += 1
            warned.append(f"step {step}: {message}")
            print(f"WARNING step {step}: {message}", flush=True)
        log(metrics)
        if (config.save_every > 0 and step % config.save_every == 0) or step == config.steps:
            save_checkpoint(trainer, run_dir, step, {"sampler": sampler.state_dict(), "history": history, "warnings": warned})

    after = {k[len("eval/"):]: v for k, v in history[-1].items() if k.startswith("eval/")}
    result = RunResult(run_dir, config, before, after, history, warned,
                       time.perf_counter() - t_start, time.process_time() - cpu_start)
    live.save(run_dir / "curves.png")  # in the run folder, whatever folder the live object was made with
    reporters.close()
    (run_dir / "summary.json").write_text(json.dumps(
        {"preset": preset_name, "before": before, "after": after, "wall_s": result.wall_s, "cpu_s": result.cpu_s,
         "warnings": warned, "torch_threads": torch.get_num_threads()}, indent=2, default=str))
    print(result.line(), flush=True)
    return result


# ----------------------------------------------------------------------------------------------
# Command line: one flag per TrainConfig field, typed from the dataclass
# ----------------------------------------------------------------------------------------------


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _parser_for(annotation):
    """A string -> value function for one field type: int, float, str, bool, X | None,
    list[str] ("a,b,c") and dict[str, float] ("correct=1.0,format=0.1")."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        inner = _parser_for(next(a for a in args if a is not type(None)))
        return lambda text: None if text.lower() == "none" else inner(text)
    if origin is list:
        return lambda text: [] if text == "" else [_parser_for(args[0])(item) for item in text.split(",")]
    if origin is dict:
        def parse_dict(text: str) -> dict:
            try:
                return {key.strip(): _parser_for(args[1])(value) for key, value in (item.split("=") for item in text.split(","))}
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected name=value,name=value, got {text!r}") from None
        return parse_dict
    if annotation is bool:
        return _parse_bool
    return annotation  # int, float, str


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m helpers.train", description="GRPO training of an LLM agent (the workbook's loop).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--preset", default="tiny-cpu", choices=sorted(PRESETS), help="starting config; flags below override it")
    hints = typing.get_type_hints(TrainConfig)
    for f in fields(TrainConfig):
        parser.add_argument(f"--{f.name.replace('_', '-')}", f"--{f.name}", dest=f.name, type=_parser_for(hints[f.name]),
                            default=argparse.SUPPRESS, metavar=getattr(hints[f.name], "__name__", "VALUE").upper(),
                            help=f"({hints[f.name]})" if not isinstance(hints[f.name], type) else None)
    return parser


def main(argv: list[str] | None = None) -> RunResult:
    args = vars(build_parser().parse_args(argv))
    preset = args.pop("preset")
    config = get_preset(preset, **args)
    print(f"preset {preset}" + (f" with {args}" if args else ""), flush=True)
    return train(config, preset_name=preset)


if __name__ == "__main__":
    main()
