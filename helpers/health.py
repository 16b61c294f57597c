"""Training health during a run: warnings for the classic failures, from the metrics alone.

    found = check_health(history)      # [(kind, message)] for the newest step's metrics

The training loop (``helpers.loop``) calls ``check_health`` after every step, prints each
warning and counts it as ``warn/<kind>``: a KL spike, entropy collapse, reward collapse, an
all-zero-reward batch (no learning signal at all), and many truncated episodes (a limit is
cutting the agent off). A reward collapse must also be a fall larger than the steps' own sampling
noise (``window_noise``): a small batch's mean reward swings from luck alone. Each threshold is a
rule of thumb, named below so that notebook 08 can cite it. The checklist *before* a run is ``helpers.lab.pitfalls.preflight``.

Taught in notebooks/08_pitfalls.ipynb §4.
"""

from __future__ import annotations

# --- health thresholds (check_health) ---
KL_SPIKE_FACTOR = 5.0  # KL jumps to 5x its median over the previous (up to 10) steps...
KL_SPIKE_MIN = 0.1  # ...and is above 0.1 nats/token (small KLs wobble by large factors)
ENTROPY_FLOOR = 0.01  # nats/token: the policy samples (almost) one answer; exploration is over
REWARD_COLLAPSE_WINDOW = 3  # steps averaged when comparing the reward with its best so far
REWARD_COLLAPSE_FRACTION = 0.5  # reward window below half of its best window...
REWARD_COLLAPSE_MIN_BEST = 0.2  # ...after the run had reached at least this reward...
REWARD_COLLAPSE_NOISE = 4.5  # ...and the fall is over 4.5 standard errors of the steps' own noise (window_noise): the best
# of a few dozen noisy windows and a last window at its unluckiest differ by about 3 of them from luck alone
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
        fell = best >= REWARD_COLLAPSE_MIN_BEST and last < REWARD_COLLAPSE_FRACTION * best
        if fell and best - last > REWARD_COLLAPSE_NOISE * window_noise(rewards, w):  # more than the luck of the batches
            found.append(("reward_collapse", f"reward collapse: last {w} steps average {last:.3f}, best was {best:.3f}"))
    if now.get("all_zero_reward"):
        found.append(("all_zero_reward", "every reward in the batch is 0: no learning signal (see reward_report for why)"))
    if now.get("completions/clipped_ratio", 0) > TRUNCATION_LIMIT:
        found.append(("truncation", f"{now['completions/clipped_ratio']:.0%} of episodes were cut short (max_steps/max_tokens/timeout)"))
    return found


def window_noise(rewards: list[float], w: int) -> float:
    """The standard error of the difference of two ``w``-step means of ``rewards`` from the steps' sampling noise alone.

    Each step's reward is the mean of one batch, a sample: its noise is estimated from the successive differences of
    the steps (von Neumann's estimator, sigma^2 = mean((r[t] - r[t-1])^2) / 2), which a slow trend barely moves. The
    best window is the largest of many noisy means, so with few episodes per step, rewards of +-1 or +-2 (a zero-sum
    game's chips) and a true mean near 0, it is mostly luck, and a later window at half of it is no collapse; a fall
    of several times this figure is.

    >>> round(window_noise([0.5, 0.5, 0.5, 0.5, 0.5], 3), 6)  # no step-to-step noise at all
    0.0
    """
    diffs = [(b - a) ** 2 for a, b in zip(rewards, rewards[1:])]
    sigma = (sum(diffs) / len(diffs) / 2) ** 0.5 if diffs else 0.0
    return sigma * (2 / w) ** 0.5
