"""Training health before a long run: a checklist (the warnings during a run are ``helpers.health``).

    from helpers.lab.pitfalls import preflight
    print(preflight(get_preset("gsm8k-24gb"), gpu_gb=24))          # [x] / [ ] per item, with the helper's name
    preflight(config, gpu_gb=24, trajectories=first_batch)        # also: does the first batch carry a signal?

Notebook 08 causes the failures three items guard against (a looping agent, all-zero
rewards, out of memory). The checks are cheap (no model is loaded); the learning-rate
item cannot be checked from a config (sweep it, as notebook 08 does) and is not listed.

Simplification, named: the env contract is probed with two tiny-world tasks when the env
takes them, because ``check_env`` exercises the env's handling of model output, which does
not depend on the questions (and GSM8K needs the hub). An env whose ``reset`` needs columns
of its own (the shop's ``item`` and ``prices``, a game's deal) is probed with two tasks of
the config's own dataset instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers.config import TrainConfig
from helpers.data import load_dataset
from helpers.envs import check_env
from helpers.lab.memory import memory_plan
from helpers.loop import env_factory
from helpers.rewards import reward_report
from helpers.worlds.arithmetic.tasks import make_tiny_tasks


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


def probe_tasks(config: TrainConfig, env) -> list:
    """Two tasks to play ``env`` with: two tiny arithmetic questions, which every env that asks only for a
    question and an answer takes; two of the config's own dataset when ``env``'s ``reset`` refuses them
    (it needs columns of its own: the shop's item and prices, a game's deal, a BFCL entry)."""
    tiny = make_tiny_tasks(2, seed=0, split="test")
    try:
        env.reset(tiny[0])
    except (KeyError, ValueError):  # how an env's reset says a row lacks its columns
        return load_dataset(config.dataset, "test", 2, seed=0)
    return tiny


def preflight(config: TrainConfig, gpu_gb: float | None = None, trajectories: list | None = None, n_random: int = 5) -> Checklist:
    """Check ``config`` before a long run. ``gpu_gb``: the card to plan memory for (None: skip,
    e.g. a CPU run). ``trajectories``: a scored first batch, to check for a learning signal.

    Taught in notebooks/08_pitfalls.ipynb §5.
    """
    items = Checklist()
    env = env_factory(config)()  # the Episode the run will drive
    problems = check_env(env, probe_tasks(config, env), n_random=n_random)
    items.append(CheckItem("env honours its contract on garbage input", "helpers.envs.check_env", not problems,
                           problems[0] if problems else f"{env.name}: no problems"))

    timeouts = bool(env.tools) and (env.episode_timeout is None or env.step_timeout is None)
    bounded = config.max_new_tokens <= config.max_total_tokens and not timeouts
    items.append(CheckItem("every episode is bounded (turns, tokens, time)", "TrainConfig limits, Episode timeouts", bounded,
                           f"{config.env_max_steps} turns, {config.max_total_tokens} tokens"
                           + (", a tool env without timeouts" if timeouts else "")))

    if gpu_gb is not None:
        plan = memory_plan(config, gpu_gb)
        items.append(CheckItem(f"fits on a {gpu_gb:g} GiB card", "helpers.lab.memory.check_fits", plan.fits,
                               f"peak {plan.peak_gib:.1f} GiB" + ("" if plan.fits else f": {plan.problems[0]}")))

    if trajectories is not None:
        report = reward_report(trajectories)
        items.append(CheckItem("the first batch has a learning signal", "helpers.rewards.reward_report",
                               report.flat_groups < report.n_groups, f"{report.flat_fraction:.0%} of groups flat"))

    items.append(CheckItem("KL is measured for the health checks", "helpers.health.check_health", config.log_kl or config.beta > 0,
                           f"log_kl={config.log_kl}, beta={config.beta}"))
    items.append(CheckItem("held-out evaluations and checkpoints are on", "TrainConfig.eval_every, save_every",
                           config.eval_every > 0 and config.save_every > 0, f"eval_every={config.eval_every}, save_every={config.save_every}"))
    return items
