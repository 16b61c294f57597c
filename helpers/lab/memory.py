"""Will this run fit on this GPU? The memory arithmetic of a colocated GRPO run.

One card does two jobs in turn: vLLM *samples* (its copy of the weights plus a KV
cache) and the trainer *learns* (its copy of the weights, LoRA state, activations,
logits). The classic out-of-memory crash is running both at full size at once.
``memory_plan`` adds up every term for both phases before anything is loaded:

    plan = memory_plan("gsm8k-24gb", gpu_gb=24)
    print(plan)                 # the table
    check_fits(plan)            # raises DoesNotFitError, with advice, if it will not fit

All sizes are in GiB (2**30 bytes; a "24 GB" card has 24 GiB). The formulas, per
term (h hidden size, L layers, I MLP width, V vocabulary, kv = kv_heads * head_dim,
b bytes per element of the compute dtype, N tokens in one micro-batch):

    weights            n_params * b                         (once for the trainer, once for vLLM)
    LoRA state         n_lora * (4 + 4 + 8)                 fp32 adapter + fp32 grads + AdamW m and v
    activations        N * L * (6h + 2kv + 4I) * b          every layer keeps its inputs for backward
      with checkpointing  N * L * h * b + N * (6h + 2kv + 4I) * b   layer inputs + one layer recomputed
    logits             min(N, chunk) * V * (b + 20)         one chunk's logits and their fp32 copies (helpers.grpo)
    KV cache (needed)  tasks * G * seq_len * L * 2 * kv * b'  all samples of a step in flight at once (b' vLLM's dtype)
    KV cache (given)   util * gpu - vLLM weights - vLLM workspace

Simplifications, named:

* Activations count the tensors a Qwen2 decoder layer saves for backward per token:
  attention block ~4h + 2kv (norm input, normed input, q, attention output, k, v),
  MLP block ~2h + 4I (norm input, normed input, gate, up, silu(gate), their product).
  Attention itself is assumed to be SDPA/flash (no T x T score matrix kept); the
  fp32 upcasts inside RMSNorm and LoRA's rank-r intermediates are ignored (small).
* Every sequence is padded to ``max_total_tokens`` (the episode budget, prompt
  included): an upper bound, as real batches pad to their longest member.
* Logits are computed as ``helpers.grpo.token_logprobs`` does: in chunks of
  ``logits_chunk_tokens`` positions, each checkpointed, so one chunk's logits are
  alive at a time. Per logit: the lm_head output (b bytes), its fp32 copy, the
  copy divided by the temperature, the log-softmax, its exp (for the entropy) and
  the gradient in backward (4 B each): b + 20 bytes (22 B in bf16).
* Full fine-tuning is counted as mixed-precision AdamW: the compute copy plus
  16 bytes per parameter (fp32 master, grad, m, v). LoRA grads are counted in every
  phase (an upper bound: ``zero_grad(set_to_none=True)`` frees them between steps).
* vLLM's own needs beyond weights and KV cache (profiled activations, CUDA graphs,
  sampler buffers) are one constant, ``VLLM_WORKSPACE_GIB``; CUDA contexts and
  allocator slack are two more. They are rough, measured-order values, not a model.
* With sleep mode (level 1) vLLM's weights go to CPU RAM and its KV cache is freed
  while the trainer runs; only its process's CUDA context stays on the card.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from transformers import AutoConfig

import helpers.worlds  # noqa: F401  (registers the presets memory_plan("gsm8k-24gb", ...) names)
from helpers.config import TrainConfig, get_preset
from helpers.paths import in_repo

GIB = 2**30
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # bytes per element of each dtype
LORA_BYTES_PER_PARAM = 4 + 4 + 8  # fp32 adapter weight (peft upcasts it) + fp32 grad + AdamW m and v
FULL_FT_EXTRA_BYTES_PER_PARAM = 16  # fp32 master weight + fp32 grad + AdamW m and v, on top of the compute copy
LOGIT_FP32_BYTES = 4 * 5  # per logit, besides the lm_head output: fp32 copy, / temperature, log-softmax, exp, grad
LOGITS_CHUNK_TOKENS = 1024  # tokens per log-prob chunk (see helpers.grpo)
TRAINER_OVERHEAD_GIB = 1.0  # trainer's CUDA context (~0.4), cuBLAS workspaces, allocator slack
VLLM_CONTEXT_GIB = 0.5  # the vLLM engine process's own CUDA context; stays while it sleeps
VLLM_WORKSPACE_GIB = 1.0  # vLLM's profiled forward activations, CUDA graphs, sampler buffers


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a Qwen2-architecture decoder that memory depends on."""

    name: str
    hidden: int  # h
    layers: int  # L
    heads: int  # query heads
    kv_heads: int  # key/value heads (grouped-query attention: fewer than query heads)
    intermediate: int  # I, the SwiGLU MLP width
    vocab: int  # V
    tie_embeddings: bool  # lm_head shares the embedding matrix (small Qwen2.5 models)
    head_dim: int = 0  # 0 means hidden // heads

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each linear layer in one decoder layer."""
        h, kv, i, q = self.hidden, self.kv_dim, self.intermediate, self.heads * self.dim
        return {
            "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
        }  # fmt: skip

    def n_params(self) -> int:
        """All parameters: embeddings, L layers (linears, q/k/v biases, two norms), final norm, lm_head."""
        linears = sum(fan_in * fan_out for fan_in, fan_out in self.linear_shapes().values())
        biases = self.heads * self.dim + 2 * self.kv_dim  # Qwen2 has biases on q, k, v only
        per_layer = linears + biases + 2 * self.hidden  # + input and post-attention RMSNorm
        embeddings = self.vocab * self.hidden * (1 if self.tie_embeddings else 2)
        return embeddings + self.layers * per_layer + self.hidden

    def n_lora_params(self, rank: int, targets: list[str]) -> int:
        """LoRA adds A (r x in) and B (out x r) to each targeted linear of each layer."""
        shapes = self.linear_shapes()
        unknown = sorted(set(targets) - set(shapes))
        if unknown:
            raise ValueError(f"LoRA targets {unknown} are not linear layers of {self.name}; choose from {sorted(shapes)}")
        return self.layers * sum(rank * (fan_in + fan_out) for name, (fan_in, fan_out) in shapes.items() if name in targets)

    def activation_elements_per_token_layer(self) -> int:
        """Elements one decoder layer saves for backward per token (see the module docstring)."""
        return 6 * self.hidden + 2 * self.kv_dim + 4 * self.intermediate

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV cache per token: every layer stores one key and one value vector per KV head."""
        return self.layers * 2 * self.kv_heads * self.dim * dtype_bytes


# Exact values from each model's config.json on the Hugging Face hub (Qwen/Qwen2.5-*-Instruct).
QWEN25 = {
    "Qwen2.5-0.5B": ModelShape("Qwen2.5-0.5B", hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936, tie_embeddings=True),
    "Qwen2.5-1.5B": ModelShape("Qwen2.5-1.5B", hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab=151936, tie_embeddings=True),
    "Qwen2.5-3B": ModelShape("Qwen2.5-3B", hidden=2048, layers=36, heads=16, kv_heads=2, intermediate=11008, vocab=151936, tie_embeddings=True),
    "Qwen2.5-7B": ModelShape("Qwen2.5-7B", hidden=3584, layers=28, heads=28, kv_heads=4, intermediate=18944, vocab=152064, tie_embeddings=False),
}


def model_shape(model: str) -> ModelShape:
    """Shape of a model: from the built-in Qwen2.5 table, else from a local folder's config.json.

    >>> model_shape("Qwen/Qwen2.5-1.5B-Instruct").layers
    28
    """
    for key, shape in QWEN25.items():
        if key.lower() in model.lower():
            return shape
    folder = in_repo(model)
    if not (folder / "config.json").exists():
        raise ValueError(f"no shape for model {model!r}: not in the built-in table {sorted(QWEN25)} and no config.json at {folder}")
    c = AutoConfig.from_pretrained(folder)
    return ModelShape(
        name=str(model),
        hidden=c.hidden_size,
        layers=c.num_hidden_layers,
        heads=c.num_attention_heads,
        kv_heads=getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
        intermediate=c.intermediate_size,
        vocab=c.vocab_size,
        tie_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
        head_dim=getattr(c, "head_dim", None) or 0,
    )


def _count(n: int) -> str:
    """A parameter count for the table: 1.54B, 36.9M, 12.3K."""
    for unit, size in [("B", 1e9), ("M", 1e6), ("K", 1e3)]:
        if n >= size:
            return f"{n / size:.{2 if unit == 'B' else 1}f}{unit}"
    return str(n)


@dataclass
class MemoryPlan:
    """The estimate for one config on one GPU. ``rows`` are (term, GiB, note)."""

    config: TrainConfig
    gpu_gb: float
    shape: ModelShape
    rows: list[tuple[str, float, str]]
    rollout_gib: float  # peak while sampling (vLLM awake)
    train_gib: float  # peak while training (vLLM asleep, if sleep mode is on)
    trainer_gib: float  # the trainer process alone while training (what torch's allocator measures there, plus its context)
    kv_needed_gib: float  # KV cache for a whole step's samples at once
    kv_available_gib: float  # what vLLM's share leaves for KV cache (hf backend: the need itself)
    problems: list[str] = field(default_factory=list)  # why it does not fit, with advice
    notes: list[str] = field(default_factory=list)  # fits, but worth knowing (e.g. KV cache short: slower sampling)

    @property
    def peak_gib(self) -> float:
        return max(self.rollout_gib, self.train_gib)

    @property
    def fits(self) -> bool:
        return not self.problems

    def table(self) -> str:
        lines = [f"memory plan: {self.shape.name} on a {self.gpu_gb:g} GiB GPU", f"{'term':<34}{'GiB':>8}  note", "-" * 78]
        lines += [f"{name:<34}{gib:>8.2f}  {note}" for name, gib, note in self.rows]
        lines.append("-" * 78)
        lines.append(f"{'peak while sampling (rollout)':<34}{self.rollout_gib:>8.2f}")
        lines.append(f"{'peak while training (update)':<34}{self.train_gib:>8.2f}")
        verdict = "fits" if self.fits else "DOES NOT FIT"
        lines.append(f"{'peak / card':<34}{self.peak_gib:>8.2f}  of {self.gpu_gb:g} GiB: {verdict}")
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  ! {p}" for p in self.problems]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def memory_plan(config: TrainConfig | str, gpu_gb: float, logits_chunk_tokens: int = LOGITS_CHUNK_TOKENS) -> MemoryPlan:
    """Estimate GPU memory for a preset (name or TrainConfig) in both phases of a step.

    Taught in notebooks/07_gsm8k_24gb.ipynb §1 and 08_pitfalls.ipynb §3.
    """
    if isinstance(config, str):
        config = get_preset(config)
    if config.dtype not in BYTES:
        raise ValueError(f"unknown dtype {config.dtype!r}; choose from {sorted(BYTES)}")
    if gpu_gb <= 0:
        raise ValueError(f"gpu_gb must be positive, got {gpu_gb}")
    shape = model_shape(config.model)
    vllm_dtype = config.vllm_dtype or config.dtype
    if vllm_dtype not in BYTES:
        raise ValueError(f"unknown vllm_dtype {vllm_dtype!r}; choose from {sorted(BYTES)}")
    b = BYTES[config.dtype]
    n = shape.n_params()
    seq_len = config.max_total_tokens  # prompt + completion budget; every sequence padded to it
    sequences = config.tasks_per_step * config.num_generations
    micro_batch = math.ceil(sequences / config.grad_accum)
    tokens = micro_batch * seq_len  # N: tokens in one forward/backward
    rows = []

    # --- the trainer's resident state ---
    weights = n * b / GIB
    rows.append(("weights (trainer copy)", weights, f"{_count(n)} params x {b} B ({config.dtype})"))
    if config.use_lora:
        n_lora = shape.n_lora_params(config.lora_r, config.lora_target_modules)
        state = n_lora * LORA_BYTES_PER_PARAM / GIB
        rows.append(("LoRA params + grads + AdamW", state, f"{_count(n_lora)} params x 16 B (fp32 weight, grad, m, v)"))
    else:
        state = n * FULL_FT_EXTRA_BYTES_PER_PARAM / GIB
        rows.append(("full FT: master + grads + AdamW", state, f"{_count(n)} params x 16 B (fp32 master, grad, m, v)"))
    rows.append(("CUDA context + allocator slack", TRAINER_OVERHEAD_GIB, "trainer process, rough constant"))
    resident = weights + state + TRAINER_OVERHEAD_GIB

    # --- the update: activations and logits of one micro-batch ---
    per_layer = shape.activation_elements_per_token_layer() * b  # bytes per token per layer
    if config.gradient_checkpointing:
        activations = (tokens * shape.layers * shape.hidden * b + tokens * per_layer) / GIB
        how = "checkpointed: layer inputs + 1 layer"
    else:
        activations = tokens * shape.layers * per_layer / GIB
        how = "no checkpointing: all layers"
    rows.append(("activations", activations, f"{micro_batch} seqs x {seq_len} tok, {how}"))
    chunk = min(tokens, logits_chunk_tokens)
    logits = chunk * shape.vocab * (b + LOGIT_FP32_BYTES) / GIB
    rows.append(("logits (chunked log-probs)", logits, f"{chunk} tok x {shape.vocab} vocab x {b + LOGIT_FP32_BYTES} B"))
    update = activations + logits
    trainer = resident + update  # the trainer process alone while it trains

    # --- the rollout: vLLM's share of the card, or the hf backend's KV cache ---
    kv_b = BYTES[vllm_dtype] if config.backend == "vllm" else b  # the KV cache is in the sampler's dtype
    kv_per_seq = seq_len * shape.kv_bytes_per_token(kv_b)
    kv_needed = sequences * kv_per_seq / GIB
    problems, notes = [], []
    if config.backend == "vllm":
        util = config.vllm_gpu_memory_utilization
        pool = util * gpu_gb
        vllm_weights = n * BYTES[vllm_dtype] / GIB
        kv_available = pool - vllm_weights - VLLM_WORKSPACE_GIB
        rows.append(("vLLM: weights", vllm_weights, f"second copy, for sampling ({vllm_dtype})"))
        rows.append(("vLLM: workspace", VLLM_WORKSPACE_GIB, "profiled activations, CUDA graphs; rough"))
        rows.append(("vLLM: KV cache available", max(kv_available, 0.0), f"gpu_memory_utilization {util} x {gpu_gb:g} GiB - the two above"))
        rows.append(("vLLM: KV cache needed", kv_needed, f"{sequences} seqs x {seq_len} tok x {shape.kv_bytes_per_token(kv_b) // 1024} KiB/tok"))
        rows.append(("vLLM: process CUDA context", VLLM_CONTEXT_GIB, "engine process; stays while asleep"))
        rollout = resident + pool + VLLM_CONTEXT_GIB
        asleep = VLLM_CONTEXT_GIB if config.vllm_sleep_mode else pool + VLLM_CONTEXT_GIB
        train = trainer + asleep
        if kv_available < kv_per_seq / GIB:
            problems.append(
                f"vLLM's share ({util} x {gpu_gb:g} = {pool:.2f} GiB) leaves {kv_available:.2f} GiB for KV cache, "
                f"less than one {seq_len}-token sequence needs ({kv_per_seq / GIB:.3f} GiB): vLLM will refuse to start. "
                "Raise vllm_gpu_memory_utilization, or shorten max_total_tokens."
            )
        elif kv_available < kv_needed:
            notes.append(f"the KV cache holds ~{kv_available / kv_needed:.0%} of a step's samples at once: vLLM queues the rest (slower sampling, not a crash)")
    else:  # hf: transformers' generate keeps its KV cache in the trainer process
        kv_available = kv_needed
        rows.append(("hf generate: KV cache", kv_needed, f"{sequences} seqs x {seq_len} tok, in the trainer process"))
        rollout = resident + kv_needed
        train = trainer

    if resident > gpu_gb:
        problems.append(f"the trainer's weights and optimizer state alone need {resident:.2f} GiB > {gpu_gb:g} GiB: train a LoRA adapter, or pick a smaller model.")
    elif rollout > gpu_gb:
        advice = "lower vllm_gpu_memory_utilization (vLLM's share of the card)" if config.backend == "vllm" else "fewer tasks_per_step or num_generations, or shorter max_total_tokens"
        problems.append(f"sampling needs {rollout:.2f} GiB > {gpu_gb:g} GiB: {advice}.")
    if train > gpu_gb:
        advice = []
        if config.backend == "vllm" and not config.vllm_sleep_mode:
            advice.append("turn on vllm_sleep_mode (frees vLLM's weights and KV cache while training)")
        if not config.gradient_checkpointing:
            advice.append("turn on gradient_checkpointing")
        advice.append(f"a smaller micro-batch (raise grad_accum; now {micro_batch} seqs)")
        advice.append(f"shorter completions (max_total_tokens now {seq_len})")
        if not config.use_lora:
            advice.append("train a LoRA adapter instead of the full model")
        problems.append(f"training needs {train:.2f} GiB > {gpu_gb:g} GiB: " + "; ".join(advice) + ".")
    return MemoryPlan(config, gpu_gb, shape, rows, rollout, train, trainer, kv_needed, kv_available, problems, notes)


class DoesNotFitError(MemoryError):
    """The memory plan says this run will not fit on the card; the message says what to change."""


def check_fits(plan_or_config: MemoryPlan | TrainConfig | str, gpu_gb: float | None = None) -> MemoryPlan:
    """Return the plan if it fits; raise ``DoesNotFitError`` with the table and advice if not."""
    plan = plan_or_config
    if not isinstance(plan, MemoryPlan):
        if gpu_gb is None:
            raise ValueError("check_fits needs gpu_gb when given a config or preset name")
        plan = memory_plan(plan, gpu_gb)
    if not plan.fits:
        raise DoesNotFitError(f"{plan.shape.name} will not fit on {plan.gpu_gb:g} GiB: " + " ".join(plan.problems) + "\n" + plan.table())
    return plan


# ----------------------------------------------------------------------------------------------
# The episode budget: what a run spends on training and on evaluation
# ----------------------------------------------------------------------------------------------


@dataclass
class EpisodeBudget:
    """Episodes a run samples: for training, and for its held-out evaluations (greedy and sampled alike)."""

    train: int  # steps * tasks_per_step * G
    eval: int  # every evaluation's tasks * (1 greedy + k sampled)
    evaluations: int  # how many evaluations: before, every eval_every steps, after

    @property
    def eval_share(self) -> float:
        """Evaluation's share of all episodes of the run."""
        return self.eval / (self.train + self.eval)

    def __str__(self) -> str:
        return (f"{self.train:,} training episodes, {self.eval:,} evaluation episodes in {self.evaluations} evaluations: "
                f"evaluation is {self.eval_share:.1%} of the run's episodes")


def episode_budget(config: TrainConfig | str, eval_pool: int | None = None) -> EpisodeBudget:
    """Count a run's episodes the way ``helpers.loop.train`` samples them (its ``run_eval``).

    Before and after training each of ``eval_tasks`` held-out tasks (at most ``eval_pool``, the test split's
    size) is played once greedily and ``pass_k`` times sampled; the evaluations in between play the first
    ``eval_subset`` tasks (0: all) greedily and once sampled (none when ``pass_k = 0``).

        episode_budget("gsm8k-24gb-tools", eval_pool=1319)   # GSM8K's test split has 1,319 problems

    Simplification, named: an episode is counted as one, whatever its turns and tokens; a multi-turn
    evaluation episode and a training one cost about the same, so the share of episodes is close to the
    share of sampling time (the update's time is not counted).
    """
    if isinstance(config, str):
        config = get_preset(config)
    tasks = min(config.eval_tasks, eval_pool) if eval_pool else config.eval_tasks
    middle_steps = [s for s in range(1, config.steps) if config.eval_every > 0 and s % config.eval_every == 0]
    middle_tasks = min(config.eval_subset, tasks) if config.eval_subset > 0 else tasks
    ends = 2 * tasks * (1 + config.pass_k)
    middle = len(middle_steps) * middle_tasks * (1 + min(config.pass_k, 1))
    train = config.steps * config.tasks_per_step * config.num_generations
    return EpisodeBudget(train=train, eval=ends + middle, evaluations=2 + len(middle_steps))
