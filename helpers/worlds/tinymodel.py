"""The tiny-model toolkit: one chat template, a small tokenizer, a tiny Qwen2, and how each world builds on them.

Every tiny world (``helpers.worlds.arithmetic``, ``shop``, ``market``, ``trail``, ``selfplay``, ``games``)
ships a ~0.8M-parameter Qwen2-architecture model with its own small tokenizer in ``data/``; this module is
what they share, their builds' first and last steps included (``start_build``, ``sft_new_model``, ``finish_build``):

    model, tokenizer = load_tiny("data/tiny-agent")        # offline, through AutoModelForCausalLM / AutoTokenizer
    tokenizer = train_tokenizer(conversations, tools)      # a byte-level BPE fitted to a world's demonstrations
    model = new_model(tokenizer, seed=0)                   # a randomly initialised Qwen2ForCausalLM (MODEL_SHAPE)
    warm_start(model, tokenizer, "data/tiny")              # start from another tiny world's weights

The tokenizer carries the chat and tool-call format of Qwen2.5-Instruct, so the same env,
rollout and reward code serves the tiny models and Qwen:

    <|im_start|>system\\n{system}\\nTools: calculator(expression)<|im_end|>\\n
    <|im_start|>user\\nWhat is 47*86?<|im_end|>\\n
    <|im_start|>assistant\\n<tool_call>\\n{"name": "calculator", "arguments": {"expression": "47*86"}}\\n</tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n4042\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n<answer>4042</answer><|im_end|>\\n

Simplifications, named:

* Tools are listed as ONE short line (``Tools: calculator(expression)``: each
  tool's name and argument names, sorted by name from last to first, see CHAT_TEMPLATE) instead
  of Qwen's long JSON tool preamble, which would make every CPU prompt several hundred tokens long.
* No default system prompt is inserted when the messages have none (Qwen inserts
  "You are Qwen, ...").
* Assistant tool calls are written by the model as plain text in ``content`` (the format of
  ``helpers.formats.format_tool_call``); an OpenAI-style ``tool_calls`` field (what TRL's
  response parser produces) renders to the same text, so both forms give the same tokens.
* The tokenizer uses Qwen2's own text pipeline (see ``train_tokenizer``): every
  digit is its own token, so the model copies numbers digit by digit.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer
from transformers.utils.chat_template_utils import render_jinja_template

from helpers.paths import TINY_DIR, in_repo
from helpers.sft import encode_conversations, train_sft

# --- tokenizer -----------------------------------------------------------------------------

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<answer>", "</answer>"]  # one token each
SPECIAL_TOKENS = [
    PAD,  # id 0: padding (as Qwen's <|endoftext|>)
    IM_START,
    IM_END,  # end of turn = eos
    *TAGS,  # ids 3-8; single tokens for the BPE trainer, but not special for the tokenizer (see train_tokenizer)
]
VOCAB_SIZE = 512  # at most: 9 special tokens + 256 bytes + merges (the shipped ones stop at 371-442); Qwen has 151,646

# Qwen2.5's roles and tool format; {% generation %} marks the tokens the model writes
# (assistant content + <|im_end|>), so apply_chat_template(return_assistant_tokens_mask=True)
# gives the SFT loss mask directly. The tools line lists the tools in one fixed order, by name
# from last to first, whatever order the caller passes them in: TRL passes an environment's tools
# sorted by name (first to last), and the shop's warm start was trained on "usual, lookup,
# calculator", the order an episode uses them; so TRL's prompt and ours are the same text.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{%- set ns = namespace(line='Tools:', functions=[]) %}"
    "{%- for tool in tools %}{%- set ns.functions = ns.functions + [tool.function if tool.function is defined else tool] %}{%- endfor %}"
    "{%- for fn in ns.functions | sort(attribute='name', reverse=true) %}"
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
    "{%- generation %}{{- message.content }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- set call = call.function if call.function is defined else call %}"
    "{{- ('\\n' if message.content or not loop.first else '') + '<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' + (call.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>' }}{%- endgeneration %}"
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
    return pre_tokenizers.ByteLevel.alphabet()


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
    return AutoTokenizer.from_pretrained(in_repo(path))


def load_tiny(path: str | Path = TINY_DIR):
    """``(model, tokenizer)`` from ``data/tiny/`` (relative paths resolve against the repo root)."""
    path = in_repo(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    model.eval()
    return model, load_tokenizer(path)


# --- building a world's warm start ----------------------------------------------------


@dataclass(frozen=True)
class BuildClock:
    """When a build started (wall and CPU clocks), and the torch thread count to give back at its end."""

    wall: float
    cpu: float
    threads: int


def start_build(defaults: dict, overrides: dict) -> tuple[dict, BuildClock]:
    """What every tiny-world build starts with: its recipe (``defaults`` with ``overrides``; an
    unknown setting is an error), the clocks, and seeded torch threads (``recipe["threads"]``,
    1 if the recipe has none: the same float sums on every machine, so the same checkpoint from the seed).
    Returns (recipe, clock); ``finish_build`` takes the clock back."""
    unknown = set(overrides) - set(defaults)
    if unknown:
        raise ValueError(f"unknown build setting(s) {sorted(unknown)}; choose from {sorted(defaults)}")
    recipe = {**defaults, **overrides}
    clock = BuildClock(time.perf_counter(), time.process_time(), torch.get_num_threads())
    torch.set_num_threads(recipe.get("threads", 1))
    torch.manual_seed(recipe["seed"])
    return recipe, clock


def sft_new_model(conversations: list[list[dict]], tools: list[dict] | None, recipe: dict, progress: bool = True):
    """A new tiny model taught ``conversations`` by SFT, as the from-scratch builds make one: a tokenizer
    fitted to them (at most ``recipe["vocab_size"]``), a new model from ``recipe["seed"]`` (started from the
    one-call world's weights when ``recipe["warm_start"]``, see ``warm_start``), then ``recipe["steps"]`` SFT
    steps (``helpers.sft.train_sft``). Returns (model, tokenizer, examples, losses per step)."""
    tokenizer = train_tokenizer(conversations, tools, vocab_size=recipe.get("vocab_size", VOCAB_SIZE))
    model = new_model(tokenizer, recipe["seed"])
    if recipe.get("warm_start"):
        warm_start(model, tokenizer)
    examples = encode_conversations(tokenizer, conversations, tools)
    losses = train_sft(
        model, examples, recipe["steps"], recipe["batch_size"], lr=recipe["lr"], seed=recipe["seed"],
        decay_fraction=recipe["decay_fraction"], pad_id=tokenizer.pad_token_id, progress=progress,
    )
    return model, tokenizer, examples, losses


def finish_build(out: str | Path, model, tokenizer, recipe: dict, losses: list[float], clock: BuildClock,
                 measured: dict, loss_every: int = 50) -> dict:
    """What every tiny-world build ends with: save ``model`` and ``tokenizer`` to ``out`` and write
    ``out/baseline.json``: ``measured`` (the world's own baseline), the recipe, the model's size, the SFT
    loss averaged over each ``loss_every`` steps, and the build's wall and CPU seconds. Gives torch its
    thread count back; returns the record."""
    save_tiny(model, tokenizer, out)
    result = {
        **measured,
        "recipe": recipe,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        f"sft_loss_every_{loss_every}_steps": [round(sum(losses[i : i + loss_every]) / len(losses[i : i + loss_every]), 3)
                                               for i in range(0, len(losses), loss_every)],
        "build_wall_s": round(time.perf_counter() - clock.wall, 1),
        "build_cpu_s": round(time.process_time() - clock.cpu, 1),
    }
    torch.set_num_threads(clock.threads)
    (Path(out) / "baseline.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def warm_start(model, tokenizer, source: str | Path = TINY_DIR) -> int:
    """Start ``model`` from the one-call world's weights (``data/tiny``): every layer, and the
    embedding of each token both vocabularies spell the same (digits, the chat and tool-call
    markup, "calculator"); the shop's own words keep their random start. Returns how many
    embedding rows were copied.

    Why: copying digits from far back in the context is the skill this world needs, and a
    small transformer trained from scratch sits on a long plateau before it learns it; the
    one-call model already copies digits (question -> calculator, tool result -> answer).
    A real agent is fine-tuned from a pretrained model for the same reason.
    """
    donor, donor_tokenizer = load_tiny(source)
    layers = {k: v for k, v in donor.state_dict().items() if "embed_tokens" not in k and "lm_head" not in k}
    missing, unexpected = model.load_state_dict(layers, strict=False)
    if unexpected or any("embed_tokens" not in k and "lm_head" not in k for k in missing):
        raise ValueError(f"{source} does not have this model's shape (missing {missing}, unexpected {unexpected})")
    donor_ids = donor_tokenizer.get_vocab()
    shared = [(i, donor_ids[token]) for token, i in tokenizer.get_vocab().items() if token in donor_ids]
    with torch.no_grad():
        for new, old in shared:
            model.get_input_embeddings().weight[new] = donor.get_input_embeddings().weight[old]
    return len(shared)
