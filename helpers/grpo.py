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
    dr_grpo  sum over all tokens / (num sequences * max_completion_length)   (Dr. GRPO)
    dapo     sum over all tokens / number of tokens in the whole batch        (DAPO; TRL's default)

The code follows TRL 1.16's ``GRPOTrainer`` (``_compute_loss`` and the advantage part
of ``_generate_and_score_completions``); ``tests/test_grpo_trl.py`` checks that both
give the same loss on the same batch.

Simplifications (named, so nothing is hidden):
- The "old" policy of the ratio is the *sampling* policy: ``Trajectory.logprobs``,
  recorded by the rollout backend. With the transformers backend on CPU they equal a
  fresh forward pass up to float noise; with vLLM the small engine mismatch is absorbed
  by the ratio and its clip (TRL adds a separate importance-sampling correction; we don't).
- Only token-level importance sampling (TRL's default), no sequence-level (GSPO) ratios,
  no entropy masks or bonuses, no two-sided ``delta`` clip.
- The reference policy is the base model: the same peft model with the adapter switched
  off (``with model.disable_adapter():``). There is never a second model in memory.
- One process, one device: no distributed gathers.
"""

from __future__ import annotations

import math
import random
import warnings
from dataclasses import dataclass, replace as replace_config
from pathlib import Path

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

from helpers.config import TrainConfig

LOSS_TYPES = ("grpo", "dr_grpo", "dapo")
SCALE_REWARDS = ("group", "batch", "none")
TRAINER_STATE = "trainer_state.pt"  # optimizer, scheduler, RNG, step, extra state (next to the adapter files)


# ----------------------------------------------------------------------------------------------
# 1. Advantages: the group is its own baseline
# ----------------------------------------------------------------------------------------------


@dataclass
class Advantages:
    advantages: torch.Tensor  # (B, G) one number per sampled answer, broadcast to all its tokens
    zero_spread: torch.Tensor  # (B,) bool: all G rewards equal, so the group carries no signal


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
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape (B, G), got {tuple(rewards.shape)}")
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}")
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
    that predict a generated token, ``chunk_size`` of them at a time. Each chunk is
    wrapped in activation checkpointing, so its (chunk, V) logits are freed right away
    and recomputed one chunk at a time in the backward pass: the (N, T, V) logits of
    the whole batch never exist. (TRL does the same with a fused kernel.)
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
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO loss of one micro-batch, normalised as TRL normalises it.

    logps, old_logps, ref_logps, mask: (N, T), token-aligned (entry t belongs to token t).
    advantages: (N,), one per sequence.
    max_completion_length: the dr_grpo constant denominator (required for dr_grpo).
    num_items: dapo's denominator, the number of mask tokens in the *whole* batch across
        all micro-batches (default: this micro-batch's), so that the accumulated gradient
        is a true per-token mean.
    grad_accum: number of micro-batches; grpo and dr_grpo divide by it, as TRL does.
    kl_ratio_correction: multiply the KL term by the ratio (TRL's ``use_bias_correction_kl``,
        default True since the DeepSeek-V3.2 paper): the tokens were sampled from the old
        policy, and the ratio makes the KL gradient the unbiased reverse-KL gradient.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    if beta != 0.0 and ref_logps is None:
        raise ValueError("beta > 0 needs ref_logps (the reference policy's token log-probs)")
    mask = mask.to(logps.dtype)  # (N, T)
    adv = advantages.unsqueeze(1)  # (N, 1): every token of a sequence shares its advantage

    ratio = torch.exp(logps - old_logps)  # (N, T)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)  # (N, T)
    per_token = -torch.min(ratio * adv, clipped * adv)  # (N, T): pessimistic (min) of the two surrogates
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
    else:  # dapo
        num_items = mask.sum() if num_items is None else torch.as_tensor(num_items, dtype=mask.dtype)
        loss = (per_token * mask).sum() / num_items.clamp(min=1.0)

    # Metrics (TRL's names in the comments). Clipping only bites where it changes the gradient:
    # below 1 - eps_low for a negative advantage, above 1 + eps_high for a positive one.
    with torch.no_grad():
        n_tok = mask.sum().clamp(min=1.0)
        mean = lambda x: ((x * mask).sum() / n_tok).item()  # noqa: E731  masked token mean
        low = ((ratio < 1 - epsilon_low) & (adv < 0)).to(mask.dtype)
        high = ((ratio > 1 + epsilon_high) & (adv > 0)).to(mask.dtype)
        on = mask.bool()
        metrics = {
            "loss": loss.item(),  # this micro-batch's share: the micro-batch losses add up to the batch loss
            "clip_low": mean(low),  # clip_ratio/low_mean
            "clip_high": mean(high),  # clip_ratio/high_mean
            "clip_region": mean(torch.maximum(low, high)),  # clip_ratio/region_mean
            "ratio_mean": mean(ratio),
            "ratio_min": ratio[on].min().item() if on.any() else 1.0,
            "ratio_max": ratio[on].max().item() if on.any() else 1.0,
            "tokens": mask.sum().item(),
        }
        if beta != 0.0:
            metrics["kl"] = mean(kl)
    return loss, metrics


# ----------------------------------------------------------------------------------------------
# 4. From trajectories to tensors
# ----------------------------------------------------------------------------------------------


@dataclass
class Batch:
    input_ids: torch.Tensor  # (N, T) right-padded episodes
    mask: torch.Tensor  # (N, T) 1 on policy-generated tokens
    old_logps: torch.Tensor  # (N, T) sampling log-probs, 0 off the mask
    advantages: torch.Tensor  # (N,)
    rewards: torch.Tensor  # (B, G)
    zero_spread: torch.Tensor  # (B,) bool

    def __len__(self) -> int:
        return self.input_ids.size(0)


def group_trajectories(trajectories) -> list[list]:
    """Trajectories grouped by task, in order of first appearance; every group must have the same size G."""
    groups: dict[str, list] = {}
    for traj in trajectories:
        groups.setdefault(traj.task_id, []).append(traj)
    sizes = {len(g) for g in groups.values()}
    if len(sizes) != 1:
        raise ValueError(f"every task needs the same number of samples G, got group sizes {sorted(sizes)}")
    return list(groups.values())


def collate(trajectories, scale_rewards: str = "group", skip_zero_spread: bool = False) -> Batch:
    """Pad trajectories into tensors and attach each one's group advantage.

    skip_zero_spread drops the groups whose G rewards are all equal before any forward
    pass: their advantage is 0, so with beta = 0 they add nothing to the gradient and
    only cost compute. (It changes dapo's token count, so it is off when comparing with TRL.)
    """
    groups = group_trajectories(trajectories)
    rewards = torch.tensor([[t.reward for t in g] for g in groups], dtype=torch.float32)  # (B, G)
    adv = group_advantages(rewards, scale_rewards)
    rows = [(i, j) for i, g in enumerate(groups) for j in range(len(g)) if not (skip_zero_spread and adv.zero_spread[i])]
    advantages = torch.stack([adv.advantages[i, j] for i, j in rows]) if rows else torch.zeros(0)  # (N,)
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
        mask[n, :L] = torch.tensor(t.mask)
        old_logps[n, :L] = torch.tensor(t.logprobs)
    return Batch(input_ids, mask, old_logps, advantages, rewards, adv.zero_spread)


# ----------------------------------------------------------------------------------------------
# 5. The trainer
# ----------------------------------------------------------------------------------------------


def rng_state() -> dict:
    """Every random generator a training step touches (LoRA dropout, data shuffles, sampling)."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest ``checkpoint-<step>`` folder under out_dir that is complete, or None."""
    done = [p for p in Path(out_dir).glob("checkpoint-*") if (p / TRAINER_STATE).exists()]
    return max(done, key=lambda p: int(p.name.split("-")[-1]), default=None)


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


class LoRAGRPO:
    """GRPO on a LoRA adapter: ``train_step(trajectories) -> metrics``.

        trainer = LoRAGRPO(model, config)          # wraps the model in a peft LoRA adapter
        metrics = trainer.train_step(trajectories) # G samples of each of B tasks
        trainer.save_checkpoint("runs/x/checkpoint-20", extra_state={"sampler": ...})

    One ``train_step`` = one batch of rollouts, reused for ``num_iterations`` (mu)
    optimizer steps (mu = 1: the ratio is ~1 and the clip never bites; mu > 1: later
    updates are off-policy and the clip keeps them close). Each optimizer step
    accumulates gradients over ``grad_accum`` micro-batches, clips the gradient norm,
    and steps AdamW (LoRA parameters only) and a linear warmup/decay schedule.

    The model is wrapped in a LoRA adapter built from the config's ``lora_*`` fields; a
    model that already is a peft model keeps its adapter. Only the adapter is trained.
    ``train_step`` puts the model in train mode and leaves it in eval mode, ready to sample.

    Named simplifications: no distributed training; the schedule decays linearly to 0
    at ``total_steps * num_iterations`` optimizer steps (TRL's default "linear").
    """

    def __init__(
        self,
        model,
        config: TrainConfig,
        total_steps: int | None = None,  # train_step calls planned (default config.steps), for the schedule
        max_completion_length: int | None = None,  # dr_grpo's denominator (default: the episode's generation budget)
        temperature: float | None = None,  # sampling temperature the log-probs were taken at (default config.temperature)
        skip_zero_spread: bool = False,  # drop groups whose rewards are all equal before the forward pass
        chunk_size: int = 1024,  # positions per LM-head chunk in token_logprobs
    ):
        from peft import LoraConfig, PeftModel, get_peft_model
        from transformers import get_linear_schedule_with_warmup

        if not config.use_lora:
            raise ValueError("LoRAGRPO trains a LoRA adapter (its reference policy is the adapter switched off); set use_lora=True")
        if config.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {config.loss_type!r}")
        if config.scale_rewards not in SCALE_REWARDS:
            raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {config.scale_rewards!r}")
        self.config = config
        self.device = torch.device("cuda" if config.device == "auto" and torch.cuda.is_available() else
                                   ("cpu" if config.device == "auto" else config.device))
        if not isinstance(model, PeftModel):
            lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                              target_modules=list(config.lora_target_modules), task_type="CAUSAL_LM")
            model = get_peft_model(model, lora)
        self.model = model.to(self.device)
        if config.gradient_checkpointing:  # recompute each layer's activations in backward: less memory, ~30% more compute
            base = self.model.get_base_model()
            if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5.x renamed it
                base.activation_checkpointing_enable({"use_reentrant": False})
            else:
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
        self.skip_zero_spread = skip_zero_spread
        self.chunk_size = chunk_size
        self.step = 0  # train_step calls done (batches of rollouts consumed)
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

    def train_step(self, trajectories) -> dict[str, float]:
        """One batch of rollouts -> num_iterations optimizer steps. Returns the step's metrics."""
        cfg = self.config
        self.model.train()
        batch = collate(trajectories, cfg.scale_rewards, self.skip_zero_spread)
        metrics = {"reward_mean": batch.rewards.mean().item(), "reward_std": batch.rewards.std().item(),
                   "frac_zero_spread": batch.zero_spread.float().mean().item()}
        self.step += 1
        if len(batch) == 0:  # every group had zero spread and was skipped
            self.model.eval()
            return {**metrics, "step": self.step, "skipped_steps": self.skipped_steps}
        ids, mask = batch.input_ids.to(self.device), batch.mask.to(self.device)  # (N, T)
        old, adv = batch.old_logps.to(self.device), batch.advantages.to(self.device)  # (N, T), (N,)
        ref = self.logprobs(ids, mask, reference=True) if cfg.beta != 0.0 else None  # (N, T) or None
        num_items = mask.sum().float()  # dapo: tokens in the whole batch, across micro-batches
        micro_rows = torch.arange(len(batch)).chunk(cfg.grad_accum)
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
                    grad_accum=len(micro_rows),
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
            lr = self.scheduler.get_last_lr()[0]
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer_steps += 1
            per_iteration.append({**_combine(micro), "grad_norm": grad_norm.item(), "lr": lr})
        for key in per_iteration[0] if per_iteration else []:  # average over the mu iterations
            metrics[key] = sum(it[key] for it in per_iteration) / len(per_iteration)
        self.model.eval()  # the next rollout samples without (LoRA) dropout
        return {**metrics, "step": self.step, "skipped_steps": self.skipped_steps}

    # ------------------------------------------------------------------------------------------
    # checkpoints: adapter + optimizer + scheduler + RNG + counters + the caller's extra state
    # ------------------------------------------------------------------------------------------

    def save_checkpoint(self, directory: str | Path, extra_state: dict | None = None) -> Path:
        """Write the adapter (peft format, loadable by ``PeftModel.from_pretrained`` and vLLM) and
        everything else needed to continue exactly: ``extra_state`` is where the training loop
        puts its own position (e.g. the data sampler's)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory)
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(),
            "step": self.step,
            "optimizer_steps": self.optimizer_steps,
            "skipped_steps": self.skipped_steps,
            "extra_state": extra_state or {},
        }
        torch.save(state, directory / TRAINER_STATE)  # written last: its presence marks a complete checkpoint
        return directory

    def load_checkpoint(self, directory: str | Path) -> dict:
        """Restore a checkpoint written by ``save_checkpoint`` into this trainer; returns its extra_state."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        directory = Path(directory)
        if not (directory / TRAINER_STATE).exists():
            raise FileNotFoundError(f"{directory} is not a complete checkpoint (no {TRAINER_STATE})")
        set_peft_model_state_dict(self.model, load_file(directory / "adapter_model.safetensors", device=str(self.device)))
        state = torch.load(directory / TRAINER_STATE, map_location="cpu", weights_only=False)  # our own file
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        self.step, self.optimizer_steps, self.skipped_steps = state["step"], state["optimizer_steps"], state["skipped_steps"]
        return state["extra_state"]


# ----------------------------------------------------------------------------------------------
# 6. The same batch through TRL's GRPOTrainer, for comparison (test, notebook 05, benchmark)
# ----------------------------------------------------------------------------------------------


def trl_trainer(model, tokenizer, config: TrainConfig, prompts: list[list[dict]], max_completion_length: int,
                output_dir: str | Path, peft_config=None):
    """A TRL ``GRPOTrainer`` with the settings of ``config`` (same loss, clip, beta, LoRA, optimizer).

    prompts: chat-message prompts, one row each of a tiny ``datasets.Dataset``.
    One optimizer step = ``tasks_per_step * num_generations`` completions, split into
    ``grad_accum`` micro-batches as ours. The reward function is a placeholder: callers
    that compare losses feed their own rewards or advantages.
    """
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    group = config.num_generations * config.tasks_per_step
    args = GRPOConfig(
        output_dir=str(output_dir), report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True,
        per_device_train_batch_size=group // config.grad_accum, gradient_accumulation_steps=config.grad_accum,
        num_generations=config.num_generations, max_completion_length=max_completion_length,
        temperature=config.temperature, top_p=config.top_p, num_iterations=config.num_iterations,
        loss_type=config.loss_type, scale_rewards=config.scale_rewards, beta=config.beta,
        epsilon=config.epsilon_low, epsilon_high=config.epsilon_high,
        learning_rate=config.lr, warmup_steps=config.warmup_steps, weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm, lr_scheduler_type="linear", max_steps=config.steps,
        gradient_checkpointing=config.gradient_checkpointing, seed=config.seed,
        use_cpu=not torch.cuda.is_available(), bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
    )
    dataset = Dataset.from_list([{"prompt": p} for p in prompts])
    placeholder = lambda completions, **kwargs: [0.0] * len(completions)  # noqa: E731
    return GRPOTrainer(model=model, reward_funcs=placeholder, args=args, train_dataset=dataset,
                       processing_class=tokenizer, peft_config=peft_config)


def _completion_aligned(full: torch.Tensor, mask: torch.Tensor, width: int) -> torch.Tensor:
    """(N, T) token-aligned values -> (N, width) TRL's completion-aligned layout (values on the mask, left-packed)."""
    out = torch.zeros(full.size(0), width, dtype=full.dtype)
    for n in range(full.size(0)):
        values = full[n][mask[n].bool()]
        out[n, : len(values)] = values
    return out


def trajectories_from_trl(inputs: dict, tasks, rewards: list[float]) -> list:
    """TRL's batch (left-padded prompts, right-padded completions) as our Trajectories:
    unpadded prompt + completion, mask 1 on the completion. Old log-probs are left at 0."""
    from helpers.rollout import Trajectory

    G = len(rewards) // len(tasks)
    trajectories = []
    for n in range(len(rewards)):
        prompt = inputs["prompt_ids"][n][inputs["prompt_mask"][n].bool()].tolist()
        completion = inputs["completion_ids"][n][inputs["completion_mask"][n].bool()].tolist()
        trajectories.append(Trajectory(task=tasks[n // G], group=n % G, token_ids=prompt + completion,
                                       mask=[0] * len(prompt) + [1] * len(completion),
                                       logprobs=[0.0] * (len(prompt) + len(completion)), prompt_len=len(prompt),
                                       reward=rewards[n]))
    return trajectories


def compare_with_trl(trainer: LoRAGRPO, tokenizer, tasks, max_completion_length: int = 16,
                     old_noise: float = 0.3, seed: int = 0) -> dict:
    """Feed one batch to our loss and to TRL's ``GRPOTrainer._compute_loss``; return both.

    1. TRL samples G completions per task (its own generate), and its reward function
       draws random rewards; TRL turns them into advantages.
    2. Completions are cut to random lengths (the untrained tiny model rarely stops by
       itself, and grpo / dr_grpo / dapo only differ when lengths differ).
    3. "Old" log-probs = current log-probs + noise, so ratios spread and the clip bites.
    4. The same tokens, old log-probs and reference log-probs (ours: adapter off) go to
       both losses. TRL gets a *copy* of our peft model, so the weights are identical.
    Returns ours/trl losses, advantages, and both clip fractions (and KL when beta > 0).
    """
    import copy
    import tempfile

    cfg = trainer.config
    G = cfg.num_generations
    gen = torch.Generator().manual_seed(seed)
    rewards_drawn = torch.randint(0, 3, (len(tasks) * G,), generator=gen).float().tolist()
    with tempfile.TemporaryDirectory() as tmp:
        trl = trl_trainer(copy.deepcopy(trainer.model), tokenizer, replace_config(cfg, tasks_per_step=len(tasks), grad_accum=1),
                          [t.prompt for t in tasks], max_completion_length, tmp)
    trl.reward_funcs[0] = lambda completions, **kwargs: rewards_drawn[: len(completions)]
    trl.current_gradient_accumulation_steps = 1  # set by Trainer.train(); we call the loss directly
    trl.model.train()
    torch.manual_seed(seed)
    rows = [{"prompt": t.prompt} for t in tasks for _ in range(G)]  # TRL's sampler repeats each prompt G times
    inputs = trl._generate_and_score_completions(rows)
    width = inputs["completion_mask"].shape[1]  # C: TRL pads to the longest completion, which can be < max_completion_length
    lengths = torch.randint(1, width + 1, (len(rows),), generator=gen)
    keep = torch.arange(width)[None, :] < lengths[:, None]  # (N, C)
    inputs["completion_mask"] = inputs["completion_mask"] * keep
    inputs["num_items_in_batch"] = inputs["completion_mask"].sum()

    trajectories = trajectories_from_trl(inputs, tasks, rewards_drawn)
    batch = collate(trajectories, cfg.scale_rewards)
    with torch.no_grad():
        current = trainer.logprobs(batch.input_ids, batch.mask)  # (N, T)
    old = (current + old_noise * torch.randn(current.shape, generator=gen)) * batch.mask  # (N, T)
    ref = trainer.logprobs(batch.input_ids, batch.mask, reference=True) if cfg.beta != 0.0 else None

    trainer.model.train()
    logps = trainer.logprobs(batch.input_ids, batch.mask)
    ours, metrics = grpo_loss(logps, old, batch.advantages, batch.mask, ref, loss_type=cfg.loss_type,
                              epsilon_low=cfg.epsilon_low, epsilon_high=cfg.epsilon_high, beta=cfg.beta,
                              max_completion_length=max_completion_length)
    inputs["old_per_token_logps"] = _completion_aligned(old, batch.mask, max_completion_length)
    if ref is not None:
        inputs["ref_per_token_logps"] = _completion_aligned(ref, batch.mask, max_completion_length)
    theirs = trl.compute_loss(trl.model, inputs)
    trl_metrics = {k: v[-1] for k, v in trl._metrics["train"].items()}
    # The same loss value could still hide a different gradient (a misplaced detach): compare those too.
    trainer.model.zero_grad()
    ours.backward()
    theirs.backward()
    trl_params = dict(trl.model.named_parameters())
    grad_diff = max((p.grad - trl_params[n].grad).abs().max().item()
                    for n, p in trainer.model.named_parameters() if p.requires_grad)
    trainer.model.zero_grad()
    return {"ours": ours.item(), "trl": theirs.item(), "grad_max_diff": grad_diff, "advantages_ours": batch.advantages,
            "advantages_trl": inputs["advantages"], "clip_ours": metrics["clip_region"],
            "clip_trl": trl_metrics["clip_ratio/region_mean"], "kl_ours": metrics.get("kl"), "kl_trl": trl_metrics.get("kl"),
            "tokens": int(batch.mask.sum())}
