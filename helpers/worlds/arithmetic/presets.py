"""The one-call world's preset: learn to use the calculator on a laptop CPU."""

from __future__ import annotations

from helpers.config import TrainConfig, register_preset


@register_preset("tiny-cpu")
def tiny_cpu() -> TrainConfig:
    """The tiny world on a laptop CPU: learn to use the calculator in a few minutes.

    64 episodes per step (8 tasks x G = 8), short turns (a tool call is ~22 tokens, an
    answer ~7), and a learning rate far above the GSM8K one: a rank-8 adapter on a
    tiny model (helpers.worlds.tinymodel.MODEL_SHAPE) moves slowly, and the reward here is clean (exact arithmetic).
    """
    return TrainConfig(
        device="cpu",
        lr=5e-3,  # 2e-3 taught sampled tool use (0.44 -> 0.98) but left greedy copy errors (51 -> "53") untouched in 40 steps
        lora_r=8,
        lora_alpha=16,
        steps=50,  # the lr decays linearly to 0 over these steps
        tasks_per_step=8,
        num_generations=8,
        max_new_tokens=48,  # one turn: the longest (a tool call) is ~22 tokens
        max_total_tokens=192,  # prompt ~40 + call ~22 + tool reply ~18 + answer ~7, with room to spare
        eval_every=25,  # a greedy held-out evaluation costs about one step's rollout; every 25 steps keeps the curve cheap
        eval_tasks=64,
        pass_k=4,
        save_every=10,
        log_trajectories_every=5,
        skip_zero_spread=True,  # late in training most groups are all correct: skip them, not compute them
    )
