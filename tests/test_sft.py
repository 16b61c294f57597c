"""SFT: the loss mask trains on assistant tokens only, and a few steps lower the loss."""

import pytest
import torch

from helpers.envs import make_env
from helpers.formats import format_tool_call
from helpers.policy import quiet_peft
from helpers.sft import (
    IGNORE,
    collate,
    encode_conversation,
    encode_conversations,
    sft_loss,
    train_sft,
)
from helpers.worlds.arithmetic.tasks import demonstration, make_tiny_tasks
from helpers.worlds.tinymodel import load_tokenizer, new_model

TOOLS = make_env("calculator").tools


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def tool_conversation(result: str, answer: str | None = None) -> list[dict]:
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "What is 47 * 86?"},
        {"role": "assistant", "content": format_tool_call("calculator", {"expression": "47*86"})},
        {"role": "tool", "content": result},
    ]
    return messages + ([{"role": "assistant", "content": f"<answer>{answer}</answer>"}] if answer else [])


def test_labels_are_exactly_the_assistant_turns(tokenizer):
    messages = tool_conversation("4042", answer="4042")
    example = encode_conversation(tokenizer, messages, TOOLS)
    trained = [t for t in example["labels"] if t != IGNORE]
    expected = "".join(m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant")
    assert tokenizer.decode(trained) == expected
    with pytest.raises(ValueError, match="no assistant tokens"):
        encode_conversation(tokenizer, messages[:2], TOOLS)


def test_tool_result_tokens_do_not_change_the_loss(tokenizer):
    """The conversation ends with the tool result, so a changed result token can only
    matter as a *target*: the loss must not move. Changing an assistant token must."""
    torch.manual_seed(0)
    model = new_model(tokenizer, seed=0).eval()

    def loss(messages):
        batch = collate([encode_conversation(tokenizer, messages, TOOLS)], tokenizer.pad_token_id)
        with torch.no_grad():
            return sft_loss(model, batch).item()

    base = loss(tool_conversation("4042"))
    assert loss(tool_conversation("9999")) == pytest.approx(base, abs=1e-6)
    changed_call = tool_conversation("4042")
    changed_call[2] = {"role": "assistant", "content": format_tool_call("calculator", {"expression": "99*99"})}
    assert abs(loss(changed_call) - base) > 1e-3


def test_padding_does_not_change_the_loss(tokenizer):
    model = new_model(tokenizer, seed=0).eval()
    short = encode_conversation(tokenizer, tool_conversation("4042", "4042")[:2] + [{"role": "assistant", "content": "<answer>1</answer>"}], TOOLS)
    long = encode_conversation(tokenizer, tool_conversation("4042", "4042"), TOOLS)
    with torch.no_grad():
        alone = sft_loss(model, collate([short], tokenizer.pad_token_id)).item()
        padded = collate([short, long], tokenizer.pad_token_id)
        padded = {k: v[:1] for k, v in padded.items()}  # the short row, right-padded to the long one's width
        assert sft_loss(model, padded).item() == pytest.approx(alone, abs=1e-5)


def test_few_steps_lower_the_loss(tokenizer):
    torch.manual_seed(0)
    tasks = make_tiny_tasks(64, seed=0, split="train")
    examples = encode_conversations(tokenizer, [demonstration(t, use_tool=i % 2 == 0) for i, t in enumerate(tasks)], TOOLS)
    model = new_model(tokenizer, seed=0)
    losses = train_sft(model, examples, steps=20, batch_size=4, grad_accum=2, lr=3e-3, warmup_steps=5, progress=False)
    assert len(losses) == 20
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5


def test_lora_trains_only_the_adapter(tokenizer):
    from peft import LoraConfig, get_peft_model

    tasks = make_tiny_tasks(8, seed=0, split="train")
    examples = encode_conversations(tokenizer, [demonstration(t, use_tool=True) for t in tasks], TOOLS)
    with quiet_peft():
        model = get_peft_model(new_model(tokenizer, seed=0), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train_sft(model, examples, steps=3, batch_size=4, lr=1e-2, warmup_steps=1, progress=False)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
