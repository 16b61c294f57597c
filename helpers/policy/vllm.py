"""vLLM backend (GPU): the same ``Policy.generate`` as the transformers backend, much faster.

    policy = VLLMPolicy.from_config(config)           # vllm.LLM(enable_lora=True, ...)
    gens = policy.generate(prompt_ids, params)        # rollout: token ids in, Generations out
    policy.sleep()                                    # free the card for the update
    ...GRPO update on the peft model...
    policy.load_adapter(peft_model)                   # save it, hand vLLM a new LoRARequest
    gens = policy.generate(prompt_ids, params)        # wakes vLLM, samples with the new adapter

How the two copies of the model stay in step without a merge: vLLM holds the frozen
base weights; after each update the trainer's LoRA adapter is saved to a folder and
passed to ``generate`` as a ``LoRARequest`` with a *new integer id*. vLLM caches
adapters (and prefix-cache entries) by that id, so a new id per version is what makes
it load the new weights instead of reusing the old ones.

How one card serves both jobs: ``enable_sleep_mode=True`` lets ``sleep(level=1)``
move vLLM's weights to CPU RAM and free its KV cache while the trainer runs, and
``wake_up()`` bring them back. Level 1, not 2: LoRA never changes the base weights,
so keeping them in CPU RAM beats reloading them. Before waking, the trainer's freed
blocks are returned to CUDA (``torch.cuda.empty_cache``), or vLLM finds no room.

Log-probs are vLLM's *raw* log-probs (the model's distribution before temperature
and top-p), the same temperature-1 scale the transformers backend reports.

Not run in CI: vLLM needs a GPU and is not installed there. ``vllm`` is imported
lazily, so CPU users never need it; tests/test_vllm_policy.py checks every call this
adapter makes against a fake ``vllm`` module.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from helpers.policy.base import Generation, SamplingParams


def _import_vllm():
    try:
        import vllm
        from vllm.lora.request import LoRARequest
    except ImportError as e:
        raise ImportError("the vllm backend needs vLLM on a CUDA GPU: pip install -e '.[gpu]' (or use backend='hf')") from e
    return vllm, LoRARequest


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
        seed: int = 0,
        adapter_dir: str | Path | None = None,
        **llm_kwargs,
    ):
        vllm, self._LoRARequest = _import_vllm()
        self.llm = vllm.LLM(
            model=model,
            dtype=dtype,
            enable_lora=True,
            max_lora_rank=max_lora_rank,  # must be >= the adapter's rank
            max_loras=1,  # one adapter version in use at a time
            gpu_memory_utilization=gpu_memory_utilization,  # vLLM's share: weights + workspace + KV cache
            enable_sleep_mode=enable_sleep_mode,
            max_model_len=max_model_len,
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
        self._prefix_cache_stale = False  # set by load_adapter; cleared in generate, once vLLM is awake

    @classmethod
    def from_config(cls, config, tokenizer=None, adapter_dir: str | Path | None = None) -> VLLMPolicy:
        """Build from a ``TrainConfig`` (model, dtype, vLLM share of the card, sleep mode, LoRA rank)."""
        return cls(
            config.model,
            tokenizer,
            dtype=config.vllm_dtype or config.dtype,
            gpu_memory_utilization=config.vllm_gpu_memory_utilization,
            enable_sleep_mode=config.vllm_sleep_mode,
            max_lora_rank=config.lora_r,
            max_model_len=config.max_total_tokens,
            seed=config.seed,
            adapter_dir=adapter_dir,
        )

    # --- weights ------------------------------------------------------------------------

    def load_adapter(self, model_or_path) -> None:
        """Use a new adapter version from now on: a peft model (saved here) or a saved adapter folder.

        Each version gets a fresh integer id (1, 2, ...; vLLM reserves 0). The folder of
        the previous version, if this policy wrote it, is deleted: from now on nothing
        asks vLLM for that id again.
        """
        if isinstance(model_or_path, (str, Path)):
            path = Path(model_or_path)
            if not (path / "adapter_config.json").exists():
                raise FileNotFoundError(f"no LoRA adapter (adapter_config.json) in {path}")
            self.version += 1
        else:
            self.version += 1
            path = self.adapter_dir / f"v{self.version}"
            model_or_path.save_pretrained(str(path))  # peft: adapter_config.json + adapter weights only
        previous = Path(self.lora_request.lora_path) if self.lora_request is not None else None
        self.lora_request = self._LoRARequest(f"policy-v{self.version}", self.version, str(path))
        self._prefix_cache_stale = True  # cached prompt KV was computed with the old adapter
        if previous is not None and previous.parent == self.adapter_dir and previous != path:
            shutil.rmtree(previous, ignore_errors=True)

    def sleep(self) -> None:
        """Before the update: offload vLLM's weights to CPU RAM and drop its KV cache."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        """Before sampling: give the trainer's freed memory back to CUDA, then restore vLLM."""
        if self.asleep:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            self.llm.wake_up()
            self.asleep = False

    # --- sampling -----------------------------------------------------------------------

    def sampling_params(self, params: SamplingParams, prompt_lengths: list[int]) -> list:
        """One ``vllm.SamplingParams`` per prompt.

        With a seed, prompt i gets seed + i: a shared per-request seed would make the G
        samples of one task identical. ``max_tokens`` is capped so that prompt + reply
        fits ``max_model_len`` (the rollout's batch-wide budget can exceed a long
        prompt's room; the rollout cuts each row to its own budget afterwards).
        """
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
        if self._prefix_cache_stale:  # done here, awake, not in load_adapter (vLLM may be asleep then)
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
