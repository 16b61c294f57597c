"""The memory plan against numbers worked out by hand (and against the Qwen2.5 model cards)."""

import pytest

from helpers.config import get_preset
from helpers.lab.memory import GIB, QWEN25, DoesNotFitError, check_fits, episode_budget, memory_plan, model_shape


def row(plan, name):
    return next(gib for term, gib, _ in plan.rows if term == name)


@pytest.mark.parametrize(
    "name, total_b, non_embedding_b",  # billions, as printed on each Qwen2.5 model card
    [("Qwen2.5-0.5B", 0.49, 0.36), ("Qwen2.5-1.5B", 1.54, 1.31), ("Qwen2.5-3B", 3.09, 2.77), ("Qwen2.5-7B", 7.61, 6.53)],
)
def test_parameter_counts_match_the_model_cards(name, total_b, non_embedding_b):
    shape = QWEN25[name]
    n = shape.n_params()
    embeddings = shape.vocab * shape.hidden * (1 if shape.tie_embeddings else 2)
    assert n / 1e9 == pytest.approx(total_b, abs=0.01)  # the cards print two decimals
    assert (n - embeddings) / 1e9 == pytest.approx(non_embedding_b, abs=0.01)


def test_qwen25_1_5b_by_hand():
    s = model_shape("Qwen/Qwen2.5-1.5B-Instruct")
    # per layer: q 1536*1536 + k,v 1536*256 each + o 1536*1536 + MLP 3*1536*8960, biases 1536+2*256, norms 2*1536
    per_layer = 2 * 1536 * 1536 + 2 * 1536 * 256 + 3 * 1536 * 8960 + (1536 + 512) + 2 * 1536
    assert per_layer == 46_797_824
    assert s.n_params() == 28 * per_layer + 151936 * 1536 + 1536 == 1_543_714_304
    assert s.kv_bytes_per_token(2) == 28 * 2 * 2 * 128 * 2 == 28_672  # layers x (k, v) x kv heads x head dim x bf16
    # LoRA rank 32 on all 7 linears: r * (in + out) each
    assert s.n_lora_params(32, list(s.linear_shapes())) == 28 * 32 * (2 * 3072 + 2 * 1792 + 3 * 10496) == 36_929_536
    assert s.activation_elements_per_token_layer() == 6 * 1536 + 2 * 256 + 4 * 8960 == 45_568


def test_gsm8k_24gb_plan_terms_by_hand():
    plan = memory_plan("gsm8k-24gb", gpu_gb=24)
    tokens = 8 * 768  # micro-batch: 16 tasks x 8 samples / 16 accumulation steps, padded to 768 tokens
    assert row(plan, "weights (trainer copy)") == pytest.approx(1_543_714_304 * 2 / GIB)
    assert row(plan, "vLLM: weights") == row(plan, "weights (trainer copy)")
    assert row(plan, "LoRA params + grads + AdamW") == pytest.approx(36_929_536 * 16 / GIB)
    assert row(plan, "activations") == pytest.approx((tokens * 28 * 1536 * 2 + tokens * 45_568 * 2) / GIB)  # 1.01
    assert row(plan, "logits (chunked log-probs)") == pytest.approx(1024 * 151936 * 22 / GIB)  # 3.19
    assert plan.kv_needed_gib == pytest.approx(128 * 768 * 28_672 / GIB)  # 2.62
    assert plan.kv_available_gib == pytest.approx(0.3 * 24 - 1_543_714_304 * 2 / GIB - 1.0)
    assert plan.kv_available_gib > plan.kv_needed_gib  # a whole step's samples are in flight at once
    assert plan.fits and plan.peak_gib < 24
    assert check_fits(plan) is plan
    assert "fits" in plan.table() and "vLLM: KV cache needed" in str(plan)


def test_the_trainer_alone_is_its_resident_state_plus_one_update():
    """``trainer_gib`` is what scripts/gpu_memory_check.py sets beside torch's measured peak: the trainer's own rows."""
    own = ("weights (trainer copy)", "LoRA params + grads + AdamW", "CUDA context + allocator slack", "activations", "logits (chunked log-probs)")
    for preset in ("gsm8k-24gb", "gsm8k-t4-tools", "tiny-cpu"):
        plan = memory_plan(preset, gpu_gb=24)
        assert plan.trainer_gib == pytest.approx(sum(row(plan, term) for term in own))
    assert memory_plan("tiny-cpu", 24).train_gib == memory_plan("tiny-cpu", 24).trainer_gib  # hf backend: no second process
    asleep = memory_plan("gsm8k-24gb", 24)
    assert asleep.train_gib - asleep.trainer_gib == pytest.approx(row(asleep, "vLLM: process CUDA context"))  # vLLM asleep keeps its context


def test_without_checkpointing_activations_are_all_layers():
    plan = memory_plan(get_preset("gsm8k-24gb", gradient_checkpointing=False), gpu_gb=24)
    assert row(plan, "activations") == pytest.approx(8 * 768 * 28 * 45_568 * 2 / GIB)  # 14.6 GiB


def test_t4_preset_fits_a_t4_with_a_float32_trainer_and_float16_sampler():
    plan = check_fits("gsm8k-t4", gpu_gb=15)
    n = QWEN25["Qwen2.5-0.5B"].n_params()
    assert row(plan, "weights (trainer copy)") == pytest.approx(n * 4 / GIB)
    assert row(plan, "vLLM: weights") == pytest.approx(n * 2 / GIB)
    assert plan.kv_needed_gib == pytest.approx(64 * 768 * (24 * 2 * 2 * 64 * 2) / GIB)  # fp16 KV, 12 KiB/token


def test_sleep_mode_frees_vllms_share_during_training():
    awake = memory_plan(get_preset("gsm8k-24gb", vllm_sleep_mode=False), 24)
    asleep = memory_plan("gsm8k-24gb", 24)
    assert awake.train_gib - asleep.train_gib == pytest.approx(0.3 * 24)
    assert awake.rollout_gib == asleep.rollout_gib


def test_classic_oom_sampling_and_training_at_full_size():
    # vLLM's default share (0.92 in vLLM 0.32) and no sleep: the trainer has nowhere to go
    config = get_preset("gsm8k-24gb", vllm_gpu_memory_utilization=0.92, vllm_sleep_mode=False)
    with pytest.raises(DoesNotFitError, match="vllm_sleep_mode") as err:
        check_fits(config, gpu_gb=24)
    assert "lower vllm_gpu_memory_utilization" in str(err.value)


def test_long_completions_without_checkpointing_do_not_fit():
    config = get_preset("gsm8k-24gb", max_total_tokens=4096 + 256, gradient_checkpointing=False)
    with pytest.raises(DoesNotFitError, match="gradient_checkpointing"):
        check_fits(config, gpu_gb=24)
    assert memory_plan(config, 24).notes  # and its KV cache cannot hold a whole step


def test_7b_full_finetune_does_not_fit():
    config = get_preset("gsm8k-24gb", model="Qwen/Qwen2.5-7B-Instruct", use_lora=False)
    plan = memory_plan(config, 24)
    assert not plan.fits
    assert any("LoRA" in p for p in plan.problems)
    assert any("refuse to start" in p for p in plan.problems)  # 7B bf16 alone is bigger than vLLM's 7.2 GiB


def test_local_folder_is_read_with_autoconfig(tmp_path):
    from transformers import Qwen2Config

    Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, vocab_size=100).save_pretrained(tmp_path)
    s = model_shape(str(tmp_path))
    assert (s.hidden, s.layers, s.heads, s.kv_heads, s.intermediate, s.vocab, s.dim) == (64, 2, 4, 2, 128, 100, 16)


def test_bad_inputs_have_clear_errors():
    with pytest.raises(ValueError, match="no shape for model"):
        model_shape("no/such-model")
    with pytest.raises(ValueError, match="not linear layers"):
        QWEN25["Qwen2.5-0.5B"].n_lora_params(8, ["qkv"])
    with pytest.raises(ValueError, match="gpu_gb"):
        memory_plan("gsm8k-24gb", 0)
    with pytest.raises(ValueError, match="needs gpu_gb"):
        check_fits("gsm8k-24gb")


def test_episode_budget_by_hand():
    c = get_preset("tiny-cpu", steps=4, eval_every=2, tasks_per_step=3, num_generations=2, eval_tasks=10, eval_subset=5, pass_k=2)
    budget = episode_budget(c)
    assert budget.train == 4 * 3 * 2
    # before and after: 10 tasks x (1 greedy + 2 sampled); at step 2: 5 tasks x (1 greedy + 1 sampled)
    assert (budget.eval, budget.evaluations) == (2 * 10 * 3 + 5 * 2, 3)
    assert budget.eval_share == pytest.approx(70 / 94)
    assert episode_budget(c, eval_pool=4).eval == 2 * 4 * 3 + 4 * 2  # a test split smaller than eval_tasks


def test_episode_budget_counts_what_the_loop_plays(tmp_path):
    """The count agrees with the episodes a real (tiny) run records in its eval/ folder: one record per task,
    its greedy episode, and ``correct_of_<k>`` of its k sampled ones."""
    import json

    from helpers.live import LiveCurves
    from helpers.train import train

    c = get_preset("tiny-cpu", steps=3, eval_every=1, tasks_per_step=2, num_generations=2, eval_tasks=6, eval_subset=3,
                   pass_k=2, save_every=0, out_dir=str(tmp_path / "run"))
    train(c, preset_name="tiny-cpu", live=LiveCurves(None, notebook=False))
    records = [json.loads(line) for path in sorted((tmp_path / "run" / "eval").glob("step-????.jsonl"))
               for line in path.read_text().splitlines()]
    sampled = [int(key.removeprefix("correct_of_")) for record in records for key in record if key.startswith("correct_of_")]
    assert len(records) + sum(sampled) == episode_budget(c).eval == 2 * 6 * 3 + 2 * 3 * 2


@pytest.mark.parametrize("preset", ["gsm8k-24gb", "gsm8k-24gb-tools", "gsm8k-t4", "gsm8k-t4-tools"])
def test_gsm8k_presets_spend_under_a_fifth_on_evaluation(preset):
    budget = episode_budget(preset, eval_pool=1319)  # GSM8K's test split
    assert budget.eval_share < 0.2, str(budget)
    assert get_preset(preset).eval_tasks >= 1319  # before and after: the whole test split
