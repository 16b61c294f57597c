"""The tiny market's warm start: the shop's tiny agent, shown all three worlds, and its baseline per world.

    python -m helpers.worlds.market build       # rebuild data/tiny-market/ from data/tiny-agent (minutes on a CPU)
    python -m helpers.worlds.market baseline    # held-out success per world, greedy and sampled

Neither shipped model plays the mix: the one-call model (``data/tiny``) has never seen the shop's
tools, and the shop's agent (``data/tiny-agent``) has forgotten how to answer a bare calculator
question. So the market's model starts from the shop's agent (its tokenizer and layers) and is
shown demonstrations of every world, weak on purpose, as each world's own warm start is: the shop's
sloppy demonstrator (its habits, ``helpers.worlds.shop.build``; a share made clean, since the calculator
worlds' direct answers teach the model to stop early in the shop too), and in the two calculator worlds
a share of answers given "in the head" (the true answer, which the model cannot compute), so the warm
start answers that way often and GRPO has a plan to find in each world.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

from helpers.data import Task, load_dataset, parse_mix
from helpers.envs import make_env
from helpers.evaluation import evaluate
from helpers.floats import flush_denormals
from helpers.formats import format_tool_call
from helpers.paths import ROOT
from helpers.policy.hf import HFPolicy
from helpers.sft import encode_conversations, train_sft
from helpers.worlds.arithmetic.tasks import demonstration as calculator_demonstration
from helpers.worlds.market.presets import MIX
from helpers.worlds.shop.build import AGENT_DIR, demonstration as shop_demonstration, demonstrator_flaw
from helpers.worlds.shop.tasks import EPISODE
from helpers.worlds.tinymodel import finish_build, load_tiny, start_build

MARKET_DIR = ROOT / "data" / "tiny-market"

BUILD = dict(  # the recipe of the shipped checkpoint; `python -m helpers.worlds.market build` runs exactly this
    seed=0,
    threads=1,  # torch threads: one (on a shared CPU, two threads wait on each other); a rerun gives the same bytes
    per_world=600,  # training tasks of each world, each demonstrated once
    tool_fraction=0.5,  # calculator worlds: share of demonstrations that call the calculator; the rest answer "in the head"
    shop_clean=0.3,  # shop: share of demonstrations made clean; the rest as the shop's demonstrator made them (a third clean)
    steps=600,  # SFT optimizer steps, from data/tiny-agent's weights
    batch_size=16,
    lr=2e-3,  # below the from-scratch builds' rate: the layers already copy digits and call tools
    decay_fraction=0.3,  # linear decay to 0 over the last 30% of steps
    eval_tasks=90,  # held-out (validation) tasks for the baseline, a third of each world
)


def products_demonstration(task: Task, use_tool: bool) -> list[dict]:
    """A ``tiny-products`` task solved as the one-call world's: copy ``87 * 64`` into the calculator and
    answer with its result, or answer "in the head" (the true answer)."""
    final = {"role": "assistant", "content": f"<answer>{task.answer}</answer>"}
    if not use_tool:
        return task.prompt + [final]
    expression = re.search(r"-?\d+ \* -?\d+", task.prompt[-1]["content"]).group(0)
    call = {"role": "assistant", "content": format_tool_call("calculator", {"expression": expression})}
    return task.prompt + [call, {"role": "tool", "content": task.answer}, final]


def demonstrations(recipe: dict) -> list[tuple[list[list[dict]], list[dict]]]:
    """Each world's demonstrations and its tools' schemas: ``[(conversations, tools), ...]``, in MIX's order."""
    rng = random.Random(recipe["seed"])
    worlds = []
    for dataset, environment in parse_mix(MIX):
        tasks = load_dataset(dataset, "train", recipe["per_world"], seed=recipe["seed"])
        if environment == "shop":
            flaws = [None if rng.random() < recipe["shop_clean"] else demonstrator_flaw(task, rng) for task in tasks]
            conversations = [shop_demonstration(task, flaw, rng) for task, flaw in zip(tasks, flaws)]
        else:
            show = calculator_demonstration if environment == "calculator" else products_demonstration
            conversations = [show(task, use_tool=rng.random() < recipe["tool_fraction"]) for task in tasks]
        worlds.append((conversations, make_env(environment).tools))
    return worlds


def build(out: str | Path = MARKET_DIR, progress: bool = True, **overrides) -> dict:
    """Rebuild the market's model from ``data/tiny-agent``: SFT on every world's demonstrations, save to
    ``out``, measure the baseline per world, write ``out/baseline.json``; return the baseline."""
    flush_denormals()  # as the training commands do (helpers.floats): no figure changes, much faster on a CPU
    recipe, clock = start_build(BUILD, overrides)
    model, tokenizer = load_tiny(AGENT_DIR)
    model.train()
    examples = [example for conversations, tools in demonstrations(recipe)
                for example in encode_conversations(tokenizer, conversations, tools)]
    losses = train_sft(
        model, examples, recipe["steps"], recipe["batch_size"], lr=recipe["lr"], seed=recipe["seed"],
        decay_fraction=recipe["decay_fraction"], pad_id=tokenizer.pad_token_id, progress=progress,
    )
    model.eval()
    measured = {
        "greedy": baseline(model, tokenizer, recipe["eval_tasks"], seed=recipe["seed"], temperature=0.0),
        "sampled": baseline(model, tokenizer, recipe["eval_tasks"], seed=recipe["seed"], temperature=1.0),
    }
    return finish_build(out, model, tokenizer, recipe, losses, clock, measured)


def baseline(model, tokenizer, n: int = BUILD["eval_tasks"], seed: int = 0, split: str = "validation", temperature: float = 1.0) -> dict:
    """Success on ``n`` held-out tasks of the mix (a third of each world), one episode each at ``temperature``
    (0 = greedy), each played by its own environment: ``{"success": ..., "<env>/success": ..., ...}``."""
    tasks = load_dataset(MIX, split, n, seed=seed)
    envs = {environment: (lambda name=environment: make_env(name, max_steps=EPISODE["max_steps"])) for _, environment in parse_mix(MIX)}
    result = evaluate(HFPolicy(model, tokenizer), tasks, envs, temperature=temperature, greedy=temperature == 0,
                      max_new_tokens=EPISODE["max_new_tokens"], max_steps=EPISODE["max_steps"],
                      max_total_tokens=EPISODE["max_total_tokens"], seed=seed)
    figures = {key: value for key, value in result.metrics.items() if key == "success" or key.endswith("/success")}
    return dict(split=split, n=n, temperature=temperature, **{key: round(value, 4) for key, value in figures.items()})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m helpers.worlds.market", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["build", "baseline"], help="build: rebuild data/tiny-market; baseline: measure it")
    parser.add_argument("--out", default=str(MARKET_DIR), help="folder to write (build) or read (baseline)")
    args = parser.parse_args(argv)
    if args.command == "build":
        print(json.dumps(build(args.out), indent=2))
    else:
        model, tokenizer = load_tiny(args.out)
        print(json.dumps({"greedy": baseline(model, tokenizer, temperature=0.0), "sampled": baseline(model, tokenizer)}, indent=2))
