"""Scaling out: the workbook's data, envs, rewards and presets driving TRL's GRPOTrainer on several processes.

Our own loop (helpers.loop) is one process on one card. When you outgrow that, do not
grow it into a distributed trainer: hand the same pieces to TRL, whose GRPOTrainer
already runs on many GPUs with accelerate (DDP, DeepSpeed, FSDP) and samples with a
vLLM *server* on cards of its own. The pieces that carry over unchanged:

    dataset   the preset's training split (helpers.data.load_dataset) -> rows of prompt, answer and the task's
              metadata (helpers.ecosystem.trl_bridge.trl_dataset): {"prompt": messages, "answer": "141", "item": "pen", ...}
    env       a world with tools (the shop, the calculator) is multi-turn: its registered env goes to TRL as
              environment_factory, and TRL's tool loop calls the env's tool methods, episode by episode
              (helpers.ecosystem.trl_bridge.environment_factory); a world without tools (GSM8K's math env) is single turn;
              a mix of worlds (tiny-mix) goes as TRL's dict {environment name: factory}, each row's
              "environment" column picking its env, the same dict the workbook's loop plays
    rewards   the preset's own rewards (config.rewards, name -> weight), helpers.ecosystem.trl_bridge.reward_funcs
    settings  the preset's TrainConfig -> GRPOConfig and LoraConfig: helpers.ecosystem.trl_bridge.grpo_config and
              helpers.grpo.lora_config, the one mapping the tests and the benchmark use too

Run it on GPUs (here 3: GPU 0 samples with a vLLM server, GPUs 1-2 train):

    CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model Qwen/Qwen2.5-1.5B-Instruct --max-model-len 768 &
    CUDA_VISIBLE_DEVICES=1,2 accelerate launch --num_processes 2 scripts/trl_multi_gpu.py --preset gsm8k-24gb

Run it on a CPU, two training processes (what CI runs, tests/test_scale_out.py). The GSM8K
smoke preset, single turn (its 4 completions a step are one micro-batch, ``--grad-accum 2``
makes one per process):

    accelerate launch --cpu --num_processes 2 scripts/trl_multi_gpu.py --preset gsm8k-cpu-smoke --grad-accum 2

The multi-turn shop world, its tiny agent calling usual, lookup and calculator inside TRL's
tool loop (2 steps of 2 tasks x 2 episodes, one micro-batch per process):

    accelerate launch --cpu --num_processes 2 scripts/trl_multi_gpu.py --preset tiny-agent --steps 2 --tasks-per-step 2 --num-generations 2 --grad-accum 2

A mix of worlds (the tiny market: the shop, the one-call world, reasoning-gym's products), TRL's
dict of environments, each row's ``environment`` column picking its env:

    accelerate launch --cpu --num_processes 2 scripts/trl_multi_gpu.py --preset tiny-mix --steps 1 --tasks-per-step 2 --num-generations 2 --grad-accum 2 --max-train-tasks 12

    python scripts/trl_multi_gpu.py --preset gsm8k-24gb --dataset gsm8k-sample --dry-run   # build, print, train nothing
    python scripts/trl_multi_gpu.py --preset tiny-mix --dry-run                           # three worlds, one dict of environments

Every field of the preset can be overridden with the flags of ``python -m helpers.train``
(``--steps 2 --lr 1e-4``).

Sampling: on GPUs, a vLLM server (``trl vllm-serve``) on cards of its own; the server holds a
full copy of the weights, so nothing sleeps, and after each update TRL merges the LoRA
adapter into the weights it sends over NCCL (no LoRARequest, unlike our single-card
backend, helpers.policy.vllm). On a CPU, each process generates with transformers
(``--generation transformers``, the default when no GPU is visible): vLLM's server mode
needs a card of its own.

Batch sizes: one optimizer step still sees ``tasks_per_step * num_generations``
completions. The preset's ``grad_accum`` micro-batches are spread over the training
processes; the script checks the process count first (helpers.ecosystem.trl_bridge.batch_split) and,
when it does not fit, says which counts do, before anything is loaded. The per-process
share is the same update as one process: tests/test_scale_out.py checks that two
processes and one, on the same batch, end the step with the same adapter weights.

Episodes: TRL's completion is the whole episode, up to ``env_max_steps - 1`` tool-calling
rounds within ``max_total_tokens`` (helpers.ecosystem.trl_bridge.grpo_config says how the limits map).

Simplifications, named: no evaluation (evaluate the saved adapter with helpers.evaluate, as
notebook 07 does: same tasks, same env, same numbers); TRL's episode limits are close to ours,
not equal (no per-turn token cap; the prompt is not counted in the token budget).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file from anywhere in a clone

from helpers.config import TrainConfig, get_preset  # noqa: E402


def world_size() -> int:
    """Training processes: accelerate launch sets WORLD_SIZE; a plain python run is 1."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def generation_options(generation: str, host: str, port: int) -> dict:
    """GRPOConfig options for where completions are sampled: a vLLM server, or each process itself."""
    if generation == "vllm-server":
        return dict(use_vllm=True, vllm_mode="server", vllm_server_host=host, vllm_server_port=port)
    return dict(use_vllm=False)  # transformers' generate, in every training process


def training_tasks(config: TrainConfig):
    """The preset's training tasks (the held-out split is for helpers.evaluate afterwards)."""
    from helpers.data import load_dataset

    return load_dataset(config.dataset, "train", config.max_train_tasks, seed=config.seed)


def build_trainer(config: TrainConfig, output_dir: str, processes: int, **overrides):
    """A TRL ``GRPOTrainer`` for ``config``: its model, tasks, env (when it has tools), rewards,
    GRPO and LoRA settings (helpers.ecosystem.trl_bridge.grpo_trainer).

    ``overrides`` are TRL-only GRPOConfig options (where to sample, logging, saving).
    Seeded before the model is built, so the LoRA initialisation is the same whatever the
    number of processes.
    """
    from transformers import set_seed

    from helpers.policy import load_model
    from helpers.ecosystem.trl_bridge import environment_factory, grpo_trainer

    set_seed(config.seed)
    model, tokenizer = load_model(config)
    return grpo_trainer(config, model, tokenizer, training_tasks(config), output_dir, processes,
                        environment=environment_factory(config), **overrides)


def show_rewards(funcs, row: dict) -> None:
    """Score two replies to one task the way TRL will: one in the asked-for format, one lenient."""
    replies = [f"... so the answer is <answer>{row['answer']}</answer>", f"... so the answer is\n#### {row['answer']}"]
    completions = [[{"role": "assistant", "content": r}] for r in replies]
    for f in funcs:
        scores = f(prompts=[row["prompt"]] * 2, completions=completions, answer=[row["answer"]] * 2)
        print(f"  {f.__name__:>14}: tag -> {scores[0]}, '#### N' -> {scores[1]}")


def dry_run(config: TrainConfig, preset: str, output_dir: str, overrides: dict) -> None:
    """Build and print the GRPOConfig, the dataset, the env and the rewards (scoring two replies); train nothing."""
    from helpers.envs import tool_methods
    from helpers.ecosystem.trl_bridge import environment_factory, grpo_config, reward_funcs, trl_dataset

    dataset = trl_dataset(training_tasks(config))
    make_env = environment_factory(config)
    funcs, weights = reward_funcs(config)
    args = grpo_config(config, output_dir, world_size(), multi_turn=make_env is not None, reward_weights=weights, **overrides)
    where = f"vLLM server at {args.vllm_server_host}:{args.vllm_server_port}" if args.use_vllm else "transformers generation"
    print(f"preset {preset} -> TRL GRPOTrainer, {world_size()} training process(es), {where}")
    print(f"model {config.model} ({config.dtype}), LoRA r={config.lora_r} alpha={config.lora_alpha} on {', '.join(config.lora_target_modules)}")
    print(f"dataset: {len(dataset)} rows, columns {dataset.column_names}; first prompt: {dataset[0]['prompt'][-1]['content'][:80]}...")
    if make_env is None:
        print(f"env {config.env}: no tools, single turn")
    elif isinstance(make_env, dict):  # a mix of worlds: TRL's multi-environment form, one factory per environment
        print(f"environments (environment_factory as a dict, each row's 'environment' column picks one): " + "; ".join(
            f"{name}: tools {', '.join(tool_methods(make())) or 'none'}" for name, make in make_env.items()))
    else:
        print(f"env {config.env} -> environment_factory, tools {', '.join(tool_methods(make_env()))}, "
              f"up to {args.max_tool_calling_iterations} tool-calling rounds")
    print(f"rewards: {[f.__name__ for f in funcs]} with weights {args.reward_weights}")
    show_rewards(funcs, dataset[0])
    keys = ["per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "max_completion_length",
            "loss_type", "scale_rewards", "beta", "epsilon", "epsilon_high", "learning_rate", "max_steps", "bf16",
            "use_vllm", "vllm_mode"]
    print("GRPOConfig: " + ", ".join(f"{k}={getattr(args, k)}" for k in keys))


def main(argv: list[str] | None = None) -> int:
    import torch

    from helpers.train import build_parser, env_class_flags
    from helpers.ecosystem.trl_bridge import batch_split

    parser = build_parser()  # --preset and one flag per TrainConfig field, as python -m helpers.train
    parser.prog, parser.description = "scripts/trl_multi_gpu.py", __doc__.split("\n")[0]
    parser.set_defaults(preset="gsm8k-24gb")
    parser.add_argument("--output-dir", default="runs/trl-{preset}", help="where TRL writes; the LoRA adapter at the end")
    parser.add_argument("--generation", choices=["vllm-server", "transformers"], default=None,
                        help="where completions are sampled (default: vllm-server with a GPU, transformers without)")
    parser.add_argument("--vllm-server-host", default="0.0.0.0")
    parser.add_argument("--vllm-server-port", type=int, default=8000)
    parser.add_argument("--dry-run", action="store_true", help="build and print the config, dataset and rewards; train nothing")
    options = vars(parser.parse_args(argv))
    own = {k: options.pop(k) for k in ["output_dir", "generation", "vllm_server_host", "vllm_server_port", "dry_run"]}
    preset = options.pop("preset")
    options.update(env_class_flags(options.pop("env_class", [])))  # --env-class [NAME=]module:Class, as helpers.train reads it
    config = get_preset(preset, **options)
    batch_split(config, world_size())  # before loading anything: a process count that does not fit says which do
    output_dir = own["output_dir"].format(preset=preset)
    generation = own["generation"] or ("vllm-server" if torch.cuda.is_available() else "transformers")
    overrides = generation_options(generation, own["vllm_server_host"], own["vllm_server_port"])
    if config.save_every > 0:  # TRL checkpoints as often as our loop would
        overrides.update(save_strategy="steps", save_steps=config.save_every)

    if own["dry_run"]:
        dry_run(config, preset, output_dir, overrides)
        return 0
    trainer = build_trainer(config, output_dir, world_size(), **overrides)
    trainer.train()
    trainer.save_model(output_dir)  # the LoRA adapter: load it as notebook 07 shows
    return 0


if __name__ == "__main__":
    sys.exit(main())
