"""The reasoning-gym world's preset: GRPO on a reasoning-gym generator with its verifier as the reward."""

from __future__ import annotations

from helpers.config import TrainConfig, register_preset


@register_preset("reasoning-gym-cpu")
def reasoning_gym_cpu() -> TrainConfig:
    """Every line of the reasoning-gym path on a CPU, in a minute or two: the tiny model (``data/tiny``)
    on ``products`` with at most two-digit factors ("Solve the following multiplication: 57 * 87. Give
    only the result as your final answer."), one turn, the generator's own ``score_answer`` as the
    only reward part (``"reasoning_gym"``), a few steps and an evaluation before and after.

    It checks the plumbing, not the learning: the tiny model was trained on "What is 47*86?" with a
    calculator, so it does not write an ``<answer>`` tag for reasoning-gym's wording and its rewards are
    0. On a GPU, the same dataset and reward with Qwen2.5-Instruct (``--model``,
    ``--device``, longer turns) is a real run.
    """
    return TrainConfig(
        model="data/tiny",
        device="cpu",
        lora_r=8,
        lora_alpha=16,
        dataset="reasoning_gym/products:max_digits=2",  # 1-2 digit factors: the smallest products it makes
        env="reasoning_gym",  # helpers.worlds.reasoning_gym.env: one turn, judged by the generator's score_answer
        env_max_steps=1,
        max_train_tasks=256,  # drawn in well under a second (about 320 draws)
        rewards={"reasoning_gym": 1.0},  # the verifier's score, partial credit included; no reward of our own
        tasks_per_step=4,
        num_generations=4,
        max_new_tokens=24,  # "<answer>4959</answer>" is 6 tiny tokens, then <|im_end|>
        max_total_tokens=480,  # reasoning-gym's default system prompt + question are ~430 tiny tokens (near character-level)
        steps=4,
        lr=5e-3,  # the tiny world's rate (helpers.worlds.arithmetic.presets.tiny_cpu)
        eval_every=0,  # only before and after
        eval_tasks=16,
        pass_k=2,
        save_every=4,
        log_trajectories_every=2,
    )
