"""The policy interface the rollout loop talks to (采样模块).

A policy turns token-id prompts into sampled continuations with their log-probs.
It is token-in/token-out on purpose: the rollout keeps the exact token ids, so the
tokens trained on are exactly the tokens sampled (no re-tokenisation drift).

Backends: ``policy.hf`` (transformers, CPU/GPU) and ``policy.vllm`` (GPU).
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
    logprobs: list[float]  # log-prob of each sampled token under the sampling policy (temperature 1 scale, see backend)
    finish_reason: str  # "stop" (hit a stop token) or "length" (max_new_tokens)


class Policy(Protocol):
    tokenizer: object

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation for each prompt (a list of token ids)."""
        ...
