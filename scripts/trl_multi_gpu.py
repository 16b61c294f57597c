"""Scaling out: the workbook's GSM8K data, rewards and presets driving TRL's GRPOTrainer on several GPUs.

Our own loop (helpers.train) is one process on one card. When you outgrow that, do not
grow it into a distributed trainer: hand the same pieces to TRL, whose GRPOTrainer
already runs on many GPUs with accelerate (DDP, DeepSpeed, FSDP) and samples with a
vLLM *server* on cards of its own. The pieces that carry over unchanged:

    dataset   helpers.train.load_tasks(config) -> {"prompt": chat messages, "answer": "18"} rows
    rewards   helpers.rewards.to_trl_reward_func("correct"), ("format") with weight 0: logged only
    settings  the preset's TrainConfig -> GRPOConfig (same loss, clip range, beta, lr, G, LoRA)

Run it (here: 4 GPUs; GPU 0 samples, GPUs 1-3 train):

    CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model Qwen/Qwen2.5-1.5B-Instruct --max-model-len 768 &
    CUDA_VISIBLE_DEVICES=1,2,3 accelerate launch --num_processes 3 scripts/trl_multi_gpu.py --preset gsm8k-24gb

    python scripts/trl_multi_gpu.py --preset gsm8k-24gb --dataset gsm8k-sample --dry-run   # CPU: build, print, train nothing

How the two sides differ from our single-card backend (helpers.policy.vllm): the server
holds a full copy of the weights on its own card, so nothing sleeps; after each update
TRL merges the LoRA adapter into the weights it sends over NCCL (no LoRARequest).

Batch sizes: one optimizer step still sees ``tasks_per_step * num_generations``
completions. The preset's ``grad_accum`` micro-batches are spread over the training
processes: each process runs ``grad_accum / world_size`` of them (world size must divide
grad_accum). Evaluation is not run here: evaluate the saved adapter with
helpers.evaluate as notebook 07 does (same tasks, same env, same numbers).

Not run in CI: it needs GPUs and the hub. ``--dry-run`` is tested on CPU
(tests/test_gsm8k.py): it builds the GRPOConfig, the dataset and the reward functions,
scores two hand-written replies with them, and prints all of it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file from anywhere in a clone

from helpers.config import PRESETS, TrainConfig, get_preset  # noqa: E402

TRAIN_REWARD = "correct"  # what GRPO optimises: lenient correctness (the preset's rewards)
LOGGED_ONLY = ("format",)  # weight 0: TRL logs rewards/format/mean (strict-format rate), the policy is not paid for it


def world_size() -> int:
    """Training processes: accelerate launch sets WORLD_SIZE; a plain python run is 1."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def batch_split(config: TrainConfig, processes: int) -> tuple[int, int]:
    """(sequences per micro-batch, micro-batches per process) for one optimizer step of
    ``tasks_per_step * num_generations`` completions shared by ``processes`` trainers."""
    if config.grad_accum % processes:
        raise ValueError(f"{processes} training processes must divide grad_accum={config.grad_accum}: each runs an equal share of the micro-batches")
    return config.tasks_per_step * config.num_generations // config.grad_accum, config.grad_accum // processes


def grpo_config(config: TrainConfig, output_dir: str, server_host: str, server_port: int, processes: int):
    """The preset's settings as a TRL GRPOConfig in vLLM server mode."""
    import torch
    from trl import GRPOConfig

    micro_batch, accumulation = batch_split(config, processes)
    on_gpu = torch.cuda.is_available()
    return GRPOConfig(
        output_dir=output_dir,
        # the optimizer step: tasks_per_step x G completions, as in helpers.train
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=accumulation,
        num_generations=config.num_generations,
        max_completion_length=config.max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        max_steps=config.steps,
        # the loss: the same names and values as helpers.grpo
        loss_type=config.loss_type,
        scale_rewards=config.scale_rewards,
        beta=config.beta,
        epsilon=config.epsilon_low,
        epsilon_high=config.epsilon_high,
        num_iterations=config.num_iterations,
        reward_weights=[1.0] + [0.0] * len(LOGGED_ONLY),
        # the optimizer
        learning_rate=config.lr,
        warmup_steps=config.warmup_steps,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        lr_scheduler_type="linear",
        activation_checkpointing=config.gradient_checkpointing,  # transformers 5's name for gradient checkpointing
        bf16=on_gpu and config.dtype == "bfloat16",
        model_init_kwargs={"dtype": config.dtype},
        use_cpu=not on_gpu,
        seed=config.seed,
        # sampling on the vLLM server (trl vllm-serve), not on the training cards
        use_vllm=True,
        vllm_mode="server",
        vllm_server_host=server_host,
        vllm_server_port=server_port,
        # logging and checkpoints
        logging_steps=1,
        log_completions=True,
        save_steps=config.save_every,
        report_to=config.report_to or "none",
    )


def peft_config(config: TrainConfig):
    from peft import LoraConfig

    return LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=list(config.lora_target_modules), task_type="CAUSAL_LM")


def trl_dataset(tasks):
    """Tasks as TRL rows: the chat prompt, and the answer as a column TRL passes to the reward functions."""
    from datasets import Dataset

    return Dataset.from_list([{"prompt": t.prompt, "answer": t.answer, "id": t.id} for t in tasks])


def reward_funcs():
    from helpers.rewards import to_trl_reward_func

    return [to_trl_reward_func(TRAIN_REWARD)] + [to_trl_reward_func(name) for name in LOGGED_ONLY]


def show_rewards(funcs, row: dict) -> None:
    """Score two replies to one task the way TRL will: one in the asked-for format, one lenient."""
    replies = [f"... so the answer is <answer>{row['answer']}</answer>", f"... so the answer is\n#### {row['answer']}"]
    completions = [[{"role": "assistant", "content": r}] for r in replies]
    for f in funcs:
        scores = f(prompts=[row["prompt"]] * 2, completions=completions, answer=[row["answer"]] * 2)
        print(f"  {f.__name__:>14}: tag -> {scores[0]}, '#### N' -> {scores[1]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="gsm8k-24gb", choices=sorted(PRESETS))
    parser.add_argument("--dataset", default=None, help="override the preset's dataset (gsm8k-sample needs no hub)")
    parser.add_argument("--output-dir", default="runs/trl-{preset}")
    parser.add_argument("--vllm-server-host", default="0.0.0.0")
    parser.add_argument("--vllm-server-port", type=int, default=8000)
    parser.add_argument("--dry-run", action="store_true", help="build and print the config, dataset and rewards; train nothing")
    args = parser.parse_args(argv)

    from helpers.train import load_tasks

    config = get_preset(args.preset, **({"dataset": args.dataset} if args.dataset else {}))
    output_dir = args.output_dir.format(preset=args.preset)
    train_tasks, _ = load_tasks(config)  # the held-out tasks are for helpers.evaluate afterwards
    dataset = trl_dataset(train_tasks)
    funcs = reward_funcs()
    args_trl = grpo_config(config, output_dir, args.vllm_server_host, args.vllm_server_port, world_size())

    if args.dry_run:
        print(f"preset {args.preset} -> TRL GRPOTrainer, {world_size()} training process(es), vLLM server at "
              f"{args.vllm_server_host}:{args.vllm_server_port}")
        print(f"model {config.model} ({config.dtype}), LoRA r={config.lora_r} alpha={config.lora_alpha} on {', '.join(config.lora_target_modules)}")
        print(f"dataset: {len(dataset)} rows, columns {dataset.column_names}; first prompt: {dataset[0]['prompt'][-1]['content'][:80]}...")
        print(f"rewards: {[f.__name__ for f in funcs]} with weights {args_trl.reward_weights}")
        show_rewards(funcs, dataset[0])
        keys = ["per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "max_completion_length",
                "loss_type", "scale_rewards", "beta", "epsilon", "epsilon_high", "learning_rate", "max_steps",
                "activation_checkpointing", "bf16", "use_vllm", "vllm_mode"]
        print("GRPOConfig: " + ", ".join(f"{k}={getattr(args_trl, k)}" for k in keys))
        return 0

    from trl import GRPOTrainer

    trainer = GRPOTrainer(model=config.model, reward_funcs=funcs, args=args_trl, train_dataset=dataset,
                          peft_config=peft_config(config))
    trainer.train()
    trainer.save_model(output_dir)  # the LoRA adapter: load it as notebook 07 shows
    return 0


if __name__ == "__main__":
    sys.exit(main())
