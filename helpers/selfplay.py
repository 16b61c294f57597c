"""Self-play (自我博弈): one policy proposes tasks and solves them; the curriculum climbs by itself.

Agentic RL needs tasks, not answers; self-play needs not even the tasks. One policy (one
LoRA adapter) plays two roles, told apart only by the prompt:

* the **proposer** (system prompt ``PROPOSER_SYSTEM``) writes a new task in the world's
  grammar, ``<task>A*B</task>``; the env (``helpers.envs.selfplay_env``) checks it and
  computes its answer itself, so no label is needed. An invalid task is never solved;
* the **solver** (the one-call world's prompt, "What is A*B?", with the calculator)
  attempts every valid proposed task G times and is paid by outcome (``correct``).

The proposer is paid for tasks at the edge of the solver's ability. With p the solver's
success rate over its G attempts of a task (Absolute Zero, Zhao et al. 2025):

    r_propose = 1 - p    if 0 < p < 1                                   (learnability)
                0        if p = 0 (never solved) or p = 1 (always solved)
               -0.5      if the task is invalid (``invalid_reward``: Absolute Zero's format penalty)

Worked example, G = 4 attempts per task:

    task        attempts   p      r_propose   why
    12*34       1 1 1 1    1.00   0           always solved: too easy, the solver learns nothing
    47*86       1 1 1 0    0.75   0.25        mostly solved
    123*45      1 0 0 0    0.25   0.75        at the edge: pays most
    987*654     0 0 0 0    0.00   0           never solved: too hard (or impossible), no signal either
    <task>47*   -          -      -0.5        invalid: the env refuses it, the proposer pays a penalty

Each role is then a GRPO group with its own baseline (SPIRAL's role-conditioned
advantages, in their simplest form): the P proposals sampled from one proposer prompt are
one group, the G attempts of one task are another,

    A_propose = (r_propose - mean over the P proposals) / std           (K, P)
    A_solve   = (r_solve   - mean over the task's G attempts) / std     (V, G)

and both go into one ``LoRAGRPO.update``. One baseline for everything would mix two
different reward scales (0/1 outcomes and learnability) and two different questions
(notebook 09 shows what goes wrong).

The proposer's advantages are then multiplied by ``proposer_weight`` (10 in the preset): the
loss averages over tokens (dapo), and the proposer's 16 replies of ~15 tokens are a few per
cent of a batch next to the solver's 128 episodes, so at weight 1 the solver's tokens drown
its signal. The adapter is shared, so the solver's own step stays small (lr 1e-3, and
``beta`` = 0.1 of KL to the warm start): larger steps made the greedy held-out success fall.
How, measured (``--lr 2e-3 --steps 80``, seed 0: greedy 0.797 -> 0.746, while the proposed
difficulty climbed 4.40 -> 4.96): by the end, 8 of the proposer's 16 tasks had a second operand
of three digits starting with 1, and 13 of the 14 held-out tasks the solver lost were
calculator calls that wrote the second operand's first digit as 1 or 2. Both roles write "A*B"
with the same adapter, so what the proposer learns to write, the solver starts to copy: the
price of one adapter for two roles. At lr 1e-3 (the preset; seeds 0 and 1 at 50 steps, seed 0
at 80) greedy loses one task, the same in every run (270*24: the answer 6480 copied as 6460).
The other settings measured do no better (50 steps; greedy after, seed 0, then seed 1 where
run): ``beta`` 0: 0.793; ``beta`` 0.3: 0.793, 0.789; two updates per batch (``num_iterations``
2): 0.789; twice the proposals (``proposer_groups`` 4, 423 s): 0.793, 0.793; a larger solver
step with the proposer's kept (lr 2e-3, ``proposer_weight`` 5): 0.797, 0.789; half the proposer's
weight at the preset's lr (``proposer_weight`` 5): 0.789, 0.793; twice it (20): 0.793. Nor does
the fixed-dataset run lift it (seed 0: 0.797 -> 0.797; seed 1: 0.793, it loses 270*24 too, and
54*446, and wins 619*932): the near-tie flips under plain GRPO as well. At this size, 50 steps
sharpen the sampled answers (pass@1 0.59-0.61 -> 0.64-0.73; at proposer weight 20 only to 0.613),
not the greedy one. Why (notebook 09 §7, 8 samples a task): on the 52 held-out tasks the warm start
gets wrong greedily it succeeds in 0.034 of its samples, and only 17% of them see one success in 8, so their
groups have no spread and carry no gradient; training leaves them at 0.031 (self-play) and 0.038 (fixed), while
on the 204 it gets right the sampled success rises 0.724 -> 0.817 and 0.862. GRPO sharpens what the solver
sometimes gets right; greedy answers change only at near ties. Larger steps do no better for plain GRPO either
(the fixed preset, seeds 0 and 1: lr 3e-3 greedy 0.793, 0.785; lr 5e-3 0.781, 0.781; pass@1 0.707-0.723).

Why a penalty for invalid tasks and not just 0: once most valid tasks are trivial (paid 0),
an invalid one paid 0 is exactly as good, and nothing keeps the proposer in the grammar
(an early run with ``invalid_reward = 0`` had steps where 3 of its 8 proposals were invalid).

    python -m helpers.selfplay build                      # the warm start data/tiny-selfplay/ (~7 min CPU, 1 thread)
    python -m helpers.selfplay baseline                   # held-out success by difficulty, proposer validity
    python -m helpers.train --preset tiny-selfplay        # the self-play run (dispatches to train_selfplay)
    python -m helpers.train --preset tiny-selfplay-fixed  # the same compute on a fixed dataset, for comparison

Simplifications, named:

* The one-call world, one operation: a task is a product of two numbers of 2-3 digits
  (``helpers.envs.selfplay_env``); difficulty is their digits together (4..6). The warm
  start (``BUILD``) was shown more 3-digit operands than the held-out set has, so that its
  solver sometimes solves difficulty 6 (greedy 0.48 on the held-out set): a task it never
  solves pays the proposer nothing, and a curriculum needs a next level that pays.
* P = G (``num_generations``): a proposer group has as many samples as a solver group,
  so both roles' groups stack into one (K + V, G) advantage tensor and one update.
* The proposer prompt never changes (no examples of earlier tasks in it, unlike Absolute
  Zero): what it proposes changes only because its adapter does.
* Proposals are not kept from the held-out tasks (256 of the ~980,000 possible tasks);
  the fixed-dataset run's training split is kept from them by hash, as usual.
* The solver's batch metrics keep the main loop's names (``reward``, ``success``,
  ``tool_calls`` ...), so the health checks read them unchanged; the proposer's are
  ``proposer/...``.

Taught in notebooks/09_self_play.ipynb.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from helpers.config import TrainConfig
from helpers.data import Task, register_dataset
from helpers.envs.selfplay_env import ProposerEnv, difficulty, proposer_task
from helpers.live import LiveCurves
from helpers.paths import ROOT
from helpers.tiny import TINY_DIR, TINY_SYSTEM, split_of

SELFPLAY_DIR = ROOT / "data" / "tiny-selfplay"
SOLVER_DIGITS = {2: 0.5, 3: 0.5}  # share of operands with 2 and 3 digits in solver tasks (held-out set, fixed dataset)


# ----------------------------------------------------------------------------------------------
# 1. Tasks of the solver role
# ----------------------------------------------------------------------------------------------


def solver_task(expression: str, task_id: str | None = None) -> Task:
    """A task of the one-call world's grammar, as the solver sees it ("What is 47*86?")."""
    a, b = (int(x) for x in expression.split("*"))
    prompt = [{"role": "system", "content": TINY_SYSTEM}, {"role": "user", "content": f"What is {expression}?"}]
    return Task(task_id or f"selfplay-{expression}", prompt, str(a * b), {"expression": expression, "difficulty": difficulty(expression)})


def draw_expression(rng: random.Random, digit_weights: dict[int, float] = SOLVER_DIGITS) -> str:
    """``"A*B"`` with each operand's number of digits drawn from ``digit_weights`` (digits -> weight)."""
    a_digits, b_digits = rng.choices(list(digit_weights), weights=list(digit_weights.values()), k=2)
    a, b = (rng.randint(10 ** (d - 1), 10**d - 1) for d in (a_digits, b_digits))
    return f"{a}*{b}"


def make_selfplay_tasks(n: int, seed: int = 0, split: str = "test", digit_weights: dict[int, float] = SOLVER_DIGITS) -> list[Task]:
    """``n`` distinct solver tasks of one split (the tiny world's hash split), difficulty 4..6."""
    rng = random.Random(f"selfplay-{seed}-{split}")
    tasks, seen = [], set()
    while len(tasks) < n:
        expression = draw_expression(rng, digit_weights)
        if expression not in seen and split_of(expression) == split:
            seen.add(expression)
            tasks.append(solver_task(expression, f"selfplay-{split}-{expression}"))
    return tasks


@register_dataset("selfplay")
def selfplay_dataset(split: str, n: int | None, seed: int) -> list[Task]:
    """The self-play world's fixed tasks: ``test`` is the held-out set the solver is measured on
    (256 tasks: one task is 0.004 of its success rate); ``train`` (2,000) is what the fixed-dataset
    comparison run trains on."""
    return make_selfplay_tasks(n if n is not None else (2000 if split == "train" else 256), seed=seed, split=split)


# ----------------------------------------------------------------------------------------------
# 2. The proposer's reward and the per-role advantages
# ----------------------------------------------------------------------------------------------


def learnability(solver_rewards):
    """The proposer's reward for each task from the solver's G attempts at it (Absolute Zero):

        p = mean of the G outcomes;   r = 1 - p  if 0 < p < 1,  else 0

    solver_rewards: (V, G) tensor of 0/1 outcomes, one row per valid proposed task.
    returns:        (V,) rewards. Tasks always solved (too easy) and never solved (too hard,
                    or wrong) both earn 0: neither gives the solver anything to learn from.

    >>> learnability(torch.tensor([[1., 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]))
    tensor([0.0000, 0.2500, 0.7500, 0.0000])
    """
    import torch

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
    import torch

    from helpers.grpo import Advantages, group_advantages

    proposer = group_advantages(proposer_rewards, scale_rewards)  # (K, G)
    proposer = Advantages(proposer.advantages * proposer_weight, proposer.zero_spread)
    if solver_rewards.size(0) == 0:
        return proposer
    solver = group_advantages(solver_rewards, scale_rewards)  # (V, G)
    return Advantages(torch.cat([proposer.advantages, solver.advantages]), torch.cat([proposer.zero_spread, solver.zero_spread]))


# ----------------------------------------------------------------------------------------------
# 3. One round of self-play: propose, check, solve, pay both roles
# ----------------------------------------------------------------------------------------------


@dataclass
class SelfPlayConfig(TrainConfig):
    # --- self-play (the fields above are the main loop's, with the same meanings) ---------------
    loop: str = "selfplay"  # helpers.train.train hands a config with this field to train_selfplay
    proposer_groups: int = 2  # K: proposer prompts per step, each sampled num_generations (P = G) times
    invalid_reward: float = -0.5  # an invalid task's reward: below a trivial task's 0, or nothing keeps the proposer in the grammar
    max_proposal_tokens: int = 24  # "<task>123*456</task>" is ~16 tokens; a proposal that runs on is cut (invalid)
    proposer_temperature: float = 1.0  # the proposer's sampling temperature (``temperature`` is the solver's)
    proposer_weight: float = 1.0  # multiplies the proposer's advantages: its ~15-token replies are a few % of the batch's tokens


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
        from helpers.evaluate import episode_stats
        from helpers.rewards import reward_report

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

    make_solver_env: a fresh solver env per episode (``helpers.train.env_factory(config)``)
    reward:          the solver's reward (``helpers.rewards.combine(config.rewards)``)
    step:            names the tasks and, with ``config.seed``, seeds the sampling

    Taught in notebooks/09_self_play.ipynb §3.
    """
    import torch

    from helpers.grpo import group_rewards
    from helpers.policy import SamplingParams
    from helpers.rewards import score_trajectories
    from helpers.rollout import rollout
    from helpers.train import step_seed

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
# 4. The loop: the main trainer's parts, with play_round where it samples and scores
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


def train_selfplay(config: SelfPlayConfig, preset_name: str | None = None, live=None):
    """Self-play GRPO as ``config`` says; returns a ``helpers.train.RunResult`` like the main loop.

    The run folder is the main loop's (``helpers.train``: config.json, metrics.jsonl, eval/,
    trajectories/ with the proposals and the attempts, checkpoints, curves.png, summary.json);
    summary.json adds ``proposer``: difficulty and validity in the first and last tenth of the run.
    Resume is the main loop's too: every step's sampling is seeded by (seed, step).

    Taught in notebooks/09_self_play.ipynb §4.
    """
    import torch

    from helpers.data import load_dataset, write_jsonl
    from helpers.evaluate import evaluate, save_records
    from helpers.grpo import LoRAGRPO, collate, latest_checkpoint
    from helpers.live import Reporters
    from helpers.pitfalls import HEALTH_KINDS, check_health
    from helpers.policy import load_model, make_policy, resolve_device
    from helpers.rewards import combine
    from helpers.rollout import save_trajectories
    from helpers.train import (EVAL_DIR, EVAL_SEED, TRAJECTORY_DIR, RunResult, clear_run_dir, env_factory, run_dir_for,
                               save_checkpoint, seed_everything, step_seed)

    started, cpu_started = time.perf_counter(), time.process_time()
    config = replace(config, device=resolve_device(config.device))
    run_dir = run_dir_for(config, preset_name)
    checkpoint = latest_checkpoint(run_dir) if config.resume and run_dir.exists() else None
    if checkpoint is None:
        clear_run_dir(run_dir)
    for folder in (TRAJECTORY_DIR, EVAL_DIR):
        (run_dir / folder).mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps({"preset": preset_name, **asdict(config)}, indent=2))
    seed_everything(config.seed)

    held_out = load_dataset(config.dataset, "test", config.eval_tasks, seed=EVAL_SEED)  # fixed: the same for every seed
    make_solver_env, reward = env_factory(config), combine(config.rewards)
    model, tokenizer = load_model(config)
    trainer = LoRAGRPO(model, config)
    policy = make_policy(config, trainer.model, tokenizer)
    live = live if live is not None else LiveCurves(run_dir, total_steps=config.steps, panels=PANELS, line_fields=LINE_FIELDS)
    reporters = Reporters(config.report_to, run_dir, config)
    history, warned = [], []

    def held_out_success(step: int) -> dict:
        t0 = time.perf_counter()
        result = evaluate(policy, held_out, make_solver_env, k=config.pass_k if step in (0, config.steps) else 0,
                          temperature=config.temperature, max_new_tokens=config.max_new_tokens, seed=config.seed,
                          max_steps=config.env_max_steps, max_total_tokens=config.max_total_tokens)
        save_records(run_dir / EVAL_DIR / f"step-{step:04d}.jsonl", result.records)
        return {**{f"eval/{k}": v for k, v in result.metrics.items()}, "t_eval": time.perf_counter() - t0}

    def log(metrics: dict) -> None:
        history.append(metrics)
        write_jsonl(run_dir / "metrics.jsonl", [metrics], mode="a")
        reporters.log({k: v for k, v in metrics.items() if v is not None})
        live.update(metrics["step"], metrics)

    if checkpoint is not None:
        extra = trainer.load_checkpoint(checkpoint)
        history, warned = extra["history"], extra["warnings"]
        write_jsonl(run_dir / "metrics.jsonl", history)
        for metrics in history:
            live.record(metrics["step"], metrics)
        print(f"resumed from {checkpoint.relative_to(run_dir.parent)} at step {trainer.step}")
    else:
        log({"step": 0, **held_out_success(0)})

    for step in range(trainer.step + 1, config.steps + 1):
        seed_everything(step_seed(config.seed, step))
        t0 = time.perf_counter()
        played = play_round(policy, make_solver_env, reward, config, step)  # propose -> check -> solve -> pay
        t1 = time.perf_counter()
        batch = collate(played.trajectories, played.advantages, config.skip_zero_spread, config.mask_truncated_completions)
        stats = trainer.update(batch)
        if "kl" not in stats and config.log_kl:
            stats["kl"] = trainer.sampled_kl(batch)
        policy.sync(trainer.model)
        metrics = {"step": step, **played.metrics(), **stats, "t_rollout": t1 - t0 - played.t_reward, "t_reward": played.t_reward,
                   "t_update": time.perf_counter() - t1}
        if config.log_trajectories_every > 0 and step % config.log_trajectories_every == 0:
            save_trajectories(run_dir / TRAJECTORY_DIR / f"step-{step:04d}.jsonl", played.trajectories)
        if step == config.steps or (config.eval_every > 0 and step % config.eval_every == 0):
            metrics.update(held_out_success(step))
        found = (check_health(history + [metrics]) if "reward" in metrics  # the main loop's health checks, counted as warn/<kind>
                 else [("all_zero_reward", "no valid proposal this step: the solver had nothing to attempt")])
        metrics.update({f"warn/{kind}": history[-1].get(f"warn/{kind}", 0) + sum(k == kind for k, _ in found) for kind in HEALTH_KINDS})
        warned += [f"step {step}: {message}" for _, message in found]
        print(*(f"WARNING step {step}: {message}" for _, message in found), sep="\n", end="\n" if found else "", flush=True)
        log(metrics)
        if (config.save_every > 0 and step % config.save_every == 0) or step == config.steps:
            save_checkpoint(trainer, run_dir, step, {"history": history, "warnings": warned})

    before, after = ({k[len("eval/"):]: v for k, v in m.items() if k.startswith("eval/")} for m in (history[0], history[-1]))
    result = RunResult(run_dir, config, before, after, history, warned,
                       time.perf_counter() - started, time.process_time() - cpu_started)
    live.save(run_dir / "curves.png")
    reporters.close()
    (difficulty_first, difficulty_last), (validity_first, validity_last) = (tenth_means(history, key) for key in
                                                                            ("proposer/difficulty", "proposer/validity"))
    proposer = dict(difficulty_first_tenth=difficulty_first, difficulty_last_tenth=difficulty_last,
                    validity_first_tenth=validity_first, validity_last_tenth=validity_last)
    (run_dir / "summary.json").write_text(json.dumps(
        {"preset": preset_name, "before": before, "after": after, "proposer": proposer, "wall_s": result.wall_s,
         "cpu_s": result.cpu_s, "warnings": warned, "torch_threads": torch.get_num_threads()}, indent=2, default=str))
    shown = {key: "-" if value is None else f"{value:.2f}" for key, value in proposer.items()}  # None: no valid proposal then
    print(result.line() + f" | proposed difficulty {shown['difficulty_first_tenth']} -> {shown['difficulty_last_tenth']}"
          f" | validity {shown['validity_first_tenth']} -> {shown['validity_last_tenth']}", flush=True)
    return result


# ----------------------------------------------------------------------------------------------
# 5. The warm start: SFT on both roles, from the one-call world's model
# ----------------------------------------------------------------------------------------------

BUILD = dict(  # the recipe of data/tiny-selfplay; `python -m helpers.selfplay build` runs exactly this
    seed=0,
    solver_demos=4000,  # solver conversations on the train split
    solver_digits={2: 0.4, 3: 0.6},  # their operands' digits (digits -> share): more 3-digit ones than the held-out set's 0.5
    tool_fraction=0.9,  # share of solver demonstrations calling the calculator; the rest answer "in the head"
    proposer_demos=1500,  # proposer conversations: "<task>A*B</task>"
    proposer_digits={2: 0.8, 3: 0.2},  # mostly easy tasks (difficulty 4.4 on average), a few longer ones
    steps=2000,  # SFT steps, starting from data/tiny (it already calls the calculator on 2-digit tasks)
    batch_size=16,
    lr=3e-3,
    decay_fraction=0.3,
)


def demonstrations(recipe: dict) -> tuple[list[list[dict]], list[list[dict]]]:
    """(solver conversations, proposer conversations) of the warm start, drawn from ``recipe["seed"]``."""
    from helpers.tiny import demonstration

    rng = random.Random(recipe["seed"])
    solver_digits, proposer_digits = ({int(d): w for d, w in recipe[key].items()} for key in ("solver_digits", "proposer_digits"))
    solver = [demonstration(task, use_tool=rng.random() < recipe["tool_fraction"])
              for task in make_selfplay_tasks(recipe["solver_demos"], recipe["seed"], "train", solver_digits)]
    proposer = []
    while len(proposer) < recipe["proposer_demos"]:
        expression = draw_expression(rng, proposer_digits)
        if split_of(expression) == "train":  # the proposer is shown training tasks only
            proposer.append(proposer_task().prompt + [{"role": "assistant", "content": f"<task>{expression}</task>"}])
    return solver, proposer


def build(out: str | Path = SELFPLAY_DIR, progress: bool = True, **overrides) -> dict:
    """Rebuild data/tiny-selfplay from data/tiny and the seed: SFT on both roles, save, measure."""
    import torch

    from helpers.sft import encode_conversations, train_sft
    from helpers.tiny import calculator_tools, load_tiny, save_tiny, start_build

    recipe, started, cpu_started, threads = start_build(BUILD, overrides)  # one seeded thread: BUILD sets no "threads"
    model, tokenizer = load_tiny(TINY_DIR)  # the one-call world's model and tokenizer (byte level: the proposer's text encodes)
    solver, proposer = demonstrations(recipe)
    examples = encode_conversations(tokenizer, solver, calculator_tools()) + encode_conversations(tokenizer, proposer, None)
    losses = train_sft(model, examples, recipe["steps"], recipe["batch_size"], lr=recipe["lr"], seed=recipe["seed"],
                       decay_fraction=recipe["decay_fraction"], pad_id=tokenizer.pad_token_id, progress=progress)
    save_tiny(model, tokenizer, out)
    result = {**baseline(model, tokenizer), "recipe": recipe,
              "sft_loss_every_50_steps": [round(sum(losses[i : i + 50]) / len(losses[i : i + 50]), 3) for i in range(0, len(losses), 50)],
              "build_wall_s": round(time.perf_counter() - started, 1), "build_cpu_s": round(time.process_time() - cpu_started, 1)}
    torch.set_num_threads(threads)
    (Path(out) / "baseline.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def success_by_difficulty(records: list[dict]) -> dict[int, float]:
    """Held-out success per difficulty, from evaluation records (a task id ends in its expression)."""
    rows: dict[int, list[bool]] = {}
    for record in records:
        rows.setdefault(difficulty(record["task_id"].rsplit("-", 1)[1]), []).append(record["correct"])
    return {d: round(sum(v) / len(v), 3) for d, v in sorted(rows.items())}


def baseline(model, tokenizer, proposals: int = 64) -> dict:
    """The warm start, measured: greedy held-out success (overall and by difficulty) and, at T = 1,
    the share of valid proposals and their mean difficulty."""
    from helpers.evaluate import evaluate
    from helpers.policy.base import SamplingParams
    from helpers.policy.hf import HFPolicy
    from helpers.rollout import rollout

    policy = HFPolicy(model, tokenizer)
    held_out = evaluate(policy, selfplay_dataset("test", None, 0), "calculator", max_new_tokens=48, max_steps=4, max_total_tokens=192)
    proposed = rollout([proposer_task()], ProposerEnv, policy, group_size=proposals, progress=False,
                       sampling=SamplingParams(max_new_tokens=24, temperature=1.0, seed=0), max_steps=1, max_total_tokens=192)
    valid = [t.info for t in proposed if t.info.get("valid")]
    return dict(held_out_greedy_success=held_out.metrics["success"], held_out_by_difficulty=success_by_difficulty(held_out.records),
                proposer_validity=len(valid) / proposals, proposer_difficulty=_mean(v["difficulty"] for v in valid),
                parameters=sum(p.numel() for p in model.parameters()))


def main(argv: list[str] | None = None) -> None:
    import argparse

    from helpers.tiny import load_tiny

    parser = argparse.ArgumentParser(prog="python -m helpers.selfplay", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["build", "baseline"], help="build: rebuild data/tiny-selfplay; baseline: measure it "
                        "(train: python -m helpers.train --preset tiny-selfplay)")
    parser.add_argument("--out", default=str(SELFPLAY_DIR), help="folder to write (build) or read (baseline)")
    parser.add_argument("--steps", type=int, default=BUILD["steps"], help="SFT steps (build)")
    args = parser.parse_args(argv)
    result = build(args.out, steps=args.steps) if args.command == "build" else baseline(*load_tiny(args.out))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
