"""Our GRPO loss equals TRL's: same batch, same weights, same numbers (and gradients).

helpers.ecosystem.trl_bridge.compare_with_trl builds a TRL GRPOTrainer on a copy of our LoRA model,
lets TRL sample and score a batch, and feeds the same tokens, rewards, old log-probs
and reference log-probs to both losses.
"""

import copy

import pytest
import torch

from helpers.config import TrainConfig
from helpers.ecosystem.trl_bridge import compare_with_trl
from helpers.grpo import LoRAGRPO
from helpers.worlds.arithmetic.tasks import make_tiny_tasks

pytestmark = pytest.mark.usefixtures("one_thread")


def trained_looking(model, config):
    """A LoRA trainer whose adapter is not zero, so the policy differs from the reference (KL > 0)."""
    trainer = LoRAGRPO(copy.deepcopy(model), config)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return trainer


@pytest.mark.parametrize("multi_turn", [False, True], ids=["single-turn", "multi-turn"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_loss_equals_trl(tiny, loss_type, beta, multi_turn):
    """multi-turn: a tool's reply sits inside each completion; TRL masks it with tool_mask, we with mask 0."""
    model, tokenizer = tiny
    config = TrainConfig(lora_r=4, lora_alpha=8, num_generations=4, loss_type=loss_type, beta=beta, temperature=1.0)
    trainer = trained_looking(model, config)
    result = compare_with_trl(trainer, tokenizer, make_tiny_tasks(2, seed=1), max_completion_length=16, multi_turn=multi_turn)
    assert result["ours"] == pytest.approx(result["trl"], abs=1e-5)
    assert result["grad_max_diff"] < 1e-5
    assert result["clip_ours"] == pytest.approx(result["clip_trl"], abs=1e-6)
    assert result["clip_ours"] > 0  # the noisy old log-probs make the clip bite: the check covers clipping
    if beta:
        assert result["kl_ours"] > 0
        assert result["kl_ours"] == pytest.approx(result["kl_trl"], rel=1e-5)


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_advantages_equal_trl(tiny, scale_rewards):
    model, tokenizer = tiny
    config = TrainConfig(lora_r=4, lora_alpha=8, num_generations=4, scale_rewards=scale_rewards, temperature=1.0)
    result = compare_with_trl(LoRAGRPO(copy.deepcopy(model), config), tokenizer, make_tiny_tasks(3, seed=2), seed=1)
    assert result["advantages_ours"].abs().sum() > 0
    torch.testing.assert_close(result["advantages_ours"], result["advantages_trl"], atol=1e-5, rtol=1e-5)
    assert result["ours"] == pytest.approx(result["trl"], abs=1e-5)


def test_loss_types_differ(tiny):
    """Guard on the check itself: completions of different lengths make the three aggregations disagree."""
    model, tokenizer = tiny
    losses = {}
    for loss_type in ("grpo", "dr_grpo", "dapo"):
        config = TrainConfig(lora_r=4, lora_alpha=8, num_generations=4, loss_type=loss_type, temperature=1.0)
        losses[loss_type] = compare_with_trl(trained_looking(model, config), tokenizer, make_tiny_tasks(2, seed=1))["ours"]
    assert len({round(v, 6) for v in losses.values()}) == 3, losses
