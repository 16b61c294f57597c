"""The multi-step tiny world (多步小世界): a shop where every answer hides behind three tools.

Where the one-call world (``helpers.tiny``) asks the agent to copy a question into the
calculator, here it has to *plan* a chain of calls, each built from the one before: find
what the customer buys (``usual``), look that item's price up (``lookup``), multiply it
out (``calculator``), and answer with what the calculator said. What the customer buys and
what every item costs are drawn per task (``task.metadata``, read only by the env), so
nothing can be memorised; ``helpers.envs.shop.ShopEnv`` is the env. One episode, in the
tiny tokenizer's chat format (the Qwen2.5 tool format):

    <|im_start|>system\\nFind the customer's item, look up its price, then use the calculator. Answer as <answer>N</answer>.\\nTools: usual(), lookup(item), calculator(expression)<|im_end|>\\n
    <|im_start|>user\\nWhat do 3 of my usual items cost?<|im_end|>\\n
    <|im_start|>assistant\\n<tool_call>\\n{"name": "usual", "arguments": {}}\\n</tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n{"item": "pen"}\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n<tool_call>\\n{"name": "lookup", "arguments": {"item": "pen"}}\\n</tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n47\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n<tool_call>\\n{"name": "calculator", "arguments": {"expression": "3*47"}}\\n</tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n141\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n<answer>141</answer><|im_end|>\\n

Four turns, three tool calls, three tools; the second call's argument is the first call's
result, the third's is built from the second's and the question, and the answer is the third's.

The warm start is a *weak* agent, for the reasons real agents are weak: its SFT
demonstrations come from a sloppy demonstrator with habits (``HABITS``, keyed on the item
the customer buys): for 9 items in 12, most of the time, it guesses the price instead of
looking it up, stops at the unit price, or asks ``lookup`` (not the calculator) for the
bill and gives up; and now and then, for any item, it makes one of those slips
(``SLIP_RATE``). The SFT model imitates the mixture, so greedy decoding follows the habits
and fails on most tasks, and sampling finds the right plan often enough for GRPO to learn
from the outcome alone (``rewards={"correct": 1.0}``, no bonus for tool calls).

Measured (``baseline.json``, 200 validation tasks): the warm start succeeds 0.24 greedy and
0.285 sampled; its greedy failures are wrong tool 51, stopped early 50, skipped lookups 50, copy
error 1. The ``tiny-agent`` GRPO run (30 steps, 4-5 min alone on 2 cores) takes held-out greedy
success from 0.265 to 0.860 / 0.915 / 0.915 and sampled from 0.275-0.292 to 0.812 / 0.875 / 0.875
(seeds 0, 1, 2; README). What it does not fix: orders of one item, ``key`` (17 of the 200 held-out
tasks), which the warm start copies into ``lookup`` only 13% of the time; it writes ``cake``
instead. Where it copies the name, the warm start does not tell the two apart: after
``{"item": "key"}`` and after ``{"item": "cake"}`` it gives the same 0.86 to ``cake`` and 0.13 to
``key``. GRPO cannot pull them apart either: every push on the copy after one name moves the
copy after the other the same way (on ``key`` orders the rare right copy is rewarded, ``key`` up;
on ``cake`` orders the common right one, ``cake`` up). After 30 steps (seed 0) the policy looks
``key`` orders up with probability 0.99 (0.18 before), and after either name it now copies
``key`` with 0.22 and ``cake`` with 0.77: the two moved together, and greedy decoding still
writes ``cake`` for both.

Which copies the SFT run learns is fragile; rebuilds with one change each (measured, seed 0
unless named; "copied" is the teacher-forced probability of the right item in ``lookup``):
the guessing habit at 0.7 instead of 0.85 copies every item (>= 0.98) but miscopies the bill
into the answer (GRPO stalls at 0.72 greedy, 55 of 200 answers like 552 -> 572; with the shipped
preset, 12 tasks x 2 updates, still 0.72-0.725 at step 20 on seeds 0 and 1), and with the
decay over the last half, not 30%, it copies cake and hat at 0.50 (it mixes them up); at 0.75 the
warm start is too good (0.405 greedy) and copies key, lamp, mug and pen at 0.44-0.56; at 0.7
with seed 1 it copies 9 items in 12 at 0.07-0.52; the shop's words' embeddings started at the
donor's scale copy no item (<= 0.14); a demonstrator who looks the guessed items' prices up and
then computes with last year's price (so every item is looked up) teaches no copying at all
(sampled success 0.015, 60 copy errors in 200). The shipped build is the best of those measured.

    tasks = make_agent_tasks(64, seed=0, split="test")    # or load_dataset("tiny-agent", "test", 64)
    model, tokenizer = load_tiny("data/tiny-agent")

    python -m helpers.tiny_agent build                    # rebuild data/tiny-agent/ from the seed (~8 min on 2 cores)
    python -m helpers.tiny_agent baseline                 # held-out success at T=1 (--temperature 0: greedy), failures by kind
    python -m helpers.train --preset tiny-agent --seed 0  # GRPO: the agent learns the plan

Simplifications, named:

* One question shape (quantities 2-9, prices 10-99, a three-digit bill), so every canonical
  episode has the same length in tokens.
* ``usual()`` takes no argument: it knows who is asking, as a real API knows the logged-in
  user. An earlier version named the customer in the question (``{"customer": "Ann"}``) and
  the first call had to copy the name: with 24 names, earlier builds copied it right on
  0.43-0.95 of held-out tasks, and a 750-step build wrote one name ("Kim") for almost every
  customer; with 96 names, names were still miscopied after 1,500 SFT steps.
* Why a chain and not "3 pens and 2 cups" (two lookups, then one sum): every value the
  agent copies here comes from the tool result just before it (or the question), which a
  small transformer learns to copy; copying the *second-to-last* result, or picking the
  *second* item off a question, is what a ~0.8M-parameter model failed to learn in a
  10-minute SFT budget (an earlier version of this world: 0.00 held-out success).
* The split is by what decides the answer (quantity, item, price), not by the question's
  text, which is the same for every task with the same quantity.
* The model starts from the one-call world's weights (``warm_start``), as a real agent
  starts from a pretrained model.
* The demonstrator's habits are keyed on the item; a real agent's weaknesses have
  messier causes.
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

SYSTEM = "Find the customer's item, look up its price, then use the calculator. Answer as <answer>N</answer>."
ITEMS = ("bag", "ball", "book", "cake", "card", "cup", "hat", "key", "lamp", "mug", "pen", "sock")
QUANTITIES = range(2, 10)  # one digit
PRICES = range(10, 100)  # two digits
BILLS = range(100, 1000)  # three digits (the price is redrawn until the bill fits): too much for a 1M model's "head"
EPISODE = dict(max_steps=5, max_new_tokens=40, max_total_tokens=320)  # the canonical episode: 4 turns, ~170 tokens


def question(quantity: int) -> str:
    """'What do 3 of my usual items cost?' (who is asking, the env knows: see ``ShopEnv``)."""
    return f"What do {quantity} of my usual items cost?"


def make_agent_tasks(n: int, seed: int = 0, split: str = "train") -> list[Task]:
    """``n`` shop tasks of one split, drawn from ``seed``.

    A task is the question and the shop behind it: what the customer buys (``metadata["item"]``)
    and what every item costs (``metadata["prices"]``), both drawn per task and read only by the
    env. The split is a hash of what decides the answer, the quantity, the item and its price
    (``helpers.tiny.split_of``): a task the model is tested on is never one it trained on,
    whatever the seed (of the 8 x 12 x 90 combinations, 7,368 give a three-digit bill: 5,887 /
    740 / 741). The held-out splits hold every item equally often (in turn: bag, ball, ...), so
    one item the agent gets wrong costs the same share of the success rate in every draw.
    ``metadata`` also holds the ``quantity`` and the ``expression`` that solves it.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {list(SPLITS)}")
    rng = random.Random(f"tiny-agent-{seed}-{split}")
    tasks = []
    while len(tasks) < n:
        quantity = rng.choice(QUANTITIES)
        # Held-out splits take the items in turn, each as often as training draws it: a free draw of 200
        # tasks from seed 0 held 29 orders of one item (1/12 is 17), and that item alone then moved success by 0.06.
        item = rng.choice(ITEMS) if split == "train" else ITEMS[len(tasks) % len(ITEMS)]
        prices = {name: rng.choice(PRICES) for name in ITEMS}
        if quantity * prices[item] not in BILLS or split_of(f"{quantity}*{item}={prices[item]}") != split:
            continue
        text, expression = question(quantity), f"{quantity}*{prices[item]}"
        prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
        metadata = {"quantity": quantity, "item": item, "prices": prices, "expression": expression}
        tasks.append(Task(f"tiny-agent-{split}-{seed}-{len(tasks):05d}", prompt, str(quantity * prices[item]), metadata))
    return tasks


@register_dataset("tiny-agent")
def tiny_agent_dataset(split: str, n: int | None, seed: int) -> list[Task]:
    """The dataset registry's view of this world (``config.dataset = "tiny-agent"``):
    ``n`` tasks of ``split`` (None: 4,000 for train, 64 otherwise)."""
    return make_agent_tasks(n if n is not None else (4000 if split == "train" else 64), seed=seed, split=split)


# --- demonstrations: a sloppy demonstrator ---------------------------------------------------

FLAWS = ("skipped_lookup", "stopped_early", "wrong_tool")  # with copy_error, the failure kinds of failure_kind()
HABITS = {  # item -> the flaw the demonstrator makes on orders of it, HABIT_RATE of the time
    **dict.fromkeys(("cup", "key", "pen"), "skipped_lookup"),  # "I know what a pen costs": guesses the price
    **dict.fromkeys(("bag", "book", "lamp"), "stopped_early"),  # answers with the price of one
    **dict.fromkeys(("cake", "card", "hat"), "wrong_tool"),  # asks lookup, not the calculator, for the bill
}  # ball, mug, sock: no habit
HABIT_RATE = 0.85  # greedy decoding follows a habit that strong: the SFT agent fails on 3 tasks in 4
SLIP_RATE = 0.03  # each flaw, for any task (on top of the habit)


def demonstrator_flaw(task: Task, rng: random.Random) -> str | None:
    """The flaw the demonstrator makes on ``task`` this time, or None (a clean solution)."""
    habit = HABITS.get(task.metadata["item"])
    if habit is not None and rng.random() < HABIT_RATE:
        return habit
    u = rng.random()
    for flaw in FLAWS:
        if u < SLIP_RATE:
            return flaw
        u -= SLIP_RATE
    return None


def demonstration(task: Task, flaw: str | None, rng: random.Random) -> list[dict]:
    """The conversation the demonstrator has with a real ``ShopEnv`` on ``task``.

    Every tool message is what the env answered, so the model learns to read real results
    and real error messages. flaw None is the clean plan (usual, lookup, calculator, answer);
    a flawed one ends with a wrong answer, as it would for the demonstrator:

    skipped_lookup  finds the item, then skips its lookup and computes with a guessed price
    stopped_early   looks the price up, then answers with it (the price of one, not the bill)
    wrong_tool      looks the price up, then asks lookup (not the calculator) for "3*47"; gives up with the price
    """
    env = ShopEnv(max_steps=EPISODE["max_steps"])
    messages = env.reset(task)

    def act(text: str) -> str | None:
        """One assistant turn; the tool's reply, or None when the turn was the answer."""
        messages.append({"role": "assistant", "content": text})
        observation = env.step(text).observation
        messages.extend(observation)
        return observation[0]["content"] if observation else None

    quantity = task.metadata["quantity"]
    item = json.loads(act(format_tool_call("usual", {})))["item"]
    if flaw == "skipped_lookup":
        price = rng.choice([p for p in PRICES if p != task.metadata["prices"][item] and quantity * p in BILLS])
    else:
        price = act(format_tool_call("lookup", {"item": item}))
    if flaw in ("stopped_early", "wrong_tool"):
        if flaw == "wrong_tool":
            act(format_tool_call("lookup", {"item": f"{quantity}*{price}"}))  # -> "error: the shop has no item '3*47'"
        act(f"<answer>{price}</answer>")  # gives up with the one number it has
        return messages
    total = act(format_tool_call("calculator", {"expression": f"{quantity}*{price}"}))
    act(f"<answer>{total}</answer>")
    return messages


# --- what went wrong ---------------------------------------------------------------------------


def failure_kind(trajectory) -> str:
    """How one episode ended: ``correct``, ``truncated`` (a limit cut it short), or the first
    flaw that explains the wrong answer, checked in this order:

    wrong_tool      a tool call came back as an error (an unknown tool or item, a name in the calculator)
    stopped_early   answered without calling the calculator
    skipped_lookup  the calculator ran before any price was looked up (the price was guessed)
    copy_error      the plan was followed, still wrong: a value (item, price, bill) was copied wrongly
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
    names = [c.name for m in messages if m["role"] == "assistant" for c in parse_tool_calls(m["content"])]
    if "calculator" not in names:
        return "stopped_early"
    if "lookup" not in names[: names.index("calculator")]:
        return "skipped_lookup"
    return "copy_error"


# --- build: tokenizer + SFT + baseline -----------------------------------------------------

BUILD = dict(  # the recipe of the shipped checkpoint; `python -m helpers.tiny_agent build` runs exactly this
    seed=0,
    train_tasks=4000,  # training tasks, each demonstrated once
    threads=2,  # torch threads: 2,000 steps fit the 10-minute budget on 2 cores (a rerun on the same machine gives the same bytes)
    vocab_size=512,  # at most; the shop's words and the JSON of a tool call each become one token
    warm_start=True,  # start from data/tiny's weights (see warm_start): its layers already copy digits
    steps=2000,  # SFT optimizer steps: copying the bill into the answer is learned late (~1,500 steps)
    batch_size=16,
    lr=3e-3,  # as helpers.tiny: high for a transformer, fine for ~0.8M parameters
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
