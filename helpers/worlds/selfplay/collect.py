"""Self-play's step: the proposer writes tasks, the solver attempts them, both roles are paid.

    round = play_round(policy, make_solver_env, reward, config, step)   # propose -> check -> solve -> pay
    round.advantages                                                   # (K + V, G): a baseline per role

``SelfPlayCollector`` hands each round to the training loop (``helpers.loop``) as one step's
batch; everything else about the run (evaluation, update, checkpoints, curves) is the loop's.
The proposer's reward (learnability) and the per-role advantages are explained in the world's
docstring (``helpers.worlds.selfplay``) and taught in notebooks/09_self_play.ipynb.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from helpers.config import TrainConfig
from helpers.evaluation import episode_stats
from helpers.grpo import Advantages, group_advantages, group_rewards
from helpers.loop import Collected, register_collector, step_seed
from helpers.policy import SamplingParams
from helpers.rewards import reward_report, score_trajectories
from helpers.rollout import rollout
from helpers.worlds.selfplay.env import ProposerEnv, proposer_task
from helpers.worlds.selfplay.tasks import solver_task


def learnability(solver_rewards):
    """The proposer's reward for each task from the solver's G attempts at it (Absolute Zero):

        p = mean of the G outcomes;   r = 1 - p  if 0 < p < 1,  else 0

    solver_rewards: (V, G) tensor of 0/1 outcomes, one row per valid proposed task.
    returns:        (V,) rewards. Tasks always solved (too easy) and never solved (too hard,
                    or wrong) both earn 0: neither gives the solver anything to learn from.

    >>> learnability(torch.tensor([[1., 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]))
    tensor([0.0000, 0.2500, 0.7500, 0.0000])
    """
    p = solver_rewards.float().mean(dim=1)  # (V,)
    return torch.where((p > 0) & (p < 1), 1 - p, torch.zeros_like(p))  # (V,)


def role_advantages(proposer_rewards, solver_rewards, scale_rewards: str = "group", proposer_weight: float = 1.0):
    """GRPO advantages with a baseline per role: ``group_advantages`` on each role's groups,
    stacked proposer groups first (the order the trajectories are collated in).

    proposer_rewards: (K, G): K proposer groups of G proposals (a proposal's reward is its learnability)
    solver_rewards:   (V, G): one row per valid proposed task, its G attempts' outcomes (may be V = 0)
    proposer_weight:  multiplies the proposer's advantages (``SelfPlayConfig.proposer_weight``: its
                      replies are a few tokens, the solver's many, and the loss averages over tokens)
    returns:          ``Advantages`` of shape (K + V, G)
    """
    proposer = group_advantages(proposer_rewards, scale_rewards)  # (K, G)
    proposer = Advantages(proposer.advantages * proposer_weight, proposer.zero_spread)
    if solver_rewards.size(0) == 0:
        return proposer
    solver = group_advantages(solver_rewards, scale_rewards)  # (V, G)
    return Advantages(torch.cat([proposer.advantages, solver.advantages]), torch.cat([proposer.zero_spread, solver.zero_spread]))


# ----------------------------------------------------------------------------------------------
# One round of self-play: propose, check, solve, pay both roles
# ----------------------------------------------------------------------------------------------


@dataclass
class SelfPlayConfig(TrainConfig):
    # --- self-play (the fields above are the main loop's, with the same meanings) ---------------
    collect: str = "selfplay"  # the loop makes each step's batch with SelfPlayCollector (below)
    proposer_groups: int = 2  # K: proposer prompts per step, each sampled num_generations (P = G) times
    invalid_reward: float = -0.5  # an invalid task's reward: below a trivial task's 0, or nothing keeps the proposer in the grammar
    max_proposal_tokens: int = 24  # "<task>123*456</task>" is 20 tokens with <|im_end|>; longer ones are cut (invalid)
    proposer_temperature: float = 1.0  # the proposer's sampling temperature (``temperature`` is the solver's)
    proposer_weight: float = 1.0  # multiplies the proposer's advantages: its ~18-token replies are a few % of the batch's tokens


@dataclass
class Round:
    """One round of self-play: what each role did and what it was paid."""

    proposals: list  # K * G proposer Trajectories; .info has valid / expression / difficulty / error
    attempts: list  # V * G solver Trajectories, G per valid proposal, in the proposals' order
    advantages: object  # helpers.grpo.Advantages (K + V, G), a baseline per role
    t_reward: float = 0.0  # seconds spent scoring and paying (the rest of the round is rollout)

    @property
    def trajectories(self) -> list:
        return [*self.proposals, *self.attempts]  # the order of the advantages' rows

    def metrics(self) -> dict:
        """The round's numbers: the solver's under the main loop's names, the proposer's under ``proposer/``."""
        valid = [t for t in self.proposals if t.info.get("valid")]
        solve_rates = [t.info["solve_rate"] for t in valid]
        out = {
            "proposer/validity": len(valid) / len(self.proposals),
            "proposer/difficulty": _mean([t.info["difficulty"] for t in valid]),
            "proposer/learnability": _mean([t.reward_parts["learnability"] for t in self.proposals]),  # invalid ones as 0
            "proposer/reward": _mean([t.reward for t in self.proposals]),  # with invalid_reward for the invalid ones
            "proposer/solve_rate": _mean(solve_rates),
            "proposer/frac_trivial": _mean([p == 1.0 for p in solve_rates]),  # always solved: paid 0
            "proposer/frac_unsolved": _mean([p == 0.0 for p in solve_rates]),  # never solved: paid 0
            "proposer/completions/mean_length": _mean([t.num_generated for t in self.proposals]),
        }
        if self.attempts:
            out.update(reward_report(self.attempts).metrics())
            out.update(episode_stats(self.attempts))
        return out


def _mean(values) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def play_round(policy, make_solver_env, reward, config: SelfPlayConfig, step: int = 0) -> Round:
    """Propose K * G tasks, solve each valid one G times, pay both roles, compute advantages per role.

    make_solver_env: a fresh solver env per episode (``helpers.loop.env_factory(config)``)
    reward:          the solver's reward (``helpers.rewards.combine(config.rewards)``)
    step:            names the tasks and, with ``config.seed``, seeds the sampling

    Taught in notebooks/09_self_play.ipynb §6.
    """
    G, seed = config.num_generations, step_seed(config.seed, step)
    propose = SamplingParams(config.max_proposal_tokens, config.proposer_temperature, config.top_p, seed=seed)
    solve = SamplingParams(config.max_new_tokens, config.temperature, config.top_p, seed=seed + 500_000)

    # Proposer: K prompts x G samples; the env checks each proposal and computes its answer.
    prompts = [proposer_task(f"propose-{step}-{k}") for k in range(config.proposer_groups)]
    proposals = rollout(prompts, ProposerEnv, policy, group_size=G, sampling=propose, max_steps=1,
                        max_total_tokens=config.max_total_tokens, progress=False)
    valid = [t for t in proposals if t.info.get("valid")]

    # Solver: every valid proposal G times, paid by outcome (one group per proposal, even for repeats).
    tasks = [solver_task(t.info["expression"], f"solve-{step}-{i}-{t.info['expression']}") for i, t in enumerate(valid)]
    attempts = rollout(tasks, make_solver_env, policy, group_size=G, sampling=solve, max_steps=config.env_max_steps,
                       max_total_tokens=config.max_total_tokens, progress=False) if tasks else []
    t0 = time.perf_counter()
    score_trajectories(attempts, reward)
    solver_rewards = group_rewards(attempts) if attempts else torch.zeros(0, G)  # (V, G)

    # Proposer's pay: the learnability of its task; invalid_reward for a task outside the grammar.
    paid = learnability(solver_rewards)  # (V,)
    for t in proposals:
        t.reward, t.reward_parts = config.invalid_reward, {"learnability": 0.0}
    for t, r, p in zip(valid, paid.tolist(), solver_rewards.mean(dim=1).tolist()):
        t.reward, t.reward_parts = r, {"learnability": r}
        t.info["solve_rate"] = p
    advantages = role_advantages(group_rewards(proposals), solver_rewards, config.scale_rewards, config.proposer_weight)  # (K + V, G)
    return Round(proposals, attempts, advantages, time.perf_counter() - t0)


# ----------------------------------------------------------------------------------------------
# The collector: the loop's one step, with play_round where it samples and scores
# ----------------------------------------------------------------------------------------------

# The live figure's six panels (as helpers.live.PANELS: title, y label, [(metric, legend)]).
PANELS = [
    ("held-out solver success", "success rate", [("eval/success", "greedy, fixed held-out set")]),
    ("proposer validity", "fraction", [("proposer/validity", "valid proposals")]),
    ("curriculum: proposed difficulty", "operand digits", [("proposer/difficulty", "mean of valid proposals")]),
    ("rewards", "mean reward", [("success", "solver on proposed tasks"), ("proposer/learnability", "proposer (learnability)")]),
    ("KL to reference", "KL", [("kl", "k3 estimate")]),
    ("step time split", "seconds", [("t_rollout", "rollout"), ("t_reward", "reward"), ("t_update", "update")]),
]


# The console line (as helpers.live.LINE_FIELDS: metric, format).
LINE_FIELDS = [
    ("proposer/validity", "valid {:.2f}"),
    ("proposer/difficulty", "difficulty {:.2f}"),
    ("proposer/learnability", "learnability {:.3f}"),
    ("success", "solver {:.2f}"),
    ("kl", "kl {:.4f}"),
    ("eval/success", "EVAL held-out {:.3f}"),
]


def tenth_means(history: list[dict], key: str) -> tuple[float | None, float | None]:
    """Mean of ``key`` over the first and the last tenth of the training steps (at least one step each)."""
    steps = [m for m in history if m["step"] > 0]
    n = max(1, len(steps) // 10)
    return (_mean(m[key] for m in steps[:n] if m.get(key) is not None),
            _mean(m[key] for m in steps[-n:] if m.get(key) is not None))


@register_collector("selfplay")
class SelfPlayCollector:
    """The training loop's collector for self-play (``config.collect = "selfplay"``): each step is
    one ``play_round`` (propose, check, solve, pay both roles) instead of tasks from a dataset.

    It has no data position to save (the proposals are sampled from the seed of each step), its
    own live panels, and adds ``proposer`` to summary.json: the proposed difficulty and the share of
    valid proposals in the first and the last tenth of the run.
    """

    panels = PANELS
    line_fields = LINE_FIELDS

    def __init__(self, config: SelfPlayConfig, policy, make_env, reward):
        self.config, self.policy, self.make_env, self.reward = config, policy, make_env, reward

    def __call__(self, step: int) -> Collected:
        played = play_round(self.policy, self.make_env, self.reward, self.config, step)
        metrics = played.metrics()
        if not played.attempts:  # no valid proposal: the solver had nothing to attempt, so no signal at all this step
            metrics.update(reward=0.0, all_zero_reward=True)
        return Collected(played.trajectories, played.advantages, metrics, played.t_reward)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def summary(self, history: list[dict]) -> dict:
        (difficulty_first, difficulty_last), (validity_first, validity_last) = (
            tenth_means(history, key) for key in ("proposer/difficulty", "proposer/validity"))
        return {"proposer": dict(difficulty_first_tenth=difficulty_first, difficulty_last_tenth=difficulty_last,
                                 validity_first_tenth=validity_first, validity_last_tenth=validity_last)}
