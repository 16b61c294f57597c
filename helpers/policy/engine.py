"""A small decode engine (采样模块): what a serving engine adds to ``HFPolicy``, in one file.

    policy = EnginePolicy(trainer.model, tokenizer)           # the trainer's (LoRA) model; CPU or GPU
    gens = policy.generate(prompts, SamplingParams(...))      # the same interface and numbers as HFPolicy
    policy.sync(trainer.model)                                # after each update: take the new adapter

``HFPolicy`` (notebook 03) is the textbook sampler: left padding, a KV cache, finished rows dropped.
On a model as small as the tiny worlds' it spends most of its time on bookkeeping rather than
arithmetic: measured on the shop world (96 episodes, 2 cores), a decode step took ~29 ms, of which
the matrix products were ~4 ms; the rest was growing the cache by concatenation (~55 %), attention
kernels made for long queries (~25 %), and the LoRA wrappers' extra calls. And in a multi-turn
episode every turn *re-reads the whole conversation* (the prefill), so for the shop world's four
turns the model computed ~10x more prompt tokens than it generated. The engine removes those costs
the way vLLM does, at the scale of one file:

1. **Merged weights.** At ``sync(model)`` each projection's effective weight is computed (the base
   weight plus LoRA's ``B A * alpha / r``, by peft's own ``get_delta_weight``), and q/k/v and
   gate/up are fused into one matrix each: one matrix product where the peft model makes ~9 calls. The engine samples from a copy; the trainer's model is untouched.
2. **A KV cache kept across turns (prefix caching).** The keys and values of every sequence of the
   last ``generate`` call are kept. A prompt that extends one of them (the next turn of the same
   episode: its sampled turn, the tool's reply, the next turn's opening) computes only its new
   tokens. This is vLLM's automatic prefix caching, keyed here by the whole token sequence.
   Keys and values depend only on the tokens and the weights, so the reuse changes no number
   (beyond float rounding); ``sync`` forgets the cache, because the weights changed.
3. **A static cache.** One preallocated buffer ``(layers, rows, kv_heads, T, head_dim)`` written in
   place at each row's own position, instead of a concatenation per step. Live rows are kept at the
   front of the buffer: when rows finish, each one is swapped with a live row from the back, so a
   step copies two rows per finished row, not the whole cache.
4. **Attention for one new token** is two small batched matrix products over the live part of
   the cache, with a per-row length mask (grouped-query heads by broadcasting, no copies).

Sampling is ``helpers.policy.hf.sample_next`` over the live rows in their original order, so with
the same seed the engine draws the same tokens as ``HFPolicy`` and reports the same log-probs (the
log-probs agree to float rounding, ~1e-6; ``tests/test_engine.py`` checks both on multi-turn episodes).

Simplifications, named:

* Qwen2- and Llama-family decoders only (RMSNorm, rotary positions, grouped-query attention, SwiGLU;
  q/k/v biases when the model has them); no sliding window, no q/k norms (Qwen3). ``supports(model)``
  says whether a model qualifies; ``make_policy`` refuses the backend otherwise.
* The cache keeps the sequences of the *last* call only (enough for the rollout, whose every call is
  the next turn of the same episodes), in one buffer sized for that call: no paging, no eviction policy.
* The merged weights are a second copy of the projections (free for the tiny model; for a 1.5B model
  on a GPU, vLLM is the engine to use).
* A row that reaches the model's last position ends there, with finish reason "length"; from then on
  the other rows' draws differ from ``HFPolicy``'s, which samples past the positions it was trained on.
"""

from __future__ import annotations

import torch

from helpers.policy.base import Generation, SamplingParams
from helpers.policy.hf import Continuations, sample_next, start_sampling

SUPPORTED = ("qwen2", "llama")  # config.model_type of the decoders the engine computes exactly


def _base(model):
    """The transformers model under a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def supports(model) -> bool:
    """Whether the engine computes this model exactly (architecture and options it knows)."""
    config = _base(model).config
    return (config.model_type in SUPPORTED and not getattr(config, "use_sliding_window", False)
            and getattr(config, "hidden_act", "silu") == "silu")


def effective_linear(module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(weight (out, in), bias (out,) or None)`` of what a linear layer computes. For a peft LoRA layer
    that is peft's own merge, ``W + B A * alpha / r`` (``get_delta_weight``) for each active adapter,
    unless the adapters are switched off (``disable_adapter()``) or already merged into ``W``."""
    if hasattr(module, "base_layer"):  # a peft LoRA layer
        weight = module.base_layer.weight.detach().clone()
        if not module.disable_adapters and not module.merged:
            for name in module.active_adapters:
                if name in module.lora_A:
                    weight += module.get_delta_weight(name)
        bias = module.base_layer.bias
    else:
        weight, bias = module.weight.detach(), module.bias
    return weight, None if bias is None else bias.detach()


class _Weights:
    """The model's weights as the engine uses them: merged, fused, in the model's dtype and device."""

    @torch.no_grad()
    def __init__(self, model):
        base = _base(model)
        was_training = model.training
        model.eval()  # no LoRA dropout while the effective weights are read
        try:
            config, decoder = base.config, base.get_decoder()
            self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
            self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
            self.eps = config.rms_norm_eps
            self.embed = decoder.embed_tokens.weight.detach()  # (V, H)
            self.layers = []
            for layer in decoder.layers:
                attn, mlp = layer.self_attn, layer.mlp
                q, k, v = (effective_linear(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj))
                gate, up = effective_linear(mlp.gate_proj)[0], effective_linear(mlp.up_proj)[0]
                # attention's 1/sqrt(head_dim) folded into q's rows (rotary positions are linear, so it commutes)
                scale = self.head_dim**-0.5
                q = (q[0] * scale, None if q[1] is None else q[1] * scale)
                biases = [b if b is not None else torch.zeros(w.shape[0], dtype=w.dtype, device=w.device) for w, b in (q, k, v)]
                self.layers.append(dict(
                    norm1=layer.input_layernorm.weight.detach(),
                    qkv=torch.cat([q[0], k[0], v[0]]).T.contiguous(),  # (H, (heads + 2 kv_heads) * head_dim)
                    qkv_bias=torch.cat(biases) if any(b is not None for _, b in (q, k, v)) else None,
                    o=effective_linear(attn.o_proj)[0].T.contiguous(),  # (heads * head_dim, H)
                    norm2=layer.post_attention_layernorm.weight.detach(),
                    gate_up=torch.cat([gate, up]).T.contiguous(),  # (H, 2 I)
                    down=effective_linear(mlp.down_proj)[0].T.contiguous(),  # (I, H)
                ))
            self.norm = decoder.norm.weight.detach()
            self.lm_head = effective_linear(base.get_output_embeddings())[0].T.contiguous()  # (H, V)
            # cos/sin of every position, from the model's own rotary module (its scaling rules included)
            positions = torch.arange(config.max_position_embeddings, device=self.embed.device)[None]  # (1, P)
            cos, sin = decoder.rotary_emb(self.embed[None, :1], positions)
            self.cos, self.sin = cos[0], sin[0]  # (P, head_dim)
        finally:
            model.train(was_training)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as transformers computes it (in float32, then back to the input's dtype)."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions: ``x * cos + rotate_half(x) * sin``.   x (N, heads, S, D), cos/sin (N, 1, S, D)"""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class EnginePolicy:
    """A ``Policy`` that samples from merged weights with a KV cache kept across turns (module docstring).

    Taught in notebooks/03_rollout.ipynb §7.
    """

    def __init__(self, model, tokenizer):
        if not supports(model):
            config = _base(model).config
            raise ValueError(f"the engine computes {SUPPORTED} decoders without sliding window; this model is "
                             f"{config.model_type!r}: use backend 'hf'")
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.sync(model)

    def sleep(self) -> None:
        """Before the update: nothing to free (the engine's copy is small next to the trainer's)."""

    def sync(self, model) -> None:
        """After the update: read the merged weights again, and forget the cache (it holds the old weights' keys)."""
        self.w = _Weights(model)
        self.cache_k = self.cache_v = None  # (layers, rows, kv_heads, T, head_dim): views into self._buffers
        self._buffers: list[tuple[torch.Tensor, torch.Tensor]] = []  # at most two (key, value) allocations, reused
        self.cached: dict[tuple, tuple[int, int]] = {}  # token sequence -> (row in the cache, tokens whose keys are there)

    # --- the forward pass over new tokens of some rows ------------------------------------------

    def _forward(self, new: torch.Tensor, lengths: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Feed ``new`` tokens to the first N rows of the cache; return each row's logits after its last new token.

        new:     (N, S) token ids, right-padded
        lengths: (N,) tokens already cached   counts: (N,) real tokens in each row of ``new``
        returns: (N, V) float32 logits
        """
        w = self.w
        N, S = new.shape  # the live rows are the cache's first N rows
        positions = lengths[:, None] + torch.arange(S, device=new.device)  # (N, S) absolute positions
        real = torch.arange(S, device=new.device)[None] < counts[:, None]  # (N, S) not padding
        T = int((lengths + counts).max())  # keys to attend over: the longest row after this step
        keys = torch.arange(T, device=new.device)
        hidden = keys[None, None, :] > positions[:, :, None]  # (N, S, T): later positions, and other rows' padding
        mask = torch.zeros(hidden.shape, dtype=w.embed.dtype, device=new.device).masked_fill(hidden, float("-inf"))
        mask = mask[:, None, None]  # (N, 1, 1, S, T): added to the scores of every head
        cos = w.cos[positions][:, None]  # (N, 1, S, D)
        sin = w.sin[positions][:, None]
        rows = torch.arange(N, device=new.device)
        write_rows, write_pos = rows[:, None].expand(N, S)[real], positions[real]  # (M,), (M,) where the new keys go
        x = w.embed[new]  # (N, S, H)
        groups = w.heads // w.kv_heads
        for i, layer in enumerate(w.layers):
            h = _rms_norm(x, layer["norm1"], w.eps)
            qkv = h @ layer["qkv"]  # (N, S, (heads + 2 kv) * D)
            if layer["qkv_bias"] is not None:
                qkv = qkv + layer["qkv_bias"]
            qk, v = qkv.split([(w.heads + w.kv_heads) * w.head_dim, w.kv_heads * w.head_dim], dim=-1)
            qk = _rotate(qk.view(N, S, w.heads + w.kv_heads, w.head_dim).transpose(1, 2), cos, sin)  # (N, heads + kv, S, D)
            q, k = qk[:, : w.heads], qk[:, w.heads :]  # (N, heads, S, D), (N, kv, S, D)
            v = v.view(N, S, w.kv_heads, w.head_dim).transpose(1, 2)  # (N, kv, S, D)
            self.cache_k[i][write_rows, :, write_pos] = k.transpose(1, 2)[real]  # (M, kv, D) into the static cache
            self.cache_v[i][write_rows, :, write_pos] = v.transpose(1, 2)[real]
            K, V = self.cache_k[i][:N, :, :T], self.cache_v[i][:N, :, :T]  # (N, kv, T, D): views, no copy
            q = q.reshape(N, w.kv_heads, groups * S, w.head_dim)  # grouped-query: the heads sharing a kv head side by side
            scores = (q @ K.transpose(-1, -2)).view(N, w.kv_heads, groups, S, T) + mask  # q carries 1/sqrt(D)
            probs = torch.softmax(scores.float(), dim=-1).to(q.dtype).view(N, w.kv_heads, groups * S, T)
            attn = (probs @ V).view(N, w.heads, S, w.head_dim).transpose(1, 2).reshape(N, S, -1)  # (N, S, heads * D)
            x = x + attn @ layer["o"]
            h = _rms_norm(x, layer["norm2"], w.eps)
            gate, up = (h @ layer["gate_up"]).chunk(2, dim=-1)
            x = x + (torch.nn.functional.silu(gate) * up) @ layer["down"]
        last = x[torch.arange(N, device=x.device), counts - 1]  # (N, H): each row's last real token
        return (_rms_norm(last, w.norm, w.eps) @ w.lm_head).float()  # (N, V)

    # --- the cache: which rows hold which sequences ----------------------------------------------

    def _place(self, prompts: list[list[int]], width: int, rows: int) -> list[int]:
        """Make a fresh cache of ``rows`` rows and give its row r to ``prompts[r]``, copying the keys of the
        sequence it extends (if the last call left one). Returns how many tokens of each prompt are cached."""
        w, L = self.w, len(self.w.layers)
        reused, sources = [], []
        by_length = sorted({len(key) for key in self.cached}, reverse=True)
        for prompt in prompts:
            hit = next((self.cached[key] for n in by_length if n <= len(prompt)
                        and (key := tuple(prompt[:n])) in self.cached), None)
            # a prompt equal to a cached sequence still needs its last token fed (its logits are the next turn's)
            reused.append(0 if hit is None else min(hit[1], len(prompt) - 1))
            sources.append(-1 if hit is None else hit[0])
        new_k, new_v = self._spare_buffer(rows, width)
        source = torch.tensor(sources, device=self.device)
        if self.cache_k is not None and bool((source >= 0).any()):
            to, frm = (source >= 0).nonzero().squeeze(-1), source[source >= 0]
            span = min(width, max(reused) + 1)
            new_k[:, to, :, :span] = self.cache_k[:, frm, :, :span]
            new_v[:, to, :, :span] = self.cache_v[:, frm, :, :span]
        self.cache_k, self.cache_v = new_k, new_v
        return reused

    def _spare_buffer(self, rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Key and value buffers ``(layers, rows, kv_heads, width, head_dim)`` for the next call's cache: views
        into whichever of two reused allocations the current cache is not in (grown when too small). Made with
        zeros and afterwards only ever written with keys and values, they hold finite numbers everywhere:
        masked positions get probability 0, and 0 times a finite value is 0."""
        w = self.w
        busy = None if self.cache_k is None else self.cache_k.untyped_storage().data_ptr()
        spare = next((i for i, (k, _) in enumerate(self._buffers) if k.untyped_storage().data_ptr() != busy), None)
        if spare is None or self._buffers[spare][0].shape[1] < rows or self._buffers[spare][0].shape[3] < width:
            old_rows, old_width = (self._buffers[spare][0].shape[1], self._buffers[spare][0].shape[3]) if spare is not None else (0, 0)
            shape = (len(w.layers), max(rows, old_rows), w.kv_heads, max(width, old_width), w.head_dim)
            fresh = (torch.zeros(shape, dtype=w.embed.dtype, device=self.device),
                     torch.zeros(shape, dtype=w.embed.dtype, device=self.device))
            if spare is None:
                self._buffers.append(fresh)
                spare = len(self._buffers) - 1
            else:
                self._buffers[spare] = fresh
        k, v = self._buffers[spare]
        return k[:, :rows, :, :width], v[:, :rows, :, :width]

    def _move_rows(self, to: torch.Tensor, frm: torch.Tensor, span: int) -> None:
        """Copy cache rows ``frm`` to rows ``to``, their first ``span`` positions (a swap when ``to`` is ``frm``
        reordered: the rows are read before any is written)."""
        for cache in (self.cache_k, self.cache_v):
            used = cache[:, :, :, :span]
            used.index_copy_(1, to, used.index_select(1, frm))

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation per prompt, as ``HFPolicy.generate`` does (same draws for the same seed)."""
        if not prompts:
            return []
        generator, stop_ids = start_sampling(prompts, params, self.device)
        # The cache holds the longest prompt and its continuation, up to the model's positions; a row that
        # reaches the last position ends there ("length"), as its own budget would have cut it (the rollout
        # gives each row at most what is left of max_total_tokens, and the batch the largest of those).
        positions, longest = self.w.cos.shape[0], max(len(p) for p in prompts)
        if longest >= positions:
            raise ValueError(f"a prompt of {longest} tokens leaves no room in the model's {positions} positions")
        width = min(longest + params.max_new_tokens, positions)
        B = len(prompts)
        # Identical prompts (the G samples of a task share their first prompt, and often their first turns)
        # are computed once: their first copies take the front rows of the cache, the repeats the rest.
        first_of: dict[tuple, int] = {}
        for i, prompt in enumerate(prompts):
            first_of.setdefault(tuple(prompt), i)
        unique = list(first_of.values())
        repeats = [i for i, prompt in enumerate(prompts) if first_of[tuple(prompt)] != i]
        layout = unique + repeats  # cache row r holds prompts[layout[r]]
        cached_tokens = self._place([prompts[i] for i in unique], width, rows=B)

        # Prefill the unique prompts: each one's tokens not in the cache, right-padded.   (U, S)
        fresh = [prompts[i][n:] for i, n in zip(unique, cached_tokens)]
        S = max(len(f) for f in fresh)
        new = torch.tensor([f + [0] * (S - len(f)) for f in fresh], dtype=torch.long, device=self.device)
        counts = torch.tensor([len(f) for f in fresh], device=self.device)
        lengths = torch.tensor(cached_tokens, device=self.device) + counts  # (U,) keys in the cache of each row
        logits = self._forward(new, lengths - counts, counts)  # (U, V)
        if repeats:  # copy the first copy's keys, values and logits to each repeat
            row_of = {i: r for r, i in enumerate(unique)}
            copied = torch.tensor([row_of[first_of[tuple(prompts[i])]] for i in repeats], device=self.device)
            for cache in (self.cache_k, self.cache_v):
                cache[:, len(unique):] = cache[:, copied]
            logits, lengths = torch.cat([logits, logits[copied]]), torch.cat([lengths, lengths[copied]])
        order = torch.tensor(layout, device=self.device)  # (L,) cache row r holds the live row of prompts[order[r]]
        finished: dict[int, tuple[int, int]] = {}  # prompt -> (cache row, cached tokens), as rows finish

        sampled = Continuations(B)
        for step in range(params.max_new_tokens):
            # Sample in the prompts' order (as HFPolicy does), so a seed gives the same draws.
            by_prompt = order.argsort()
            token, logprob = sample_next(logits[by_prompt], params.temperature, params.top_p, generator)
            token, logprob = token[by_prompt.argsort()], logprob[by_prompt.argsort()]  # back to cache-row order
            stopped = sampled.add(order, token, logprob, stop_ids) | (lengths + 1 >= width)  # (L,): a stop token, or the cache is full
            if step == params.max_new_tokens - 1 or bool(stopped.all()):
                break
            if bool(stopped.any()):  # finished rows move behind the live ones (their keys are kept for the next turn)
                live = len(order) - int(stopped.sum())
                holes = stopped[:live].nonzero().squeeze(-1)  # finished rows in the front part
                movers = (~stopped[live:]).nonzero().squeeze(-1) + live  # live rows in the back part
                to, frm = torch.cat([holes, movers]), torch.cat([movers, holes])
                self._move_rows(to, frm, span=int(lengths.max()))
                for t in (order, lengths, token):
                    t[to] = t[frm]
                retire(finished, order[live:], lengths[live:], first_row=live)
                order, lengths, token = order[:live], lengths[:live], token[:live]
            logits = self._forward(token[:, None], lengths, torch.ones_like(lengths))  # (L, V): one new token per row
            lengths = lengths + 1
        retire(finished, order, lengths, first_row=0)
        self.cached = {tuple(prompts[p] + sampled.tokens[p]): where for p, where in finished.items()}
        return sampled.generations()


def retire(finished: dict[int, tuple[int, int]], order: torch.Tensor, lengths: torch.Tensor, first_row: int) -> None:
    """Note in ``finished`` where the rows of prompts ``order`` ended: cache rows ``first_row, first_row + 1, ...``,
    with ``lengths`` tokens' keys in them (every token but the last sampled one)."""
    for i, (prompt, n) in enumerate(zip(order.tolist(), lengths.tolist())):
        finished[prompt] = (first_row + i, n)
