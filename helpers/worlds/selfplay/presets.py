"""The self-play presets: self-play, and the same compute on a fixed dataset for comparison."""

from __future__ import annotations

from helpers.config import TrainConfig, register_preset
from helpers.worlds.selfplay.collect import SelfPlayConfig


@register_preset("tiny-selfplay")
def tiny_selfplay():
    """Self-play on the one-call world (``helpers.worlds.selfplay``): the policy proposes its own tasks.

    No dataset: each step the proposer writes 2 x G = 16 tasks, the solver attempts each valid one
    G = 8 times (up to 128 episodes), and both roles are trained in one update.
    The held-out set is fixed (the "selfplay" test split, 256 tasks of difficulty 4-6) for every seed.
    """
    return SelfPlayConfig(
        **{**vars(tiny_selfplay_fixed()), "collect": "selfplay"},  # the fixed run's settings, with self-play's step
        proposer_groups=2,
        invalid_reward=-0.5,
        proposer_temperature=1.0,
        # The proposer's 16 replies of ~18 tokens are a few % of a batch's tokens (dapo averages over tokens): x10 at
        # lr 1e-3 gives it about the step of lr 1e-2, while the solver, which shares the adapter, moves at 1e-3.
        proposer_weight=10.0,
    )


@register_preset("tiny-selfplay-fixed")
def tiny_selfplay_fixed() -> TrainConfig:
    """The comparison for tiny-selfplay: the same model, compute and held-out set, trained by the
    main loop on a fixed dataset of the same grammar (16 tasks x G = 8 per step)."""
    return TrainConfig(
        model="data/tiny-selfplay",  # the warm start that knows both roles (python -m helpers.worlds.selfplay build)
        device="cpu",
        dataset="selfplay",  # test: the fixed held-out set; train: 2,000 tasks (the fixed run only)
        env="calculator",
        lr=1e-3,  # small steps anchored to the warm start: at tiny-cpu's 5e-3 greedy held-out success fell
        beta=0.1,  # KL to the warm start in the loss (one more no-grad forward, the adapter switched off)
        lora_r=8,
        lora_alpha=16,
        steps=50,
        tasks_per_step=16,  # as many solver groups as self-play's 2 x 8 proposals when all are valid
        num_generations=8,  # G, and P (proposals per proposer prompt)
        max_new_tokens=48,
        max_total_tokens=192,
        eval_every=10,
        eval_tasks=256,  # one task = 0.004 of the success rate
        pass_k=1,  # besides greedy success, the sampled one at the training temperature (pass@1), one episode per task
        save_every=10,
        log_trajectories_every=10,
        skip_zero_spread=True,  # groups all solved (or all failed) carry no signal: skip them
    )
