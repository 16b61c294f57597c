"""A small decode engine (采样模块): what a serving engine adds to ``HFPolicy``, in one file.

    policy = EnginePolicy(trainer.model, tokenizer)           # the trainer's (LoRA) model; CPU or GPU
    gens = policy.generate(prompts, SamplingParams(...))      # the same interface and numbers as HFPolicy
    policy.sync(trainer.model)                                # after each update: take the new adapter

``HFPolicy`` (notebook 03) is the textbook sampler: left padding, a KV cache, finished rows dropped.
On a model as small as the tiny worlds' it spends most of its time on bookkeeping rather than
arithmetic: growing the cache by concatenation, and an attention kernel made for long queries run on
one-token queries. And in a multi-turn episode every turn *re-reads the whole conversation* (the
prefill), so the model computes many more prompt tokens than it generates. The engine removes those
costs the way vLLM does, at the scale of one file:

1. **Merged weights.** At ``sync(model)`` each projection's effective weight is computed (the base
   weight plus LoRA's ``B A * alpha / r``, by peft's own ``get_delta_weight``), and q/k/v and
   gate/up are fused into one matrix each: one matrix product where the peft model makes ~9 calls. The engine
   samples from its own copy of the projections (embeddings and norms are read in place, never written); the
   trainer's model is untouched.
2. **A KV cache kept across turns (prefix caching).** The keys and values of every sequence of the
   last ``generate`` call are kept. A prompt that extends one of them (the next turn of the same
   episode: its sampled turn, the tool's reply, the next turn's opening) computes only its new
   tokens. This is vLLM's automatic prefix caching, keyed here by the whole token sequence.
   Keys and values depend only on the tokens and the weights, so the reuse changes no number
   (beyond float rounding); ``sync`` forgets the cache, because the weights changed.
3. **A static cache in two parts**, preallocated, written in place instead of grown by concatenation:
   the *prompt part* ``(layers, U, kv_heads, T0, head_dim)`` holds each *distinct* prompt of the call
   once (T0 its longest; the shorter ones' last columns are masked), and the *generated part*
   ``(layers, rows, kv_heads, new tokens, head_dim)`` the keys of what is sampled, a row per node (5.),
   one column per step. The live nodes are kept at the front of the generated part, a node's first
   child takes over its row, and a node where prompts finished is copied to a row at the back (kept
   for their next turn): a step copies the rows of new branches and finished nodes, not the cache.
   Each part is one contiguous block (a view of reused storage of its exact shape): on a CPU, reading
   the same keys out of a wider buffer makes the attention slower. The prompt part's keys lie transposed
   in memory, ``(head_dim, T0)`` per head, as the product ``q @ K^T`` reads them (the code indexes them
   through a transposed view, ``(T0, head_dim)`` like the values).
4. **Attention for one new token** is small batched matrix products, one softmax over both parts.
   Rows whose prompts are identical (the G samples of a task in the first turn; often in later ones,
   when their turns so far came out the same) read their prompt's keys *once*: their queries are stacked into one
   matrix for it (the ``(U, R)`` grid of ``_forward``), as cascade attention does for a shared prefix.
   The grid is one product over the whole part, so as prompts finish their rows would still be read;
   once the rows with a live node are a quarter fewer than those read, those alone are copied into a
   smaller part that later steps read (``_read``; the prompt part itself stays whole for the next call).
5. **Rows that agree are computed once.** A row's next logits depend only on its sequence so far, and
   the G samples of a task often write the same tokens for a while. So each step computes one
   *node* per distinct sequence (prompt and sampled tokens), and every row draws its own token from its
   node's logits. The rows of a node that drew different tokens go on in different nodes (children),
   each starting from a copy of the node's keys: the tree of shared prefixes that SGLang's radix cache
   keeps, grown a token at a time. The draws are still one per row, so the tokens are a row-by-row
   decode's.

Sampling is ``helpers.policy.hf.sample_next`` over the live rows in their original order (each row
reading its node's logits, each node's softmax computed once), so with the same seed the engine draws the
same tokens as ``HFPolicy`` and reports the same log-probs (the log-probs agree to float rounding, a few
1e-6; ``tests/test_engine.py`` checks both on multi-turn episodes).

Simplifications, named:

* Qwen2- and Llama-family decoders only (RMSNorm, rotary positions, grouped-query attention, SwiGLU;
  q/k/v biases when the model has them, none on o_proj or the MLP); no sliding window, no q/k norms (Qwen3). ``supports(model)``
  says whether a model qualifies; ``make_policy`` refuses the backend otherwise.
* The cache keeps the sequences of the *last* call only (enough for the rollout, whose every call is
  the next turn of the same episodes), copied into the next call's prompt part: no paging, no eviction
  policy. Prompts share keys only when they are identical (and then along the nodes they grow), not when
  they merely share a prefix, as they do in vLLM's and SGLang's caches.
* The merged weights are a second copy of the projections (free for the tiny model; for a 1.5B model
  on a GPU, vLLM is the engine to use).
* A row that reaches the model's last position ends there, with finish reason "length"; from then on
  the other rows' draws differ from ``HFPolicy``'s, which samples past the positions it was trained on.
"""

from __future__ import annotations

import math
from collections import Counter

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
    # biases: the engine adds q/k/v's (Qwen2's); Llama's attention_bias puts one on o_proj too, and mlp_bias on the MLP
    other_biases = getattr(config, "mlp_bias", False) or (config.model_type == "llama" and getattr(config, "attention_bias", False))
    return (config.model_type in SUPPORTED and not getattr(config, "use_sliding_window", False)
            and getattr(config, "hidden_act", "silu") == "silu" and not other_biases)


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
        self._storage: dict[str, torch.Tensor] = {}  # name -> flat memory that cache parts are views of, reused
        self.sync(model)

    def sleep(self) -> None:
        """Before the update: nothing to free (the engine's copy is small next to the trainer's)."""

    def sync(self, model) -> None:
        """After the update: read the merged weights again, and forget the cache (it holds the old weights' keys)."""
        self.w = _Weights(model)
        # The last call's cache (module docstring, 3.):
        self.prompt_kv = None  # (keys, values), each (layers, U, kv_heads, T0, head_dim): each distinct prompt once, T0 its longest
        self.prompt_len = None  # (U,) tokens of each prompt row
        self.gen_kv = None  # (2, layers, rows, kv_heads, new tokens, head_dim): what each node generated
        self.read_rows: list[int] = []  # the prompt rows the live nodes read (4.): all of them, or a copy of fewer
        self.read_kv = self.read_len = None  # their (keys, values), each (layers, A, kv_heads, T0, head_dim), their lengths (A,)
        self.source = self.slot = None  # (N,) each live node's place in ``read_rows``, and its place among the nodes sharing it
        self.sharing = 0  # the most nodes sharing one prompt row: the grid's width R in ``_forward``
        self.prompt_storage = "prompt_a"  # the storage of the prompt part (the next call's goes into the other)
        self.cached: dict[tuple, tuple[int, int, int]] = {}  # token sequence -> (cache row, tokens whose keys are there, its prompt row)

    # --- the forward pass over new tokens of some rows ------------------------------------------

    def _forward(self, new: torch.Tensor, lengths: torch.Tensor, counts: torch.Tensor, step: int | None = None) -> torch.Tensor:
        """Feed ``new`` tokens to N rows; return each row's logits after its last new token.

        new:     (N, S) token ids, right-padded
        lengths: (N,) tokens already cached   counts: (N,) real tokens in each row of ``new``
        step:    None for a prefill: the rows are the prompt part's first N rows; the new keys go into them
                 at their positions, and each query sees the keys at its own position and before. Else the
                 rows are the nodes, the first N rows of the generated part, one token each (S = 1), the
                 ``step``-th of this call: its key goes into column ``step``, and the query sees its prompt's
                 row of the prompt rows read (``_read``) and the first ``step + 1`` columns of its own row.
        returns: (N, V) float32 logits
        """
        w = self.w
        N, S = new.shape
        prompt_k, prompt_v = self.prompt_kv if step is None else self.read_kv  # (layers, U, kv, T0, D) each
        U, T0 = prompt_k.shape[1], prompt_k.shape[3]
        groups, D = w.heads // w.kv_heads, w.head_dim
        positions = lengths[:, None] + torch.arange(S, device=new.device)  # (N, S) absolute positions
        columns = torch.arange(T0, device=new.device)
        if step is None:
            hidden = columns[None, None, :] > positions[:, :, None]  # (N, S, T0): later positions, and the padding
            real = torch.arange(S, device=new.device)[None] < counts[:, None]  # (N, S) not padding
            rows = torch.arange(N, device=new.device)[:, None].expand(N, S)
            write_rows, write_pos = rows[real], positions[real]  # (M,), (M,) where the new keys go
        else:
            source, slot = self.source[:N], self.slot[:N]  # (N,), (N,)
            hidden = (columns[None, :] >= self.read_len[source, None])[:, None, :]  # (N, 1, T0): the prompt's padding
            # the rows sharing a prompt side by side: row n at (source[n], slot[n]) of a (U, R) grid, the rest zeros
            R = self.sharing
            gen_k, gen_v = self.gen_kv  # (layers, rows, kv, new tokens, D) each
            q_grid = torch.zeros(U, w.kv_heads, R, groups, D, dtype=w.embed.dtype, device=new.device)
            p_grid = torch.zeros(U, w.kv_heads, R, groups, T0, dtype=w.embed.dtype, device=new.device)
        mask = torch.zeros(hidden.shape, dtype=w.embed.dtype, device=new.device).masked_fill(hidden, float("-inf"))
        last_position = w.cos.shape[0] - 1  # a padding token may sit past it; its outputs are never used
        cos = w.cos[positions.clamp(max=last_position)][:, None]  # (N, 1, S, D)
        sin = w.sin[positions.clamp(max=last_position)][:, None]
        x = w.embed[new]  # (N, S, H)
        for i, layer in enumerate(w.layers):
            h = _rms_norm(x, layer["norm1"], w.eps)
            qkv = h @ layer["qkv"]  # (N, S, (heads + 2 kv) * D)
            if layer["qkv_bias"] is not None:
                qkv = qkv + layer["qkv_bias"]
            qk, v = qkv.split([(w.heads + w.kv_heads) * D, w.kv_heads * D], dim=-1)
            qk = _rotate(qk.view(N, S, w.heads + w.kv_heads, D).transpose(1, 2), cos, sin)  # (N, heads + kv, S, D)
            q, k = qk[:, : w.heads], qk[:, w.heads :]  # (N, heads, S, D), (N, kv, S, D); q carries 1/sqrt(D)
            v = v.view(N, S, w.kv_heads, D).transpose(1, 2)  # (N, kv, S, D)
            Kp, Vp = prompt_k[i].flatten(0, 1), prompt_v[i].flatten(0, 1)  # (U kv, T0, D): one block each (Kp^T contiguous)
            if step is None:
                q = q.reshape(N * w.kv_heads, groups * S, D)  # grouped-query: the heads sharing a kv head side by side
                prompt_k[i][write_rows, :, write_pos] = k.transpose(1, 2)[real]  # (M, kv, D) into the prompt part
                prompt_v[i][write_rows, :, write_pos] = v.transpose(1, 2)[real]
                scores = (q @ Kp.transpose(1, 2)).view(N, w.heads, S, T0) + mask[:, None]
                probs = torch.softmax(scores.float(), dim=-1).to(q.dtype).view(N * w.kv_heads, groups * S, T0)
                attn = probs @ Vp  # (N kv, groups S, D): in a prefill the rows are the prompt rows, N = U
            else:
                q = q.reshape(N * w.kv_heads, groups, D)
                gen_k[i][:N, :, step] = k[:, :, 0]  # (N, kv, D) into column `step`
                gen_v[i][:N, :, step] = v[:, :, 0]
                Kg, Vg = gen_k[i][:N, :, : step + 1].flatten(0, 1), gen_v[i][:N, :, : step + 1].flatten(0, 1)  # (N kv, step + 1, D)
                q_grid[source, :, slot] = q.view(N, w.kv_heads, groups, D)  # each prompt row's keys read once, for all the rows that share it
                prompt_scores = (q_grid.view(U * w.kv_heads, R * groups, D) @ Kp.transpose(1, 2)).view(U, w.kv_heads, R, groups, T0)
                scores = torch.cat([prompt_scores[source, :, slot].view(N, w.heads, T0) + mask,  # (N, heads, T0)
                                    (q @ Kg.transpose(1, 2)).view(N, w.heads, step + 1)], dim=-1)
                probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)  # (N, heads, T0 + step + 1): one softmax over both parts
                p_grid[source, :, slot] = probs[..., :T0].view(N, w.kv_heads, groups, T0)
                attn = ((p_grid.view(U * w.kv_heads, R * groups, T0) @ Vp).view(U, w.kv_heads, R, groups, D)[source, :, slot]
                        + (probs[..., T0:].reshape(N * w.kv_heads, groups, step + 1) @ Vg).view(N, w.kv_heads, groups, D))
            attn = attn.reshape(N, w.heads, S, D).transpose(1, 2).reshape(N, S, -1)  # (N, S, heads * D)
            x = x + attn @ layer["o"]
            h = _rms_norm(x, layer["norm2"], w.eps)
            gate, up = (h @ layer["gate_up"]).chunk(2, dim=-1)
            x = x + (torch.nn.functional.silu(gate) * up) @ layer["down"]
        last = x[torch.arange(N, device=x.device), counts - 1]  # (N, H): each row's last real token
        return (_rms_norm(last, w.norm, w.eps) @ w.lm_head).float()  # (N, V)

    # --- the cache: which rows hold which sequences ----------------------------------------------

    def _buffer(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """A contiguous tensor of ``shape`` in the reused storage called ``name`` (grown when too small). It holds
        whatever was there before: the callers write every element they read."""
        size = math.prod(shape)
        storage = self._storage.get(name)
        if storage is None or storage.numel() < size or storage.dtype != self.w.embed.dtype:
            storage = self._storage[name] = torch.empty(size, dtype=self.w.embed.dtype, device=self.device)
        return storage[:size].view(shape)

    def _place(self, prompts: list[list[int]], width: int) -> list[int]:
        """Make this call's prompt part, a row of ``width`` columns for each of ``prompts``: the keys of the
        sequence it extends (if the last call left one) copied from the last call's two parts, zeros past the
        prompt's end (masked, but read: they must be finite, as 0 x NaN is NaN). Returns how many tokens of
        each prompt are cached."""
        w = self.w
        old_prompt, old_gen, old_len = self.prompt_kv, self.gen_kv, self.prompt_len
        self.prompt_storage = "prompt_b" if self.prompt_storage == "prompt_a" else "prompt_a"  # not the old one's
        shape = (len(w.layers), len(prompts), w.kv_heads)
        new = (self._buffer(self.prompt_storage + " keys", (*shape, w.head_dim, width)).transpose(-1, -2),  # (docstring, 3.)
               self._buffer(self.prompt_storage + " values", (*shape, width, w.head_dim)))  # each (layers, U, kv, width, D)
        by_length = sorted({len(key) for key in self.cached}, reverse=True)
        reused = []
        for r, prompt in enumerate(prompts):
            hit = next((self.cached[key] for n in by_length if n <= len(prompt)
                        and (key := tuple(prompt[:n])) in self.cached), None)
            n = 0
            if hit is not None:
                row, have, source = hit
                n = min(have, len(prompt) - 1)  # a prompt equal to a cached sequence still feeds its last token
                head = min(n, int(old_len[source]))
                for part, old_part, old_gen_part in zip(new, old_prompt, old_gen):  # keys, then values
                    part[:, r, :, :head] = old_part[:, source, :, :head]  # the last call's prompt ...
                    part[:, r, :, head:n] = old_gen_part[:, row, :, : n - head]  # ... and what that row generated
            for part in new:
                part[:, r, :, len(prompt):] = 0
            reused.append(n)
        self.prompt_kv = new
        return reused

    @torch.inference_mode()  # no_grad, and no autograd bookkeeping at all (version counters): cheaper small ops
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation per prompt, as ``HFPolicy.generate`` does (same draws for the same seed)."""
        if not prompts:
            return []
        generator, stop_ids = start_sampling(prompts, params, self.device)
        # A row that reaches the model's last position ends there ("length"), as its own budget would have cut
        # it (the rollout gives each row at most what is left of max_total_tokens, and the batch the largest of those).
        positions, longest = self.w.cos.shape[0], max(len(p) for p in prompts)
        if longest >= positions:
            raise ValueError(f"a prompt of {longest} tokens leaves no room in the model's {positions} positions")
        B, w = len(prompts), self.w
        # Identical prompts (the G samples of a task share their first prompt, and often their first turns)
        # get one row of the prompt part, computed once and read once per step for all of them.
        row_of: dict[tuple, int] = {}
        for prompt in prompts:
            row_of.setdefault(tuple(prompt), len(row_of))
        unique = [list(p) for p in row_of]  # in order of first appearance: prompt row u holds unique[u]
        cached_tokens = self._place(unique, width=longest)

        # Prefill the unique prompts: each one's tokens not in the cache, right-padded.   (U, S)
        fresh = [p[n:] for p, n in zip(unique, cached_tokens)]
        S = max(len(f) for f in fresh)
        new = torch.tensor([f + [0] * (S - len(f)) for f in fresh], dtype=torch.long, device=self.device)
        counts = torch.tensor([len(f) for f in fresh], device=self.device)
        self.prompt_len = torch.tensor(cached_tokens, device=self.device) + counts  # (U,)
        prompt_len = self.prompt_len.tolist()
        logits = self._forward(new, self.prompt_len - counts, counts)  # (U, V)
        self.read_rows, self.read_kv, self.read_len = list(range(len(unique))), self.prompt_kv, self.prompt_len

        # The nodes (module docstring, 5.): node n is row n of the generated part, the sequence so far that
        # the prompts of `live` whose `node_of` is n have in common. To begin with, the unique prompts.
        source = list(range(len(unique)))  # (N,) each node's prompt row
        live = list(range(B))  # the prompts still sampling, in their order (HFPolicy's order: a seed gives its draws)
        node_of = [row_of[tuple(p)] for p in prompts]  # (L,) each live prompt's node
        # the generated part: a column for every token fed back (all but the last one sampled), a row per node
        self.gen_kv = self._buffer("generated", (2, len(w.layers), B, w.kv_heads, params.max_new_tokens - 1, w.head_dim))
        kept = B  # rows kept, ..., B - 1 of the generated part: the nodes where prompts finished (their keys, for the next turn)
        finished: dict[int, tuple[int, int, int]] = {}  # prompt -> (row, cached tokens, prompt row), as prompts finish

        sampled = Continuations(B)
        for step in range(params.max_new_tokens):
            # Each prompt draws from its node's logits, in the prompts' order: the draws of HFPolicy's rows.
            token, logprob = sample_next(logits, params.temperature, params.top_p, generator,
                                         rows=torch.tensor(node_of, device=self.device))  # (L,) each
            held = [prompt_len[source[n]] + step for n in node_of]  # (L,) tokens whose keys each prompt's node holds
            stop_token = sampled.add(torch.tensor(live, device=self.device), token, logprob, stop_ids).tolist()
            stopped = [stop or n + 1 >= positions for stop, n in zip(stop_token, held)]  # or no position left
            if step == params.max_new_tokens - 1 or all(stopped):
                for p, n, length in zip(live, node_of, held):
                    finished[p] = (n, length, source[n])
                break
            # The next nodes: one per (node, token) of the prompts that go on; the keys of a node where a prompt
            # stopped move to a row at the back, kept (the next turn of that episode starts from them).
            child_of: dict[tuple[int, int], int] = {}  # (node, token) -> child
            parent, fed, next_live, next_node_of, ending = [], [], [], [], {}
            for p, n, t, stop, length in zip(live, node_of, token.tolist(), stopped, held):
                if stop:
                    if n not in ending:
                        kept -= 1
                        ending[n] = kept
                    finished[p] = (ending[n], length, source[n])
                    continue
                if (n, t) not in child_of:
                    child_of[n, t] = len(parent)
                    parent.append(n)
                    fed.append(t)
                next_live.append(p)
                next_node_of.append(child_of[n, t])
            row = child_rows(parent)  # child c becomes node row[c]
            moves = [(r, n) for r, n in zip(row, parent) if r != n] + [(r, n) for n, r in ending.items()]
            if moves and step > 0:  # (to, from): each child gets its parent's keys; all are read before any is written
                to, frm = torch.tensor(moves, device=self.device).T
                used = self.gen_kv[:, :, :, :, :step]
                used.index_copy_(2, to, used.index_select(2, frm))
            child_in = [0] * len(row)  # (N,) the child in each row
            for c, r in enumerate(row):
                child_in[r] = c
            source = [source[parent[c]] for c in child_in]
            live, node_of = next_live, [row[c] for c in next_node_of]
            self._read(source)
            new = torch.tensor([fed[c] for c in child_in], device=self.device)[:, None]  # (N, 1)
            lengths = self.read_len[self.source] + step  # (N,)
            logits = self._forward(new, lengths, torch.ones_like(lengths), step)  # (N, V): one new token per node
        self.cached = {tuple(prompts[p] + sampled.tokens[p]): where for p, where in finished.items()}
        return sampled.generations()

    def _read(self, source: list[int]) -> None:
        """Set up the next step's reads of the prompt part for nodes whose prompt rows are ``source`` (N,). As rows
        finish, fewer prompt rows have a live node, but every step would still read all of them (the grid is one
        batched product over the part): once the rows with a live node are a quarter fewer than those read, they
        alone are copied into a smaller part, read from then on (the prompt part itself stays whole: the next
        call's prompts extend the finished rows)."""
        live = sorted(set(source))
        if len(live) <= 3 * len(self.read_rows) // 4:
            rows = torch.tensor(live, device=self.device)
            self.read_rows, self.read_len = live, self.prompt_len[rows]
            self.read_kv = tuple(_rows_of(part, rows) for part in self.prompt_kv)
        place = {u: a for a, u in enumerate(self.read_rows)}
        self.source, self.slot, self.sharing = grid([place[u] for u in source], self.device)


def _rows_of(part: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """A copy of the prompt rows ``rows`` of a cache part (layers, U, kv, T, D), in the part's own memory layout
    (the keys' transposed one too: module docstring, 3.). ``index_select`` over the memory as it lies copies
    each row's block whole, rather than an element at a time through the keys' transposed view."""
    if part.is_contiguous():
        return part.index_select(1, rows)
    return part.transpose(-1, -2).index_select(1, rows).transpose(-1, -2)  # keys: (..., D, T) in memory


def child_rows(parent: list[int]) -> list[int]:
    """The rows of the generated part for the next nodes, ``parent[c]`` being the node that child ``c`` extends:
    rows ``0 .. N-1``, each node's first child in its parent's own row where that row is one of them (its keys
    are there already: no copy), the other children in the rows left over."""
    N = len(parent)
    row: list[int | None] = [None] * N
    taken = set()
    for c, n in enumerate(parent):
        if n < N and n not in taken:
            row[c] = n
            taken.add(n)
    free = iter(r for r in range(N) if r not in taken)
    return [r if r is not None else next(free) for r in row]


def grid(source: list[int], device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Where each node sits in ``_forward``'s ``(U, R)`` grid: its prompt row ``source`` (N,), its place among the
    nodes sharing that prompt row (N,), and R, the most nodes sharing one."""
    taken = Counter()
    slot = []
    for u in source:
        slot.append(taken[u])
        taken[u] += 1
    return torch.tensor(source, device=device), torch.tensor(slot, device=device), max(taken.values())
