"""The training command: ``python -m helpers.train``, one flag per config field.

    python -m helpers.train --preset tiny-agent                # the shop world on a CPU, a few minutes
    python -m helpers.train --preset tiny-agent --seed 1 --steps 20 --lr 1e-4
    python -m helpers.train --preset tiny-agent --resume true  # continue a killed run from its last checkpoint
    python -m helpers.train --preset tiny-selfplay --proposer-weight 5   # a preset's own config fields are flags too
    python -m helpers.train --preset tiny-agent --env-class mypkg.shop:Shop   # your own env class, on TRL's contract

``--env-class package.module:ClassName`` trains with any class that follows TRL's environment
contract (``helpers.envs.base``; it need import nothing from ``helpers``): it becomes
``config.env``, and ``helpers.envs.check_env_class`` checks it on one of the preset's test tasks
before any model loads. A class that breaks the contract (no ``reset``, a tool without type hints
or an ``Args:`` line, a ``get_reward`` that returns no number) is refused with a one-line reason.
The same class runs in TRL's ``GRPOTrainer(environment_factory=...)``. Taught in
notebooks/02_environment.ipynb.

This module sits on top of the house: it imports ``helpers.worlds`` (which registers every
world's datasets, environments, presets and collectors), then hands the config to the one loop,
``helpers.loop.train``, which it re-exports (``from helpers.train import train``).
"""

from __future__ import annotations

import argparse
import types
import typing
from dataclasses import fields

import helpers.worlds  # noqa: F401  (registers the built-in worlds: datasets, envs, presets, collectors)
from helpers.config import DEFAULT_PRESET, PRESETS, TrainConfig, get_preset
from helpers.data import load_dataset
from helpers.envs import check_env_class
from helpers.loop import EVAL_SEED, RunResult, train

__all__ = ["RunResult", "build_parser", "main", "train"]


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _parser_for(annotation):
    """A string -> value function for one field type: int, float, str, bool, X | None,
    list[str] ("a,b,c") and dict[str, float] ("correct=1.0,format=0.1")."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        inner = _parser_for(next(a for a in args if a is not type(None)))
        return lambda text: None if text.lower() == "none" else inner(text)
    if origin is list:
        return lambda text: [] if text == "" else [_parser_for(args[0])(item) for item in text.split(",")]
    if origin is dict:
        def parse_dict(text: str) -> dict:
            try:
                return {key.strip(): _parser_for(args[1])(value) for key, value in (item.split("=") for item in text.split(","))}
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected name=value,name=value, got {text!r}") from None
        return parse_dict
    if annotation is bool:
        return _parse_bool
    return annotation  # int, float, str


def build_parser(preset: str | None = None) -> argparse.ArgumentParser:
    """``--preset`` and one flag per field of the preset's config class: TrainConfig's fields,
    plus a subclass's own (``--preset tiny-selfplay`` also takes ``--proposer-weight 5`` ...)."""
    parser = argparse.ArgumentParser(
        prog="python -m helpers.train", description="GRPO training of an LLM agent (the workbook's loop).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS), help="starting config; flags below override it")
    parser.add_argument("--env-class", "--env_class", dest="env", default=argparse.SUPPRESS, metavar="MODULE:CLASS",
                        help="train with this environment class (TRL's contract), e.g. mypkg.shop:Shop; sets --env")
    config_class = type(PRESETS[preset]()) if preset in PRESETS else TrainConfig
    hints = typing.get_type_hints(config_class)
    for f in fields(config_class):
        names = dict.fromkeys([f"--{f.name.replace('_', '-')}", f"--{f.name}"])  # --max-new-tokens and --max_new_tokens; --lr once
        parser.add_argument(*names, dest=f.name, type=_parser_for(hints[f.name]),
                            default=argparse.SUPPRESS, metavar=getattr(hints[f.name], "__name__", "VALUE").upper(),
                            help=f"({hints[f.name]})" if not isinstance(hints[f.name], type) else None)
    return parser


def main(argv: list[str] | None = None) -> RunResult:
    preset_only = argparse.ArgumentParser(add_help=False)
    preset_only.add_argument("--preset", default=DEFAULT_PRESET)
    args = vars(build_parser(preset_only.parse_known_args(argv)[0].preset).parse_args(argv))
    preset = args.pop("preset")
    config = get_preset(preset, **args)
    if ":" in config.env:  # a class by name: refuse a broken one now, before any model loads
        problems = check_env_class(config.env, load_dataset(config.dataset, "test", 1, seed=EVAL_SEED)[0])
        if problems:
            raise SystemExit(f"python -m helpers.train: environment class {config.env} refused: {'; '.join(problems)}")
    print(f"preset {preset}" + (f" with {args}" if args else ""), flush=True)
    return train(config, preset_name=preset)


if __name__ == "__main__":
    main()
