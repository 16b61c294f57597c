"""Transformers backend (采样模块): batched sampling with a KV cache, on CPU or GPU.

    policy = HFPolicy(model, tokenizer, device="cpu")
    gens = policy.generate([[1, 5, 9], [1, 7]], SamplingParams(max_new_tokens=32, stop_token_ids=[im_end]))
    gens[0].token_ids, gens[0].logprobs, gens[0].finish_reason

How a batch of prompts of different lengths is sampled together:

* **Left padding.** Prompts are padded on the left to one length, so every row's
  next token is predicted at the same (last) column. ``attention_mask`` hides the
  pads, and ``position_ids`` count only real tokens (``cumsum(mask) - 1``), so a
  padded row computes exactly what it would compute alone.
* **KV cache.** One forward pass over the prompts (the *prefill*) fills the cache;
  after that each step feeds only the B newly sampled tokens, ``(B, 1)``: no token
  is encoded twice.
* **Per-row finish.** A row stops at its first stop token (end of turn
  ``<|im_end|>``, or ``</tool_call>`` so that the environment can run the tool).
  Finished rows are *dropped from the batch*, cache included
  (``Cache.batch_select_indices``), so a long straggler does not drag the finished
  rows through every remaining step.

Which log-prob is returned (the convention of TRL and vLLM):

* ``temperature > 0``: ``log_softmax(logits / temperature)[token]``, the log-prob
  under the temperature-scaled distribution the token was drawn from. TRL's
  ``GRPOTrainer`` computes ``old_per_token_logps`` and the new log-probs the same way
  (its fused LM head, ``add_fused_lm_head(model, temperature=...)``), and asks vLLM for
  ``logprobs_mode="processed_logprobs"`` (after temperature) for the same reason:
  the importance ratio must compare like with like.
* ``top_p`` is *not* folded in: the log-prob is over the full (temperature-scaled)
  vocabulary, not renormalised over the nucleus. This again matches what the
  trainer recomputes (TRL does not apply top-p when it scores tokens); with
  ``top_p < 1`` the sampler's true probability of a token is a little higher.
* ``temperature == 0`` (greedy): the argmax token, with its log-prob at temperature 1.

Simplifications, named: no top-k, min-p or repetition penalty; every row shares
one ``SamplingParams``; the whole batch is one forward pass (no micro-batching, so
a GPU batch must fit in memory); a stop token is matched by id, not by string.
"""

from __future__ import annotations

import inspect
import math

import torch
from transformers import DynamicCache

from helpers.policy.base import Generation, SamplingParams


class HFPolicy:
    """A ``Policy`` over a transformers causal LM (a peft-wrapped one works too).

    Taught in notebooks/03_rollout.ipynb §2.
    """

    def __init__(self, model, tokenizer, device: str | torch.device | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        # The cache argument's name, read off the unwrapped (non-peft) model's forward: past_key_values in
        # transformers 5.19's decoders; a forward that takes cache= instead gets it under that name.
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.cache_kwarg = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"

    # The loop calls these around every update (vLLM frees its memory and takes the new
    # adapter). This policy samples with the trainer's own model: nothing to free, nothing to copy.
    def sleep(self) -> None:
        """Before the update: nothing to do (the trainer's model is the policy)."""

    def sync(self, model) -> None:
        """After the update: nothing to do (the updated adapter is already the one sampling)."""

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation per prompt; all prompts advance together, one token per step."""
        if not prompts:
            return []
        generator, stop_ids = start_sampling(prompts, params, self.device)

        was_training = self.model.training
        self.model.eval()  # no dropout while sampling: the log-probs must be the policy's own
        try:
            input_ids, attention_mask = self.left_pad(prompts)  # (B, T0), (B, T0)
            position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (B, T0): pads get 0, real tokens 0..len-1
            cache = DynamicCache()  # filled in place by every forward pass
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=True,
                logits_to_keep=1,  # only the last column's logits: (B, 1, V), not (B, T0, V)
                **{self.cache_kwarg: cache},
            )
            logits = out.logits[:, -1, :].float()  # (B, V): prediction for each row's first new token
            next_position = position_ids[:, -1] + 1  # (B,)

            sampled = Continuations(len(prompts))
            live = torch.arange(len(prompts), device=self.device)  # (L,) original row index of each live row
            for step in range(params.max_new_tokens):
                token, logprob = sample_next(logits, params.temperature, params.top_p, generator)  # (L,), (L,)
                stopped = sampled.add(live, token, logprob, stop_ids)  # (L,)
                if step == params.max_new_tokens - 1 or bool(stopped.all()):
                    break
                if bool(stopped.any()):  # drop finished rows from the batch and the cache
                    keep = (~stopped).nonzero().squeeze(-1)  # (L',) positions within the live batch
                    cache.batch_select_indices(keep)
                    live, token, attention_mask, next_position = live[keep], token[keep], attention_mask[keep], next_position[keep]
                attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(live), 1)], dim=1)  # (L, T+1)
                out = self.model(
                    input_ids=token[:, None],  # (L, 1): only the new token; the cache holds the rest
                    attention_mask=attention_mask,
                    position_ids=next_position[:, None],
                    use_cache=True,
                    **{self.cache_kwarg: cache},
                )
                logits = out.logits[:, -1, :].float()  # (L, V)
                next_position = next_position + 1
        finally:
            self.model.train(was_training)
        return sampled.generations()

    def left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompts of different lengths -> ``input_ids`` and ``attention_mask``, both (B, T0), pads on the left."""
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)  # (B, T0)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)  # (B, T0)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention_mask[i, width - len(p) :] = 1
        return input_ids.to(self.device), attention_mask.to(self.device)


def start_sampling(prompts: list[list[int]], params: SamplingParams, device) -> tuple[torch.Generator | None, torch.Tensor]:
    """Check a ``generate`` request (every prompt has a token, at least one new token is asked for); return
    its random generator (seeded when ``params.seed`` is set, else None) and its stop token ids, (S,)."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {params.max_new_tokens}")
    generator = torch.Generator(device=device).manual_seed(params.seed) if params.seed is not None else None
    return generator, torch.tensor(sorted(set(params.stop_token_ids)), dtype=torch.long, device=device)


class Continuations:
    """What has been sampled for each prompt of a ``generate`` call: tokens, their log-probs, finish reason."""

    def __init__(self, n: int):
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.logprobs: list[list[float]] = [[] for _ in range(n)]
        self.finish = ["length"] * n

    def add(self, rows: torch.Tensor, token: torch.Tensor, logprob: torch.Tensor, stop_ids: torch.Tensor) -> torch.Tensor:
        """Append one sampled token to each prompt of ``rows``; return which of them hit a stop token.
        rows, token, logprob: (L,) prompt indices and what was drawn for them; returns (L,) bool."""
        for row, t, lp in zip(rows.tolist(), token.tolist(), logprob.tolist()):
            self.tokens[row].append(t)
            self.logprobs[row].append(lp)
        stopped = torch.isin(token, stop_ids)  # (L,)
        for row in rows[stopped].tolist():
            self.finish[row] = "stop"
        return stopped

    def generations(self) -> list[Generation]:
        return [Generation(t, lp, f) for t, lp, f in zip(self.tokens, self.logprobs, self.finish)]


def sample_next(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None = None,
                rows: torch.Tensor | None = None):
    """Draw one token per row from ``logits`` (B, V); return the tokens (B,) and their log-probs (B,).

    The log-prob is ``log_softmax(logits / temperature)`` at the drawn token (see the module
    docstring); top-p only narrows the set the token is drawn from.

    ``rows`` (L,): draw L tokens, the i-th from row ``rows[i]`` of ``logits``. Rows that share their
    logits (the engine's nodes) then share their softmax too; the draws and their numbers are those
    of ``sample_next(logits[rows], ...)``, as each row's softmax is computed on its own.
    """
    logp = torch.log_softmax(logits / temperature if temperature else logits, dim=-1)  # (B, V)
    if temperature == 0:  # greedy
        token = logits.argmax(dim=-1)  # (B,)
        token = token if rows is None else token[rows]  # (L,)
    else:
        probs = logp.exp()
        if top_p < 1.0:
            # Nucleus: keep the smallest set of most likely tokens whose mass reaches top_p.
            sorted_probs, order = probs.sort(dim=-1, descending=True)  # (B, V)
            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the more likely tokens
            sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)  # the top token always stays
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        token = multinomial_one(probs if rows is None else probs[rows], generator)  # (L,)
    rows = torch.arange(len(token), device=token.device) if rows is None else rows
    return token, logp[rows, token]


def multinomial_one(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``probs`` (B, V), the very token ``torch.multinomial(probs, 1)`` draws.

    How torch draws it (the exponential race, the Gumbel-max trick; vLLM's sampler races the same
    way): every token ``v`` gets a waiting time ``q_v ~ Exp(1)``, and the winner is ``argmax p_v / q_v``,
    which is token ``v`` with probability ``p_v / sum(p)``. On a CPU torch makes each ``q_v`` as
    ``-log1p(-u)`` of a float64 uniform ``u``, in a scalar loop, V numbers a row. The same uniforms from
    ``torch.rand`` (one float64 each, from the same generator, in the same order) and the same formula,
    vectorised, give the same float32 waiting times faster, so the same tokens (``tests/test_policy_hf.py`` checks
    this against ``torch.multinomial``). Elsewhere (float64 probabilities, a GPU: there torch's draws
    differ from these) this is ``torch.multinomial`` itself.
    """
    if probs.device.type != "cpu" or probs.dtype != torch.float32:
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    low, high = torch.aminmax(probs)  # NaN makes both NaN: the checks below fail on it
    if not (bool(low >= 0) and bool(high < math.inf) and bool(probs.sum(-1).min() > 0)):
        raise ValueError("probabilities must be finite and >= 0 with a positive sum in every row (NaN logits?)")
    uniform = torch.rand(probs.shape, dtype=torch.float64, generator=generator)  # (B, V)
    waiting = uniform.neg_().log1p_().neg_().float()  # (B, V): Exp(1), as torch's exponential_ makes them
    return (probs / waiting).argmax(dim=-1)  # (B,)
