"""The trail world's preset: the long-horizon run where turn-level credit has something to find."""

from __future__ import annotations

from dataclasses import replace

from helpers.config import TrainConfig, register_preset
from helpers.worlds.arithmetic.presets import tiny_cpu

SUCCESS_BAR = 0.8  # held-out greedy success the comparison of notebook 06b counts steps to


@register_preset("tiny-long-horizon")
def tiny_long_horizon() -> TrainConfig:
    """The trail (``helpers.worlds.trail``): six rooms, a ``go(door)`` call in each, then the exit's code;
    seven decisions at least, a few turns to spare, the outcome reward only at the end.

    The warm start follows the signs except in room 4, where it tries the first door listed, again
    and again. Compare ``--advantage grpo`` and ``--advantage gigpo`` (notebook 06b §4): the settings
    were chosen on seeds 0-2 with both, the comparison is on seeds 3-8.
    """
    return replace(  # the one-call world's run (tiny_cpu), on the trail's model, data and env
        tiny_cpu(),
        model="data/tiny-trail",
        backend="engine",  # helpers.policy.engine: HFPolicy's tokens and log-probs, faster rollouts
        dataset="tiny-trail",
        env="trail",  # helpers.worlds.trail.env: go(door); its anchor state is the room (current_room)
        env_max_steps=11,  # seven turns needed; a loop in room 4 meets the token budget first, at about the tenth turn
        steps=20,  # the lr decays linearly to 0 over these steps
        lr=1e-3,  # slow enough that room 4's habit fades over several steps: steps to the bar then tell the methods apart
        tasks_per_step=16,
        num_generations=4,  # tiny_cpu's 64 episodes a step in smaller groups: more groups end right in every episode, where
        # GRPO has nothing to learn (skip_zero_spread) and GiGPO's step groups still rank the tries made in one room
        num_iterations=2,  # TRL's mu: 2 optimizer steps per batch of rollouts
        max_new_tokens=32,  # one turn: a go() call is ~12 tokens
        max_total_tokens=480,  # seven turns are ~330 tokens; the model's positions stop at 512
        eval_every=1,  # greedy on the held-out trails after every step: how many steps to the success bar
        eval_tasks=100,
        pass_k=1,  # greedy and one sampled episode per held-out trail
    )
