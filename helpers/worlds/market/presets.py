"""The tiny market's preset: GRPO on three worlds at once, each row played by its own environment."""

from __future__ import annotations

from dataclasses import replace

from helpers.config import TrainConfig, register_preset
from helpers.worlds.shop.presets import tiny_agent

MIX = "tiny-agent@shop+tiny@calculator+tiny-products@reasoning_gym_calculator"  # dataset@environment, joined by +


@register_preset("tiny-mix")
def tiny_mix() -> TrainConfig:
    """The shop, the one-call world and reasoning-gym's ``products`` in one run (``helpers.worlds.market``):
    the warm start ``data/tiny-market`` plays all three weakly (habits in the shop, answers "in the head"
    elsewhere), and one outcome reward, judged by each row's environment, teaches it each world's plan.
    The held-out tasks are a third of each world, interleaved, so the subset evaluations see them all."""
    return replace(  # the shop world's run (tiny_agent), on the mix
        tiny_agent(),
        model="data/tiny-market",
        dataset=MIX,
        max_train_tasks=3000,  # shared out evenly: 1,000 training tasks of each world (reasoning-gym draws its 1,000 in seconds)
        env="shop",  # rows that name no environment (none here); the mix names each row's
        steps=16,  # the lr decays linearly to 0 over these steps
        eval_every=4,
        eval_tasks=150,  # before and after: 50 of each world
        eval_subset=60,  # the points in between: the first 60 of those, 20 of each world
    )
