"""The training loop: one function and one command.

    python -m helpers.train --preset tiny-cpu                  # the tiny world on a CPU, a few minutes
    python -m helpers.train --preset tiny-cpu --seed 1 --steps 20 --lr 1e-4
    python -m helpers.train --preset tiny-cpu --resume true    # continue a killed run from its last checkpoint

    from helpers.train import train
    result = train(get_preset("tiny-cpu"), preset_name="tiny-cpu")
    print(result.line())                                       # before -> after

One step of the loop, each arrow of the pipeline one line (see ``train`` below):

    tasks = sampler.next_batch()                                         # Dataset   B tasks
    trajs = rollout(tasks, make_env, policy, group_size=G, ...)          # Env + Rollout: B*G episodes
    rewards = score_trajectories(trajs, reward)                          # Reward    one number per episode
    advantages = group_advantages(group_rewards(trajs), scale_rewards)   # GRPO      A = (r - mean) / std, (B, G)
    stats = trainer.update(collate(trajs, advantages, ...))              # GRPO      the clipped-ratio update
    policy.sync(trainer.model)                                           # the sampler takes the new adapter

The run folder (``runs/<preset>-seed<seed>/`` by default) gets:

    config.json          the full config of the run
    metrics.jsonl        one line per step (step 0 = the evaluation before training), TRL's metric names
    trajectories/        sampled training episodes every ``log_trajectories_every`` steps (JSONL)
    eval/                per-task evaluation records (and the greedy episodes) before, during and after
    curves.png           the live curves, saved at the end
    summary.json         before, after, wall-clock and CPU time
    checkpoint-<step>/   adapter + optimizer + RNG + data position (the last two are kept; written atomically)

Health checks (``helpers.pitfalls.check_health``) watch the metrics for the classic failures
and print a warning (counted in the metrics as ``warn/<kind>``).

Resume: a checkpoint holds everything the next step depends on (adapter, optimizer,
scheduler, data position, metrics so far), and every step's sampling seed is a
function of ``(seed, step)``, so a run killed after a checkpoint and resumed gives the
same numbers as a run that was never killed (on CPU; GPU kernels may not be bit-exact).

Simplifications, named:
- One process, one device; rollout and update alternate (no asynchronous rollouts).
- ``kl`` is measured on the sampled batch *before* the update (policy at sampling time vs
  the reference), with one extra no-grad forward pass, counted in ``t_update``. With
  ``beta > 0`` the trainer's own KL (during the update) is logged instead.
- Evaluations between the first and the last sample one episode per task (``eval/pass@1``,
  the sampled success rate) besides the greedy one; pass@k costs k episodes per task, so it
  is measured before and after only. ``pass_k = 0`` turns sampled evaluation off.
- The evaluation tasks are fixed (the test split drawn with seed 0, the same for every
  run seed) so seeds compare; training never samples from the test split.

Taught in notebooks/06_training_loop.ipynb.
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

from helpers.config import DEFAULT_PRESET, PRESETS, TrainConfig, get_preset
from helpers.paths import ROOT

TRAJECTORY_DIR, EVAL_DIR = "trajectories", "eval"
KEEP_CHECKPOINTS = 2  # older checkpoint folders are deleted (a GSM8K adapter + optimizer is ~200 MB)
EVAL_SEED = 0  # the held-out tasks: the test split drawn with this seed, whatever the run's seed


def env_factory(config: TrainConfig):
    """A function making one fresh env per episode: the registry name and options in the config."""
    from helpers.envs import make_env

    make_env(config.env, max_steps=config.env_max_steps, **config.env_kwargs)  # fail now, with the registry's message
    return lambda: make_env(config.env, max_steps=config.env_max_steps, **config.env_kwargs)


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


def save_checkpoint(trainer, run_dir: Path, step: int, extra_state: dict) -> None:
    """Save this step's checkpoint (atomically), then delete all but the newest ``KEEP_CHECKPOINTS``
    (and any ``.tmp-`` folder a killed save left behind)."""
    from helpers.grpo import CHECKPOINT_NAME

    trainer.save_checkpoint(run_dir / f"checkpoint-{step}", extra_state=extra_state)
    folders = list(run_dir.glob("checkpoint-*"))
    done = sorted((p for p in folders if CHECKPOINT_NAME.fullmatch(p.name)), key=lambda p: int(p.name.split("-")[-1]))
    for old in done[:-KEEP_CHECKPOINTS] + [p for p in folders if not CHECKPOINT_NAME.fullmatch(p.name)]:
        shutil.rmtree(old, ignore_errors=True)


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
                f"tool calls {b['tool_calls']:.2f} -> {a['tool_calls']:.2f} | turns {b['turns']:.2f} -> {a['turns']:.2f}")
        for key in a:
            if key.startswith("pass@") and key in b:
                text += f" | {key} {b[key]:.3f} -> {a[key]:.3f}"
        return text + f" | {self.wall_s:.0f} s wall, {self.cpu_s:.0f} s CPU"


def train(config: TrainConfig, preset_name: str | None = None, live=None) -> RunResult:
    """Run GRPO as ``config`` says; return before/after evaluation, the metric history and the run folder.

    live: a ``helpers.live.LiveCurves`` (or anything with ``update(step, metrics)``, ``record(step,
          metrics)`` and ``save(path)``); None makes one that picks notebook curves or console lines.

    Taught in notebooks/06_training_loop.ipynb §2.
    """
    if getattr(config, "loop", "grpo") == "selfplay":  # the same parts, another loop (notebooks/09_self_play.ipynb)
        from helpers.selfplay import train_selfplay

        return train_selfplay(config, preset_name, live)
    import torch

    from helpers.data import TaskSampler, load_dataset, write_jsonl
    from helpers.evaluate import episode_stats, evaluate, save_records
    from helpers.grpo import LoRAGRPO, collate, group_advantages, group_rewards, latest_checkpoint
    from helpers.live import LiveCurves, Reporters
    from helpers.pitfalls import HEALTH_KINDS, check_health
    from helpers.policy import SamplingParams, load_model, make_policy, resolve_device
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
    train_tasks = load_dataset(config.dataset, "train", config.max_train_tasks, seed=config.seed)
    eval_tasks = load_dataset(config.dataset, "test", config.eval_tasks, seed=EVAL_SEED)
    sampler = TaskSampler(train_tasks, config.tasks_per_step, seed=config.seed)
    make_env = env_factory(config)
    reward = combine(config.rewards)
    model, tokenizer = load_model(config)
    trainer = LoRAGRPO(model, config)
    policy = make_policy(config, trainer.model, tokenizer)
    limits = dict(max_steps=config.env_max_steps, max_total_tokens=config.max_total_tokens)
    live = live if live is not None else LiveCurves(run_dir, total_steps=config.steps)
    reporters = Reporters(config.report_to, run_dir, config)

    def run_eval(step: int) -> dict:
        # Every evaluation: greedy, plus sampled episodes for the sampled success rate (pass@1): k per
        # task before and after (pass@k too), one per task in between (the curve, at a k-th of the cost).
        k = config.pass_k if step in (0, config.steps) else min(config.pass_k, 1)
        result = evaluate(policy, eval_tasks, make_env, k=k, temperature=config.temperature,
                          max_new_tokens=config.max_new_tokens, seed=config.seed, **limits)
        save_records(run_dir / EVAL_DIR / f"step-{step:04d}.jsonl", result.records)
        save_trajectories(run_dir / EVAL_DIR / f"step-{step:04d}.trajectories.jsonl", result.trajectories)
        return {f"eval/{key}": value for key, value in result.metrics.items()}

    def log(metrics: dict) -> None:
        history.append(metrics)
        write_jsonl(run_dir / "metrics.jsonl", [metrics], mode="a")
        reporters.log(metrics)
        live.update(metrics["step"], metrics)

    history: list[dict] = []
    warned: list[str] = []
    if checkpoint is not None:  # continue a killed run exactly where its last checkpoint left it
        extra = trainer.load_checkpoint(checkpoint)
        sampler.load_state_dict(extra["sampler"])
        history, warned = extra["history"], extra["warnings"]
        write_jsonl(run_dir / "metrics.jsonl", history)  # drop lines of steps after the checkpoint
        for metrics in history:
            live.record(metrics["step"], metrics)
        print(f"resumed from {checkpoint.relative_to(run_dir.parent)} at step {trainer.step}")
    else:
        t0 = time.perf_counter()
        log({"step": 0, **run_eval(0), "t_eval": time.perf_counter() - t0})

    for step in range(trainer.step + 1, config.steps + 1):
        seed_everything(step_seed(config.seed, step))
        t0 = time.perf_counter()
        tasks = sampler.next_batch()
        sampling = SamplingParams(config.max_new_tokens, config.temperature, config.top_p, seed=step_seed(config.seed, step))
        trajs = rollout(tasks, make_env, policy, group_size=config.num_generations, sampling=sampling, progress=False, **limits)
        t1 = time.perf_counter()
        score_trajectories(trajs, reward)
        advantages = group_advantages(group_rewards(trajs), config.scale_rewards)  # (B, G): the group is its own baseline
        t2 = time.perf_counter()
        policy.sleep()  # vLLM frees the accelerator for the update (a no-op for the transformers backend)
        batch = collate(trajs, advantages, config.skip_zero_spread, config.mask_truncated_completions)
        stats = trainer.update(batch)
        if "kl" not in stats and config.log_kl:
            stats["kl"] = trainer.sampled_kl(batch)
        policy.sync(trainer.model)  # sample from the updated adapter from now on
        t3 = time.perf_counter()

        metrics = {"step": step, **reward_report(trajs).metrics(), **episode_stats(trajs), **stats,
                   "tokens_per_s": trajs.stats.tokens_per_s, "t_rollout": t1 - t0, "t_reward": t2 - t1, "t_update": t3 - t2}
        if config.log_trajectories_every > 0 and step % config.log_trajectories_every == 0:
            save_trajectories(run_dir / TRAJECTORY_DIR / f"step-{step:04d}.jsonl", trajs)
        if step == config.steps or (config.eval_every > 0 and step % config.eval_every == 0):
            t4 = time.perf_counter()
            metrics.update(run_eval(step))
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

    before = {key[len("eval/"):]: value for key, value in history[0].items() if key.startswith("eval/")}
    after = {key[len("eval/"):]: value for key, value in history[-1].items() if key.startswith("eval/")}
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


def build_parser(preset: str | None = None) -> argparse.ArgumentParser:
    """``--preset`` and one flag per field of the preset's config class: TrainConfig's fields,
    plus a subclass's own (``--preset tiny-selfplay`` also takes ``--proposer-weight 5`` ...)."""
    parser = argparse.ArgumentParser(
        prog="python -m helpers.train", description="GRPO training of an LLM agent (the workbook's loop).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS), help="starting config; flags below override it")
    config_class = type(PRESETS[preset]()) if preset in PRESETS else TrainConfig
    hints = typing.get_type_hints(config_class)
    for f in fields(config_class):
        parser.add_argument(f"--{f.name.replace('_', '-')}", f"--{f.name}", dest=f.name, type=_parser_for(hints[f.name]),
                            default=argparse.SUPPRESS, metavar=getattr(hints[f.name], "__name__", "VALUE").upper(),
                            help=f"({hints[f.name]})" if not isinstance(hints[f.name], type) else None)
    return parser


def main(argv: list[str] | None = None) -> RunResult:
    preset_only = argparse.ArgumentParser(add_help=False)
    preset_only.add_argument("--preset", default=DEFAULT_PRESET)
    args = vars(build_parser(preset_only.parse_known_args(argv)[0].preset).parse_args(argv))
    preset = args.pop("preset")
    config = get_preset(preset, **args)
    print(f"preset {preset}" + (f" with {args}" if args else ""), flush=True)
    return train(config, preset_name=preset)


if __name__ == "__main__":
    main()
