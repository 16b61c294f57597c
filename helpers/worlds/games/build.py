"""The game world's warm start: a tiny model that imitates a weak, plausible Kuhn poker player.

    python -m helpers.worlds.games build                           # rebuild data/tiny-games/ from the seed (~3.5 min of CPU, one thread)
    python -m helpers.worlds.games baseline                        # its exact move table and strength
    python -m helpers.worlds.games compare RUN_A RUN_B [RUN_C ...]  # exact head to head of runs' final policies
    python -m helpers.worlds.games keep RUN OUT.json --command "..."  # a run's summary, trimmed, for notebook 09

The demonstrator is a cautious player (``BETS``): it bets its good cards, bluffs a J now and then,
and folds too often when bet into. What it does depends on the card and on the betting so far:

    situation (moves so far)          bet or call with   J     Q     K
    player 1 opens (none)                               0.3   0.4   0.8
    player 2 after a pass ("p")                         0.3   0.5   0.9
    facing a bet ("b", "pb")                            0.05  0.2   0.7

That is plausible (better cards, more chips in; first to act, a little more careful) and weak: it
folds a K to a bet 3 times in 10, so a player who bets every hand wins its antes, and its bets say
what it holds. Its exploitability is 0.270 chips per hand (uniform random: 0.458; a Nash
equilibrium: 0), so there is room to improve; the best response to it (bet everything, which a
fixed-opponent learner drifts toward) is itself very exploitable; and it mixes at every state, so
sampling tries every move. Because its play depends on the history, the model that imitates it
reads the moves so far, not only its card (a demonstrator that played by card alone gave a warm
start whose 12 states collapsed to 3, and RL from it never separated them). The SFT model
imitates the mixture: hands of the demonstrator against itself, each seat's conversation one
example (``game.conversation`` + its replies).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from helpers.paths import ROOT
from helpers.worlds.games.game import DEALS, MOVES, Match, conversation, information_states, reply_for
from helpers.worlds.games.strength import exploitability, head_to_head, illegal_mass, move_table, table_from_bets
from helpers.worlds.tinymodel import finish_build, load_tiny, sft_new_model, start_build

GAMES_DIR = ROOT / "data" / "tiny-games"
BETS = {  # the demonstrator's probability of bet (or call), by the moves so far, for J, Q, K
    "": (0.3, 0.4, 0.8),  # player 1 opens
    "p": (0.3, 0.5, 0.9),  # player 2 after a pass
    "b": (0.05, 0.2, 0.7),  # player 2 facing a bet
    "pb": (0.05, 0.2, 0.7),  # player 1 facing a bet after its pass
}
BUILD = dict(  # the recipe of the shipped checkpoint; `python -m helpers.worlds.games build` runs exactly this
    seed=0,
    hands=4000,  # demonstration hands (two examples each: one per seat)
    threads=1,  # torch threads: the tiny model's matrices gain nothing from a second one (and one thread gives the same bytes on every machine)
    vocab_size=512,  # at most; the BPE stops far below (the world's text is a few dozen words)
    steps=400,  # SFT optimizer steps
    batch_size=32,
    lr=3e-3,
    decay_fraction=0.3,  # linear decay to 0 over the last 30% of steps
)


def demonstrator() -> dict[str, dict[str, float]]:
    """The demonstrator's move table: bet with probability ``BETS[moves so far][card]`` at each state ("0pb": J after pass, bet)."""
    return table_from_bets({key: BETS[key[1:]][int(key[0])] for key in information_states()})


def demonstrations(hands: int, seed: int) -> list[list[dict]]:
    """Hands of the demonstrator against itself; each seat's conversation (with its replies) is one example."""
    rng, table = random.Random(seed), demonstrator()
    examples = []
    for _ in range(hands):
        match = Match(DEALS[rng.randrange(len(DEALS))])
        last = {}  # seat -> its last (state, move): the state's conversation holds the seat's earlier replies
        while not match.done:
            key = match.key(match.to_move)
            move = MOVES[0] if rng.random() < table[key][MOVES[0]] else MOVES[1]
            last[match.to_move] = (key, move)
            match.play_move(move)
        for key, move in last.values():
            examples.append(conversation(key) + [{"role": "assistant", "content": reply_for(move)}])
    return examples


def build(out: str | Path = GAMES_DIR, progress: bool = True, **overrides) -> dict:
    """Rebuild the warm start from the seed: tokenizer, SFT on the demonstrations, save to ``out``,
    measure it (``baseline``), write ``out/baseline.json``; return the baseline."""
    recipe, clock = start_build(BUILD, overrides)
    conversations = demonstrations(recipe["hands"], recipe["seed"])
    model, tokenizer, examples, losses = sft_new_model(conversations, None, recipe, progress)
    return finish_build(out, model, tokenizer, recipe, losses, clock, {**baseline(model, tokenizer), "examples": len(examples)})


def baseline(model, tokenizer) -> dict:
    """The model's exact move table and strength, beside its demonstrator's."""
    table, target = move_table(model, tokenizer), demonstrator()
    return {"exploitability": round(exploitability(table), 4), "demonstrator_exploitability": round(exploitability(target), 4),
            "vs_demonstrator": round(head_to_head(table, target), 4), "illegal": round(illegal_mass(table), 5),
            "max_gap_to_demonstrator": round(max(abs(table[k]["bet"] - target[k]["bet"]) for k in table), 4),
            "bet": {k: round(row["bet"], 3) for k, row in table.items()}}


def compare(run_dirs: list[str]) -> dict:
    """Exact head to head between runs' final policies (summary.json's ``tables.after``): chips per hand, row vs column."""
    tables = {str(d): json.loads((Path(d) / "summary.json").read_text())["tables"]["after"] for d in run_dirs}
    return {a: {b: round(head_to_head(ta, tb), 4) for b, tb in tables.items() if b != a} for a, ta in tables.items()}


def keep(run_dir: str | Path, command: str) -> dict:
    """What notebook 09 reads of a run (``notebooks/runs_saved/games/*.json``): the command that made it, the exact
    strength (before, after, the curve), the move tables, the held-out win rates, and per step the KL and the
    sampled reward; the health warnings and the wall and CPU seconds."""
    run_dir = Path(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "reward" in m]
    return {"command": command, "opponent": summary["opponent"], "rae": summary["rae"], "strength": summary["strength"],
            "tables": summary["tables"], "eval": {k: {"success": summary[k]["success"], "pass@1": summary[k]["pass@1"]} for k in ("before", "after")},
            "kl": [round(m["kl"], 5) for m in steps], "reward": [round(m["reward"], 4) for m in steps],
            "warnings": summary["warnings"], "wall_s": round(summary["wall_s"], 1), "cpu_s": round(summary["cpu_s"], 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m helpers.worlds.games", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["build", "baseline", "compare", "keep"],
                        help="build: rebuild data/tiny-games; baseline: measure it; compare: head to head of run folders; "
                             "keep: write a run's trimmed summary (keep RUN OUT.json --command ...)")
    parser.add_argument("runs", nargs="*", help="compare: run folders (each with a summary.json); keep: a run folder and the file to write")
    parser.add_argument("--command", dest="made_by", default="", help="keep: the command that made the run")
    parser.add_argument("--out", default=str(GAMES_DIR), help="folder to write (build) or read (baseline)")
    parser.add_argument("--steps", type=int, default=BUILD["steps"], help="SFT steps (build)")
    args = parser.parse_args(argv)
    if args.command == "build":
        result = build(args.out, steps=args.steps)
    elif args.command == "baseline":
        result = baseline(*load_tiny(args.out))
    elif args.command == "keep":
        if len(args.runs) != 2 or not args.made_by:
            parser.error("keep needs a run folder, the file to write and --command")
        Path(args.runs[1]).write_text(json.dumps(keep(args.runs[0], args.made_by)) + "\n")
        result = {"written": args.runs[1]}
    else:
        if len(args.runs) < 2:
            parser.error("compare needs at least two run folders")
        result = compare(args.runs)
    print(json.dumps(result, indent=2))
