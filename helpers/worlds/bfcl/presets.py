"""The BFCL multi-turn presets: GRPO on BFCL's simulators, reward = BFCL's multi-turn checker's verdict."""

from __future__ import annotations

from helpers.config import TrainConfig, register_preset

GPU_SIMULATORS = "GorillaFileSystem+MathAPI+TwitterAPI"  # 49 functions; 37 multi_turn_base entries use only these


@register_preset("bfcl-multiturn-smoke")
def bfcl_multiturn_smoke() -> TrainConfig:
    """Every line of the BFCL multi-turn path on a CPU: the tiny agent (``data/tiny-agent``) on the file-system
    simulator's entries (``bfcl-splits/multi_turn_base:GorillaFileSystem``, train split), its 18 functions as
    tools, BFCL's multi-turn checker as the only reward (the env's ``get_reward``), two steps.

    It checks the plumbing, not the learning: the tiny agent was trained on the shop world, so it never
    solves a BFCL entry and its rewards are 0. The first use makes BFCL's environment (about a minute,
    once per machine: ``helpers.worlds.bfcl.official``).
    """
    return TrainConfig(
        model="data/tiny-agent",
        device="cpu",
        lora_r=8,
        lora_alpha=16,
        dataset="bfcl-splits/multi_turn_base:GorillaFileSystem",  # 13 entries: 9 train, the rest validation and test
        env="bfcl_multiturn",
        env_kwargs={"classes": "GorillaFileSystem"},
        env_max_steps=6,  # tool turns and the replies that end a user turn
        rewards={"BfclMultiTurnEnv": 1.0},  # the env's get_reward() (BFCL's checker), the one part, as TRL adds it
        tasks_per_step=2,
        num_generations=2,
        max_new_tokens=32,
        max_total_tokens=512,  # the tiny model's context
        steps=2,
        lr=5e-3,
        eval_every=0,
        eval_tasks=2,
        pass_k=0,
        save_every=2,
        log_trajectories_every=1,
    )


@register_preset("bfcl-multiturn-24gb")
def bfcl_multiturn_24gb() -> TrainConfig:
    """Qwen2.5-1.5B-Instruct on BFCL's multi-turn simulators, on one 24 GB card (GPU; not run here).

    The entries on the file system, math and Twitter simulators (``GPU_SIMULATORS``: 37 of multi_turn_base's
    200; ``bfcl-splits`` puts 30 in train, 4 in validation, 3 in test: it evaluates before and after on those 3,
    a plumbing check more than a measurement; the full ``bfcl/multi_turn_base`` has entries it trained on),
    the 49 functions of the three as tools in Qwen's native format, BFCL's multi-turn checker as the reward.
    Episodes are long: the tools' schemas alone are 30k characters (roughly 8k tokens), then 2-5 user turns,
    each with calls and results; so fewer, longer sequences per step than the GSM8K presets.
    ``python -c "from helpers.lab.memory import memory_plan; print(memory_plan('bfcl-multiturn-24gb', 24))"``
    prints the memory arithmetic (16.9 of 24 GiB at the peak, while sampling).
    """
    return TrainConfig(
        model="Qwen/Qwen2.5-1.5B-Instruct",
        dtype="bfloat16",
        device="cuda",
        gradient_checkpointing=True,
        lora_r=32,
        lora_alpha=64,
        dataset=f"bfcl-splits/multi_turn_base:{GPU_SIMULATORS}",
        env="bfcl_multiturn",
        env_kwargs={"classes": GPU_SIMULATORS},
        env_max_steps=16,  # about 4 user turns x (2-3 calls + the reply that ends the turn)
        rewards={"BfclMultiTurnEnv": 1.0},  # the env's get_reward(): BFCL's multi-turn checker, 1.0 or 0.0
        backend="vllm",
        tasks_per_step=2,  # 2 entries x G = 16 episodes per step
        num_generations=8,
        max_new_tokens=256,  # one reply: a few <tool_call> blocks or a short answer
        max_total_tokens=12288,  # ~8k tokens of tool schemas + the turns, calls and results
        vllm_gpu_memory_utilization=0.5,  # KV cache for a whole step: 16 episodes x 12288 tokens x 28 KiB = 5.3 GiB (helpers.lab.memory)
        vllm_sleep_mode=True,
        grad_accum=8,  # micro-batches of 2 sequences of up to 12k tokens
        steps=60,
        lr=1e-5,
        eval_every=20,
        eval_tasks=64,  # all of the held-out test split there is: 3 entries (validation: 4)
        pass_k=0,
        save_every=10,
        log_trajectories_every=5,
        max_train_tasks=None,
    )
