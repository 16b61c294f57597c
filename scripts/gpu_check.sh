#!/usr/bin/env bash
# GPU check: the tiny-world training run on a GPU, transformers backend, bf16; records the
# step time and the peak GPU memory next to helpers.memory's prediction for the same config.
#
#     bash scripts/gpu_check.sh                  # on a machine with a CUDA GPU (about a minute)
#     DEVICE=cpu STEPS=3 EVAL_TASKS=8 bash scripts/gpu_check.sh   # on a CPU, float32: checks the plumbing
#
# Writes gpu_check.json (and the run folder) under $OUT, or runs/gpu_check when $OUT is unset.
# Peak memory is torch's max_memory_allocated/reserved for this process; the plan's
# "peak" also counts a rough constant for the CUDA context, shown apart so they compare.
set -euo pipefail
cd "$(dirname "$0")/.."
export OUT_DIR="${OUT:-runs/gpu_check}"
export DEVICE="${DEVICE:-cuda}"
mkdir -p "$OUT_DIR"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "nvidia-smi: not available"

python - <<'PY'
import json, os, statistics, time
from pathlib import Path

import torch

from helpers.config import get_preset
from helpers.memory import TRAINER_OVERHEAD_GIB, GIB, memory_plan
from helpers.notebook import show_versions
from helpers.train import train

show_versions()
device, out = os.environ["DEVICE"], Path(os.environ["OUT_DIR"]).resolve()
if device == "cuda" and not torch.cuda.is_available():
    raise SystemExit("no CUDA GPU here: run with DEVICE=cpu to check the plumbing only")
dtype = "bfloat16" if device == "cuda" else "float32"
steps, eval_tasks = int(os.environ.get("STEPS", 10)), int(os.environ.get("EVAL_TASKS", 64))
config = get_preset("tiny-cpu", device=device, dtype=dtype, steps=steps, eval_every=0, eval_tasks=eval_tasks, pass_k=0,
                    save_every=0, out_dir=str(out / "run"))
gpu_gb = torch.cuda.get_device_properties(0).total_memory / GIB if device == "cuda" else 24.0
plan = memory_plan(config, gpu_gb)
print(plan)

if device == "cuda":
    torch.cuda.reset_peak_memory_stats()
t0 = time.perf_counter()
result = train(config, preset_name="gpu-check")
wall = time.perf_counter() - t0
steps = [m for m in result.history if m["step"] >= 2 and "t_update" in m]  # step 1 includes warm-up (kernels, allocator)
step_s = [m["t_rollout"] + m["t_reward"] + m["t_update"] for m in steps]
record = {
    "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
    "dtype": dtype,
    "torch": torch.__version__,
    "steps": config.steps,
    "median_step_s": statistics.median(step_s),
    "median_rollout_s": statistics.median(m["t_rollout"] for m in steps),
    "median_update_s": statistics.median(m["t_update"] for m in steps),
    "wall_s": wall,
    "measured_peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB if device == "cuda" else None,
    "measured_peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB if device == "cuda" else None,
    "predicted_peak_gib": plan.peak_gib,
    "predicted_peak_without_context_gib": plan.peak_gib - TRAINER_OVERHEAD_GIB,
    "predicted_rows": {name: gib for name, gib, _ in plan.rows},
    "before": result.before,
    "after": result.after,
}
(out / "gpu_check.json").write_text(json.dumps(record, indent=2, default=str))
print(json.dumps({k: v for k, v in record.items() if k != "predicted_rows"}, indent=2, default=str))
PY
