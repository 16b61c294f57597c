"""Kill and resume: 3 steps, checkpoint, a fresh trainer, 3 more steps == 6 steps in one go.

Everything random in a step comes from the global RNGs the checkpoint restores: the
batches are drawn from torch's RNG after each step (standing in for rollouts sampled
by the policy), and LoRA dropout draws from it too. So the resumed run only matches if
adapter, AdamW moments, the warmup schedule, the RNG states and the caller's
``extra_state`` all come back.
"""

import copy
import random
from dataclasses import replace

import numpy as np
import pytest
import torch

from helpers.config import TrainConfig
from helpers.data import Task
from helpers.checkpoint import latest_checkpoint
from helpers.grpo import LoRAGRPO
from helpers.rollout import Trajectory
from helpers.worlds.tinymodel import load_tiny

pytestmark = pytest.mark.usefixtures("one_thread")


CONFIG = TrainConfig(lora_r=4, lora_alpha=8, lora_dropout=0.1, lr=5e-3, warmup_steps=2, steps=6, num_iterations=2,
                     num_generations=4, beta=0.04, temperature=1.0)


def batch_from_rng(trainer, position: int) -> list[Trajectory]:
    """A batch of episodes drawn from the global RNGs (torch, numpy, python), like a sampler would."""
    vocab = trainer.model.get_base_model().config.vocab_size
    out = []
    for b in range(2):
        task = Task(id=f"task-{position}-{b}", prompt=[])
        prompt = torch.randint(3, vocab, (5,)).tolist()
        for g in range(4):
            n = random.randint(3, 8)
            ids = prompt + torch.randint(3, vocab, (n,)).tolist()
            logprobs = [0.0] * 5 + (-np.random.rand(n) * 3 - 2).tolist()  # old log-probs: ratios far from 1
            mask = [0] * 5 + [1] * n
            mask[5 + n // 2] = logprobs[5 + n // 2] = 0  # a tool's token: two turns, for GiGPO's per-turn advantages
            messages = [{"role": "user", "content": f"tokens {prompt}"}, {"role": "assistant", "content": f"tokens {ids[5:5 + n // 2]}"},
                        {"role": "tool", "content": "result"}, {"role": "assistant", "content": f"tokens {ids[6 + n // 2:]}"}]
            out.append(Trajectory(task=task, group=g, token_ids=ids, mask=mask, logprobs=logprobs,
                                  prompt_len=5, reward=float(torch.rand(())), messages=messages))
    return out


def new_trainer(model, seed, advantage="grpo"):
    torch.manual_seed(seed)  # a different LoRA init each time: the checkpoint must overwrite it
    return LoRAGRPO(copy.deepcopy(model), replace(CONFIG, advantage=advantage))


def run(trainer, steps: int, position: int = 0) -> int:
    for _ in range(steps):
        trainer.train_step(batch_from_rng(trainer, position))
        position += 1
    return position


def seed_everything(seed):
    """Seed every RNG a training step may draw from (python, numpy, torch)."""
    torch.manual_seed(seed), np.random.seed(seed), random.seed(seed)


def adapter(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("advantage", ["grpo", "gigpo"])
def test_kill_and_resume_gives_the_same_weights(tmp_path, advantage):
    model, _ = load_tiny()
    seed_everything(123)
    straight = new_trainer(model, seed=0, advantage=advantage)
    seed_everything(123)
    run(straight, 6)

    seed_everything(123)
    first = new_trainer(model, seed=0, advantage=advantage)
    seed_everything(123)
    position = run(first, 3)
    first.save_checkpoint(tmp_path / "checkpoint-3", extra_state={"sampler_position": position})
    del first  # "killed"
    seed_everything(999)  # a new process would start elsewhere

    resumed = new_trainer(model, seed=1, advantage=advantage)
    extra = resumed.load_checkpoint(latest_checkpoint(tmp_path))
    assert extra == {"sampler_position": 3} and resumed.step == 3 and resumed.optimizer_steps == 6
    run(resumed, 3, extra["sampler_position"])

    a, b = adapter(straight), adapter(resumed)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=0)
    assert straight.scheduler.get_last_lr() == resumed.scheduler.get_last_lr()


def test_resume_without_rng_would_differ(tmp_path):
    """Guard on the test above: skipping the RNG restore changes the result, so the test can fail."""
    model, _ = load_tiny()
    seed_everything(123)
    straight = new_trainer(model, seed=0)
    seed_everything(123)
    run(straight, 4)

    seed_everything(123)
    first = new_trainer(model, seed=0)
    seed_everything(123)
    run(first, 3)
    first.save_checkpoint(tmp_path / "checkpoint-3")
    resumed = new_trainer(model, seed=1)
    resumed.load_checkpoint(tmp_path / "checkpoint-3")
    seed_everything(999)  # clobber the restored RNG
    run(resumed, 1, 3)
    diff = max((adapter(straight)[n] - p).abs().max().item() for n, p in adapter(resumed).items())
    assert diff > 1e-4


def test_incomplete_checkpoint_is_refused(tmp_path):
    model, _ = load_tiny()
    trainer = new_trainer(model, seed=0)
    (tmp_path / "checkpoint-5").mkdir()  # killed while writing: no trainer_state.pt
    assert latest_checkpoint(tmp_path) is None
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        trainer.load_checkpoint(tmp_path / "checkpoint-5")
