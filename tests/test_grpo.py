"""helpers.grpo: advantages, chunked log-probs, the loss, and the LoRA trainer on the tiny model."""

import copy
import math

import pytest
import torch

from helpers.config import TrainConfig
from helpers.data import Task
from helpers.grpo import LoRAGRPO, collate, group_advantages, group_rewards, grpo_loss, token_logprobs
from helpers.rollout import Trajectory


pytestmark = pytest.mark.usefixtures("one_thread")


def config(**overrides) -> TrainConfig:
    base = dict(lora_r=4, lora_alpha=8, lr=1e-2, num_generations=4, temperature=1.0)
    return TrainConfig(**{**base, **overrides})


def fake_trajectories(trainer, n_tasks=2, G=4, generator=None, rewards=None):
    """Random episodes (prompt, then 3-10 "generated" tokens) with on-policy old log-probs."""
    vocab = trainer.model.get_base_model().config.vocab_size
    out = []
    for b in range(n_tasks):
        task = Task(id=f"task-{b}", prompt=[])
        prompt = torch.randint(3, vocab, (6,), generator=generator).tolist()
        for g in range(G):
            n = int(torch.randint(3, 11, (), generator=generator))
            ids = prompt + torch.randint(3, vocab, (n,), generator=generator).tolist()
            reward = float(torch.randint(0, 2, (), generator=generator)) if rewards is None else rewards[b][g]
            out.append(Trajectory(task=task, group=g, token_ids=ids, mask=[0] * 6 + [1] * n, logprobs=[0.0] * len(ids),
                                  prompt_len=6, reward=reward))
    batch = batch_of(out)
    with torch.no_grad():
        old = trainer.logprobs(batch.input_ids, batch.mask)  # (N, T): the policy "sampled" these tokens
    for n, t in enumerate(out):
        t.logprobs = old[n, : len(t.token_ids)].tolist()
    return out


def batch_of(trajs, **options):
    """The loop's two lines: group advantages, then the padded batch."""
    return collate(trajs, group_advantages(group_rewards(trajs)), **options)


# --- advantages ---------------------------------------------------------------------------


def test_group_advantages_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    std = math.sqrt(1 / 3)  # unbiased std of (1, 0, 0, 1): sum of squares 1 over n - 1 = 3
    adv = group_advantages(rewards, "group")
    torch.testing.assert_close(adv.advantages[0], torch.tensor([0.5, -0.5, -0.5, 0.5]) / (std + 1e-4))
    torch.testing.assert_close(adv.advantages[1], torch.zeros(4))
    assert adv.zero_spread.tolist() == [False, True]
    batch_std = rewards.flatten().std().item()
    torch.testing.assert_close(group_advantages(rewards, "batch").advantages[0],
                               torch.tensor([0.5, -0.5, -0.5, 0.5]) / (batch_std + 1e-4))
    torch.testing.assert_close(group_advantages(rewards, "none").advantages[0], torch.tensor([0.5, -0.5, -0.5, 0.5]))


def test_group_advantages_bad_input():
    with pytest.raises(ValueError, match="shape"):
        group_advantages(torch.zeros(4))
    with pytest.raises(ValueError, match="scale_rewards"):  # the config checks the name, where it is made
        TrainConfig(scale_rewards="std")


# --- log-probs ----------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [1, 7, 1024])
def test_chunked_logprobs_equal_full_logits(tiny, chunk_size):
    model, _ = tiny
    model = copy.deepcopy(model).train()
    ids = torch.randint(3, model.config.vocab_size, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.zeros_like(ids)
    mask[0, 4:] = 1
    mask[1, 2:9] = 1  # a gap, as a tool response would leave
    mask[1, 10:] = 1
    logps, entropy = token_logprobs(model, ids, mask, temperature=0.7, chunk_size=chunk_size)
    (logps * mask).sum().backward()
    grad_chunked = model.model.layers[0].mlp.up_proj.weight.grad.clone()
    model.zero_grad()

    all_logp = torch.log_softmax(model(input_ids=ids).logits / 0.7, dim=-1)  # (N, T, V) the naive way
    full = torch.zeros_like(logps)
    full[:, 1:] = all_logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    full = full * mask
    (full * mask).sum().backward()
    torch.testing.assert_close(logps, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.model.layers[0].mlp.up_proj.weight.grad, grad_chunked, atol=1e-5, rtol=1e-4)
    assert (logps[mask == 0] == 0).all() and (entropy[mask == 1] > 0).all()


# --- the loss, by hand --------------------------------------------------------------------


def test_grpo_loss_by_hand():
    # one sequence, 3 tokens (token 0 is the prompt): ratios 1.5 and 0.5; then a second sequence of 1 token, ratio 1
    logps = torch.log(torch.tensor([[1.0, 0.6, 0.2, 1.0], [1.0, 0.3, 1.0, 1.0]]))
    old = torch.log(torch.tensor([[1.0, 0.4, 0.4, 1.0], [1.0, 0.3, 1.0, 1.0]]))
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0]])
    adv = torch.tensor([1.0, -2.0])
    # sequence 0, A = +1: token 1 ratio 1.5 -> clipped to 1.28 -> -1.28; token 2 ratio 0.5 -> unclipped (A > 0) -> -0.5
    # sequence 1, A = -2: ratio 1 -> -(1 * -2) = 2
    kw = dict(epsilon_low=0.2, epsilon_high=0.28)
    loss, m = grpo_loss(logps, old, adv, mask, loss_type="grpo", **kw)
    assert loss.item() == pytest.approx(((-1.28 - 0.5) / 2 + 2) / 2, abs=1e-6)
    loss, _ = grpo_loss(logps, old, adv, mask, loss_type="dapo", **kw)
    assert loss.item() == pytest.approx((-1.28 - 0.5 + 2) / 3, abs=1e-6)
    loss, _ = grpo_loss(logps, old, adv, mask, loss_type="dr_grpo", max_completion_length=5, **kw)
    assert loss.item() == pytest.approx((-1.28 - 0.5 + 2) / (2 * 5), abs=1e-6)
    assert m["clip_ratio/high_mean"] == pytest.approx(1 / 3) and m["clip_ratio/low_mean"] == 0.0
    assert m["clip_ratio/region_mean"] == pytest.approx(1 / 3)
    assert m["ratio_max"] == pytest.approx(1.5) and m["ratio_min"] == pytest.approx(0.5)


def test_grpo_loss_kl_and_errors():
    logps = torch.tensor([[0.0, -1.0, -2.0]])
    mask = torch.tensor([[0, 1, 1]])
    ref = torch.tensor([[0.0, -1.5, -2.0]])
    loss, m = grpo_loss(logps, logps, torch.zeros(1), mask, ref, beta=0.1, loss_type="dapo")
    kl = math.exp(-0.5) + 0.5 - 1  # k3 on token 1; token 2 matches the reference: 0
    assert m["kl"] == pytest.approx(kl / 2, rel=1e-5)
    assert loss.item() == pytest.approx(0.1 * kl / 2, rel=1e-5)
    with pytest.raises(ValueError, match="ref_logps"):
        grpo_loss(logps, logps, torch.zeros(1), mask, beta=0.1)
    with pytest.raises(ValueError, match="max_completion_length"):
        grpo_loss(logps, logps, torch.zeros(1), mask, loss_type="dr_grpo")
    with pytest.raises(ValueError, match="loss_type"):  # the config checks the name, where it is made
        TrainConfig(loss_type="ppo")


# --- the trainer --------------------------------------------------------------------------


def test_only_adapter_weights_change(tiny):
    model, _ = tiny
    trainer = LoRAGRPO(copy.deepcopy(model), config(lora_target_modules=["q_proj", "v_proj", "up_proj"]))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    metrics = trainer.train_step(fake_trajectories(trainer, generator=torch.Generator().manual_seed(0)))
    assert metrics["skipped_steps"] == 0 and math.isfinite(metrics["loss"])
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
    # LoRA was applied where asked: A and B of q, v and up projections of every layer
    targets = {n.split(".lora_")[0].split(".")[-1] for n in changed}
    assert targets == {"q_proj", "v_proj", "up_proj"}
    assert all(not p.requires_grad for n, p in trainer.model.named_parameters() if "lora_" not in n)


def test_reference_is_the_base_model(tiny):
    model, _ = tiny
    trainer = LoRAGRPO(copy.deepcopy(model), config())
    trajs = fake_trajectories(trainer, generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        trainer.train_step(trajs)
    batch = batch_of(trajs)
    with torch.no_grad():
        base, _ = token_logprobs(model, batch.input_ids, batch.mask)
    ref = trainer.logprobs(batch.input_ids, batch.mask, reference=True)
    policy = trainer.logprobs(batch.input_ids, batch.mask).detach()
    torch.testing.assert_close(ref, base)
    assert (policy - ref).abs().max() > 1e-3  # the adapter did move the policy away from it


def test_grad_accum_gives_the_same_update(tiny):
    """dapo's normaliser is the token count of the whole batch, so splitting it into micro-batches changes nothing."""
    model, _ = tiny
    weights = []
    for grad_accum in (1, 2):
        torch.manual_seed(0)  # the same LoRA initialisation for both
        trainer = LoRAGRPO(copy.deepcopy(model), config(grad_accum=grad_accum, loss_type="dapo", beta=0.04))
        trainer.train_step(fake_trajectories(trainer, generator=torch.Generator().manual_seed(2)))
        weights.append({n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad})
    assert weights[0].keys() == weights[1].keys()
    for n in weights[0]:
        torch.testing.assert_close(weights[0][n], weights[1][n], atol=1e-6, rtol=1e-5)


def test_num_iterations_and_schedule(tiny):
    model, _ = tiny
    trainer = LoRAGRPO(copy.deepcopy(model), config(num_iterations=3, warmup_steps=2, steps=4, lr=1e-2))
    metrics = trainer.train_step(fake_trajectories(trainer, generator=torch.Generator().manual_seed(3)))
    assert trainer.optimizer_steps == 3 and trainer.step == 1
    assert metrics["ratio_max"] > 1.0 or metrics["ratio_min"] < 1.0  # later iterations are off-policy
    # 4 steps x 3 iterations = 12 optimizer steps planned: 2 of warm-up, then linear decay to 0
    assert trainer.scheduler.get_last_lr()[0] == pytest.approx(1e-2 * (12 - 3) / (12 - 2))


def test_non_finite_step_is_skipped(tiny):
    model, _ = tiny
    trainer = LoRAGRPO(copy.deepcopy(model), config())
    trajs = fake_trajectories(trainer, generator=torch.Generator().manual_seed(4))
    trajs[0].logprobs = [float("nan")] * len(trajs[0].logprobs)  # a broken sampler
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    with pytest.warns(UserWarning, match="non-finite"):
        metrics = trainer.train_step(trajs)
    assert metrics["skipped_steps"] == 1 and trainer.optimizer_steps == 0
    assert all(torch.equal(p, before[n]) for n, p in trainer.model.named_parameters() if p.requires_grad)


def test_zero_spread_groups_are_skipped_when_the_config_says_so(tiny):
    """LoRAGRPO(model, config) reads skip_zero_spread from the config (it once needed a separate argument)."""
    model, _ = tiny
    rewards = [[1, 1, 1, 1], [0, 1, 0, 0]]
    tokens = {}
    for skip in (False, True):
        trainer = LoRAGRPO(copy.deepcopy(model), config(skip_zero_spread=skip))
        trajs = fake_trajectories(trainer, generator=torch.Generator().manual_seed(5), rewards=rewards)
        tokens[skip] = trainer.train_step(trajs)["tokens"]
        assert trainer.optimizer_steps == 1
    kept = sum(t.num_generated for t in trajs if t.task_id == "task-1")  # the group with a spread
    assert len(batch_of(trajs, skip_zero_spread=True)) == 4  # the all-ones group is dropped before any forward
    assert tokens[True] == kept and tokens[False] == sum(t.num_generated for t in trajs)


def test_mask_truncated_completions_trains_on_no_token_of_a_cut_episode(tiny):
    model, _ = tiny
    trainer = LoRAGRPO(copy.deepcopy(model), config())
    trajs = fake_trajectories(trainer, generator=torch.Generator().manual_seed(8), rewards=[[0, 1, 0, 1], [1, 0, 0, 0]])
    trajs[0].stop_reason, trajs[5].stop_reason = "max_tokens", "timeout"
    plain, masked = batch_of(trajs), batch_of(trajs, mask_truncated=True)
    assert masked.mask[0].sum() == 0 and masked.mask[5].sum() == 0
    assert torch.equal(masked.mask[1:5], plain.mask[1:5]) and plain.mask[0].sum() > 0
    torch.testing.assert_close(masked.advantages, plain.advantages)  # the cut episode still counts in its group's baseline


def test_gradient_checkpointing_same_update(tiny):
    model, _ = tiny
    weights = []
    for checkpointing in (False, True):
        torch.manual_seed(0)  # the same LoRA initialisation for both
        trainer = LoRAGRPO(copy.deepcopy(model), config(gradient_checkpointing=checkpointing))
        base = trainer.model.get_base_model()  # transformers >= 5.20 renamed the flag (the old name warns)
        assert getattr(base, "is_activation_checkpointing" if hasattr(type(base), "is_activation_checkpointing") else "is_gradient_checkpointing") == checkpointing
        trainer.train_step(fake_trajectories(trainer, generator=torch.Generator().manual_seed(6)))
        weights.append([p.detach().clone() for p in trainer.params])
    for a, b in zip(*weights):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_bad_config(tiny):
    model, _ = tiny
    with pytest.raises(ValueError, match="loss_type"):
        LoRAGRPO(copy.deepcopy(model), config(loss_type="ppo"))
    with pytest.raises(ValueError, match="use_lora"):
        LoRAGRPO(copy.deepcopy(model), config(use_lora=False))
    trainer = LoRAGRPO(copy.deepcopy(model), config())
    trajs = fake_trajectories(trainer, generator=torch.Generator().manual_seed(7))
    with pytest.raises(ValueError, match="same number of samples"):
        trainer.train_step(trajs[:-1])
