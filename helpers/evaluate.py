"""The evaluation command: a base model or a saved adapter on fresh held-out tasks.

    python -m helpers.evaluate --preset tiny-agent --adapter runs/tiny-agent-seed0/checkpoint-30 --n 200 --seed 1234

The evaluation itself is ``helpers.evaluation.evaluate`` (re-exported here), the function the
training loop runs before, during and after training: the same tasks, envs and numbers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import helpers.worlds  # noqa: F401  (registers the built-in worlds: datasets, envs, presets)
from helpers.config import DEFAULT_PRESET, PRESETS, get_preset
from helpers.data import load_dataset
from helpers.evaluation import breakdown, evaluate
from helpers.loop import env_factory

__all__ = ["evaluate", "main"]


def main(argv: list[str] | None = None) -> dict:
    """``python -m helpers.evaluate --preset P [--adapter DIR] [--n N] [--seed S] [--temperature T]``

    Prints one JSON line: success (greedy, or sampled at ``--temperature`` when it is > 0),
    pass@k, tool calls and turns per episode, and the failure kinds. The tasks are the
    preset dataset's test split drawn from ``--seed`` (generated worlds: a seed training never
    uses gives tasks it never saw).
    """
    from helpers.policy import load_adapter, load_model, make_policy

    parser = argparse.ArgumentParser(prog="python -m helpers.evaluate", description="Held-out evaluation of a base model or a saved LoRA adapter.")
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS), help="model, dataset, env and limits")
    parser.add_argument("--adapter", default=None, help="a checkpoint folder (or any saved peft adapter); default: the base model")
    parser.add_argument("--n", type=int, default=200, help="held-out tasks")
    parser.add_argument("--seed", type=int, default=0, help="draws the tasks (generated worlds) and the samples")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; > 0 samples one episode per task at this temperature")
    parser.add_argument("--k", type=int, default=None, help="pass@k samples per task (default: the preset's pass_k; 0 = none)")
    args = parser.parse_args(argv)

    config = get_preset(args.preset, device="cpu" if args.preset.startswith(("tiny", "gsm8k-cpu")) else "auto")
    model, tokenizer = load_model(config)
    if args.adapter is not None:
        if not (Path(args.adapter) / "adapter_config.json").is_file():
            parser.error(f"--adapter {args.adapter}: no adapter_config.json there (give a checkpoint-<step> folder of a run)")
        model = load_adapter(model, args.adapter)
    model.eval()
    policy = make_policy(config, model, tokenizer)
    tasks = load_dataset(config.dataset, "test", args.n, seed=args.seed)
    result = evaluate(policy, tasks, env_factory(config),
                      k=config.pass_k if args.k is None else args.k, temperature=args.temperature or config.temperature,
                      greedy=args.temperature == 0, max_new_tokens=config.max_new_tokens, max_steps=config.env_max_steps,
                      max_total_tokens=config.max_total_tokens, seed=args.seed)
    line = {"preset": args.preset, "adapter": args.adapter, "seed": args.seed, "temperature": args.temperature,
            **result.metrics, "failures": breakdown(result.records)}
    print(json.dumps(line))
    return line


if __name__ == "__main__":
    main()
