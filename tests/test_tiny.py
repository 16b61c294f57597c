"""The tiny world: shipped checkpoint, tokenizer round trip, chat template, tasks."""

import json
import time

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers.envs import make_env
from helpers.formats import format_tool_call
from helpers.paths import TINY_DIR
from helpers.worlds.arithmetic.tasks import (
    SPLITS,
    demonstration,
    make_tiny_tasks,
    split_of,
)
from helpers.worlds.tinymodel import SPECIAL_TOKENS, load_tiny, train_tokenizer

TOOLS = make_env("calculator").tools


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TINY_DIR)


def test_loads_offline_fast():
    """Under 2 s once the libraries are imported (importing torch and transformers is not loading)."""
    from transformers import Qwen2ForCausalLM, Qwen2Tokenizer  # noqa: F401  (the imports load_tiny triggers)

    start = time.perf_counter()
    model, tokenizer = load_tiny()
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0, f"loading data/tiny took {elapsed:.2f} s"
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert 0.4e6 < sum(p.numel() for p in model.parameters()) < 3e6
    assert model.config.vocab_size == len(tokenizer) < 1000
    assert model.config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    size = sum(f.stat().st_size for f in TINY_DIR.iterdir())
    assert size < 8e6, f"data/tiny is {size / 1e6:.1f} MB"


def test_auto_classes_load_the_folder():
    model = AutoModelForCausalLM.from_pretrained(TINY_DIR)
    assert model.config.model_type == "qwen2"


def test_tokenizer_round_trip(tokenizer):
    task = make_tiny_tasks(1, seed=3, split="test")[0]
    text = tokenizer.apply_chat_template(demonstration(task, use_tool=True), tools=TOOLS, tokenize=False)
    ids = tokenizer(text)["input_ids"]
    assert len(ids) > 30  # not the silent empty-ids failure
    assert tokenizer.decode(ids) == text
    for odd in ["héllo, 世界! 12,345.5 ÷ 0", "  two  spaces\n\nand tabs\t"]:
        assert tokenizer.decode(tokenizer(odd)["input_ids"]) == odd


def test_save_load_keeps_ids(tmp_path):
    """A tokenizer trained here and saved encodes the same after AutoTokenizer loads it back
    (transformers 5 rebuilds a qwen2 folder's tokenizer as Qwen2Tokenizer)."""
    tasks = make_tiny_tasks(50, seed=1, split="train")
    conversations = [demonstration(t, use_tool=i % 2 == 0) for i, t in enumerate(tasks)]
    trained = train_tokenizer(conversations, TOOLS)
    trained.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = trained.apply_chat_template(conversations[0], tools=TOOLS, tokenize=False)
    assert loaded(text)["input_ids"] == trained(text)["input_ids"]
    assert loaded.apply_chat_template(conversations[0], tools=TOOLS, tokenize=False) == text


def test_special_tokens_and_digits_are_single_tokens(tokenizer):
    for token in SPECIAL_TOKENS:
        ids = tokenizer(token)["input_ids"]
        assert len(ids) == 1 and tokenizer.convert_ids_to_tokens(ids[0]) == token
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.eos_token == "<|im_end|>"
    digits = tokenizer("4042 7")["input_ids"]
    assert [tokenizer.decode([i]) for i in digits] == ["4", "0", "4", "2", " ", "7"]


def test_chat_template_renders_qwen_tool_format(tokenizer):
    call = format_tool_call("calculator", {"expression": "47*86"})
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "What is 47 * 86?"},
        {"role": "assistant", "content": call},
        {"role": "tool", "content": "4042"},
        {"role": "tool", "content": "7"},
        {"role": "assistant", "content": "<answer>4042</answer>"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nS\nTools: calculator(expression)<|im_end|>\n"
        "<|im_start|>user\nWhat is 47 * 86?<|im_end|>\n"
        f"<|im_start|>assistant\n{call}<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n4042\n</tool_response>\n<tool_response>\n7\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<answer>4042</answer><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_tools = tokenizer.apply_chat_template(messages[:2], tokenize=False)
    assert no_tools == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nWhat is 47 * 86?<|im_end|>\n"


def test_splits_are_disjoint_and_deterministic():
    by_split = {split: make_tiny_tasks(300, seed=0, split=split) for split in SPLITS}
    expressions = {split: {t.metadata["expression"] for t in tasks} for split, tasks in by_split.items()}
    assert all(len(e) == 300 for e in expressions.values())  # distinct within a split
    assert not expressions["train"] & expressions["validation"]
    assert not expressions["train"] & expressions["test"]
    assert not expressions["validation"] & expressions["test"]
    # other seeds draw other problems, but a problem never changes split
    other = make_tiny_tasks(300, seed=1, split="train")
    assert {t.metadata["expression"] for t in other} != expressions["train"]
    assert all(split_of(t.metadata["expression"]) == "train" for t in other)
    again = make_tiny_tasks(300, seed=0, split="test")
    assert [(t.id, t.prompt, t.answer) for t in again] == [(t.id, t.prompt, t.answer) for t in by_split["test"]]


def test_task_answers_are_the_calculator_results():
    from helpers.calculator import calculate

    for task in make_tiny_tasks(30, seed=2, split="validation"):
        assert calculate(task.metadata["expression"]) == task.answer
        assert task.prompt[-1]["content"].replace(" ", "") == f"Whatis{task.metadata['expression']}?"
    with pytest.raises(ValueError, match="unknown split"):
        make_tiny_tasks(1, split="dev")


def test_shipped_baseline_is_in_range():
    """The build wrote its measured baseline; RL needs room to teach tool use, and a reliable tool path."""
    result = json.loads((TINY_DIR / "baseline.json").read_text())
    assert 0.2 <= result["success"] <= 0.6
    assert 0.2 <= result["tool_use"] <= 0.7
    assert result["success_with_tool"] >= 0.7  # sampled at T=1; greedy copies better (see baseline.json)
    assert result["success_without_tool"] < 0.2


def test_build_is_deterministic(tmp_path):
    """A (very short) build twice from the same seed: the same weights, tokenizer and baseline."""
    from helpers.worlds.arithmetic.build import build

    small = dict(steps=4, train_tasks=48, eval_tasks=8, progress=False)
    first, second = build(tmp_path / "a", **small), build(tmp_path / "b", **small)
    for name in ["model.safetensors", "tokenizer.json", "baseline.json"]:
        assert (tmp_path / "a" / name).exists()
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()
    timings = {"build_wall_s", "build_cpu_s"}
    assert {k: v for k, v in first.items() if k not in timings} == {k: v for k, v in second.items() if k not in timings}


def test_tags_are_single_tokens_that_decoding_keeps():
    """<answer> and <tool_call> are one token each, but not special ones (as in Qwen2.5): TRL decodes
    completions with skip_special_tokens=True, and a reward reading the tags must still see them."""
    from helpers.worlds.tinymodel import TAGS, load_tokenizer

    tokenizer = load_tokenizer()
    text = "<tool_call>\n{}\n</tool_call><answer>42</answer>"
    ids = tokenizer(text)["input_ids"]
    assert [tokenizer.convert_tokens_to_ids(tag) for tag in TAGS] == list(range(3, 9))
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer.decode([tokenizer.eos_token_id], skip_special_tokens=True) == ""  # <|im_end|> stays special
