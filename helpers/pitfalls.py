"""Training health: a checklist before a long run, and warnings during it.

    from helpers.pitfalls import check_health, preflight
    print(preflight(get_preset("gsm8k-24gb"), gpu_gb=24))          # [x] / [ ] per item, with the helper's name
    preflight(config, gpu_gb=24, trajectories=first_batch)        # also: does the first batch carry a signal?
    check_health(history)                                         # [(kind, message)] for the newest step's metrics

``check_health`` watches the training loop's metrics for the classic failures and the
loop prints each as a warning (and counts it as ``warn/<kind>``): a KL spike, entropy
collapse, reward collapse, an all-zero-reward batch (no learning signal at all), and
many truncated episodes (a limit is cutting the agent off). Each threshold is a rule of
thumb, named below so that notebook 08 can cite it.

Notebook 08 causes each failure these items guard against. The checks are cheap (no
model is loaded); the learning-rate item cannot be checked from a config (sweep it,
as notebook 08 does) and is not listed.

Simplification, named: the env contract is probed with two tiny-world tasks whatever
the config's dataset, because ``check_env`` exercises the env's handling of model
output, which does not depend on the questions (and GSM8K needs the hub).
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers.config import TrainConfig

# --- health thresholds (check_health) ---
KL_SPIKE_FACTOR = 5.0  # KL jumps to 5x its median over the previous steps...
KL_SPIKE_MIN = 0.1  # ...and is above 0.1 nats/token (small KLs wobble by large factors)
ENTROPY_FLOOR = 0.01  # nats/token: the policy samples (almost) one answer; exploration is over
REWARD_COLLAPSE_WINDOW = 3  # steps averaged when comparing the reward with its best so far
REWARD_COLLAPSE_FRACTION = 0.5  # reward window below half of its best window...
REWARD_COLLAPSE_MIN_BEST = 0.2  # ...after the run had reached at least this reward
TRUNCATION_LIMIT = 0.25  # more than a quarter of the episodes cut short by max_steps/max_tokens/timeout
HEALTH_KINDS = ("kl_spike", "entropy_collapse", "reward_collapse", "all_zero_reward", "truncation")


def check_health(history: list[dict]) -> list[tuple[str, str]]:
    """Warnings for the newest entry of ``history`` (a list of step metrics), as (kind, message).

    A pure function of the history, so a resumed run re-derives the same warnings.

    Taught in notebooks/08_pitfalls.ipynb §4.
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
    if now.get("completions/clipped_ratio", 0) > TRUNCATION_LIMIT:
        found.append(("truncation", f"{now['completions/clipped_ratio']:.0%} of episodes were cut short (max_steps/max_tokens/timeout)"))
    return found


@dataclass
class CheckItem:
    name: str  # what is checked
    helper: str  # the helper that checks it
    ok: bool
    detail: str  # the number or message behind the verdict


class Checklist(list):
    """The items of ``preflight`` (a plain list); ``str()`` is the printed checklist, ``.ok`` all passed."""

    @property
    def ok(self) -> bool:
        return all(item.ok for item in self)

    def __str__(self) -> str:
        return "\n".join(f"[{'x' if i.ok else ' '}] {i.name:<48} {i.helper:<38} {i.detail}" for i in self)


def preflight(config: TrainConfig, gpu_gb: float | None = None, trajectories: list | None = None, n_random: int = 5) -> Checklist:
    """Check ``config`` before a long run. ``gpu_gb``: the card to plan memory for (None: skip,
    e.g. a CPU run). ``trajectories``: a scored first batch, to check for a learning signal.

    Taught in notebooks/08_pitfalls.ipynb §5.
    """
    from helpers.envs import ToolEnv, check_env, make_env
    from helpers.tiny import make_tiny_tasks

    items = Checklist()
    env = make_env(config.env, max_steps=config.env_max_steps, **config.env_kwargs)
    problems = check_env(env, make_tiny_tasks(2, seed=0, split="test"), n_random=n_random)
    items.append(CheckItem("env honours its contract on garbage input", "helpers.envs.check_env", not problems,
                           problems[0] if problems else f"{type(env).__name__}: no problems"))

    timeouts = isinstance(env, ToolEnv) and (env.episode_timeout is None or env.step_timeout is None)
    bounded = config.max_new_tokens <= config.max_total_tokens and not timeouts
    items.append(CheckItem("every episode is bounded (turns, tokens, time)", "TrainConfig limits, ToolEnv timeouts", bounded,
                           f"{config.env_max_steps} turns, {config.max_total_tokens} tokens"
                           + (", a tool env without timeouts" if timeouts else "")))

    if gpu_gb is not None:
        from helpers.memory import memory_plan

        plan = memory_plan(config, gpu_gb)
        items.append(CheckItem(f"fits on a {gpu_gb:g} GiB card", "helpers.memory.check_fits", plan.fits,
                               f"peak {plan.peak_gib:.1f} GiB" + ("" if plan.fits else f": {plan.problems[0]}")))

    if trajectories is not None:
        from helpers.rewards import reward_report

        report = reward_report(trajectories)
        items.append(CheckItem("the first batch has a learning signal", "helpers.rewards.reward_report",
                               report.flat_groups < report.n_groups, f"{report.flat_fraction:.0%} of groups flat"))

    items.append(CheckItem("KL is measured for the health checks", "helpers.pitfalls.check_health", config.log_kl or config.beta > 0,
                           f"log_kl={config.log_kl}, beta={config.beta}"))
    items.append(CheckItem("held-out evaluations and checkpoints are on", "TrainConfig.eval_every, save_every",
                           config.eval_every > 0 and config.save_every > 0, f"eval_every={config.eval_every}, save_every={config.save_every}"))
    return items
