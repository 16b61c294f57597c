"""The multi-step tiny world (多步小世界): a shop whose prices only a tool knows.

Where the one-call world (``helpers.tiny``) asks the agent to copy a question into the
calculator, here it has to *plan*: look up two prices the prompt never shows, with the
``lookup`` tool, put them into the calculator, and answer with what the calculator
said. Prices are drawn per task (``task.metadata["prices"]``, read only by the env),
so they cannot be memorised; ``helpers.envs.shop.ShopEnv`` is the env. One episode,
in the tiny tokenizer's chat format (the Qwen2.5 tool format):

    <|im_start|>system\\nLook up prices, then use the calculator. Answer as <answer>N</answer>.\\nTools: lookup(item), calculator(expression)<|im_end|>\\n
    <|im_start|>user\\nWhat do 3 pens and 2 cups cost?<|im_end|>\\n
    <|im_start|>assistant\\n<tool_call>\\n{"name": "lookup", "arguments": {"item": "pen"}}\\n</tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n47\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n<tool_call>\\n{"name": "lookup", "arguments": {"item": "cup"}}\\n</tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n86\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n<tool_call>\\n{"name": "calculator", "arguments": {"expression": "3*47+2*86"}}\\n</tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n313\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n<answer>313</answer><|im_end|>\\n

Four turns, three tool calls, two tools; the calculator's argument depends on both
lookups' results, and the answer on the calculator's.

The warm start is a *weak* agent, for the reasons real agents are weak: its SFT
demonstrations come from a sloppy demonstrator who, most of the time for some items
(its habits, ``HABITS``), skips the second lookup and assumes that item costs what the
first did, stops after one call and answers with the one price it has, or asks the
calculator for an item's price; and now and then anywhere makes one of those slips or
copies a digit wrongly (``SLIP_RATE``, ``COPY_ERROR_RATE``). The SFT model imitates the
mixture, so greedy decoding follows the habit and fails on most tasks; the plan is for
sampling to find the right plan often enough for GRPO to learn from the outcome alone
(``rewards={"correct": 1.0}``, no bonus for tool calls).

Status (issue 14): the shipped checkpoint is weaker than that plan needs. It has the
habits, but it also has not learned to read the *second* item off the question (it
looks up a wrong one) and miscopies digits, so its held-out success is 0.00 greedy and
0.00 sampled (``baseline.json``): GRPO gets no successful episode to learn from.

    tasks = make_agent_tasks(64, seed=0, split="test")    # or load_dataset("tiny-agent", "test", 64)
    model, tokenizer = load_tiny("data/tiny-agent")

    python -m helpers.tiny_agent build                    # rebuild data/tiny-agent/ from the seed (~7 min CPU, 1 thread)
    python -m helpers.tiny_agent baseline                 # held-out success at T=1 (--temperature 0: greedy), failures by kind
    python -m helpers.train --preset tiny-agent --seed 0  # GRPO: the agent learns to plan

Simplifications, named:

* One question shape (two items, quantities 2-9, prices 10-99, a three-digit bill), so
  every canonical episode has the same length in tokens: the numbers to copy always
  sit at the same distance back, the easiest copy for a small transformer.
* The model starts from the one-call world's weights (``warm_start``), as a real agent
  starts from a pretrained model: trained from scratch, this ~0.8M-parameter model had
  not learned to copy a single digit after 1,500 SFT steps.
* The demonstrator's habits are keyed on the *first* item of the question (the one it
  has just looked up when it decides what to do next); a real agent's weaknesses have
  messier causes. (Keyed on the second item, the SFT model learned which items tend to
  be looked up second instead of reading the second item off the question.)
* The shop sells the same twelve items in every task (only the prices change), and
  items are looked up by their singular name.
* The tokenizer training, the chat template, the model's shape and the SFT loop are the
  one-call world's (``helpers.tiny``, ``helpers.sft``); only the tasks (and so the
  vocabulary) differ.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path

from helpers.data import Task, register_dataset
from helpers.envs.shop import ShopEnv
from helpers.formats import format_tool_call, parse_tool_calls
from helpers.paths import ROOT, TINY_DIR
from helpers.tiny import SPLITS, load_tiny, new_model, save_tiny, split_of, start_build, train_tokenizer

AGENT_DIR = ROOT / "data" / "tiny-agent"

# --- tasks ---------------------------------------------------------------------------------

SYSTEM = "Look up prices, then use the calculator. Answer as <answer>N</answer>."
ITEMS = ("bag", "ball", "book", "cake", "card", "cup", "hat", "key", "lamp", "mug", "pen", "sock")  # plural: + "s"
QUANTITIES = range(2, 10)  # one digit
PRICES = range(10, 100)  # two digits
BILLS = range(100, 1000)  # three digits (prices are redrawn until the bill fits): too much for a 1M model's "head"
EPISODE = dict(max_steps=5, max_new_tokens=40, max_total_tokens=320)  # the canonical episode: 4 turns, ~150 tokens


def question(order: list[tuple[str, int]]) -> str:
    """ "What do 3 pens and 2 cups cost?" for order [("pen", 3), ("cup", 2)]."""
    return "What do " + " and ".join(f"{quantity} {item}s" for item, quantity in order) + " cost?"


def make_agent_tasks(n: int, seed: int = 0, split: str = "train") -> list[Task]:
    """``n`` shop tasks of one split, drawn from ``seed``.

    The split is a hash of the question (``helpers.tiny.split_of``): a question the model
    is tested on is never one it trained on, whatever the seed. Each task draws a fresh
    price for every item, so a question may come again with other prices (a split holds
    about ``SPLITS[split] * 8448`` two-item questions, ~845 for test). ``metadata`` holds
    ``order`` (the (item, quantity) pairs), ``prices`` (all twelve, read only by the env)
    and the ``expression`` that solves it.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {list(SPLITS)}")
    rng = random.Random(f"tiny-agent-{seed}-{split}")
    tasks = []
    while len(tasks) < n:
        order = [(item, rng.choice(QUANTITIES)) for item in rng.sample(ITEMS, 2)]
        text = question(order)
        if split_of(text) != split:
            continue
        prices = {item: rng.choice(PRICES) for item in ITEMS}
        while (bill := sum(quantity * prices[item] for item, quantity in order)) not in BILLS:
            for item, _ in order:
                prices[item] = rng.choice(PRICES)
        expression = "+".join(f"{quantity}*{prices[item]}" for item, quantity in order)
        prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
        metadata = {"order": [list(pair) for pair in order], "prices": prices, "expression": expression}
        tasks.append(Task(f"tiny-agent-{split}-{seed}-{len(tasks):05d}", prompt, str(bill), metadata))
    return tasks


@register_dataset("tiny-agent")
def tiny_agent_dataset(split: str, n: int | None, seed: int) -> list[Task]:
    """The dataset registry's view of this world (``config.dataset = "tiny-agent"``):
    ``n`` tasks of ``split`` (None: 4,000 for train, 64 otherwise)."""
    return make_agent_tasks(n if n is not None else (4000 if split == "train" else 64), seed=seed, split=split)


# --- demonstrations: a sloppy demonstrator ---------------------------------------------------

FLAWS = ("skipped_lookup", "stopped_early", "wrong_tool", "copy_error")  # also the failure kinds of failure_kind()
HABITS = {  # first item of the question -> the flaw the demonstrator then makes, HABIT_RATE of the time
    "cup": "skipped_lookup", "hat": "skipped_lookup", "ball": "skipped_lookup",  # assumes the other item costs the same
    "lamp": "stopped_early", "card": "stopped_early", "key": "stopped_early",  # forgets the other item
    "mug": "wrong_tool", "sock": "wrong_tool", "cake": "wrong_tool",  # asks the calculator for the other price
}  # bag, book, pen: no habit
HABIT_RATE = 0.7  # greedy decoding follows a habit that strong: the SFT agent fails on 3 tasks in 4
SLIP_RATE = 0.04  # each of the first three flaws, in any task (on top of the habit)
COPY_ERROR_RATE = 0.08  # one digit of the calculator expression miscopied, in any task


def demonstrator_flaw(task: Task, rng: random.Random) -> str | None:
    """The flaw the demonstrator makes on ``task`` this time, or None (a clean solution)."""
    habit = HABITS.get(task.metadata["order"][0][0])
    if habit is not None and rng.random() < HABIT_RATE:
        return habit
    u = rng.random()
    for flaw, rate in [("skipped_lookup", SLIP_RATE), ("stopped_early", SLIP_RATE), ("wrong_tool", SLIP_RATE), ("copy_error", COPY_ERROR_RATE)]:
        if u < rate:
            return flaw
        u -= rate
    return None


def demonstration(task: Task, flaw: str | None, rng: random.Random) -> list[dict]:
    """The conversation the demonstrator has with a real ``ShopEnv`` on ``task``.

    Every tool message is what the env answered, so the model learns to read real results
    and real error messages. flaw None is the clean plan (lookup, lookup, calculator, answer);
    a flawed one ends with a wrong answer, as it would for the demonstrator.
    """
    env = ShopEnv(max_steps=EPISODE["max_steps"])
    messages = env.reset(task)

    def act(text: str) -> str | None:
        """One assistant turn; the tool's reply, or None when the turn was the answer."""
        messages.append({"role": "assistant", "content": text})
        observation = env.step(text).observation
        messages.extend(observation)
        return observation[0]["content"] if observation else None

    order = task.metadata["order"]
    prices = [act(format_tool_call("lookup", {"item": order[0][0]}))]
    if flaw in ("stopped_early", "wrong_tool"):
        if flaw == "wrong_tool":
            act(format_tool_call("calculator", {"expression": order[1][0]}))  # -> "error: names are not allowed: 'cup'"
        act(f"<answer>{prices[0]}</answer>")  # gives up with the one price it has
        return messages
    for item, _ in order[1:]:  # "skipped_lookup" assumes the next item costs what the first did
        prices.append(prices[0] if flaw == "skipped_lookup" else act(format_tool_call("lookup", {"item": item})))
    expression = "+".join(f"{quantity}*{price}" for (_, quantity), price in zip(order, prices))
    if flaw == "copy_error":
        expression = miscopy(expression, rng)
    total = act(format_tool_call("calculator", {"expression": expression}))
    act(f"<answer>{total}</answer>")
    return messages


def miscopy(expression: str, rng: random.Random) -> str:
    """``expression`` with one digit replaced by another nonzero digit (never a leading zero)."""
    where = rng.choice([i for i, c in enumerate(expression) if c.isdigit()])
    digit = rng.choice([d for d in "123456789" if d != expression[where]])
    return expression[:where] + digit + expression[where + 1 :]


# --- what went wrong ---------------------------------------------------------------------------


def failure_kind(trajectory) -> str:
    """How one episode ended: ``correct``, ``truncated`` (a limit cut it short), or the first
    flaw that explains the wrong answer, checked in this order:

    wrong_tool      a tool call came back as an error (unknown tool or item, a name in the calculator)
    stopped_early   answered without calling the calculator
    skipped_lookup  the calculator ran without both prices having been looked up (one was guessed)
    copy_error      both looked up, computed, still wrong: a number was copied wrongly
    """
    from helpers.envs.base import TRUNCATED
    from helpers.rewards import outcome

    if outcome(trajectory).get("correct"):
        return "correct"
    if trajectory.stop_reason in TRUNCATED:
        return "truncated"
    messages = trajectory.messages
    if any(m["role"] == "tool" and m["content"].startswith("error:") for m in messages):
        return "wrong_tool"
    calls = [c for m in messages if m["role"] == "assistant" for c in parse_tool_calls(m["content"])]
    if not any(c.name == "calculator" for c in calls):
        return "stopped_early"
    looked_up = {str(c.arguments.get("item")) for c in calls if c.name == "lookup" and c.arguments}
    if not {item for item, _ in trajectory.task.metadata["order"]} <= looked_up:
        return "skipped_lookup"
    return "copy_error"


# --- build: tokenizer + SFT + baseline -----------------------------------------------------

BUILD = dict(  # the recipe of the shipped checkpoint; `python -m helpers.tiny_agent build` runs exactly this
    seed=0,
    train_tasks=4000,  # distinct training questions (of ~6,760), each demonstrated once
    vocab_size=512,  # at most; the shop's words and the JSON of a tool call each become one token
    warm_start=True,  # start from data/tiny's weights (see warm_start); from scratch, 1,500 steps never learned to copy
    steps=1500,  # SFT optimizer steps
    batch_size=16,
    lr=3e-3,  # as helpers.tiny: high for a transformer, fine for ~0.8M parameters trained from scratch
    decay_fraction=0.3,  # linear decay to 0 over the last 30% of steps
    eval_tasks=200,  # held-out (validation) tasks for the baseline, greedy and sampled
)


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
    import torch

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


def build(out: str | Path = AGENT_DIR, progress: bool = True, **overrides) -> dict:
    """Rebuild the tiny agent from the seed: tokenizer, SFT on the sloppy demonstrations,
    save to ``out``, measure the baseline, write ``out/baseline.json``; return the baseline."""
    import torch

    from helpers.sft import encode_conversations, train_sft

    recipe, started, cpu_started, threads = start_build(BUILD, overrides)
    tasks = make_agent_tasks(recipe["train_tasks"], recipe["seed"], "train")
    rng = random.Random(recipe["seed"])
    flaws = [demonstrator_flaw(task, rng) for task in tasks]
    conversations = [demonstration(task, flaw, rng) for task, flaw in zip(tasks, flaws)]
    tokenizer = train_tokenizer(conversations, ShopEnv.tools, vocab_size=recipe["vocab_size"])
    model = new_model(tokenizer, recipe["seed"])
    if recipe["warm_start"]:
        warm_start(model, tokenizer)
    examples = encode_conversations(tokenizer, conversations, ShopEnv.tools)
    losses = train_sft(
        model, examples, recipe["steps"], recipe["batch_size"], lr=recipe["lr"], seed=recipe["seed"],
        decay_fraction=recipe["decay_fraction"], pad_id=tokenizer.pad_token_id, progress=progress,
    )
    save_tiny(model, tokenizer, out)
    result = {
        "greedy": baseline(model, tokenizer, recipe["eval_tasks"], seed=recipe["seed"], temperature=0.0),
        "sampled": baseline(model, tokenizer, recipe["eval_tasks"], seed=recipe["seed"], temperature=1.0),
        "demonstrations": dict(Counter(flaw or "clean" for flaw in flaws).most_common()),
        "recipe": recipe,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "sft_loss_every_50_steps": [round(sum(losses[i : i + 50]) / len(losses[i : i + 50]), 3) for i in range(0, len(losses), 50)],
        "build_wall_s": round(time.perf_counter() - started, 1),
        "build_cpu_s": round(time.process_time() - cpu_started, 1),
    }
    torch.set_num_threads(threads)
    (Path(out) / "baseline.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def baseline(model, tokenizer, n: int = BUILD["eval_tasks"], seed: int = 0, split: str = "validation", temperature: float = 1.0) -> dict:
    """How the model does on ``n`` held-out tasks in ShopEnv, one episode each at ``temperature``
    (0 = greedy), through ``helpers.rollout`` (the loop RL uses).

    Returns ``success``, ``tool_calls_per_success`` (mean tool calls of the correct episodes)
    and ``failures``: episodes by ``failure_kind``.
    """
    from helpers.policy.base import SamplingParams
    from helpers.policy.hf import HFPolicy
    from helpers.rollout import rollout

    tasks = make_agent_tasks(n, seed, split)
    sampling = SamplingParams(max_new_tokens=EPISODE["max_new_tokens"], temperature=temperature, seed=seed)
    episodes = rollout(tasks, "shop", HFPolicy(model, tokenizer), group_size=1, sampling=sampling, progress=False,
                       max_steps=EPISODE["max_steps"], max_total_tokens=EPISODE["max_total_tokens"])
    kinds = Counter(failure_kind(e) for e in episodes)
    solved = [e.tool_calls for e in episodes if failure_kind(e) == "correct"]
    return dict(
        split=split, n=n, temperature=temperature, success=round(kinds["correct"] / n, 4),
        tool_calls_per_success=round(sum(solved) / len(solved), 2) if solved else None,
        failures=dict(kinds.most_common()),
    )


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m helpers.tiny_agent", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["build", "baseline"], help="build: rebuild data/tiny-agent from the seed; baseline: measure it")
    parser.add_argument("--out", default=str(AGENT_DIR), help="folder to write (build) or read (baseline)")
    parser.add_argument("--steps", type=int, default=BUILD["steps"], help="SFT steps (build)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (baseline); 0 = greedy")
    args = parser.parse_args(argv)
    if args.command == "build":
        result = build(args.out, steps=args.steps)
    else:
        result = baseline(*load_tiny(args.out), temperature=args.temperature)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
