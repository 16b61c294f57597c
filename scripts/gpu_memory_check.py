"""The memory plan against real GRPO steps, with no download: Qwen2.5 built from its configuration alone.

    python scripts/gpu_memory_check.py                      # on a GPU: every GPU preset at its own batch shape
    python scripts/gpu_memory_check.py --device cpu         # a CPU: the same code path on a 1-layer model, small batch

A lent GPU machine reaches no model hub, so the check cannot load Qwen2.5's weights. It does not need them:
memory depends on the shapes, not the values. ``data/model_configs/<model>/config.json`` is each model's
``config.json`` from the hub (the same vocabulary of 151,936, so the logits' memory is real);
``AutoModelForCausalLM.from_config`` builds the model with random weights on the card. Each GPU preset's
(GSM8K's four, BFCL multi-turn) trainer (``LoRAGRPO``: LoRA, gradient checkpointing, chunked log-probs, its micro-batches) then runs real
GRPO updates on a batch of the preset's shape: ``tasks_per_step * num_generations`` episodes, each padded to
``max_total_tokens`` as the plan assumes, with half of each group paid, so every advantage is non-zero.

It prints one table: the plan's training phase (``helpers.lab.memory.memory_plan``, the trainer's own terms:
weights, LoRA state, activations, logits, and its CUDA context and slack) beside what torch measured (the peak
allocated, and the peak reserved by its allocator), the seconds per update and the tokens per second.
The vLLM terms are not measured here (``scripts/gpu_check.sh`` runs vLLM on the tiny world); there the
plan's rows, vLLM's among them, are set beside the whole card's measured peak.

Simplifications, named: the episodes are random token ids (attention and the MLP cost the same for any
ids); their sampling log-probs are those of a uniform policy, about what random weights give (the ratio
is near 1; its value does not change the memory); the first update is a warm-up (CUDA kernels, the allocator), the
median of the rest is reported. On a CPU (``--device cpu``) the model keeps one decoder layer and the batch
shrinks to 2 episodes of 64 tokens: it checks the code path in seconds, not the memory (the table's
"measured" columns are then empty).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

import helpers.worlds  # noqa: F401  (registers the GPU presets)
from helpers.config import get_preset
from helpers.data import Task
from helpers.grpo import LoRAGRPO
from helpers.lab.memory import GIB, TRAINER_OVERHEAD_GIB, memory_plan
from helpers.paths import ROOT
from helpers.rollout import Trajectory

CONFIGS = ROOT / "data" / "model_configs"  # each model's config.json, copied from the hub
PRESETS = ["gsm8k-24gb-tools", "gsm8k-24gb", "gsm8k-t4-tools", "gsm8k-t4", "bfcl-multiturn-24gb"]
PRESET_COLUMN = max(map(len, PRESETS)) + 2  # the table's preset column
PROMPT_TOKENS = 256  # the leading tokens of each episode that the policy did not write (mask 0), at most half


def model_folder(model: str, device: str, workdir: Path) -> Path:
    """The folder of ``model``'s shipped config.json; on a CPU a copy with one decoder layer."""
    folder = CONFIGS / model.split("/")[-1]
    if not (folder / "config.json").exists():
        raise SystemExit(f"no shipped configuration for {model}: expected {folder / 'config.json'}")
    if device == "cuda":
        return folder
    config = json.loads((folder / "config.json").read_text())
    small = workdir / f"{folder.name.replace('Qwen2.5', 'qwen25')}-1-layer"  # a name helpers.lab.memory does not take for the full model
    small.mkdir(exist_ok=True)
    (small / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1, "max_window_layers": 1}))
    return small


def batch_of(config, vocab: int, seed: int) -> list[Trajectory]:
    """``tasks_per_step * G`` episodes of ``max_total_tokens`` random tokens; half of each group paid."""
    generator = torch.Generator().manual_seed(seed)
    length, uniform = config.max_total_tokens, -torch.log(torch.tensor(float(vocab))).item()
    prompt = min(PROMPT_TOKENS, length // 2)
    episodes = []
    for t in range(config.tasks_per_step):
        task = Task(id=f"memory-{t}", prompt=[{"role": "user", "content": "?"}], answer=None)
        for g in range(config.num_generations):
            ids = torch.randint(0, vocab, (length,), generator=generator).tolist()  # (T,)
            generated = length - prompt
            episodes.append(Trajectory(task=task, group=g, token_ids=ids, mask=[0] * prompt + [1] * generated,
                                       logprobs=[0.0] * prompt + [uniform] * generated, prompt_len=prompt,
                                       reward=float(g % 2)))
    return episodes


def check(preset: str, device: str, updates: int, workdir: Path) -> dict:
    config = get_preset(preset)
    folder = model_folder(config.model, device, workdir)
    if device == "cpu":  # the code path only: a small batch, float32
        config = replace(config, device="cpu", dtype="float32", tasks_per_step=1, num_generations=2, grad_accum=1,
                         max_total_tokens=64)
    config = replace(config, model=str(folder), device=device)
    plan = memory_plan(config, gpu_gb=torch.cuda.get_device_properties(0).total_memory / GIB if device == "cuda" else 24.0)

    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[config.dtype]
    with torch.device(device):  # random weights, built where they will live
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=dtype)
    trainer = LoRAGRPO(model, config)
    seconds = []
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    for u in range(updates):
        episodes = batch_of(config, model.config.vocab_size, seed=u)
        t0 = time.perf_counter()
        stats = trainer.train_step(episodes)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
    tokens = config.tasks_per_step * config.num_generations * config.max_total_tokens * config.num_iterations
    per_update = statistics.median(seconds[1:]) if len(seconds) > 1 else seconds[0]
    row = {
        "preset": preset, "model": config.model, "dtype": config.dtype,
        "batch": f"{config.tasks_per_step * config.num_generations} x {config.max_total_tokens} tok / {config.grad_accum} micro",
        "planned_trainer_gib": plan.trainer_gib,
        "planned_without_context_gib": plan.trainer_gib - TRAINER_OVERHEAD_GIB,
        "measured_allocated_gib": torch.cuda.max_memory_allocated() / GIB if device == "cuda" else None,
        "measured_reserved_gib": torch.cuda.max_memory_reserved() / GIB if device == "cuda" else None,
        "seconds_per_update": per_update, "tokens_per_s": tokens / per_update, "loss": stats.get("loss"),
    }
    del trainer, model
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def table(rows: list[dict]) -> str:
    def gib(value):
        return f"{value:.2f}" if value is not None else "-"

    lines = [f"{'preset':<{PRESET_COLUMN}}{'batch':<28}{'plan GiB':>9}{'plan-ctx':>9}{'alloc':>8}{'reserved':>9}{'s/update':>9}{'tok/s':>9}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['preset']:<{PRESET_COLUMN}}FAILED: {r['error'][:150]}")
            continue
        lines.append(f"{r['preset']:<{PRESET_COLUMN}}{r['batch']:<28}{gib(r['planned_trainer_gib']):>9}{gib(r['planned_without_context_gib']):>9}"
                     f"{gib(r['measured_allocated_gib']):>8}{gib(r['measured_reserved_gib']):>9}{r['seconds_per_update']:>9.2f}"
                     f"{r['tokens_per_s']:>9.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python scripts/gpu_memory_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: the code path on a 1-layer model")
    parser.add_argument("--presets", default=",".join(PRESETS), help="comma-separated GPU presets")
    parser.add_argument("--updates", type=int, default=3, help="GRPO updates per preset (the first is a warm-up)")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: run with --device cpu to check the code path only")
    if args.updates < 1:
        raise SystemExit(f"--updates must be >= 1, got {args.updates}")
    presets = args.presets.split(",")
    for preset in presets:  # an unknown name fails here, before any model is built
        try:
            get_preset(preset)
        except KeyError as error:
            raise SystemExit(error.args[0]) from None
    rows = []
    print(table([]), flush=True)  # the header; each preset's row follows as it is measured, then the whole table
    with tempfile.TemporaryDirectory() as workdir:
        for preset in presets:
            try:
                rows.append(check(preset, args.device, args.updates, Path(workdir)))
            except Exception as error:  # one preset's failure (an out-of-memory is a finding too) must not cost the others' rows
                traceback.print_exc()
                rows.append({"preset": preset, "error": repr(error)})
            gc.collect()  # the failed preset's model and trainer, held by the traceback until here
            if args.device == "cuda":
                torch.cuda.empty_cache()
            print(table(rows[-1:]).splitlines()[-1], flush=True)
            if args.out:  # after every preset: a run stopped at its time limit keeps the rows it has
                Path(args.out).write_text(json.dumps(rows, indent=2))
    print(table(rows))
    if any("error" in r for r in rows):
        raise SystemExit(1)
    return rows


if __name__ == "__main__":
    main()
