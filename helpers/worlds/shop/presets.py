"""The shop world's preset: GRPO teaches the weak warm start the three-call plan."""

from __future__ import annotations

from dataclasses import replace

from helpers.config import TrainConfig, register_preset
from helpers.worlds.arithmetic.presets import tiny_cpu


@register_preset("tiny-agent")
def tiny_agent() -> TrainConfig:
    """The multi-step tiny world (``helpers.worlds.shop``): find the customer's item, look up its
    price, compute the bill, answer: three tool calls, each built from the one before.

    The SFT warm start (data/tiny-agent) is a weak agent that follows its demonstrator's
    habits (guess the price, stop at the unit price, ask lookup for the bill). The reward is
    the outcome alone, no bonus for calling tools: GRPO has to find out that the whole chain
    is what pays. Taught in notebooks/06_training_loop.ipynb.
    """
    return replace(  # the one-call world's run (tiny_cpu), on the shop world's model, data and env
        tiny_cpu(),
        model="data/tiny-agent",
        backend="engine",  # helpers.policy.engine: HFPolicy's tokens and log-probs, faster rollouts
        dataset="tiny-agent",
        env="shop",  # helpers.worlds.shop.env: usual(), lookup(item), calculator(expression)
        env_max_steps=5,  # the plan takes 4 turns (usual, lookup, calculator, answer); one to spare
        steps=20,  # the lr decays linearly to 0 over these steps
        tasks_per_step=12,  # 96 episodes per step: sampled success is what needs the compute
        num_iterations=2,  # TRL's mu: 2 optimizer steps per batch of rollouts; the second is off-policy, so PPO's clip acts
        max_new_tokens=40,  # one turn: the longest (the calculator call) is ~22 tokens
        max_total_tokens=320,  # the 4-turn episode is ~170 tokens; error messages are longer
        eval_every=4,  # 6 held-out points on the curve
        eval_tasks=200,  # before and after: 16-17 orders of each item (held-out draws take the items in turn); one task is 0.005
        eval_subset=50,  # the 4 points in between: the first 50 of those tasks (about 4 of each item), a quarter of the cost
        pass_k=2,  # before and after: 200 greedy + 400 sampled episodes; in between 50 + 50
    )
