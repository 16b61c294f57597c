"""Supervised fine-tuning (训练模块: SFT), the warm start before RL.

SFT teaches a model to imitate whole conversations, but only the *assistant's*
tokens are targets: the prompt and the tool results are written by someone else
(the user, the environment), so the model must read them, never learn to write them.

    examples = encode_conversations(tokenizer, conversations, tools=env.tools)
    losses = train_sft(model, examples, steps=300, batch_size=32, lr=3e-3)

The mask comes from the chat template itself: the template wraps what the assistant
writes (its content and the closing ``<|im_end|>``) in ``{% generation %}`` markers, and
``apply_chat_template(return_assistant_tokens_mask=True)`` returns 1 for exactly those
tokens. The loss is cross-entropy on the next token, averaged over the masked tokens.

Why a short loop and not TRL's ``SFTTrainer``: ``SFTTrainer(assistant_only_loss=True)``
reads the same ``{% generation %}`` mask, so it would train the same thing, but it
brings ``TrainingArguments``, a ``datasets.Dataset`` conversion and accelerate's
set-up, which cost start-up time and hide the four lines that
matter (forward, masked loss, backward, step). The loop below is those lines.

Simplifications, named:

* Each micro-batch's loss is the mean over *its* masked tokens, and the
  ``grad_accum`` micro-batch losses are averaged; micro-batches with more target
  tokens are not weighted more (TRL weights by token count).
* Batches are drawn with replacement from a seeded generator (no epochs).
* Learning rate: linear warm-up, constant, then a linear decay to 0 over the last
  ``decay_fraction`` of the steps (warmup-stable-decay); AdamW; gradient clipping at 1.0.
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

IGNORE = -100  # label value the loss skips (PyTorch's and transformers' convention)


def encode_conversation(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> dict:
    """Token ids of one conversation and its labels: the ids where the assistant
    wrote them, ``IGNORE`` (-100) everywhere else (prompt, tool results, turn headers)."""
    out = tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
    if not any(mask):
        raise ValueError("conversation has no assistant tokens to train on (does the chat template mark {% generation %}?)")
    labels = [t if m else IGNORE for t, m in zip(ids, mask)]
    return {"input_ids": ids, "labels": labels}


def encode_conversations(tokenizer, conversations: list[list[dict]], tools: list[dict] | None = None) -> list[dict]:
    return [encode_conversation(tokenizer, messages, tools) for messages in conversations]


def collate(examples: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a list of encoded examples into tensors (B, T); pads are ignored by the loss."""
    width = max(len(e["input_ids"]) for e in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)  # (B, T)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)  # (B, T)
    for i, e in enumerate(examples):
        n = len(e["input_ids"])
        input_ids[i, :n] = torch.tensor(e["input_ids"])
        labels[i, :n] = torch.tensor(e["labels"])
        attention_mask[i, :n] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}


def sft_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy over the tokens whose label is not IGNORE."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # (B, T, V)
    targets = batch["labels"][:, 1:]  # (B, T-1): token t+1 is predicted at position t
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE
    )


def lr_factor(step: int, steps: int, warmup_steps: int, decay_fraction: float) -> float:
    """Multiplier of the peak learning rate at ``step``: warm up, hold, decay linearly to 0."""
    decay_start = steps * (1 - decay_fraction)
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if step >= decay_start:
        return max(0.0, (steps - step) / max(1.0, steps - decay_start))
    return 1.0


def train_sft(
    model,
    examples: list[dict],
    steps: int,
    batch_size: int = 32,
    grad_accum: int = 1,
    lr: float = 1e-3,
    warmup_steps: int = 20,
    decay_fraction: float = 0.3,
    weight_decay: float = 0.0,
    seed: int = 0,
    pad_id: int = 0,
    progress: bool = True,
) -> list[float]:
    """Train ``model`` in place on ``examples`` (from ``encode_conversations``); return the loss per step.

    Every trainable parameter is updated: pass a peft model (``get_peft_model``) to
    train a LoRA adapter only. One step = ``grad_accum`` micro-batches of ``batch_size``.

    Taught in notebooks/05_trainer.ipynb §1.
    """
    if not examples:
        raise ValueError("no examples to train on")
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, steps, warmup_steps, decay_fraction))
    generator = torch.Generator().manual_seed(seed)
    model.train()
    losses = []
    bar = tqdm(range(steps), desc="SFT", disable=not progress)
    for _ in bar:
        total = 0.0
        for _ in range(grad_accum):
            rows = torch.randint(len(examples), (batch_size,), generator=generator).tolist()
            batch = {k: v.to(device) for k, v in collate([examples[i] for i in rows], pad_id).items()}
            loss = sft_loss(model, batch) / grad_accum
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total)
        bar.set_postfix(loss=f"{total:.3f}")
    model.eval()
    return losses
