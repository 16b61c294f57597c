"""The training loop (训练循环): one function, ``train``, for every world.

    from helpers.train import train            # the command's module re-exports it
    result = train(get_preset("tiny-agent"), preset_name="tiny-agent")
    print(result.line())                       # before -> after

One step of the loop, each arrow of the pipeline one line (see ``GroupCollector`` and ``train`` below):

    tasks = sampler.next_batch()                                         # Dataset   B tasks
    trajs = rollout(tasks, make_env, policy, group_size=G, ...)          # Env + Rollout: B*G episodes
    rewards = score_trajectories(trajs, reward)                          # Reward    one number per episode
    advantages = compute_advantages(trajs, config)                       # GRPO      A = (r - mean) / std, (B, G); GiGPO: per turn too
    stats = trainer.update(collate(trajs, advantages, ...))              # GRPO      the clipped-ratio update
    policy.sync(trainer.model)                                           # the sampler takes the new adapter

The first four lines are the *collector*: how one step's batch of episodes and advantages is
made. ``GroupCollector`` is the default (B tasks from the training split, G episodes each); a
world whose batches are made differently registers its own collector (``@register_collector``)
and names it in its preset (``config.collect``): self-play proposes its tasks before it solves
them (``helpers.worlds.selfplay``). Everything else (evaluation, the update, ``policy.sleep()``
and ``policy.sync()``, logging, health checks, checkpoints, resume) is this one loop's.

The run folder (``runs/<preset>-seed<seed>/`` by default) gets:

    config.json          the full config of the run
    metrics.jsonl        one line per step (step 0 = the evaluation before training), mostly TRL's metric names,
                         and the step's seconds: t_rollout, t_reward, t_update, t_eval, t_save
    trajectories/        sampled training episodes every ``log_trajectories_every`` steps (JSONL)
    eval/                per-task evaluation records (and the greedy episodes) before, during and after
    curves.png           the live curves, saved at the end
    summary.json         before, after, wall-clock and CPU time, the time split (and what the collector adds)
    checkpoint-<step>/   adapter + optimizer + RNG + collector state (the last two are kept; written atomically)

The folder's disk work (checkpoints, checksums, the lock, the resume check) is ``helpers.checkpoint``'s.

Where the time went: the run ends with a line splitting its wall-clock time into ``TIME_SPLIT``'s
parts, kept in summary.json as ``time_split`` (seconds; ``other`` is what the parts leave over).
A step's ``t_save`` is what it wrote before its metrics line (trajectories, evaluation files); the
checkpoint written after that line, the metrics lines and the curves count in the run's ``save``.

Health checks (``helpers.health.check_health``) watch the metrics for the classic failures
and print a warning (counted in the metrics as ``warn/<kind>``).

Resume: a checkpoint holds everything the next step depends on (adapter, optimizer,
scheduler, the collector's data position, metrics so far), and every step's sampling seed is a
function of ``(seed, step)``, so a run killed after a checkpoint and resumed gives the
same numbers as a run that was never killed (on CPU; GPU kernels may not be bit-exact).
A resumed run may also be given more ``steps``: it continues past its old end, the learning-rate
schedule re-planned for the new total from the step reached (``replan_schedule``; config.json keeps
``schedule_replans``), and its curves and summary go on from the checkpoint's history.

Several worlds in one run (TRL's multi-environment training): a mixed dataset names each task's
environment (``helpers.data.mix_datasets``), ``env_factory`` gives the rollout TRL's dict of
factories, and the metrics add each environment's figures to the overall ones
(``rewards/<env>/mean`` and ``<env>/success`` per step, ``eval/<env>/success`` and ``eval/<env>/pass@k``).

Simplifications, named:
- One process, one device; rollout and update alternate (no asynchronous rollouts).
- ``kl`` is measured on the sampled batch *before* the update (policy at sampling time vs
  the reference), with one extra no-grad forward pass, counted in ``t_update``. With
  ``beta > 0`` the trainer's own KL (during the update) is logged instead.
- Evaluations between the first and the last sample one episode per task (``eval/pass@1``,
  the sampled success rate) besides the greedy one; pass@k costs k episodes per task, so it
  is measured before and after only. ``pass_k = 0`` turns sampled evaluation off.
- With ``eval_subset = N`` those evaluations in between run on the first N held-out tasks only
  (always the same N, so the curve's points compare with one another, and ``eval/n`` says N);
  the before and after figures are always on all ``eval_tasks``. The curve is then a cheaper,
  noisier estimate (its standard error grows as 1/sqrt(N)) of the same quantity.
- The evaluation tasks are fixed (the test split drawn with seed 0, the same for every
  run seed) so seeds compare; training never samples from the test split.

Taught in notebooks/06_training_loop.ipynb.
"""

from __future__ import annotations

import json
import random
import time
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from helpers.checkpoint import (EVAL_DIR, TRAJECTORY_DIR, clear_run_dir, resumable_checkpoint, run_dir_for, run_folder_lock,
                                save_checkpoint, saved_config)
from helpers.config import ConfigError, TrainConfig
from helpers.data import TaskSampler, load_dataset, parse_mix, write_jsonl
from helpers.envs import make_env
from helpers.evaluation import by_environment, episode_stats, evaluate, save_records
from helpers.floats import flush_denormals
from helpers.grpo import LoRAGRPO, collate, compute_advantages, step_group_metrics, step_groups
from helpers.health import HEALTH_KINDS, check_health
from helpers.live import LiveCurves, Reporters
from helpers.policy import SamplingParams, load_model, make_policy, resolve_device
from helpers.registry import register
from helpers.rewards import combine, reward_report, score_trajectories
from helpers.rollout import rollout, save_trajectories

EVAL_SEED = 0  # the held-out tasks: the test split drawn with this seed, whatever the run's seed
# The parts of a run's wall-clock time (summary.json's time_split; "other" is the remainder):
TIME_SPLIT = (
    "startup",  # from the call to the first evaluation: imports, data, model load (a resumed run: the checkpoint)
    "rollout",  # sampling the training episodes (t_rollout)
    "reward",  # scoring them and the advantages (t_reward)
    "update",  # the GRPO update, the KL measurement, the sampler's sync (t_update)
    "eval",  # held-out evaluations (t_eval)
    "save",  # writing: trajectories, evaluation files, metrics lines, checkpoints, the curves (t_save and the rest)
)


def env_factory(config: TrainConfig):
    """A function making one fresh env per episode (an ``Episode``): ``config.env`` (a registry name, or
    ``"package.module:ClassName"``, any class on TRL's environment contract) and its options.

    A mixed dataset (``"tiny-agent@shop+tiny@calculator"``, ``helpers.data.mix_datasets``) gets TRL's
    multi-environment form instead: a dict ``{environment name: function}``, one per part, which the
    rollout picks from by each task's ``environment``; ``config.env_classes`` replaces the class of a
    named environment (``--env-class shop=mypkg.shop:Shop``). Every registered env is made once now, so a
    bad name fails here, with the registry's message (a class by name is checked by ``check_env_class``)."""
    if not is_mix(config):
        return _episode_factory(config.env, config)
    names = [environment for _, environment in parse_mix(config.dataset)]
    unknown = sorted(set(config.env_classes) - set(names))
    if unknown:
        raise ValueError(f"--env-class {unknown[0]}=...: the dataset has no environment {unknown[0]!r}; "
                         f"its environments: {', '.join(dict.fromkeys(names))}")
    return {name: _episode_factory(config.env_classes.get(name, name), config) for name in names}


def _episode_factory(name: str, config: TrainConfig):
    if ":" not in name or not is_mix(config):  # a class by name in a mix: helpers.train checks it on a task of its world
        make_env(name, max_steps=config.env_max_steps, **config.env_kwargs)  # fail now, with the registry's message
    return lambda: make_env(name, max_steps=config.env_max_steps, **config.env_kwargs)


def is_mix(config: TrainConfig) -> bool:
    """Does the run mix environments (a dataset ``dataset@env+dataset@env``)?"""
    return "@" in config.dataset


def env_classes(config: TrainConfig) -> list[str]:
    """The classes named ``"package.module:ClassName"`` that the run plays (``config.env``, or a mix's environments
    after ``config.env_classes``): ``helpers.train`` checks each on the contract before any model loads."""
    if not is_mix(config):
        return [config.env] if ":" in config.env else []
    names = [config.env_classes.get(environment, environment) for _, environment in parse_mix(config.dataset)]
    return [name for name in dict.fromkeys(names) if ":" in name]


def look_up(config: TrainConfig):
    """Look the config's names up in their registries, raising their one-line errors (an unknown collector, dataset,
    env, env option or reward); returns one held-out task. Nothing is kept: a run builds its own afterwards."""
    if config.collect not in COLLECTORS:
        raise ConfigError("collect", config.collect, sorted(COLLECTORS))
    task = load_dataset(config.dataset, "test", 1, seed=EVAL_SEED)[0]
    combine(config.rewards)
    if is_mix(config) or ":" not in config.env:  # a class by name is checked by check_env_class, on this task
        env_factory(config)
    return task


def replan_schedule(trainer, old_steps: int, steps: int) -> dict:
    """A resumed run whose ``steps`` grew: follow, from the step reached, the learning-rate schedule of a run
    planned for ``steps`` from the start (linear decay to 0 at the new last step; ``LoRAGRPO`` builds its
    scheduler for ``config.steps``). The checkpoint restored the old plan's current rate (0 at the old last
    step, where a finished run stands), so the rate is set to the new plan's value now. Returns what
    config.json records: the step, the two totals, the next step's rate and one line saying so."""
    scheduler = trainer.scheduler
    scheduler.last_epoch -= 1  # step() counts it back up and sets each group's rate to base_lr * plan(last_epoch)
    scheduler.step()
    lr = scheduler.get_last_lr()[0]
    line = (f"steps {old_steps} -> {steps}: the learning-rate schedule is re-planned for {steps} steps from step "
            f"{trainer.step} (linear decay to 0 at step {steps}); step {trainer.step + 1} trains at lr {lr:.3g}")
    return {"at_step": trainer.step, "steps_before": old_steps, "steps": steps, "next_lr": lr, "line": line}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def step_seed(seed: int, step: int) -> int:
    """The sampling seed of one step: a function of (run seed, step) only, so a resumed run
    samples exactly what the uninterrupted run sampled at that step."""
    return seed * 1_000_003 + step


@contextmanager
def torch_threads(count: int):
    """Run the block with torch computing on ``count`` CPU threads; 0 leaves torch's setting alone.
    The caller's setting comes back afterwards (a notebook's later cells keep theirs)."""
    before = torch.get_num_threads()
    if count > 0:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if count > 0:
            torch.set_num_threads(before)


# ----------------------------------------------------------------------------------------------
# The collector: how one step's batch is made
# ----------------------------------------------------------------------------------------------


@dataclass
class Collected:
    """One step's batch: what the update needs and what the step logs."""

    trajectories: list  # every episode of the step, in the order of the advantages' rows
    advantages: object  # helpers.grpo.Advantages, (B, G): one row per group
    metrics: dict  # the batch's metrics, under TRL's names where TRL has one (reward, success, tool calls, ...)
    t_reward: float = 0.0  # seconds spent scoring (the rest of collecting is rollout)


class GroupCollector:
    """The default collector: each step B tasks from the training split, G episodes of each, and
    the config's advantages: GRPO's group advantages (every group is its own baseline), or with
    ``advantage="gigpo"`` GiGPO's per turn (``helpers.grpo`` §1b). It logs the step groups either way.

    A collector is made once per run with ``(config, policy, make_env, reward)`` and called once
    per step; ``state_dict`` is saved with every checkpoint so that a resumed run draws the same
    tasks; ``summary(history)`` adds fields to summary.json; ``panels`` and ``line_fields`` (None:
    ``helpers.live``'s) say what the live curves draw.
    """

    panels = None
    line_fields = None

    def __init__(self, config: TrainConfig, policy, make_env: Callable, reward: Callable):
        self.config, self.policy, self.make_env, self.reward = config, policy, make_env, reward
        train_tasks = load_dataset(config.dataset, "train", config.max_train_tasks, seed=config.seed)
        self.sampler = TaskSampler(train_tasks, config.tasks_per_step, seed=config.seed)

    def __call__(self, step: int) -> Collected:
        c = self.config
        tasks = self.sampler.next_batch()
        sampling = SamplingParams(c.max_new_tokens, c.temperature, c.top_p, seed=step_seed(c.seed, step))
        trajs = rollout(tasks, self.make_env, self.policy, group_size=c.num_generations, sampling=sampling, progress=False,
                        max_steps=c.env_max_steps, max_total_tokens=c.max_total_tokens)
        t0 = time.perf_counter()
        score_trajectories(trajs, self.reward)
        advantages = compute_advantages(trajs, c)  # (B, G): the group is its own baseline (gigpo: and per turn, its step groups)
        metrics = {**reward_report(trajs).metrics(), **episode_stats(trajs), "tokens_per_s": trajs.stats.tokens_per_s,
                   **step_group_metrics(step_groups(trajs, c.gamma, c.env)),  # what GiGPO's step groups offer, whichever advantage
                   **environment_metrics(trajs)}  # a mix of worlds: each environment's reward and success
        return Collected(trajs, advantages, metrics, time.perf_counter() - t0)

    def state_dict(self) -> dict:
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state["sampler"])

    def summary(self, history: list[dict]) -> dict:
        return {}


def environment_metrics(trajs) -> dict[str, float]:
    """A mixed run's batch, per environment: ``rewards/<env>/mean`` (the mean reward of that environment's
    episodes, each scored by its own env's verdict and reward) and ``<env>/success``; ``{}`` for one environment."""
    metrics = {}
    for environment, mine in by_environment(trajs).items():
        metrics[f"rewards/{environment}/mean"] = sum(t.reward for t in mine) / len(mine)
        metrics[f"{environment}/success"] = episode_stats(mine)["success"]
    return metrics


COLLECTORS: dict[str, Callable] = {"groups": GroupCollector}  # config.collect -> collector class; worlds add theirs


def register_collector(name: str):
    """Decorator: ``@register_collector("selfplay")`` on a collector class (``GroupCollector``'s interface)."""

    return lambda cls: register(COLLECTORS, "collector", name, cls)


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
    time_split: dict[str, float] = field(default_factory=dict)  # wall_s by part: TIME_SPLIT's and "other"

    def line(self) -> str:
        """The before -> after line every run ends with."""
        b, a = self.before, self.after
        text = (f"before -> after (held-out, n={a.get('n')}): greedy success {b['success']:.3f} -> {a['success']:.3f} | "
                f"tool calls {b['tool_calls']:.2f} -> {a['tool_calls']:.2f} | turns {b['turns']:.2f} -> {a['turns']:.2f}")
        for key in a:
            if key.startswith("pass@") and key in b:
                text += f" | {key} {b[key]:.3f} -> {a[key]:.3f}"
        for key in a:  # a mixed run: each environment's greedy success
            if key.endswith("/success") and key in b:
                text += f" | {key.removesuffix('/success')} {b[key]:.3f} -> {a[key]:.3f}"
        return text + f" | {self.wall_s:.0f} s wall, {self.cpu_s:.0f} s CPU"

    def time_line(self) -> str:
        """Where the wall-clock time went: ``time split: startup 5.1 s (6%) | rollout 40.2 s (47%) | ...``."""
        parts = [f"{part} {seconds:.1f} s ({seconds / max(self.wall_s, 1e-9):.0%})" for part, seconds in self.time_split.items()]
        return "time split: " + " | ".join(parts) + f" | wall {self.wall_s:.1f} s"


def train(config: TrainConfig, preset_name: str | None = None, live=None) -> RunResult:
    """Run GRPO as ``config`` says; return before/after evaluation, the metric history and the run folder.

    live: a ``helpers.live.LiveCurves`` (or anything with ``update(step, metrics)``, ``record(step,
          metrics)`` and ``save(path)``); None makes one that picks notebook curves or console lines.

    The run folder is locked for as long as the run lives (``run_folder_lock``): a second run on
    the same folder stops at once instead of writing between this one's lines. The rollout policy
    is the run's own: one with a ``close()`` (vLLM's engine) is closed when the run ends or fails.

    Taught in notebooks/06_training_loop.ipynb §2.
    """
    started = time.perf_counter(), time.process_time()  # the run's wall and CPU clocks start at the call
    flush_denormals()  # attention's tiny probabilities on the CPU's fast path (helpers.floats); no figure changes
    run_dir = run_dir_for(config, preset_name)
    with run_folder_lock(run_dir), torch_threads(config.torch_threads), ExitStack() as on_exit:
        return _train(config, run_dir, preset_name, live, started, on_exit)


def _train(config: TrainConfig, run_dir: Path, preset_name: str | None, live, started: tuple[float, float],
           on_exit: ExitStack) -> RunResult:
    t_start, cpu_start = started
    spent = dict.fromkeys(TIME_SPLIT, 0.0)  # seconds of this call by part
    config = replace(config, device=resolve_device(config.device))  # a copy: the caller's config is not changed
    look_up(config)  # an unknown collector, dataset, env or reward raises here, before the folder's last run is cleared
    checkpoint = resumable_checkpoint(run_dir, config) if config.resume else None
    saved = saved_config(run_dir, config) if checkpoint is not None else {}  # the settings the resumed run had so far
    seed_everything(config.seed)

    # Data, environment, reward, model + LoRA trainer, rollout policy, and the world's collector.
    eval_tasks = load_dataset(config.dataset, "test", config.eval_tasks, seed=EVAL_SEED)
    make_env = env_factory(config)
    model, tokenizer = load_model(config)
    trainer = LoRAGRPO(model, config)
    policy = make_policy(config, trainer.model, tokenizer)
    if hasattr(policy, "close"):  # vLLM's engine holds its memory (the GPU's share, or CPU worker processes) until closed:
        on_exit.callback(policy.close)  # at the end of the run, or when it fails or is interrupted, not at the kernel's exit
    # Only now, with everything loaded (a hub id with a typo, the hub out of reach, an engine that does not start
    # fail above), does a fresh run replace what an earlier run left in the folder.
    if checkpoint is None:
        clear_run_dir(run_dir)
    (run_dir / TRAJECTORY_DIR).mkdir(parents=True, exist_ok=True)
    (run_dir / EVAL_DIR).mkdir(parents=True, exist_ok=True)
    collect = COLLECTORS[config.collect](config, policy, make_env, combine(config.rewards))
    limits = dict(max_steps=config.env_max_steps, max_total_tokens=config.max_total_tokens)
    if live is None:
        drawn = {k: v for k, v in (("panels", collect.panels), ("line_fields", collect.line_fields)) if v is not None}
        live = LiveCurves(run_dir, total_steps=config.steps, **drawn)
    reporters = Reporters(config.report_to, run_dir, config)

    def run_eval(step: int) -> dict:
        # Every evaluation: greedy, plus sampled episodes for the sampled success rate (pass@1). Before and
        # after: all eval tasks, k sampled episodes per task (pass@k too). In between: the first eval_subset
        # tasks (0: all), one sampled episode per task (the curve, at a fraction of the cost).
        t0 = time.perf_counter()
        first_or_last = step in (0, config.steps)
        k = config.pass_k if first_or_last else min(config.pass_k, 1)
        tasks = eval_tasks if first_or_last or config.eval_subset <= 0 else eval_tasks[: config.eval_subset]
        result = evaluate(policy, tasks, make_env, k=k, temperature=config.temperature,
                          max_new_tokens=config.max_new_tokens, seed=config.seed, **limits)
        t1 = time.perf_counter()
        save_records(run_dir / EVAL_DIR / f"step-{step:04d}.jsonl", result.records)
        save_trajectories(run_dir / EVAL_DIR / f"step-{step:04d}.trajectories.jsonl", result.trajectories)
        return {**{f"eval/{key}": value for key, value in result.metrics.items()}, "t_eval": t1 - t0,
                "t_save": time.perf_counter() - t1}

    def log(metrics: dict) -> None:
        t0 = time.perf_counter()
        history.append(metrics)
        write_jsonl(run_dir / "metrics.jsonl", [metrics], mode="a")
        reporters.log({key: value for key, value in metrics.items() if value is not None})
        live.update(metrics["step"], metrics)
        for part in ("rollout", "reward", "update", "eval", "save"):  # the step's own seconds, then this line's writing
            spent[part] += metrics.get(f"t_{part}", 0.0)
        spent["save"] += time.perf_counter() - t0

    history: list[dict] = []
    warned: list[str] = []
    replans = list(saved.get("schedule_replans", []))  # each resume that raised --steps: where the schedule was re-planned
    if checkpoint is not None:  # continue a killed run exactly where its last checkpoint left it
        extra = trainer.load_checkpoint(checkpoint)
        collect.load_state_dict(extra["collector"])
        history, warned = extra["history"], extra["warnings"]
        write_jsonl(run_dir / "metrics.jsonl", history)  # drop lines of steps after the checkpoint
        for metrics in history:
            live.record(metrics["step"], metrics)
        print(f"resumed from {checkpoint.relative_to(run_dir.parent)} at step {trainer.step}")
        if saved["steps"] != config.steps:  # --steps raised (helpers.checkpoint.RESUME_GROWS): a longer run
            replans.append(replan_schedule(trainer, saved["steps"], config.steps))
            print(f"resume: {replans[-1]['line']}", flush=True)
    (run_dir / "config.json").write_text(json.dumps(
        {"preset": preset_name, **asdict(config), **({"schedule_replans": replans} if replans else {})}, indent=2))
    spent["startup"] = time.perf_counter() - t_start
    if checkpoint is None:
        log({"step": 0, **run_eval(0)})

    for step in range(trainer.step + 1, config.steps + 1):
        seed_everything(step_seed(config.seed, step))
        t0 = time.perf_counter()
        batch_of_step = collect(step)  # Dataset -> Env + Rollout -> Reward -> advantages
        t1 = time.perf_counter()
        if config.advantage != "grpo" and batch_of_step.advantages.turn_advantages is None:
            raise ValueError(f"advantage={config.advantage!r} needs per-turn advantages, and the {config.collect!r} "
                             "collector makes one per episode; use advantage='grpo' with it")
        policy.sleep()  # vLLM frees the accelerator for the update (a no-op for the transformers backend)
        batch = collate(batch_of_step.trajectories, batch_of_step.advantages, config.skip_zero_spread, config.mask_truncated_completions)
        stats = trainer.update(batch)
        if "kl" not in stats and config.log_kl:
            stats["kl"] = trainer.sampled_kl(batch)
        policy.sync(trainer.model)  # sample from the updated adapter from now on
        t2 = time.perf_counter()

        metrics = {"step": step, **batch_of_step.metrics, **stats, "t_rollout": t1 - t0 - batch_of_step.t_reward,
                   "t_reward": batch_of_step.t_reward, "t_update": t2 - t1}
        if config.log_trajectories_every > 0 and step % config.log_trajectories_every == 0:
            save_trajectories(run_dir / TRAJECTORY_DIR / f"step-{step:04d}.jsonl", batch_of_step.trajectories)
        metrics["t_save"] = time.perf_counter() - t2
        if step == config.steps or (config.eval_every > 0 and step % config.eval_every == 0):
            evaluated = run_eval(step)
            metrics.update(evaluated, t_save=metrics["t_save"] + evaluated["t_save"])
        found = check_health(history + [metrics])
        metrics.update({f"warn/{kind}": (history[-1] if history else {}).get(f"warn/{kind}", 0) + sum(k == kind for k, _ in found)
                        for kind in HEALTH_KINDS})
        for _, message in found:
            warned.append(f"step {step}: {message}")
            print(f"WARNING step {step}: {message}", flush=True)
        log(metrics)
        if (config.save_every > 0 and step % config.save_every == 0) or step == config.steps:
            t3 = time.perf_counter()
            save_checkpoint(trainer, run_dir, step, {"collector": collect.state_dict(), "history": history, "warnings": warned})
            spent["save"] += time.perf_counter() - t3

    t0 = time.perf_counter()
    live.save(run_dir / "curves.png")  # in the run folder, whatever folder the live object was made with
    reporters.close()
    spent["save"] += time.perf_counter() - t0
    wall_s, cpu_s = time.perf_counter() - t_start, time.process_time() - cpu_start
    before = {key[len("eval/"):]: value for key, value in history[0].items() if key.startswith("eval/")}
    after = {key[len("eval/"):]: value for key, value in history[-1].items() if key.startswith("eval/")}
    result = RunResult(run_dir, config, before, after, history, warned, wall_s, cpu_s,
                       {**spent, "other": wall_s - sum(spent.values())})
    extra_summary = collect.summary(history)
    (run_dir / "summary.json").write_text(json.dumps(
        {"preset": preset_name, "before": before, "after": after, **extra_summary, "wall_s": result.wall_s,
         "cpu_s": result.cpu_s, "time_split": result.time_split, "warnings": warned,
         "torch_threads": torch.get_num_threads()}, indent=2, default=str))
    print(result.line(), flush=True)
    print(result.time_line(), flush=True)
    if extra_summary:
        print(json.dumps(extra_summary, default=str), flush=True)
    return result
