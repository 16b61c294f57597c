"""The train-inference importance-sampling correction (helpers.grpo §3b) is TRL's, and a no-op when it should be.

- the worked example of helpers.grpo §3b, by hand, in all four modes;
- our weights, TRL's five ``sampling/...`` metrics, the loss and its gradient equal TRL 1.16's own
  (``GRPOTrainer._generate_and_score_completions`` and ``compute_loss`` with vLLM's correction on,
  ``helpers.lab.mismatch.compare_is_with_trl``) on the same multi-turn batch, in every mode, with the upper
  bound, a lower bound and each alone, and the bounds crossed (truncation and masking both covered);
- when the sampler's log-probs equal the trainer's, every weight is 1 and an update with the
  correction on gives the very adapter an update without it gives;
- the correction only acts with backend="vllm" (the CPU backends' runs are unchanged), and our option
  names and defaults are TRL's.
"""

import copy
import dataclasses
import math

import pytest
import torch

from helpers.config import TrainConfig
from helpers.grpo import (IS_MODES, LoRAGRPO, collate, group_advantages, group_rewards, grpo_loss,
                          importance_sampling_metrics, importance_sampling_ratio)
from helpers.ecosystem.trl_bridge import import_trl
from helpers.lab.mismatch import compare_is_with_trl
from helpers.loop import env_factory
from helpers.policy import HFPolicy, SamplingParams
from helpers.rollout import rollout
from helpers.worlds.arithmetic.tasks import make_tiny_tasks
from tests.test_grpo_trl import trained_looking  # a LoRA trainer whose adapter is not zero

pytestmark = pytest.mark.usefixtures("one_thread")
G = 4


def config(**overrides) -> TrainConfig:
    return TrainConfig(lora_r=4, lora_alpha=8, num_generations=G, temperature=1.0, max_new_tokens=48, max_total_tokens=192,
                       **overrides)  # the one-call world's episode limits (tiny-cpu)


@pytest.fixture(scope="module")
def episodes(tiny):
    """Multi-turn episodes of the one-call world (calculator replies in them, mask 0), G per task."""
    model, tokenizer = tiny
    torch.manual_seed(0)
    cfg = config()
    trajs = rollout(make_tiny_tasks(3, seed=1), env_factory(cfg), HFPolicy(model, tokenizer), group_size=G,
                    sampling=SamplingParams(cfg.max_new_tokens, 1.0, seed=0), max_steps=cfg.env_max_steps,
                    max_total_tokens=cfg.max_total_tokens, progress=False)
    assert any(t.turns >= 2 for t in trajs), "no episode with a tool reply: the check would not cover tool tokens"
    return trajs


def test_worked_example():
    """helpers.grpo §3b's table: sampler p (0.90, 0.10, 0.50, 0.005), trainer p (0.909, 0.135, 0.50, 0.020)."""
    sampling = torch.tensor([[0.90, 0.10, 0.50, 0.005]]).log()
    old = torch.tensor([[0.909, 0.135, 0.50, 0.020]]).log()
    mask = torch.ones(1, 4)
    w = lambda mode: importance_sampling_ratio(old, sampling, mask, mode, None, 3.0)[0].tolist()  # noqa: E731
    assert w("token_truncate") == pytest.approx([1.01, 1.35, 1.0, 3.0], abs=1e-5)
    assert w("token_mask") == pytest.approx([1.01, 1.35, 1.0, 0.0], abs=1e-5)
    assert w("sequence_truncate") == pytest.approx([3.0])  # 1.01 * 1.35 * 4 = 5.45, capped
    assert w("sequence_mask") == [0.0]
    assert importance_sampling_ratio(old, sampling, mask, "sequence_truncate", None, 6.0)[0].item() == pytest.approx(1.01 * 1.35 * 4, rel=1e-5)
    # a tool token (mask 0) adds nothing, whatever its numbers; a NaN sampling log-prob weighs 1
    mask[0, 3] = 0
    assert w("sequence_mask") == pytest.approx([1.01 * 1.35], rel=1e-5)
    sampling[0, 1] = float("nan")
    assert w("token_truncate")[1] == 1.0


@pytest.mark.parametrize("clip_min, clip_max", [(None, 3.0), (0.5, 2.0), (0.5, None)], ids=["max", "min-max", "min"])
@pytest.mark.parametrize("mode", IS_MODES)
def test_equals_trl(tiny, episodes, mode, clip_min, clip_max):
    if clip_max is None and mode.endswith("truncate") and clip_min is None:
        pytest.skip("TRL refuses a truncate mode without bounds")
    model, tokenizer = tiny
    trainer = trained_looking(model, config())
    r = compare_is_with_trl(trainer, tokenizer, episodes, mode, clip_min, clip_max, noise=0.5)
    ours, theirs = r["weights_ours"], r["weights_trl"]
    assert ours.shape == theirs.shape
    on = torch.ones_like(ours, dtype=torch.bool) if mode.startswith("sequence") else r["loss_mask"]
    torch.testing.assert_close(ours[on], theirs[on], rtol=1e-4, atol=1e-5)
    for key, value in r["metrics_trl"].items():
        assert r["metrics_ours"][key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    assert r["loss_ours"] == pytest.approx(r["loss_trl"], rel=1e-5, abs=1e-5)  # without C_max a weight can be e^40
    assert r["grad_max_diff"] <= 1e-5 * max(1.0, r["grad_max"])
    # the bounds were crossed, so clamping or zeroing is what was compared
    weights = theirs[on]
    if clip_max is not None:
        assert (weights == (0.0 if mode.endswith("mask") else clip_max)).any()
    if clip_min is not None:
        assert (weights == (0.0 if mode.endswith("mask") else clip_min)).any()
    assert ((weights != 0) & (weights != clip_max) & (weights != clip_min)).any()  # and some were left as they were


def test_kl_term_is_not_weighted(tiny, episodes):
    """With beta > 0 TRL adds the KL after the weighting; so do we (compare_is_with_trl's losses agree)."""
    model, tokenizer = tiny
    trainer = trained_looking(model, config(beta=0.04))
    r = compare_is_with_trl(trainer, tokenizer, episodes, "token_truncate", None, 3.0)
    assert r["loss_ours"] == pytest.approx(r["loss_trl"], abs=1e-5) and r["grad_max_diff"] < 1e-5


def test_no_op_when_logprobs_agree(tiny, episodes):
    """The sampler's log-probs are the trainer's own: every weight is 1, the loss is the uncorrected one, and an
    update with backend="vllm" (correction on) leaves the same adapter as one with backend="hf" (no correction)."""
    model, _ = tiny
    hf = trained_looking(model, config())
    vllm = LoRAGRPO(copy.deepcopy(hf.model), config(backend="vllm"))  # the same adapter
    assert vllm.correct_sampler and not hf.correct_sampler
    batch = collate(episodes, group_advantages(group_rewards([dataclasses.replace(t, reward=float(i % 3)) for i, t in enumerate(episodes)])))
    with torch.no_grad():
        batch.old_logps = hf.logprobs(batch.input_ids, batch.mask)  # what a sampler with the trainer's arithmetic records
    for mode in IS_MODES:
        w = importance_sampling_ratio(batch.old_logps, batch.old_logps, batch.mask, mode, 0.5, 3.0)
        assert torch.equal(w, torch.ones_like(w)), mode
    logps = hf.logprobs(batch.input_ids, batch.mask)
    plain, _ = grpo_loss(logps, batch.old_logps, batch.advantages, batch.mask)
    corrected, _ = grpo_loss(logps, batch.old_logps, batch.advantages, batch.mask, importance_sampling_ratio=torch.ones_like(logps))
    assert corrected.item() == plain.item()

    old, weights, metrics = vllm.old_logps(batch)
    assert torch.equal(old, batch.old_logps) and torch.equal(weights, torch.ones_like(weights))
    assert metrics["sampling/importance_sampling_ratio/min"] == metrics["sampling/importance_sampling_ratio/max"] == 1.0
    assert metrics["sampling/sampling_logp_difference/max"] == 0.0
    a, b = hf.update(batch), vllm.update(batch)
    assert a["loss"] == b["loss"]
    assert all(torch.equal(p, q) for p, q in zip(hf.params, vllm.params))
    assert "sampling/importance_sampling_ratio/mean" in b and not any(k.startswith("sampling/") for k in a)


def test_only_with_vllm(tiny):
    """TRL corrects only vLLM's samples; the CPU backends sample with the trainer's arithmetic and are left alone,
    and the option turns it off for vLLM too."""
    model, _ = tiny
    for backend, correction, expected in (("hf", True, False), ("engine", True, False), ("vllm", True, True), ("vllm", False, False)):
        trainer = LoRAGRPO(copy.deepcopy(model), config(backend=backend, vllm_importance_sampling_correction=correction))
        assert trainer.correct_sampler == expected, backend


def test_trl_names_and_defaults():
    """Our options are TRL 1.16's GRPOConfig fields, with its defaults (and so is the KL's ratio correction)."""
    import inspect

    fields = {f.name: f.default for f in dataclasses.fields(import_trl().GRPOConfig)}
    ours = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.name.startswith("vllm_importance_sampling")}
    assert set(ours) == {"vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
                         "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min"}
    for name, default in ours.items():
        assert fields[name] == default, name
    assert inspect.signature(grpo_loss).parameters["kl_ratio_correction"].default == fields["use_bias_correction_kl"]


def test_bad_options_refused(tiny):
    model, _ = tiny
    for bad in (dict(vllm_importance_sampling_mode="token"), dict(vllm_importance_sampling_clip_min=3.0),
                dict(vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=None)):
        with pytest.raises(ValueError, match="vllm_importance_sampling"):
            LoRAGRPO(copy.deepcopy(model), config(**bad))


def test_metrics_are_trls_means():
    """Sequence modes report one weight per episode (all of them), token modes one per generated token."""
    old = torch.tensor([[0.0, -1.0, -2.0], [0.0, -1.0, 0.0]])
    sampling = torch.tensor([[0.0, -1.5, -1.0], [0.0, -1.0, 0.0]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]])
    seq = importance_sampling_metrics(importance_sampling_ratio(old, sampling, mask, "sequence_truncate", None, 3.0), old, sampling, mask,
                                      "sequence_truncate")
    assert seq["sampling/importance_sampling_ratio/mean"] == pytest.approx((math.exp(-0.5) + 1.0) / 2)
    tok = importance_sampling_metrics(importance_sampling_ratio(old, sampling, mask, "token_truncate", None, 3.0), old, sampling, mask,
                                      "token_truncate")
    assert tok["sampling/importance_sampling_ratio/mean"] == pytest.approx((math.exp(0.5) + math.exp(-1.0) + 1.0) / 3)
    assert tok["sampling/sampling_logp_difference/mean"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert tok["sampling/sampling_logp_difference/max"] == pytest.approx(1.0)
