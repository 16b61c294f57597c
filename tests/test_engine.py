"""The engine backend (helpers.policy.engine) samples what HFPolicy samples: the same tokens and the
same log-probs (to float rounding) for the same seed, over whole multi-turn episodes, with the KV
cache kept across turns, identical prompts computed once, and a LoRA adapter merged into its weights."""

from dataclasses import replace

import pytest
import torch

import helpers.worlds  # noqa: F401  (registers the shop world)
from helpers.config import get_preset
from helpers.data import load_dataset
from helpers.grpo import LoRAGRPO
from helpers.lab.mismatch import Mismatch, logprob_mismatch, score, step_batch
from helpers.loop import env_factory
from helpers.policy import EnginePolicy, HFPolicy, SamplingParams, load_model, make_policy
from helpers.policy.engine import child_rows, supports
from helpers.rollout import rollout

LOGPROB_TOLERANCE = 1e-4  # float rounding of other matrix shapes (fused projections, one token at a time)


@pytest.fixture(scope="module")
def shop():
    """The shop world's warm start under a LoRA adapter whose B is not zero (so the merge matters)."""
    config = get_preset("tiny-agent")
    model, tokenizer = load_model(config)
    trainer = LoRAGRPO(model, config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    tasks = load_dataset(config.dataset, "test", 6, seed=0)
    return config, trainer.model, tokenizer, tasks


def assert_same_episodes(a, b):
    assert [t.token_ids for t in a] == [t.token_ids for t in b]
    assert [t.mask for t in a] == [t.mask for t in b]
    worst = max(abs(x - y) for s, t in zip(a, b) for x, y in zip(s.logprobs, t.logprobs))
    assert worst < LOGPROB_TOLERANCE


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.0, 1.0), (0.8, 0.9)])
def test_engine_episodes_equal_transformers_episodes(shop, temperature, top_p):
    config, model, tokenizer, tasks = shop
    sampling = SamplingParams(config.max_new_tokens, temperature, top_p, seed=7)
    limits = dict(group_size=4, sampling=sampling, progress=False, max_steps=config.env_max_steps,
                  max_total_tokens=config.max_total_tokens)
    expected = rollout(tasks, env_factory(config), HFPolicy(model, tokenizer), **limits)
    engine = EnginePolicy(model, tokenizer)
    got = rollout(tasks, env_factory(config), engine, **limits)
    assert max(t.turns for t in got) >= 3  # multi-turn: later turns came from the kept cache
    assert_same_episodes(expected, got)
    assert_same_episodes(expected, rollout(tasks, env_factory(config), engine, **limits))  # and again, warm


def test_kept_cache_changes_nothing(shop):
    """A prompt that extends the last call's sequence reuses its keys: the same numbers as a fresh engine."""
    config, model, tokenizer, tasks = shop
    engine = EnginePolicy(model, tokenizer)
    prompt = tokenizer.apply_chat_template(tasks[0].prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
    params = SamplingParams(12, temperature=1.0, seed=3, stop_token_ids=[tokenizer.eos_token_id])
    first = engine.generate([prompt, prompt], params)[0]
    follow_up = prompt + first.token_ids + tokenizer.encode("\nmore", add_special_tokens=False)
    assert engine.cached  # the last call's sequences are kept ...
    warm = engine.generate([follow_up], params)[0]
    cold = EnginePolicy(model, tokenizer).generate([follow_up], params)[0]
    assert warm.token_ids == cold.token_ids
    assert max(abs(x - y) for x, y in zip(warm.logprobs, cold.logprobs)) < LOGPROB_TOLERANCE


def test_sync_takes_the_new_adapter_and_forgets_the_cache(shop):
    config, model, tokenizer, tasks = shop
    engine = EnginePolicy(model, tokenizer)
    prompt = [5, 6, 7, 8]
    params = SamplingParams(6, temperature=0.0)
    before = engine.generate([prompt], params)[0]
    lora_b = next(p for n, p in model.named_parameters() if "lora_B" in n)
    saved = lora_b.detach().clone()
    try:
        with torch.no_grad():
            lora_b.add_(0.5)
        assert engine.generate([prompt], params)[0].logprobs == before.logprobs  # the engine holds its own copy
        engine.sync(model)
        assert not engine.cached
        after = engine.generate([prompt], params)[0]
        assert after.logprobs != before.logprobs
        assert after.logprobs == pytest.approx(HFPolicy(model, tokenizer).generate([prompt], params)[0].logprobs, abs=LOGPROB_TOLERANCE)
    finally:
        with torch.no_grad():
            lora_b.copy_(saved)


@pytest.mark.parametrize("family", ["qwen2-gqa", "llama"])
def test_other_decoders_of_the_family(family):
    """Grouped-query attention (2 kv heads for 4 query heads), q/k/v biases (Qwen2), none (Llama)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    shape = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    model = (Qwen2ForCausalLM(Qwen2Config(**shape)) if family == "qwen2-gqa" else LlamaForCausalLM(LlamaConfig(**shape))).eval()
    if family == "qwen2-gqa":
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.bias.normal_(0, 0.1)
                layer.self_attn.k_proj.bias.normal_(0, 0.1)
    tokenizer = type("Tok", (), {"pad_token_id": 0, "eos_token_id": 1})()
    prompts = [[3, 4, 5, 6, 7], [9, 10], [3, 4, 5, 6, 7]]
    params = SamplingParams(10, temperature=1.0, seed=1, stop_token_ids=[1])
    expected = HFPolicy(model, tokenizer).generate(prompts, params)
    got = EnginePolicy(model, tokenizer).generate(prompts, params)
    assert [g.token_ids for g in got] == [g.token_ids for g in expected]
    for g, e in zip(got, expected):
        assert g.logprobs == pytest.approx(e.logprobs, abs=LOGPROB_TOLERANCE)


def test_refuses_what_it_does_not_compute():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=32))
    assert not supports(model)
    from transformers import LlamaConfig, LlamaForCausalLM

    small = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=2,
                 vocab_size=50, max_position_embeddings=32)
    assert supports(LlamaForCausalLM(LlamaConfig(**small)))
    for biased in ({"attention_bias": True}, {"mlp_bias": True}):  # o_proj's and the MLP's biases: the engine has none
        assert not supports(LlamaForCausalLM(LlamaConfig(**small, **biased)))
    with pytest.raises(ValueError, match="use backend 'hf'"):
        EnginePolicy(model, None)


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_rows_that_agree_are_computed_once(shop, temperature):
    """Each decode step feeds the model one row per distinct sequence so far (a node), not one per prompt: counted
    from what G samples of two prompts sampled, step by step. Sampled (T = 1), the samples of a prompt part ways; greedy,
    they never do, so every step feeds at most the two prompts' nodes."""
    config, model, tokenizer, tasks = shop
    engine = EnginePolicy(model, tokenizer)
    fed = []  # rows of each forward pass: the prefill, then each decode step
    forward = engine._forward
    engine._forward = lambda new, *args: fed.append(new.shape[0]) or forward(new, *args)
    prompts = [tokenizer.apply_chat_template(t.prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
               for t in tasks[:2] for _ in range(8)]
    gens = engine.generate(prompts, SamplingParams(config.max_new_tokens, temperature=temperature, seed=5))
    sampled = [g.token_ids for g in gens]
    distinct = [len({(tuple(p), tuple(s[: step + 1])) for p, s in zip(prompts, sampled) if len(s) > step + 1})
                for step in range(max(map(len, sampled)) - 1)]  # the sequences fed back at each step
    assert fed == [2] + distinct  # the prefill of the two distinct prompts, then the nodes
    if temperature == 0.0:
        assert max(fed) <= 2 and len(fed) > 10
    else:
        assert max(distinct) > 2  # nodes split


def test_steps_read_only_the_prompt_rows_of_live_nodes(shop):
    """As prompts finish, a step reads a smaller copy of the prompt part: never a row fewer than its live nodes need,
    never a quarter more than they need; the copies keep the keys transposed in memory, as the products read them
    (module docstring, 3.); and the episodes stay transformers' (the copies hold the right keys)."""
    config, model, tokenizer, tasks = shop
    sampling = SamplingParams(config.max_new_tokens, 1.0, 1.0, seed=3)
    limits = dict(group_size=4, sampling=sampling, progress=False, max_steps=config.env_max_steps,
                  max_total_tokens=config.max_total_tokens)
    engine = EnginePolicy(model, tokenizer)
    steps = []  # (prompt rows with a live node, rows read, rows in the prompt part) of each decode step
    forward = engine._forward

    def counting(new, lengths, counts, step=None):
        if step is not None:
            live = len(set(engine.source[: new.shape[0]].tolist()))
            steps.append((live, engine.read_kv[0].shape[1], engine.prompt_kv[0].shape[1]))
            assert all(keys.transpose(-1, -2).is_contiguous() for keys in (engine.read_kv[0], engine.prompt_kv[0]))
        return forward(new, lengths, counts, step)

    engine._forward = counting
    got = rollout(tasks, env_factory(config), engine, **limits)
    assert all(live <= read and 4 * live > 3 * read for live, read, _ in steps)
    assert any(read < whole for _, read, whole in steps)  # some steps read a smaller copy
    assert_same_episodes(rollout(tasks, env_factory(config), HFPolicy(model, tokenizer), **limits), got)


def test_child_rows_keep_first_children_in_their_parents_rows():
    # child c extends node parent[c]; rows 0..N-1, a node's first child in the node's own row when that row is < N
    assert child_rows([0, 0, 2, 5]) == [0, 1, 2, 3]
    assert child_rows([3, 1, 1]) == [0, 1, 2]
    assert child_rows([4, 4, 1, 0, 9]) == [4, 2, 1, 0, 3]


def test_make_policy_engine_backend(shop):
    config, model, tokenizer, _ = shop
    assert isinstance(make_policy(get_preset("tiny-agent", backend="engine"), model, tokenizer), EnginePolicy)
    with pytest.raises(ValueError, match="every prompt needs at least one token"):
        EnginePolicy(model, tokenizer).generate([[]], SamplingParams(4))


def test_a_row_that_reaches_the_last_position_ends_there(shop):
    """A batch whose longest prompt plus the batch's budget passes the model's positions (the rollout gives a batch
    the largest row budget): that row ends at the last position with "length"; a prompt that fills them is refused."""
    config, model, tokenizer, tasks = shop
    positions = model.config.max_position_embeddings
    short = tokenizer.apply_chat_template(tasks[0].prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
    long = (short * (positions // len(short) + 1))[: positions - 5]
    params = SamplingParams(40, temperature=1.0, seed=1)
    long_gen, short_gen = EnginePolicy(model, tokenizer).generate([long, short], params)
    assert len(long) + len(long_gen.token_ids) <= positions and long_gen.finish_reason == "length"
    assert len(short_gen.token_ids) > 5  # the short row was not cut with it
    with pytest.raises(ValueError, match="leaves no room"):
        EnginePolicy(model, tokenizer).generate([short * (positions // len(short) + 1)], params)


def test_in_bf16_the_engine_adds_no_gap_beyond_the_precision():
    """bf16, the GPU presets' dtype, here on the CPU: the engine runs a whole training step from a bf16 model (a dtype
    mismatch anywhere in it would raise), and the log-probs it records are as close to the float32 trainer's as bf16
    itself allows (transformers scoring the same tokens in bf16). It bounds the error; it does not find wrong math,
    which this model's confident outputs hide at bf16's tolerance (a 19 % error in the attention scale stays inside
    it): the float32 tests above, which compare every token, do that."""
    config = replace(get_preset("tiny-agent"), dtype="bfloat16", backend="engine")
    batch, trainer = step_batch(config)
    fp32 = score(trainer.model, batch, "float32", config.temperature)
    engine = Mismatch("engine, bf16", fp32, batch.old_logps, batch.mask).summary()
    precision = logprob_mismatch(trainer.model, batch, "bfloat16", config).summary()
    assert engine["tokens"] > 1000 and precision["logp_diff_mean"] > 0  # a real step, and bf16 does differ from fp32
    assert engine["logp_diff_mean"] <= 2 * precision["logp_diff_mean"]
    assert engine["logp_diff_max"] <= 2 * precision["logp_diff_max"]
