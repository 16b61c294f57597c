"""The GSM8K presets: the same loop on Qwen2.5 with vLLM rollouts (``helpers.lab.memory`` plans their memory),
and CPU smoke versions of each path on the tiny model."""

from __future__ import annotations

from helpers.config import TrainConfig, register_preset


@register_preset("gsm8k-24gb")
def gsm8k_24gb() -> TrainConfig:
    """Qwen2.5-1.5B-Instruct, LoRA on every linear layer, vLLM colocated on one 24 GB card.

    The card is shared in time: vLLM samples (its weights + KV cache, 30% of the card),
    then sleeps (weights to CPU RAM, KV cache freed) while the trainer runs the update.
    ``python -c "from helpers.lab.memory import memory_plan; print(memory_plan('gsm8k-24gb', 24))"``
    prints the arithmetic.
    """
    return TrainConfig(
        model="Qwen/Qwen2.5-1.5B-Instruct",
        dtype="bfloat16",  # Ampere and newer (3090/4090, A10, L4) compute in bf16: fp32's range, half the bytes
        device="cuda",
        gradient_checkpointing=True,  # activations of 8 x 768 tokens drop from ~15 GiB to ~1 GiB
        lora_r=32,  # rank 32, alpha 64 as in verl's logged Qwen2.5-1.5B GSM8K LoRA run, so results compare
        lora_alpha=64,
        dataset="gsm8k",  # hub train split for training, the 1,319 test problems for evaluation
        env="math",  # single turn: reason, then <answer>N</answer>; checked leniently, strict format reported apart
        env_max_steps=1,
        rewards={"correct": 1.0, "format": 0.0},  # paid for lenient correctness; the strict-format rate is logged, not paid
        backend="vllm",
        tasks_per_step=16,  # 16 problems x G = 128 completions per step
        num_generations=8,  # G
        max_new_tokens=512,  # GSM8K solutions are ~100-300 tokens; 512 leaves room without paying for rambling
        max_total_tokens=768,  # 512 completion + up to 256 prompt tokens (system prompt + question)
        vllm_gpu_memory_utilization=0.3,  # 7.2 GiB: weights 2.9 + workspace + ~3.3 GiB KV (a whole step fits)
        vllm_sleep_mode=True,
        steps=200,
        lr=1e-5,  # LoRA: ~10x TRL's full-model GRPO default (1e-6); a rank-32 delta moves slowly, higher rates risk collapse
        warmup_steps=10,
        grad_accum=16,  # micro-batches of 8 sequences: what the memory plan budgets for activations
        eval_every=25,
        eval_tasks=1319,  # all of GSM8K's test split, greedy, before and after training
        eval_subset=200,  # the 7 evaluations in between: the first 200 of them (the curve; see helpers.loop)
        # no sampled pass@k: 4 samples of 1,319 problems before and after would cost 10.6k episodes, 41% of training's
        # 25.6k; without it evaluation is 13.6% of the run's episodes (helpers.lab.memory.episode_budget)
        pass_k=0,
        max_train_tasks=None,
    )


@register_preset("gsm8k-t4")
def gsm8k_t4() -> TrainConfig:
    """Qwen2.5-0.5B-Instruct on a free 16 GB Colab T4 (about 15 GiB usable).

    A T4 (Turing) has no bf16, so each copy of the model chooses between fp16 and fp32:

    * vLLM samples in fp16: it has no bf16 on a T4, fp16 is what its kernels are built
      for, and sampling needs no gradients, so fp16's narrow range is harmless there.
    * The trainer runs in fp32. fp16 training needs a loss scaler (small gradients
      underflow to 0 in fp16, silently), and helpers.grpo has none; 0.5B weights take
      only 1.8 GiB in fp32, so the card has room. The price is speed (a T4 has no fp32
      tensor cores), and a small fp16-vs-fp32 gap between sampling and training
      log-probs, which GRPO's importance ratio absorbs like any backend difference.
    """
    config = gsm8k_24gb()
    config.model = "Qwen/Qwen2.5-0.5B-Instruct"
    config.dtype = "float32"
    config.vllm_dtype = "float16"
    config.lora_r, config.lora_alpha = 16, 32
    config.tasks_per_step = 8  # half the 24 GB preset's batch: a T4 is several times slower than a 4090
    config.grad_accum = 8  # micro-batches of 8 sequences
    config.vllm_gpu_memory_utilization = 0.35  # 5.2 GiB of 15: fp16 weights 0.9 + workspace + ~3.3 GiB KV
    # half the training episodes of the 24 GB presets, so fewer and smaller evaluations keep theirs under a fifth
    config.eval_every, config.eval_subset = 50, 100
    return config


@register_preset("gsm8k-cpu-smoke")
def gsm8k_cpu_smoke() -> TrainConfig:
    """Every line of the GSM8K path on a CPU in well under a minute: the tiny model on the
    project's GSM8K-format sample (data/gsm8k_sample.jsonl, 80/20 train/held-out split),
    hf backend, two steps, then the full evaluation path on every held-out problem.
    It checks the plumbing, not the learning: the tiny model cannot solve GSM8K."""
    return TrainConfig(
        model="data/tiny",
        device="cpu",
        lora_r=8,
        lora_alpha=16,
        dataset="gsm8k-sample",
        env="math",
        env_max_steps=1,
        backend="hf",
        tasks_per_step=2,
        num_generations=2,  # the smallest group that has an advantage
        max_new_tokens=16,
        max_total_tokens=384,  # the tiny tokenizer is near character-level: the sample's prompts run to ~350 tokens
        steps=2,
        lr=3e-4,
        eval_every=0,  # only before and after
        eval_tasks=1319,  # "the whole test set": all held-out problems of the sample
        pass_k=2,
        save_every=2,
        log_trajectories_every=1,
    )


@register_preset("gsm8k-24gb-tools")
def gsm8k_24gb_tools() -> TrainConfig:
    """The agentic GSM8K run: gsm8k-24gb with the calculator as a tool (notebook 07's main run).

    The env is ``calculator``: its JSON schema goes to the tokenizer's own
    ``apply_chat_template(tools=...)``, so Qwen2.5 sees the tool in its native format and
    calls it with ``<tool_call>{"name": "calculator", ...}</tool_call>``; the tool's answer
    comes back as a ``tool`` message, and the episode ends at the first reply without a
    call. Up to 4 tool calls (5 assistant turns). The single-turn ``gsm8k-24gb`` stays
    beside it as the RLVR baseline: the same model, data, reward and budget per turn.
    """
    config = gsm8k_24gb()
    config.env = "calculator"
    config.env_max_steps = 5  # up to 4 tool calls, then the answer
    config.max_new_tokens = 384  # per turn: reasoning + one call, or the final answer
    # Qwen's tool preamble (~250 tokens) + question (~120) + 4 x (call ~40 + result ~20) + the answer turns
    config.max_total_tokens = 1280
    config.vllm_gpu_memory_utilization = 0.35  # the longer episodes need more KV cache (helpers.lab.memory: 13.3 of 24 GiB)
    return config


@register_preset("gsm8k-tools-cpu-smoke")
def gsm8k_tools_cpu_smoke() -> TrainConfig:
    """gsm8k-24gb-tools' path on a CPU: the tiny model, the GSM8K-format sample, the calculator
    env, two steps and the full evaluation. Plumbing only, like gsm8k-cpu-smoke."""
    config = gsm8k_cpu_smoke()
    config.env = "calculator"
    config.env_max_steps = 3
    config.max_new_tokens = 32  # room for one tool call per turn
    config.max_total_tokens = 448
    return config


@register_preset("gsm8k-t4-tools")
def gsm8k_t4_tools() -> TrainConfig:
    """The agentic GSM8K run on a 16 GB Colab T4: gsm8k-t4 (Qwen2.5-0.5B-Instruct, fp32 trainer, fp16 vLLM)
    with the calculator as a tool and the episode limits of gsm8k-24gb-tools.

    ``python -c "from helpers.lab.memory import memory_plan; print(memory_plan('gsm8k-t4-tools', 15))"`` prints
    the arithmetic: 8.7 of 15 GiB at the peak. The 1,280-token episodes need 0.9 GiB of KV cache (3.3 given)
    and 1.8 GiB of checkpointed activations per micro-batch of 8; the largest term is the logits (3.5 GiB).
    """
    config = gsm8k_t4()
    config.env = "calculator"
    config.env_max_steps = 5  # up to 4 tool calls, then the answer
    config.max_new_tokens = 384  # per turn: reasoning + one call, or the final answer
    config.max_total_tokens = 1280  # Qwen's tool preamble + question + 4 calls and results + the answer
    return config
