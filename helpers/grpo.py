"""Trainer module (训练模块): LoRA-GRPO, from the formula to an optimizer step.

GRPO (Shao et al. 2024, DeepSeekMath) is PPO without the value network. For each
task we sample a *group* of G answers, score them, and use the group itself as the
baseline:

    A_i = (r_i - mean(r_1..r_G)) / (std(r_1..r_G) + eps)                  (advantage)

Every generated token t of answer i then gets the clipped surrogate of PPO,

    ratio_t = pi_theta(o_t | ...) / pi_old(o_t | ...)
    L_t     = -min(ratio_t * A_i, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A_i) + beta * KL_t

with the k3 estimator of KL(pi_theta || pi_ref) per token,
``KL_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1`` (always >= 0). The per-token
losses are then averaged in one of three ways, named as in TRL so that numbers compare:

    grpo     mean over each sequence's tokens, then mean over sequences
    dr_grpo  sum over all tokens / (num sequences * max_completion_length)   (Dr. GRPO, with scale_rewards="none")
    dapo     sum over all tokens / number of tokens in the whole batch        (DAPO; TRL's default)

The code follows TRL 1.16's ``GRPOTrainer`` (``_compute_loss`` and the advantage part
of ``_generate_and_score_completions``); ``helpers.ecosystem.trl_bridge.compare_with_trl`` feeds the
same batch to both (single-turn, and multi-turn with the tool's tokens masked out) and
``tests/test_grpo_trl.py`` checks that the losses and gradients agree (``tests/test_is_correction.py``
the same with vLLM's importance-sampling correction on). The sections below are the arrows of
one step: rewards -> advantages (1) -> log-probs (2) -> loss (3), the correction when another
engine sampled (3b), with the batch of padded tensors (4) and the trainer that owns the
optimizer (5) around them.

One outcome reward per episode, one advantage per episode: under GRPO every policy token
of a multi-turn episode (its tool calls and its final answer alike) shares the episode's
advantage, and tool / env tokens (mask 0) get none. ``advantage="gigpo"`` (section 1b)
adds turn-level credit without a critic: GiGPO's step groups, turns of the same task that
start from the same state, each judged against the others. Value functions per turn
(ArCHer) and process rewards are not implemented.

Simplifications (named, so nothing is hidden):
- The "old" policy of the ratio is the *sampling* policy, ``Trajectory.logprobs`` as the
  rollout backend recorded them, when that backend is the trained model itself (transformers,
  or the workbook's engine: a fresh forward pass gives the same numbers up to float noise, within
  1e-5 on CPU). When vLLM samples, the trainer recomputes pi_old and weights the policy loss by TRL's
  importance-sampling correction (section 3b; default mode sequence_mask), as TRL does by default.
- Only token-level importance sampling (TRL's default), no sequence-level (GSPO) ratios,
  no entropy masks or bonuses, no two-sided ``delta`` clip.
- The reference policy is the base model: the same peft model with the adapter switched
  off (``with model.disable_adapter():``). There is never a second model in memory.
- One process, one device: no distributed gathers.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.checkpoint import checkpoint

from helpers.checkpoint import read_checkpoint, write_checkpoint
from helpers.config import IS_MODES, TrainConfig  # noqa: F401  (IS_MODES: the modes of section 3b, for its callers)
from helpers.envs.anchors import Anchor, anchor_for, tool_history
from helpers.envs.base import TRUNCATED
from helpers.policy import quiet_peft
from helpers.rollout import Trajectory



# ----------------------------------------------------------------------------------------------
# 1. Advantages: the group is its own baseline
# ----------------------------------------------------------------------------------------------


@dataclass
class Advantages:
    advantages: torch.Tensor  # (B, G) one number per sampled answer, broadcast to all its tokens
    zero_spread: torch.Tensor  # (B,) bool: all G rewards equal, so the group carries no signal
    # Turn-level methods (GiGPO, section 1b): [b][g] -> (K,) one number per turn of that episode, which
    # ``collate`` spreads over the turn's generated tokens. None: every turn takes the episode's number.
    turn_advantages: list[list[torch.Tensor]] | None = None


def group_advantages(rewards: torch.Tensor, scale_rewards: str = "group", eps: float = 1e-4) -> Advantages:
    """Group-relative advantages, exactly as TRL 1.16 computes them.

    rewards: (B, G): B tasks, G sampled answers each.
    scale_rewards:
      "group"  (r - group mean) / (group std + eps)          the original GRPO
      "batch"  (r - group mean) / (std of all B*G rewards + eps)
      "none"   r - group mean                                 Dr. GRPO: no std division, so easy or
                                                              hopeless groups are not up-weighted
    The std is the unbiased one (Bessel's correction), as in TRL. A group is reported as
    zero-spread when its std is (close to) 0: every answer got the same reward, the
    advantages are all 0, and the group only costs compute.

    Taught in notebooks/05_trainer.ipynb §3 and 04_reward.ipynb §4.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape (B, G), got {tuple(rewards.shape)}")
    rewards = rewards.float()
    G = rewards.size(1)
    mean = rewards.mean(dim=1, keepdim=True)  # (B, 1)
    group_std = rewards.std(dim=1, keepdim=True) if G > 1 else torch.zeros_like(mean)  # (B, 1)
    advantages = rewards - mean  # (B, G)
    if scale_rewards == "group":
        advantages = advantages / (group_std + eps)
    elif scale_rewards == "batch":
        batch_std = rewards.std() if rewards.numel() > 1 else torch.zeros(())
        advantages = advantages / (batch_std + eps)
    zero_spread = torch.isclose(group_std, torch.zeros_like(group_std)).squeeze(1)  # (B,)
    return Advantages(advantages, zero_spread)


def group_trajectories(trajectories) -> list[list]:
    """Trajectories grouped by task, in order of first appearance; every group must have the same size G."""
    groups: dict[str, list] = {}
    for traj in trajectories:
        groups.setdefault(traj.task_id, []).append(traj)
    sizes = {len(g) for g in groups.values()}
    if len(sizes) != 1:
        raise ValueError(f"every task needs the same number of samples G, got group sizes {sorted(sizes)}")
    return list(groups.values())


def group_rewards(trajectories) -> torch.Tensor:
    """The scored trajectories' rewards as a (B, G) tensor: one row per task, in order of first appearance."""
    return torch.tensor([[t.reward for t in g] for g in group_trajectories(trajectories)], dtype=torch.float32)


# ----------------------------------------------------------------------------------------------
# 1b. Turn-level credit: GiGPO's groups inside the group
# ----------------------------------------------------------------------------------------------
#
# GRPO asks one question per episode: was it better than the other G - 1? GiGPO (Feng et al. 2025,
# Group-in-Group Policy Optimization, arXiv 2505.10978) asks a second one per turn. The G episodes of
# a task start from the same prompt, and a deterministic world returns the same tool results to the
# same calls, so several episodes often pass through exactly the same state: an *anchor state*. The
# turns taken from one anchor state form a *step group*, and each turn is judged against the others
# in its step group by its discounted return (the reward comes at the end, K turns in all):
#
#     A_E(i)   = (R_i - mean_j R_j) / F                       episode level: GRPO's advantage, above
#     R_i,k    = gamma^(K_i - 1 - k) * R_i                     the return of turn k (reward only at the end)
#     A_S(i,k) = (R_i,k - mean R_step group) / F               step level: within the turn's step group
#     A(i,k)   = A_E(i) + omega * A_S(i,k)                     on every generated token of turn k
#
# F is the std of the group in question, the episode group for A_E and the step group for A_S
# (scale_rewards="group", verl-agent's mode "mean_std_norm"), or 1 ("none", its "mean_norm");
# a step group of one turn has nothing to compare with: A_S = 0.
#
# Worked example (the test tests/test_gigpo.py computes it by hand): one task, G = 3, gamma = 0.5,
# omega = 1, F = 1. Episode 0 calls usual(), lookup(cake), calculator(...) and answers right (R = 1,
# K = 4); episode 1 calls usual(), lookup(cake) and then guesses the bill (R = 0, K = 3); episode 2
# calls lookup(key) and answers (R = 0, K = 2).
#
#     A_E = (+2/3, -1/3, -1/3)                                 mean R = 1/3
#     step group "the prompt"            turns (0,0) (1,0) (2,0)  returns 1/8, 0, 0  A_S = +1/12, -1/24, -1/24
#     step group "prompt + usual()"      turns (0,1) (1,1)        returns 1/4, 0     A_S = +1/8, -1/8
#     step group "... + lookup(cake)"    turns (0,2) (1,2)        returns 1/2, 0     A_S = +1/4, -1/4
#     turns (0,3) and (2,1)              alone in their step groups                 A_S = 0
#
# Episode 1's turns get -1/3 - 1/24, -1/3 - 1/8, -1/3 - 1/4: the guess (its last turn) takes the most
# blame, where GRPO gave all three -1/3. Two remarks. The step advantages of a step group sum to 0,
# so where two episodes took the *same* action from the same state the step level adds nothing on
# balance: it only separates different actions from one state. And with gamma < 1 the first turn's
# step group (the whole group, from the prompt) prefers the shorter of two successes.
#
# The anchor state is the *environment's* state before the turn, as the world defines it
# (``helpers.envs.anchors``): by default the tool calls so far in canonical form with their results,
# so two episodes that made the same calls in other words (spacing, key order, another tokenisation)
# share a step group; a world with a smaller state (the trail: the room the agent is in) groups every turn
# taken from that state, however the episode got there. ``compute_advantages`` passes the config's
# env (each task's own in a mix); the conversation's tokens would split a group on any difference in wording.
#
# Named simplifications, against verl-agent's gigpo/core_gigpo.py (the reference implementation):
# - the reward comes once, at the end (the outcome reward; the env's step rewards are not used),
#   so a turn's return is the discounted final reward;
# - the episode level is GRPO's ``group_advantages`` over episodes (the paper's Eq. 3); verl-agent's
#   default computes its mean and std over the group's *turns* (each episode counted K times);
# - exact matching only (verl-agent can also cluster similar text observations);
# - the discount counts turns (K_i - 1 - k), as verl-agent's; a step that does not change the state
#   (an error message) is a turn like any other.
# - ``scale_rewards="batch"`` has no step-level meaning here and is refused.


def turn_spans(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of generated tokens (mask 1) of an episode: one span per assistant turn."""
    spans, start = [], None
    for t, m in enumerate([*mask, 0]):
        if m and start is None:
            start = t
        elif not m and start is not None:
            spans.append((start, t))
            start = None
    return spans


def history_before(traj: Trajectory, turn: int) -> list[dict]:
    """The messages of an episode before its ``turn``-th assistant turn (0-based): what an anchor reads."""
    starts = [i for i, m in enumerate(traj.messages) if m["role"] == "assistant"]
    if turn >= len(starts):
        raise ValueError(f"episode {traj.task_id}#{traj.group} has {len(starts)} assistant messages but turn {turn}: "
                         "an anchor reads the episode's messages (Trajectory.messages)")
    return traj.messages[: starts[turn]]


def turn_returns(traj: Trajectory, gamma: float) -> list[float]:
    """The discounted return of each turn when the reward comes at the end: gamma^(K - 1 - k) * R."""
    K = len(turn_spans(traj.mask))
    return [gamma ** (K - 1 - k) * traj.reward for k in range(K)]


@dataclass
class StepGroup:
    """The turns of one task's episodes that start from one anchor state."""

    row: int  # the task's row b in the (B, G) advantages
    task_id: str
    turn: int  # the turn index of its first member (others may reach the state sooner or later)
    members: list[tuple[int, int]]  # (sample g, turn k) of each member
    returns: list[float]  # each member's discounted return

    @property
    def nontrivial(self) -> bool:
        """Two members or more with different returns: the step level has something to say."""
        return len(self.returns) > 1 and max(self.returns) - min(self.returns) > 1e-9

    def advantages(self, scale_rewards: str = "group", eps: float = 1e-4) -> torch.Tensor:
        """A_S of each member (members,): its return against the step group's mean (/ std with "group"); 0 alone."""
        returns = torch.tensor(self.returns, dtype=torch.float32)  # (members,)
        if len(self.returns) < 2:
            return torch.zeros_like(returns)
        step = returns - returns.mean()
        return step / (returns.std() + eps) if scale_rewards == "group" else step


def step_groups(trajectories, gamma: float, anchor: Anchor | str = tool_history) -> list[StepGroup]:
    """Every step group of a scored batch, task by task (``group_trajectories``' order), in order of
    first appearance. ``anchor(history) -> hashable``: the env's state after the messages ``history``
    (``helpers.envs.anchors``); or an env's name: then each task's own environment's registered anchor
    (``Task.environment``, TRL's environment column, in a mix of worlds), this env's for a task that names none."""
    out = []
    for b, group in enumerate(group_trajectories(trajectories)):
        found: dict = {}
        state = anchor_for(group[0].task.environment or anchor) if isinstance(anchor, str) else anchor
        for g, traj in enumerate(group):
            returns = turn_returns(traj, gamma)
            for k in range(len(returns)):
                key = state(history_before(traj, k))
                if key not in found:
                    found[key] = StepGroup(b, traj.task_id, k, [], [])
                found[key].members.append((g, k))
                found[key].returns.append(returns[k])
        out.extend(found.values())
    return out


def gigpo_advantages(trajectories, gamma: float = 0.95, step_advantage_w: float = 1.0, scale_rewards: str = "group",
                     eps: float = 1e-4, anchor: Anchor | str = tool_history) -> Advantages:
    """GiGPO's advantages: GRPO's episode advantage plus omega times the step-group advantage, per turn.

    trajectories: scored, G per task (as ``group_advantages``). Returns ``Advantages`` with the episode
    level in ``advantages`` (B, G) and ``turn_advantages[b][g]`` (K,), what the loss uses. A group is
    zero-spread when every turn advantage in it is 0 (all rewards 0, say): it teaches nothing.

    Taught in notebooks/06b_turn_credit.ipynb §1-2.
    """
    if scale_rewards not in ("group", "none"):
        raise ValueError(f"gigpo normalises each step group by its std ('group') or not at all ('none'), got {scale_rewards!r}")
    groups = group_trajectories(trajectories)
    episode = group_advantages(group_rewards(trajectories), scale_rewards, eps)  # (B, G)
    turns = [[episode.advantages[b, g].repeat(len(turn_spans(t.mask))) for g, t in enumerate(group)]
             for b, group in enumerate(groups)]  # [b][g] -> (K,): A_E on every turn, to start with
    for sg in step_groups(trajectories, gamma, anchor):
        for (g, k), a in zip(sg.members, sg.advantages(scale_rewards, eps)):
            turns[sg.row][g][k] += step_advantage_w * a
    zero_spread = torch.tensor([all(bool(torch.isclose(a, torch.zeros_like(a)).all()) for a in row) for row in turns])  # (B,)
    return Advantages(episode.advantages, zero_spread, turns)


def step_group_metrics(groups: list[StepGroup]) -> dict[str, float]:
    """What the step groups of one batch offered (logged every step, whatever the advantage):

    step_groups/size_mean               turns per step group (1 = every history unique)
    step_groups/turns_nontrivial        share of turns in a non-trivial step group (>= 2 members, different returns)
    step_groups/later_turns_nontrivial  the same for turns after the first (the first turn's step group is the
                                        episode group itself, from the prompt)
    """
    turns = [(sg.turn, sg.nontrivial) for sg in groups for _ in sg.members]
    later = [nontrivial for turn, nontrivial in turns if turn > 0]
    return {
        "step_groups/size_mean": len(turns) / max(len(groups), 1),
        "step_groups/turns_nontrivial": sum(n for _, n in turns) / max(len(turns), 1),
        "step_groups/later_turns_nontrivial": sum(later) / max(len(later), 1),
    }


def compute_advantages(trajectories, config: TrainConfig) -> Advantages:
    """The config's advantage (``config.advantage``) on scored trajectories: GRPO's per episode, or GiGPO's per turn,
    with the step groups keyed on the state each task's env says it is in (``step_groups``)."""
    if config.advantage == "gigpo":
        return gigpo_advantages(trajectories, config.gamma, config.step_advantage_w, config.scale_rewards, anchor=config.env)
    return group_advantages(group_rewards(trajectories), config.scale_rewards)


# ----------------------------------------------------------------------------------------------
# 2. Token log-probs, in chunks
# ----------------------------------------------------------------------------------------------


def _chunk_logprobs(hidden: torch.Tensor, targets: torch.Tensor, lm_head: torch.nn.Module, temperature: float):
    """log p(target) and the entropy for a chunk of positions.   hidden (C, H), targets (C,)"""
    logits = lm_head(hidden).float() / temperature  # (C, V): the only full-vocabulary tensor, one chunk at a time
    logp_all = torch.log_softmax(logits, dim=-1)  # (C, V)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (C,)
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # (C,)
    return logp, entropy.detach()


def token_logprobs(
    model, input_ids: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0, chunk_size: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob (and entropy) of each token of ``input_ids`` under ``model``, where ``mask == 1``.

    input_ids: (N, T) whole episodes, right-padded. Right padding needs no attention mask:
               under the causal mask a real token never looks at the pads after it.
    mask:      (N, T) 1 on tokens the policy generated (position 0 never is).
    returns:   logps (N, T) and entropies (N, T), 0 where mask == 0.

    The backbone runs once over every position (attention needs the whole context),
    but the LM head, the (hidden -> vocabulary) projection, runs only on the M positions
    that predict a generated token: ``chunk_size`` positions per chunk, each projected to
    the whole vocabulary, a (chunk_size, V) block of logits. Each chunk is wrapped in
    activation checkpointing, so its logits are freed right away and recomputed one chunk
    at a time in the backward pass: the (N, T, V) logits of the whole batch never exist.
    (TRL does the same with a fused kernel.)

    Taught in notebooks/05_trainer.ipynb §3-4.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wrapper -> transformers model
    hidden = base.get_decoder()(input_ids=input_ids, use_cache=False).last_hidden_state  # (N, T, H)
    predicts = mask[:, 1:].bool()  # (N, T-1): hidden state t predicts token t+1
    h = hidden[:, :-1][predicts]  # (M, H)
    targets = input_ids[:, 1:][predicts]  # (M,)
    lm_head = base.get_output_embeddings()  # a LoRA-wrapped head works too: we call the module
    logps, entropies = [], []
    for start in range(0, h.size(0), chunk_size):
        lp, ent = checkpoint(
            _chunk_logprobs, h[start : start + chunk_size], targets[start : start + chunk_size], lm_head, temperature,
            use_reentrant=False,
        )
        logps.append(lp)
        entropies.append(ent)
    logps = torch.cat(logps) if logps else h.new_zeros(0)  # (M,)
    entropies = torch.cat(entropies) if entropies else h.new_zeros(0)  # (M,)
    # Scatter back to (N, T); masked_scatter keeps the graph even when M == 0.
    full_mask = torch.zeros_like(mask, dtype=torch.bool)
    full_mask[:, 1:] = predicts
    out_logps = torch.zeros(mask.shape, dtype=logps.dtype, device=logps.device).masked_scatter(full_mask, logps)
    out_ent = torch.zeros(mask.shape, dtype=logps.dtype, device=logps.device).masked_scatter(full_mask, entropies)
    return out_logps, out_ent


# ----------------------------------------------------------------------------------------------
# 3. The loss
# ----------------------------------------------------------------------------------------------


def grpo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logps: torch.Tensor | None = None,
    *,
    loss_type: str = "dapo",
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.28,
    beta: float = 0.0,
    max_completion_length: int | None = None,
    num_items: float | None = None,
    grad_accum: int = 1,
    kl_ratio_correction: bool = True,
    importance_sampling_ratio: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO loss of one micro-batch, normalised as TRL normalises it.

    logps, old_logps, ref_logps, mask: (N, T), token-aligned (entry t belongs to token t).
    advantages: (N,), one per sequence, or (N, T), one per token (a turn-level method's, ``Batch.token_advantages``).
    max_completion_length: the dr_grpo constant denominator (required for dr_grpo).
    num_items: dapo's denominator, the number of mask tokens in the *whole* batch across
        all micro-batches (default: this micro-batch's), so that the accumulated gradient
        is a true per-token mean.
    grad_accum: number of micro-batches; grpo and dr_grpo divide by it, as TRL does.
    kl_ratio_correction: multiply the KL term by the ratio (TRL's ``use_bias_correction_kl``, from
        the DeepSeek-V3.2 paper; True by default in TRL 1.16's GRPOConfig, as here): the tokens
        were sampled from the old policy, and the ratio makes the KL gradient the unbiased
        reverse-KL gradient.
    importance_sampling_ratio: (N, T) or (N, 1), the weights of section 3b
        (``importance_sampling_ratio``) when another engine sampled: they multiply each token's
        policy loss, not its KL term, as in TRL. None: no correction.

    Taught in notebooks/05_trainer.ipynb §2-3.
    """
    if beta != 0.0 and ref_logps is None:
        raise ValueError("beta > 0 needs ref_logps (the reference policy's token log-probs)")
    mask = mask.to(logps.dtype)  # (N, T)
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages  # (N, 1): shared by a sequence's tokens; or (N, T)

    ratio = torch.exp(logps - old_logps)  # (N, T)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)  # (N, T)
    per_token = -torch.min(ratio * adv, clipped * adv)  # (N, T): pessimistic (min) of the two surrogates
    if importance_sampling_ratio is not None:
        per_token = per_token * importance_sampling_ratio  # (N, T): section 3b, the sampler's mismatch
    if beta != 0.0:
        delta = ref_logps - logps  # (N, T)
        kl = torch.exp(delta) - delta - 1  # (N, T) k3 estimator, >= 0
        if kl_ratio_correction:
            kl = kl * ratio  # (N, T) importance-weighted: differentiable even where the ratio is exactly 1
        per_token = per_token + beta * kl

    if loss_type == "grpo":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / grad_accum
    elif loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("dr_grpo needs max_completion_length (its constant denominator)")
        loss = (per_token * mask).sum() / (per_token.size(0) * max_completion_length) / grad_accum
    else:  # dapo (TrainConfig checks the name)
        num_items = mask.sum() if num_items is None else torch.as_tensor(num_items, dtype=mask.dtype)
        loss = (per_token * mask).sum() / num_items.clamp(min=1.0)

    # Metrics. Clipping only bites where it changes the gradient:
    # below 1 - eps_low for a negative advantage, above 1 + eps_high for a positive one.
    with torch.no_grad():
        n_tok = mask.sum().clamp(min=1.0)
        mean = lambda x: ((x * mask).sum() / n_tok).item()  # noqa: E731  masked token mean
        low = ((ratio < 1 - epsilon_low) & (adv < 0)).to(mask.dtype)
        high = ((ratio > 1 + epsilon_high) & (adv > 0)).to(mask.dtype)
        on = mask.bool()
        metrics = {  # TRL's names, except ratio_* and tokens (ours)
            "loss": loss.item(),  # this micro-batch's share: the micro-batch losses add up to the batch loss
            "clip_ratio/low_mean": mean(low),
            "clip_ratio/high_mean": mean(high),
            "clip_ratio/region_mean": mean(torch.maximum(low, high)),
            "ratio_mean": mean(ratio),
            "ratio_min": ratio[on].min().item() if on.any() else 1.0,
            "ratio_max": ratio[on].max().item() if on.any() else 1.0,
            "tokens": mask.sum().item(),
        }
        if beta != 0.0:
            metrics["kl"] = mean(kl)
    return loss, metrics


# ----------------------------------------------------------------------------------------------
# 3b. When another engine sampled: the importance-sampling correction (TRL's, for vLLM)
# ----------------------------------------------------------------------------------------------
#
# The ratio of section 3 divides by pi_old, "the policy that sampled". With the transformers backend
# (and the workbook's engine) the sampler *is* the trained model, run by the same arithmetic: the
# log-probs it records equal a fresh forward pass of the trainer within 1e-5 on CPU. vLLM is another
# engine: other kernels, usually bf16 where the trainer computes in fp32 (or its own bf16 kernels),
# a batch-dependent order of additions. Its log-probs differ from the trainer's for the same weights
# and the same tokens, so the tokens are a little off-policy before any update has happened
# (notebooks/05_trainer.ipynb §5b shows it on the tiny model). TRL corrects it by default
# (truncated importance sampling, Yao et al. 2025; masked and sequence-level variants, Liu et al. 2025):
#
#   1. pi_old of the clipped ratio is recomputed by the trainer, before the update, without gradient:
#          old_t = log pi_old(o_t | ...)          (the trainer's numbers, not the sampler's)
#   2. each token's policy loss is weighted by how much likelier the trainer finds what the sampler drew:
#          token modes      w_t = exp(old_t - sampling_t)                        (N, T)
#          sequence modes   w_i = exp(sum_t (old_t - sampling_t)) = prod_t w_t   (N, 1), one per episode
#      bounded in one of two ways (C_min may be None: no lower bound; C_max = 3 by default):
#          *_truncate       w <- clamp(w, C_min, C_max)                          (TIS: keep the token, cap its weight)
#          *_mask           w <- 0 where w < C_min or w > C_max                  (MIS: drop it)
#   3.     L_t = w * ( -min(ratio_t A, clip(ratio_t) A) ) + beta KL_t            (the KL is not weighted)
#
# Only generated tokens count (mask 1): tool tokens and the prompt add nothing to a sequence's sum.
#
# Worked example (tests/test_is_correction.py checks it): a 4-token answer, C_max = 3, C_min = None.
#
#     token                    1      2      3      4
#     p under the sampler     0.90   0.10   0.50   0.005
#     p under the trainer     0.909  0.135  0.50   0.020
#     w_t                     1.01   1.35   1.00   4.00
#     token_truncate          1.01   1.35   1.00   3.00     token 4 counts 3x, not 4x
#     token_mask              1.01   1.35   1.00   0        token 4 drops out
#     sequence: w = 1.01 * 1.35 * 1.00 * 4.00 = 5.45 > 3
#     sequence_truncate       3.00 on every token of the answer
#     sequence_mask           0 on every token: the episode drops out of the loss (TRL's default mode)
#
# Token 4 was rare under the sampler (0.5 %) but four times likelier under the trainer: the sampler
# drew such tokens too seldom, and the weight makes up for it. A large weight from a rare token is
# also mostly variance, hence the cap. The sequence modes weigh the episode as a whole (the outcome
# reward judges the whole episode), and one strongly mismatched token decides for all of it.


def importance_sampling_ratio(old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor,
                              mode: str = "sequence_mask", clip_min: float | None = None,
                              clip_max: float | None = 3.0) -> torch.Tensor:
    """TRL's vLLM importance-sampling weights: (N, T) in the token modes, (N, 1) in the sequence modes.

    old_logps: (N, T) the trainer's log-probs of the sampled tokens, before the update (no grad).
    sampling_logps: (N, T) the sampler's (``Trajectory.logprobs``); NaN where it gave none (weight 1).
    mask: (N, T) 1 on generated tokens. mode, clip_min, clip_max: TRL's ``vllm_importance_sampling_*``.
    Off the mask the token weights are 1 (they multiply a loss that is masked anyway).

    Taught in notebooks/05_trainer.ipynb §5b.
    """
    diff = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)  # (N, T) log w_t, 0 off the mask
    log_w = diff.sum(-1, keepdim=True) if mode.startswith("sequence") else diff  # (N, 1) or (N, T)
    w = torch.exp(log_w)
    if mode.endswith("truncate"):
        return torch.clamp(w, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return w.masked_fill((w < low) | (w > high), 0.0)


def importance_sampling_metrics(ratio: torch.Tensor, old_logps: torch.Tensor, sampling_logps: torch.Tensor,
                                mask: torch.Tensor, mode: str = "sequence_mask") -> dict[str, float]:
    """What TRL logs about the correction, under its names: |old - sampling| per generated token
    (NaN left out), and the weights after the bound: per generated token, or per episode (every
    episode) in the sequence modes."""
    on = mask.bool()  # (N, T)
    delta = (old_logps - sampling_logps).abs()[on]
    delta = delta[~torch.isnan(delta)]  # (M,)
    weights = ratio.flatten() if mode.startswith("sequence") else ratio[on]  # (N,) or (M,)
    stat = lambda x, f: f(x).item() if x.numel() else 0.0  # noqa: E731
    return {
        "sampling/sampling_logp_difference/mean": stat(delta, torch.mean),
        "sampling/sampling_logp_difference/max": stat(delta, torch.max),
        "sampling/importance_sampling_ratio/min": stat(weights, torch.min),
        "sampling/importance_sampling_ratio/mean": stat(weights, torch.mean),
        "sampling/importance_sampling_ratio/max": stat(weights, torch.max),
    }


# ----------------------------------------------------------------------------------------------
# 4. From trajectories to tensors
# ----------------------------------------------------------------------------------------------


@dataclass
class Batch:
    input_ids: torch.Tensor  # (N, T) right-padded episodes
    mask: torch.Tensor  # (N, T) 1 on policy-generated tokens
    old_logps: torch.Tensor  # (N, T) sampling log-probs, 0 off the mask
    advantages: torch.Tensor  # (N,) one per episode, from group_advantages (GiGPO: its episode level)
    token_advantages: torch.Tensor | None = None  # (N, T) per token, each turn's own (GiGPO), 0 off the turns; None: use advantages

    def __len__(self) -> int:
        return self.input_ids.size(0)


def collate(trajectories, advantages: Advantages, skip_zero_spread: bool = False, mask_truncated: bool = False) -> Batch:
    """Pad trajectories into tensors and attach each one's advantage (``group_advantages``); with per-turn
    advantages (``Advantages.turn_advantages``, GiGPO) also ``token_advantages``: each turn's number on
    that turn's generated tokens (``turn_spans``).

    skip_zero_spread: drop the groups whose G rewards are all equal before any forward
        pass: their advantage is 0, so with beta = 0 they add nothing to the gradient and
        only cost compute. (It changes dapo's token count, so it is off when comparing with TRL.)
    mask_truncated: TRL's ``mask_truncated_completions``: an episode a limit cut short
        (``TRUNCATED`` stop reasons) keeps its place in its group's baseline but none of its
        tokens is trained on, so "ran out of room" is not taught as "wrong answer".

    Taught in notebooks/06_training_loop.ipynb §1.
    """
    groups = group_trajectories(trajectories)
    if advantages.advantages.shape != (len(groups), len(groups[0])):
        raise ValueError(f"advantages have shape {tuple(advantages.advantages.shape)}, the batch has {len(groups)} groups of {len(groups[0])}")
    rows = [(i, j) for i, g in enumerate(groups) for j in range(len(g)) if not (skip_zero_spread and advantages.zero_spread[i])]
    kept = [groups[i][j] for i, j in rows]
    T = max((len(t.token_ids) for t in kept), default=1)
    input_ids = torch.zeros((len(kept), T), dtype=torch.long)  # pad id 0: pads sit after the mask, never scored
    mask = torch.zeros((len(kept), T), dtype=torch.long)
    old_logps = torch.zeros((len(kept), T), dtype=torch.float32)
    for n, t in enumerate(kept):
        L = len(t.token_ids)
        if not (len(t.mask) == len(t.logprobs) == L):
            raise ValueError(f"trajectory {t.task_id}/{t.group}: token_ids, mask and logprobs differ in length")
        input_ids[n, :L] = torch.tensor(t.token_ids)
        mask[n, :L] = 0 if mask_truncated and t.stop_reason in TRUNCATED else torch.tensor(t.mask)
        old_logps[n, :L] = torch.tensor(t.logprobs)
    flat = torch.stack([advantages.advantages[i, j] for i, j in rows]) if rows else torch.zeros(0)  # (N,)
    if advantages.turn_advantages is None:
        return Batch(input_ids, mask, old_logps, flat)
    per_token = torch.zeros((len(kept), T), dtype=torch.float32)  # (N, T)
    for n, ((i, j), t) in enumerate(zip(rows, kept)):
        spans, turns = turn_spans(t.mask), advantages.turn_advantages[i][j]
        if len(turns) != len(spans):
            raise ValueError(f"trajectory {t.task_id}/{t.group}: {len(turns)} turn advantages for {len(spans)} turns")
        for (start, end), a in zip(spans, turns):
            per_token[n, start:end] = a
    return Batch(input_ids, mask, old_logps, flat, per_token)


# ----------------------------------------------------------------------------------------------
# 5. The trainer
# ----------------------------------------------------------------------------------------------


def _combine(micro: list[dict]) -> dict:
    """Metrics of the micro-batches of one optimizer step: losses add, token means are weighted by tokens."""
    tokens = sum(m["tokens"] for m in micro) or 1.0
    out = {"loss": sum(m["loss"] for m in micro), "tokens": tokens}
    for key in micro[0]:
        if key in ("loss", "tokens"):
            continue
        if key == "ratio_min":
            out[key] = min(m[key] for m in micro)
        elif key == "ratio_max":
            out[key] = max(m[key] for m in micro)
        else:
            out[key] = sum(m[key] * m["tokens"] for m in micro) / tokens
    return out


def lora_config(config: TrainConfig):
    """The config's ``lora_*`` fields as a peft ``LoraConfig``: the one place it is built
    (our trainer, TRL's through ``helpers.ecosystem.trl_bridge``, and the scale-out script)."""
    from peft import LoraConfig  # peft is imported where an adapter is made: a command's refusals need none

    return LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=list(config.lora_target_modules), task_type="CAUSAL_LM")


class LoRAGRPO:
    """GRPO on a LoRA adapter: ``update(batch) -> metrics``.

        trainer = LoRAGRPO(model, config)                    # wraps the model in a peft LoRA adapter
        advantages = group_advantages(group_rewards(trajs))  # (B, G): G samples of each of B tasks
        metrics = trainer.update(collate(trajs, advantages))
        metrics = trainer.train_step(trajs)                  # the two lines above, with the config's options
        trainer.save_checkpoint("runs/x/checkpoint-20", extra_state={"sampler": ...})

    One ``update`` = one batch of rollouts, reused for ``num_iterations`` (mu)
    optimizer steps (mu = 1: the update is on-policy, the ratio is ~1 and the clip
    rarely bites; mu > 1: later updates are off-policy and the clip keeps them close).
    Each optimizer step accumulates gradients over ``grad_accum`` micro-batches, clips
    the gradient norm, and steps AdamW (LoRA parameters only) and a linear warmup/decay
    schedule.

    The model is wrapped in a LoRA adapter built from the config's ``lora_*`` fields; a
    model that already is a peft model keeps its adapter. Only the adapter is trained.
    ``update`` puts the model in train mode and leaves it in eval mode, ready to sample.

    Named simplifications: no distributed training; the schedule decays linearly to 0
    at ``total_steps * num_iterations`` optimizer steps (TRL's default "linear").

    Taught in notebooks/05_trainer.ipynb.
    """

    def __init__(
        self,
        model,
        config: TrainConfig,
        total_steps: int | None = None,  # update calls planned (default config.steps), for the schedule
        max_completion_length: int | None = None,  # dr_grpo's denominator (default: the episode's generation budget)
        temperature: float | None = None,  # sampling temperature the log-probs were taken at (default config.temperature)
        chunk_size: int = 1024,  # positions per LM-head chunk in token_logprobs
    ):
        # imported where an adapter is made (lora_config): peft, and transformers' schedules, which import peft too
        from peft import PeftModel, get_peft_model
        from transformers import get_linear_schedule_with_warmup

        if not config.use_lora:
            raise ValueError("LoRAGRPO trains a LoRA adapter (its reference policy is the adapter switched off); set use_lora=True")
        self.config = config
        # Section 3b: only when another engine samples (TRL: use_vllm and vllm_importance_sampling_correction)
        self.correct_sampler = config.backend == "vllm" and config.vllm_importance_sampling_correction
        self.device = torch.device("cuda" if config.device == "auto" and torch.cuda.is_available() else
                                   ("cpu" if config.device == "auto" else config.device))
        if not isinstance(model, PeftModel):
            with quiet_peft():
                model = get_peft_model(model, lora_config(config))
        self.model = model.to(self.device)
        if config.gradient_checkpointing:  # recompute each layer's activations in backward: less memory, more compute
            base = self.model.get_base_model()
            if hasattr(base, "activation_checkpointing_enable"):  # newer transformers (5.25 has it and warns on the old name)
                base.activation_checkpointing_enable({"use_reentrant": False})
            else:  # transformers 5.19 (what the CPU build of vLLM pins) has only the old name
                base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # bf16 autocast on a GPU that has it; float32 elsewhere (CPU autocast is slow and not needed for a tiny model)
        self.autocast_dtype = torch.bfloat16 if self.device.type == "cuda" and torch.cuda.is_bf16_supported() else None
        self.params = [p for p in self.model.parameters() if p.requires_grad]  # the adapter, nothing else
        self.optimizer = torch.optim.AdamW(self.params, lr=config.lr, weight_decay=config.weight_decay)
        total = (total_steps or config.steps) * config.num_iterations
        self.scheduler = get_linear_schedule_with_warmup(self.optimizer, config.warmup_steps, max(total, 1))
        # dr_grpo divides by a constant "max completion length": what the policy may write in one episode
        budget = min(config.max_total_tokens, config.max_new_tokens * config.env_max_steps)
        self.max_completion_length = max_completion_length or budget
        self.temperature = config.temperature if temperature is None else temperature
        self.chunk_size = chunk_size
        self.step = 0  # update calls done (batches of rollouts consumed)
        self.optimizer_steps = 0
        self.skipped_steps = 0  # optimizer steps skipped because the loss or gradient was NaN/inf

    def _autocast(self):
        if self.autocast_dtype is None:
            return torch.autocast("cpu", enabled=False)
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def logprobs(self, input_ids: torch.Tensor, mask: torch.Tensor, reference: bool = False) -> torch.Tensor:
        """Token log-probs (N, T) under the policy, or under the reference (the adapter switched off)."""
        with self._autocast():
            if reference:
                with torch.no_grad(), self.model.disable_adapter():
                    return token_logprobs(self.model, input_ids, mask, self.temperature, self.chunk_size)[0]
            return token_logprobs(self.model, input_ids, mask, self.temperature, self.chunk_size)[0]

    def old_logps(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, float]]:
        """pi_old of the clipped ratio, before the update: (old_logps (N, T), weights, metrics).

        The sampler's own log-probs (``batch.old_logps``; weights None, no metrics) when the trained
        model sampled. When vLLM sampled and ``vllm_importance_sampling_correction`` is on (section 3b,
        as TRL): the trainer's log-probs of the same tokens (no grad, one micro-batch at a time, eval
        mode: the policy as it sampled, without LoRA dropout; TRL recomputes in train mode, the same at
        dropout 0), the importance-sampling weights and TRL's ``sampling/...`` metrics.
        """
        cfg = self.config
        sampling = batch.old_logps.to(self.device)  # (N, T)
        if not self.correct_sampler:
            return sampling, None, {}
        ids, mask = batch.input_ids.to(self.device), batch.mask.to(self.device)  # (N, T)
        self.model.eval()
        with torch.no_grad():
            old = torch.cat([self.logprobs(ids[rows], mask[rows]) for rows in torch.arange(len(batch)).chunk(cfg.grad_accum)])
        weights = importance_sampling_ratio(old, sampling, mask, cfg.vllm_importance_sampling_mode,
                                            cfg.vllm_importance_sampling_clip_min, cfg.vllm_importance_sampling_clip_max)
        return old, weights, importance_sampling_metrics(weights, old, sampling, mask, cfg.vllm_importance_sampling_mode)

    def train_step(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """Scored trajectories -> advantages -> ``update``, with the config's ``advantage``, ``scale_rewards``,
        ``skip_zero_spread`` and ``mask_truncated_completions`` (what ``helpers.loop`` spells out)."""
        cfg = self.config
        advantages = compute_advantages(trajectories, cfg)
        return self.update(collate(trajectories, advantages, cfg.skip_zero_spread, cfg.mask_truncated_completions))

    def update(self, batch: Batch) -> dict[str, float]:
        """One batch of rollouts -> num_iterations optimizer steps. Returns the step's metrics (mostly TRL's names)."""
        cfg = self.config
        self.step += 1
        if len(batch) == 0:  # every group had zero spread and was skipped
            return {"step": self.step, "skipped_steps": self.skipped_steps}
        old, weights, sampler_metrics = self.old_logps(batch)  # (N, T); section 3b's (N, T) or (N, 1) weights, or None
        ids, mask = batch.input_ids.to(self.device), batch.mask.to(self.device)  # (N, T)
        micro_rows = torch.arange(len(batch)).chunk(cfg.grad_accum)
        self.model.train()
        adv = (batch.advantages if batch.token_advantages is None else batch.token_advantages).to(self.device)  # (N,) or (N, T)
        ref = self.logprobs(ids, mask, reference=True) if cfg.beta != 0.0 else None  # (N, T) or None
        num_items = mask.sum().float()  # dapo: tokens in the whole batch, across micro-batches
        per_iteration = []
        for _ in range(cfg.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            micro, finite = [], True
            for rows in micro_rows:
                with self._autocast():
                    logps, entropy = token_logprobs(self.model, ids[rows], mask[rows], self.temperature, self.chunk_size)
                loss, m = grpo_loss(
                    logps, old[rows], adv[rows], mask[rows], None if ref is None else ref[rows],
                    loss_type=cfg.loss_type, epsilon_low=cfg.epsilon_low, epsilon_high=cfg.epsilon_high,
                    beta=cfg.beta, max_completion_length=self.max_completion_length, num_items=num_items,
                    grad_accum=len(micro_rows), importance_sampling_ratio=None if weights is None else weights[rows],
                )
                if not torch.isfinite(loss):
                    finite = False
                    break
                loss.backward()
                m["entropy"] = ((entropy * mask[rows]).sum() / mask[rows].sum().clamp(min=1)).item()
                micro.append(m)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm) if finite else torch.tensor(math.nan)
            if not torch.isfinite(grad_norm):  # never let a NaN/inf reach the adapter
                self.optimizer.zero_grad(set_to_none=True)
                self.skipped_steps += 1
                warnings.warn(f"step {self.step}: non-finite loss or gradient, optimizer step skipped "
                              f"({self.skipped_steps} skipped so far)", stacklevel=2)
                continue
            learning_rate = self.scheduler.get_last_lr()[0]
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer_steps += 1
            per_iteration.append({**_combine(micro), "grad_norm": grad_norm.item(), "learning_rate": learning_rate})
        metrics = {key: sum(it[key] for it in per_iteration) / len(per_iteration)  # averaged over the mu iterations
                   for key in (per_iteration[0] if per_iteration else [])}
        self.model.eval()  # the next rollout samples without (LoRA) dropout
        return {**metrics, **sampler_metrics, "step": self.step, "skipped_steps": self.skipped_steps}

    def sampled_kl(self, batch: Batch) -> float:
        """Mean k3 KL(sampling policy || reference) per generated token of ``batch``, from one
        no-grad forward of the reference (the adapter switched off). With beta = 0 the loss
        never computes a KL; this one keeps it in the logs, where the health checks read it."""
        mask = batch.mask.to(self.device)
        if not mask.any():
            return 0.0
        ref = self.logprobs(batch.input_ids.to(self.device), mask, reference=True)  # (N, T)
        delta = ref - batch.old_logps.to(self.device)  # (N, T) log pi_ref - log pi_old
        kl = (torch.exp(delta) - delta - 1).clamp(min=0)  # (N, T) k3 estimator, >= 0 (clamp: float rounding near 0)
        return ((kl * mask).sum() / mask.sum()).item()

    # ------------------------------------------------------------------------------------------
    # checkpoints: adapter + optimizer + scheduler + RNG + counters + the caller's extra state
    # ------------------------------------------------------------------------------------------

    def save_checkpoint(self, directory: str | Path, extra_state: dict | None = None) -> Path:
        """Write the adapter and everything else needed to continue exactly (``helpers.checkpoint.write_checkpoint``,
        atomic, with checksums): ``extra_state`` is where the training loop puts its own position (the data sampler's)."""
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "optimizer_steps": self.optimizer_steps,
            "skipped_steps": self.skipped_steps,
            "extra_state": extra_state or {},
        }
        return write_checkpoint(directory, self.model, state)

    def load_checkpoint(self, directory: str | Path) -> dict:
        """Restore a checkpoint written by ``save_checkpoint`` into this trainer; returns its extra_state."""
        state = read_checkpoint(directory, self.model, self.device)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step, self.optimizer_steps, self.skipped_steps = state["step"], state["optimizer_steps"], state["skipped_steps"]
        return state["extra_state"]
