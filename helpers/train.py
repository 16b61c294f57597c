"""The training command: ``python -m helpers.train``, one flag per config field.

    python -m helpers.train --preset tiny-agent                # the shop world on a CPU, a few minutes
    python -m helpers.train --preset tiny-agent --seed 1 --steps 20 --lr 1e-4
    python -m helpers.train --preset tiny-agent --resume true  # continue a killed run from its last checkpoint
    python -m helpers.train --preset tiny-selfplay --proposer-weight 5   # a preset's own config fields are flags too
    python -m helpers.train --preset tiny-agent --env-class mypkg.shop:Shop   # your own env class, on TRL's contract
    python -m helpers.train --preset tiny-mix                   # one agent on three worlds, each row played by its own env
    python -m helpers.train --preset tiny-mix --env-class calculator=mypkg.calc:Calc   # your class plays one of them
    python -m helpers.train --preset tiny-agent --resume true --steps 40   # continue a finished 20-step run to 40 steps

``--env-class package.module:ClassName`` trains with any class that follows TRL's environment
contract (``helpers.envs.base``; it need import nothing from ``helpers``): it becomes
``config.env``, and ``helpers.envs.check_env_class`` checks it on one of the preset's test tasks
before any model loads. A class that breaks the contract (no ``reset``, a tool without type hints
or an ``Args:`` line, a ``get_reward`` that returns no number) is refused with a one-line reason, as is any
flag's bad value (a negative ``--seed``, an unknown ``--env`` or ``--dataset``, an ``--out-dir`` that is a file:
``refusal``), before the run folder is touched.
The same class runs in TRL's ``GRPOTrainer(environment_factory=...)``. Taught in
notebooks/02_environment.ipynb.

A mixed dataset (``--dataset tiny-agent@shop+tiny@calculator``, or the preset ``tiny-mix``) names each part's
environment, as TRL's ``environment`` column does; there ``--env-class NAME=package.module:ClassName``
(repeatable) replaces the class of environment NAME, each checked on a task of its own world, and a bare
``--env-class`` is refused (it would say nothing about which world it plays). Taught in
notebooks/10_environment_market.ipynb.

``--resume true`` continues the run in ``--out-dir`` from its newest checkpoint with the run's own settings,
except those that do not change what is trained (evaluation, logging, saving, threads:
``helpers.checkpoint.RESUME_FREE``) and ``--steps``, which may grow: the learning-rate schedule is then
re-planned for the new total from the step reached, said in one line and kept in config.json.

This module sits on top of the house: it imports ``helpers.worlds`` (which registers every
world's datasets, environments, presets and collectors), then hands the config to the one loop,
``helpers.loop.train``, which it re-exports (``from helpers.train import train``).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import io
import re
import textwrap
import tokenize
import types
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path

import torch

import helpers.worlds  # noqa: F401  (registers the built-in worlds: datasets, envs, presets, collectors)
from helpers.checkpoint import ResumeError, RunFolderBusy, run_dir_for
from helpers.config import DEFAULT_PRESET, PRESETS, ConfigError, TrainConfig, get_preset
from helpers.data import load_dataset, parse_mix
from helpers.envs import check_env_class
from helpers.loop import EVAL_SEED, RunResult, env_classes, is_mix, look_up, train
from helpers.paths import ROOT
from helpers.policy import ModelUnavailable, resolve_device
from helpers.policy.vllm import MISSING

__all__ = ["RunResult", "add_config_flags", "build_parser", "main", "refusal", "train"]


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


def field_comments(config_class: type) -> dict[str, str]:
    """Each field's comment in the source of ``config_class`` and the dataclasses it extends
    (``lr: float = 1e-3  # the step size`` gives ``{"lr": "the step size"}``): the help of its flag."""
    comments = {}
    for klass in reversed([k for k in config_class.__mro__ if is_dataclass(k)]):  # a subclass's comment wins
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # a class with no source file (made in a notebook cell): no help text
            continue
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            field_name = re.match(r"\s*(\w+)\s*:", token.line)
            if token.type == tokenize.COMMENT and field_name:
                comments[field_name.group(1)] = token.string.lstrip("#").strip()
    return comments


def add_config_flags(parser: argparse.ArgumentParser, config_class: type, defaults: object | None = None,
                     skip: tuple[str, ...] = ()) -> None:
    """One flag per field of the dataclass ``config_class`` (those in ``skip`` aside), parsed to the field's type.
    Without ``defaults`` a flag that is not given stays out of the parsed arguments (the preset gives its value);
    with ``defaults``, an instance of the class, its value is the flag's default (``python -m helpers.serve``)."""
    hints, comments = typing.get_type_hints(config_class), field_comments(config_class)
    for f in fields(config_class):
        if f.name in skip:
            continue
        kind = f"({hints[f.name]})" if not isinstance(hints[f.name], type) else None
        text = " ".join(part for part in (comments.get(f.name), kind) if part) or None
        names = dict.fromkeys([f"--{f.name.replace('_', '-')}", f"--{f.name}"])  # --max-new-tokens and --max_new_tokens; --lr once
        parser.add_argument(*names, dest=f.name, type=_parser_for(hints[f.name]),
                            default=argparse.SUPPRESS if defaults is None else getattr(defaults, f.name),
                            metavar=getattr(hints[f.name], "__name__", "VALUE").upper(),
                            help=text and text.replace("%", "%%"))  # argparse formats help with %


def build_parser(preset: str | None = None) -> argparse.ArgumentParser:
    """``--preset`` and one flag per field of the preset's config class: TrainConfig's fields,
    plus a subclass's own (``--preset tiny-selfplay`` also takes ``--proposer-weight 5`` ...)."""
    parser = argparse.ArgumentParser(
        prog="python -m helpers.train", description="GRPO training of an LLM agent (the workbook's loop).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS), help="starting config; flags below override it")
    parser.add_argument("--env-class", "--env_class", dest="env_class", action="append", default=argparse.SUPPRESS,
                        metavar="[NAME=]MODULE:CLASS",
                        help="train with this environment class (TRL's contract), e.g. mypkg.shop:Shop (sets --env); in a "
                             "mixed dataset NAME=mypkg.shop:Shop plays the rows of environment NAME (repeatable)")
    add_config_flags(parser, type(PRESETS[preset]()) if preset in PRESETS else TrainConfig, skip=("env_classes",))
    return parser


# The least each counting field may be. Below it a run fails late (after the model loaded), with a message that
# names no flag, or does what no one asked: --steps -1 evaluates and calls it a run, --torch-threads -3 is ignored.
MINIMUMS = {"steps": 0, "torch_threads": 0, "tasks_per_step": 1, "num_generations": 1, "eval_tasks": 1, "lr": 0.0}


def refusal(config: TrainConfig, preset: str) -> str | None:
    """Why the command refuses ``config``, in one line, or None. Checked before ``train``, which clears the run
    folder: a typo in a flag must not cost the folder's last run, nor a model load."""
    for name, least in MINIMUMS.items():
        if getattr(config, name) < least:
            return f"--{name.replace('_', '-')} {getattr(config, name)}: give {least} or more"
    if not 0 <= config.seed < 2**32:
        return f"--seed {config.seed}: give a whole number from 0 to 2**32 - 1 (numpy's generator takes no other)"
    model = Path(config.model)  # a hub id (Qwen/Qwen2.5-1.5B-Instruct) has one slash at most, and no repository folder for a namespace
    looks_local = len(model.parts) > 2 or (model.parent != Path(".") and (ROOT / model.parts[0]).is_dir())
    if looks_local and not (ROOT / model).is_dir():
        return f"--model {config.model}: no folder {ROOT / model} (a local model is a folder, relative to the repository root)"
    run_dir = run_dir_for(config, preset)
    existing = next(path for path in [run_dir, *run_dir.parents] if path.exists())
    if not existing.is_dir():
        return f"--out-dir {config.out_dir}: {existing} is a file; give a folder (it is made if missing)"
    if not isinstance(getattr(torch, config.dtype, None), torch.dtype):
        return f"--dtype {config.dtype}: not a torch dtype; give float32, bfloat16 or float16"
    try:
        device = torch.device(resolve_device(config.device))
    except RuntimeError:
        return f"--device {config.device}: not a torch device; give auto, cpu, cuda or cuda:N"
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():  # torch's own refusal is a traceback
        why = (f"this torch, {torch.__version__}, is built without CUDA" if torch.version.cuda is None
               else f"{torch.cuda.device_count()} CUDA GPU(s) visible")
        return (f"--device {config.device}: no such GPU here ({why}); give --device cpu, or auto to use a GPU when one is "
                "visible (the GPU presets' CPU stand-ins are their smoke presets, e.g. gsm8k-tools-cpu-smoke)")
    if config.backend == "vllm" and importlib.util.find_spec("vllm") is None:  # else a traceback once the model has loaded
        return f"--backend vllm: {MISSING}"
    try:  # the registries' own one-line messages: an unknown collector, dataset, reward, env or env option
        task = look_up(config)
    except ConfigError as e:
        return e.flag_message()
    except (KeyError, ValueError, TypeError) as e:
        return e.args[0] if isinstance(e, KeyError) else str(e)  # a KeyError's str() quotes its message
    except ConnectionError as e:  # a hub dataset (GSM8K) offline
        return (f"--dataset {config.dataset}: {e}; it comes from the Hugging Face Hub: check the connection "
                "(a copy already in the cache loads with HF_HUB_OFFLINE=1)")
    if is_mix(config) and ":" in config.env:
        names = ", ".join(dict.fromkeys(environment for _, environment in parse_mix(config.dataset)))
        return (f"--env-class {config.env}: the dataset mixes environments ({names}); "
                f"name the one the class replaces, --env-class NAME={config.env}")
    one_per_part = load_dataset(config.dataset, "test", len(parse_mix(config.dataset)), seed=EVAL_SEED) if is_mix(config) else [task]
    for spec in env_classes(config):  # a class by name: refuse a broken one now, before any model loads
        played = [t for t in one_per_part if config.env_classes.get(t.environment, t.environment) == spec] or [task]
        problems = check_env_class(spec, played[0])  # on a task of the environment it plays
        if problems:
            return f"environment class {spec} refused: {'; '.join(problems)}"
    return None


def env_class_flags(specs: list[str]) -> dict:
    """The config fields that ``--env-class`` flags give: a bare ``module:Class`` is ``env``; ``NAME=module:Class``
    goes into ``env_classes`` (the class that plays a mixed dataset's environment NAME)."""
    named = dict(spec.split("=", 1) for spec in specs if "=" in spec)
    bare = [spec for spec in specs if "=" not in spec]
    if len(bare) > 1:
        raise SystemExit(f"python -m helpers.train: --env-class given {len(bare)} classes without a NAME= ({', '.join(bare)}); "
                         "one replaces the preset's env, the others name the environment they play: NAME=module:Class")
    return {**({"env": bare[0]} if bare else {}), **({"env_classes": named} if named else {})}


def main(argv: list[str] | None = None) -> RunResult:
    preset_only = argparse.ArgumentParser(add_help=False)
    preset_only.add_argument("--preset", default=DEFAULT_PRESET)
    args = vars(build_parser(preset_only.parse_known_args(argv)[0].preset).parse_args(argv))
    preset = args.pop("preset")
    args.update(env_class_flags(args.pop("env_class", [])))
    try:
        config = get_preset(preset, **args)
    except ConfigError as e:  # a choice field's value (--backend, --loss-type, ...): TrainConfig checks them
        raise SystemExit(f"python -m helpers.train: {e.flag_message()}") from None
    except ValueError as e:  # the bounds of the importance-sampling weights
        raise SystemExit(f"python -m helpers.train: {e}") from None
    problem = refusal(config, preset)
    if problem:
        raise SystemExit(f"python -m helpers.train: {problem}")
    print(f"preset {preset}" + (f" with {args}" if args else ""), flush=True)
    try:
        return train(config, preset_name=preset)
    except (ResumeError, RunFolderBusy, ModelUnavailable) as e:  # raised before the first step (and before the run
        raise SystemExit(f"python -m helpers.train: {e}") from None  # folder is cleared), each saying what to do


if __name__ == "__main__":
    main()
