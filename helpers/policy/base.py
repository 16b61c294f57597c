"""The policy interface the rollout loop talks to (采样模块).

A policy turns token-id prompts into sampled continuations with their log-probs.
It is token-in/token-out on purpose: the rollout keeps the exact token ids, so the
tokens trained on are exactly the tokens sampled (no re-tokenisation drift).

Backends: ``policy.hf`` (transformers, CPU/GPU), ``policy.engine`` (merged weights, a KV cache across turns)
and ``policy.vllm`` (vLLM: GPU, or its CPU build);
``ScriptedPolicy`` below plays fixed replies (tests, demos of the rollout's guards).

Log-prob convention, for every backend (TRL's and vLLM's):
``Generation.logprobs[i] = log_softmax(logits / temperature)[token_i]``, the log-prob
under the temperature-scaled distribution the token was drawn from, over the full
vocabulary (top-p is not folded in). It is what the trainer recomputes for the
importance ratio (``helpers.grpo.token_logprobs(..., temperature)``; TRL's fused LM head,
``add_fused_lm_head(model, temperature=...)``); in vLLM it is
``logprobs_mode="processed_logprobs"``. Greedy (temperature 0) reports temperature 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class SamplingParams:
    max_new_tokens: int = 256  # per turn
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)  # end-of-turn, closing tool-call tag
    seed: int | None = None


@dataclass
class Generation:
    token_ids: list[int]  # sampled tokens, including the stop token if one was hit
    logprobs: list[float]  # log-prob of each sampled token: log_softmax(logits / temperature) (module docstring)
    finish_reason: str  # "stop" (hit a stop token) or "length" (max_new_tokens)


class Policy(Protocol):
    """What the rollout asks of a backend: ``generate``. What the training loop asks too:
    ``sleep()`` before each update (free the accelerator for the trainer) and ``sync(model)``
    after it (sample from the updated adapter from now on). ``HFPolicy`` samples with the
    trainer's own model, so both are no-ops there; ``VLLMPolicy`` does real work in both."""

    tokenizer: object

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation for each prompt (a list of token ids)."""
        ...

    def sleep(self) -> None: ...

    def sync(self, model) -> None: ...


class ScriptedPolicy:
    """A policy that plays a script: turn k of every episode gets ``replies[k]`` (the last
    reply repeats). For tests and demos (a looping agent); log-probs are 0.0.

    The turn number is read off the prompt: the number of assistant turns already in it
    (occurrences of ``turn_marker``, the opening of an assistant turn, minus the one the
    prompt ends with). Each reply is encoded, followed by the eos (end of turn), and cut
    after its first stop token, as a sampler would stop.
    """

    def __init__(self, tokenizer, replies: list[str], turn_marker: str = "<|im_start|>assistant"):
        if not replies:
            raise ValueError("ScriptedPolicy needs at least one reply")
        self.tokenizer = tokenizer
        self.replies = [tokenizer.encode(r, add_special_tokens=False) + [tokenizer.eos_token_id] for r in replies]
        self.marker = tokenizer.encode(turn_marker, add_special_tokens=False)  # as tokens: a user's text "<|im_start|>" is no turn

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        generations = []
        m = len(self.marker)
        for prompt in prompts:
            turn = sum(prompt[i : i + m] == self.marker for i in range(len(prompt) - m + 1)) - 1
            ids = self.replies[min(max(turn, 0), len(self.replies) - 1)]
            stops = [i for i, t in enumerate(ids) if t in params.stop_token_ids]
            if stops:  # stop where a sampler would: at the first stop token (a </tool_call>, say)
                ids = ids[: stops[0] + 1]
            finish = "stop" if stops and len(ids) <= params.max_new_tokens else "length"
            ids = ids[: params.max_new_tokens]
            generations.append(Generation(list(ids), [0.0] * len(ids), finish))
        return generations
