"""The tiny world (小世界): arithmetic tasks, a small tokenizer and a tiny Qwen2 (``MODEL_SHAPE``).

Everything here runs on a laptop CPU and needs no model hub:

    model, tokenizer = load_tiny()                    # data/tiny/, offline, < 2 s
    tasks = make_tiny_tasks(64, seed=0, split="test")  # "What is 47*86?" ...

    python -m helpers.tiny build                      # rebuild data/tiny/ from the seed

The tokenizer is a byte-level BPE trained on tiny-world text, with the chat and
tool-call format of Qwen2.5-Instruct, so the same env, rollout and reward code
serves this model and Qwen:

    <|im_start|>system\\n{system}\\nTools: calculator(expression)<|im_end|>\\n
    <|im_start|>user\\nWhat is 47*86?<|im_end|>\\n
    <|im_start|>assistant\\n<tool_call>\\n{"name": "calculator", "arguments": {"expression": "47*86"}}\\n</tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n4042\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n<answer>4042</answer><|im_end|>\\n

Simplifications, named:

* Tools are listed as ONE short line (``Tools: calculator(expression)``: each
  tool's name and argument names) instead of Qwen's long JSON tool preamble, which
  would make every CPU prompt several hundred tokens long.
* No default system prompt is inserted when the messages have none (Qwen inserts
  "You are Qwen, ...").
* Assistant tool calls are plain text in ``content`` (the format of
  ``helpers.formats.format_tool_call``); the OpenAI-style ``tool_calls`` field is not rendered.
* The tokenizer uses Qwen2's own text pipeline (see ``train_tokenizer``): every
  digit is its own token, so the model copies numbers digit by digit.
* The question writes the expression exactly as the calculator takes it
  (``47*86``), so a tool call is a token-for-token copy.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from helpers.data import Task, register_dataset
from helpers.paths import TINY_DIR

# --- tokenizer -----------------------------------------------------------------------------

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<answer>", "</answer>"]  # one token each
SPECIAL_TOKENS = [
    PAD,  # id 0: padding (as Qwen's <|endoftext|>)
    IM_START,
    IM_END,  # end of turn = eos
    *TAGS,  # ids 3-8; single tokens for the BPE trainer, but not special for the tokenizer (see train_tokenizer)
]
VOCAB_SIZE = 512  # at most: 9 special tokens + 256 bytes + merges (training stops near 440); Qwen has 151,646

# Qwen2.5's roles and tool format; {% generation %} marks the tokens the model writes
# (assistant content + <|im_end|>), so apply_chat_template(return_assistant_tokens_mask=True)
# gives the SFT loss mask directly.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{%- set ns = namespace(line='Tools:') %}"
    "{%- for tool in tools %}"
    "{%- set fn = tool.function if tool.function is defined else tool %}"
    "{%- set ns.line = ns.line + (' ' if loop.first else ', ') + fn.name + '(' + (fn.parameters.properties | list | join(', ')) + ')' %}"
    "{%- endfor %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n' }}{%- endif %}"
    "{{- ns.line + '<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}{{- message.content + '<|im_end|>' }}{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(conversations: list[list[dict]], tools: list[dict] | None, vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE fitted to ``conversations`` rendered with CHAT_TEMPLATE, as a
    transformers ``Qwen2Tokenizer`` carrying the template.

    Why Qwen2Tokenizer: transformers 5 loads the tokenizer of any folder whose
    config says ``model_type: qwen2`` as Qwen2Tokenizer, which rebuilds the text
    pipeline (NFC, Qwen's split regex, byte level) around the saved vocabulary and
    merges, ignoring the pipeline in tokenizer.json. A tokenizer trained with a
    different pipeline would then encode differently after loading. So we train
    with Qwen's exact pipeline: the regex puts each digit in its own piece (the
    model copies numbers digit by digit) and keeps merges inside words.
    Byte level means any text encodes (no unknown token).
    """
    from tokenizers import AddedToken, Tokenizer, models, trainers
    from transformers import Qwen2Tokenizer
    from transformers.utils.chat_template_utils import render_jinja_template

    texts, _ = render_jinja_template(conversations, tools=tools, chat_template=CHAT_TEMPLATE)
    pipeline = Qwen2Tokenizer()._tokenizer  # an empty Qwen2 tokenizer: we borrow its normalizer and pre-tokenizer
    bpe = Tokenizer(models.BPE())
    bpe.normalizer, bpe.pre_tokenizer = pipeline.normalizer, pipeline.pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=_byte_alphabet(), show_progress=False
    )
    bpe.train_from_iterator(texts, trainer)
    trained = json.loads(bpe.to_str())["model"]
    tokenizer = Qwen2Tokenizer(
        vocab=trained["vocab"],
        merges=[tuple(m) for m in trained["merges"]],
        eos_token=IM_END,
        pad_token=PAD,
        extra_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )
    # The tags are single tokens but not *special* ones, as in Qwen2.5: decode(skip_special_tokens=True)
    # (what TRL does to completions) must keep "<answer>42</answer>", or every reward that reads them is 0.
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TAGS])
    return tokenizer


def _byte_alphabet() -> list[str]:
    """The 256 byte-level symbols, so every byte has a token before any merge."""
    from tokenizers import pre_tokenizers

    return pre_tokenizers.ByteLevel.alphabet()


# --- tasks ---------------------------------------------------------------------------------

TINY_SYSTEM = "A calculator tool is available. Answer as <answer>N</answer>."
SPLITS = {"train": 0.8, "validation": 0.1, "test": 0.1}  # share of all problems in each split

# One kind of problem, a two-digit by two-digit product with a four-digit answer (32..99
# squared is 1024..9801): too hard for the tiny model to compute in its head, but only
# copying for the calculator. Every question has the same length in tokens, so the
# digits to copy always sit at the same distance back: the easiest copy a small
# transformer can learn (a fixed-offset attention head), which keeps the SFT short.
# The question writes the expression exactly as the calculator takes it ("47*86").
LOW, HIGH = 32, 99


def split_of(expression: str) -> str:
    """The split a problem belongs to, from a hash of its text: the same problem is
    always in the same split, whatever the seed or the number of tasks asked for."""
    u = int(hashlib.sha256(expression.encode()).hexdigest()[:8], 16) / 16**8  # uniform in [0, 1)
    edge = 0.0
    for name, share in SPLITS.items():
        edge += share
        if u < edge:
            return name
    return name


def make_tiny_tasks(n: int, seed: int = 0, split: str = "train") -> list[Task]:
    """``n`` distinct arithmetic tasks of one split, drawn from ``seed``.

    Each task's prompt is [system, user]; ``answer`` is the exact integer as text;
    ``metadata`` holds the ``expression`` a calculator needs ("47*86").
    A split holds about ``SPLITS[split] * 68**2`` distinct problems (~460 for validation).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {list(SPLITS)}")
    if n > 0.9 * SPLITS[split] * (HIGH - LOW + 1) ** 2:
        raise ValueError(f"asked for {n} {split} tasks; the split has only about {SPLITS[split] * (HIGH - LOW + 1) ** 2:.0f}")
    rng = random.Random(f"tiny-{seed}-{split}")
    tasks, seen = [], set()
    while len(tasks) < n:
        a, b = rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)
        expression = f"{a}*{b}"
        if expression in seen or split_of(expression) != split:
            continue
        seen.add(expression)
        prompt = [{"role": "system", "content": TINY_SYSTEM}, {"role": "user", "content": f"What is {expression}?"}]
        tasks.append(Task(f"tiny-{split}-{expression}", prompt, str(a * b), {"expression": expression}))
    return tasks


@register_dataset("tiny")
def tiny_dataset(split: str, n: int | None, seed: int) -> list[Task]:
    """The dataset registry's view of the one-call world (``config.dataset = "tiny"``):
    ``n`` tasks of ``split`` (None: 2,000 for train, 64 otherwise)."""
    return make_tiny_tasks(n if n is not None else (2000 if split == "train" else 64), seed=seed, split=split)


def calculator_tools() -> list[dict]:
    """The calculator's JSON schema, from the environment that runs it."""
    from helpers.envs.calculator import CalculatorEnv

    return CalculatorEnv.tools


def demonstration(task: Task, use_tool: bool) -> list[dict]:
    """A full conversation solving ``task``: with a calculator call, or answered directly.

    Direct answers are the true answer: the model is taught to try, and fails,
    because it cannot multiply two-digit numbers in its head.
    """
    from helpers.formats import format_tool_call

    final = {"role": "assistant", "content": f"<answer>{task.answer}</answer>"}
    if not use_tool:
        return task.prompt + [final]
    call = {"role": "assistant", "content": format_tool_call("calculator", {"expression": task.metadata["expression"]})}
    return task.prompt + [call, {"role": "tool", "content": task.answer}, final]


# --- model ---------------------------------------------------------------------------------

# 803,840 parameters with the shipped 371-token vocabulary (data/tiny/baseline.json counts them);
# the embedding is tied to the output layer.
MODEL_SHAPE = dict(
    hidden_size=128,
    intermediate_size=320,
    num_hidden_layers=4,  # the shipped checkpoint has 4 layers (a 3-layer rebuild copied digits far less reliably)
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=512,
)


def new_model(tokenizer, seed: int = 0):
    """A randomly initialised Qwen2ForCausalLM (the real class) sized for a CPU."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **MODEL_SHAPE,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def save_tiny(model, tokenizer, path: str | Path = TINY_DIR) -> None:
    """Save model and tokenizer so that the Auto* classes load them back unchanged."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def load_tokenizer(path: str | Path = TINY_DIR):
    """The tiny tokenizer, through ``AutoTokenizer`` as any user would load it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_resolve(path))


def load_tiny(path: str | Path = TINY_DIR):
    """``(model, tokenizer)`` from ``data/tiny/`` (relative paths resolve against the repo root)."""
    from transformers import AutoModelForCausalLM

    path = _resolve(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    model.eval()
    return model, load_tokenizer(path)


def _resolve(path: str | Path) -> Path:
    from helpers.paths import ROOT

    path = Path(path)
    return path if path.is_absolute() else ROOT / path


# --- build: tokenizer + SFT + baseline -----------------------------------------------------

BUILD = dict(  # the recipe of the shipped checkpoint; `python -m helpers.tiny build` runs exactly this
    seed=0,
    train_tasks=3000,  # distinct training problems (of ~3700), each demonstrated once
    tool_fraction=0.5,  # share of demonstrations that call the calculator; the rest answer "in the head"
    steps=900,  # SFT optimizer steps; copying the digits "clicks" around step 450-500
    batch_size=16,
    lr=3e-3,  # high for a transformer, fine for a model this small trained from scratch
    decay_fraction=0.3,  # linear decay over the last 30% of steps (train_sft's default when the shipped checkpoint was built)
    eval_tasks=400,  # held-out (validation) tasks for the baseline
)


def start_build(defaults: dict, overrides: dict) -> tuple[dict, float, float, int]:
    """What every tiny-world build starts with: its recipe (``defaults`` with ``overrides``; an
    unknown setting is an error), the wall and CPU clocks, and seeded torch threads (``recipe["threads"]``,
    1 if the recipe has none: the same float sums on every machine, so the same checkpoint from the seed).
    Returns (recipe, wall clock, CPU clock, the thread count to restore at the end)."""
    import time

    import torch

    unknown = set(overrides) - set(defaults)
    if unknown:
        raise ValueError(f"unknown build setting(s) {sorted(unknown)}; choose from {sorted(defaults)}")
    recipe = {**defaults, **overrides}
    started, cpu_started, threads = time.perf_counter(), time.process_time(), torch.get_num_threads()
    torch.set_num_threads(recipe.get("threads", 1))
    torch.manual_seed(recipe["seed"])
    return recipe, started, cpu_started, threads


def build(out: str | Path = TINY_DIR, progress: bool = True, **overrides) -> dict:
    """Rebuild the tiny model from the seed: tokenizer, SFT on a tool/no-tool mixture,
    save to ``out``, measure the baseline, write ``out/baseline.json``; return the baseline."""
    import time

    import torch

    from helpers.sft import encode_conversations, train_sft

    recipe, started, cpu_started, threads = start_build(BUILD, overrides)
    tools = calculator_tools()
    tasks = make_tiny_tasks(recipe["train_tasks"], recipe["seed"], "train")
    coin = random.Random(recipe["seed"])
    conversations = [demonstration(task, use_tool=coin.random() < recipe["tool_fraction"]) for task in tasks]
    tokenizer = train_tokenizer(conversations, tools)
    model = new_model(tokenizer, recipe["seed"])
    examples = encode_conversations(tokenizer, conversations, tools)
    losses = train_sft(
        model, examples, recipe["steps"], recipe["batch_size"], lr=recipe["lr"], seed=recipe["seed"],
        decay_fraction=recipe["decay_fraction"], pad_id=tokenizer.pad_token_id, progress=progress,
    )
    save_tiny(model, tokenizer, out)
    result = baseline(model, tokenizer, recipe["eval_tasks"], seed=recipe["seed"])
    result.update(
        greedy=baseline(model, tokenizer, recipe["eval_tasks"], seed=recipe["seed"], temperature=0.0),
        recipe=recipe,
        parameters=sum(p.numel() for p in model.parameters()),
        vocab_size=len(tokenizer),
        sft_loss_every_25_steps=[round(sum(losses[i : i + 25]) / len(losses[i : i + 25]), 3) for i in range(0, len(losses), 25)],
        build_wall_s=round(time.perf_counter() - started, 1),
        build_cpu_s=round(time.process_time() - cpu_started, 1),
    )
    torch.set_num_threads(threads)
    (Path(out) / "baseline.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def baseline(model, tokenizer, n: int = BUILD["eval_tasks"], seed: int = 0, split: str = "validation", temperature: float = 1.0) -> dict:
    """How the model does on ``n`` held-out tasks in CalculatorEnv, sampled at ``temperature``.

    Returns rates: ``success``, ``tool_use`` (episodes with a calculator call),
    ``success_with_tool`` and ``success_without_tool`` (success among each kind).
    One episode per task through ``helpers.rollout`` (the same loop RL uses).
    """
    from helpers.evaluate import task_record
    from helpers.policy.base import SamplingParams
    from helpers.policy.hf import HFPolicy
    from helpers.rollout import rollout

    tasks = make_tiny_tasks(n, seed, split)
    sampling = SamplingParams(max_new_tokens=48, temperature=temperature, seed=seed)
    episodes = rollout(tasks, "calculator", HFPolicy(model, tokenizer), group_size=1, sampling=sampling,
                       max_steps=4, max_total_tokens=256, progress=False)
    records = [task_record(e) for e in episodes]
    used = [r for r in records if r["tool_calls"] > 0]
    unused = [r for r in records if r["tool_calls"] == 0]

    def rate(rows):
        return round(sum(r["correct"] for r in rows) / len(rows), 4) if rows else None

    return dict(
        split=split, n=n, temperature=temperature,
        success=rate(records), tool_use=round(len(used) / n, 4),
        success_with_tool=rate(used), success_without_tool=rate(unused),
    )


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m helpers.tiny", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["build", "baseline"], help="build: rebuild data/tiny from the seed; baseline: measure it")
    parser.add_argument("--out", default=str(TINY_DIR), help="folder to write (build) or read (baseline)")
    parser.add_argument("--steps", type=int, default=BUILD["steps"], help="SFT steps (build)")
    args = parser.parse_args(argv)
    if args.command == "build":
        result = build(args.out, steps=args.steps)
    else:
        result = baseline(*load_tiny(args.out))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
