#!/usr/bin/env bash
# The first GPU run, prepared: everything the project can only check on a GPU, in one script, < 10 min.
#
#     bash scripts/gpu_check.sh                                    # on a machine with a CUDA GPU
#     bash scripts/gpu_check.sh --device cpu --steps 2 --backends hf --no-tests   # a CPU: the plumbing only
#
# 1. The tiny world's training run with each backend (transformers, the workbook's engine, vLLM), bf16 where the
#    card has it (else the trainer in float32 and vLLM in float16, as the T4 preset does): the
#    median step time (rollout, update) and the peak memory, beside helpers.lab.memory's prediction
#    for the same config. Two peaks are measured: the trainer process's own (torch's
#    max_memory_reserved) and the whole card's (total - free, read after every step), which
#    also holds vLLM's engine process and what it reserved.
# 2. The vLLM parity tests (tests/test_vllm_engine.py) on CUDA: per-token log-probs of vLLM
#    vs transformers within 1e-4, LoRA versions, seeds, a short training run.
# 3. The memory plan of every GPU preset (GSM8K's four, BFCL multi-turn) against real GRPO updates at
#    the preset's batch shape, on Qwen2.5-1.5B and 0.5B built from their shipped config.json with random weights (no download):
#    scripts/gpu_memory_check.py, one table of planned vs measured GiB, seconds per update, tokens/s.
#    On a CPU it runs the same code on a 1-layer model and a small batch (the code path, not the memory).
# Where vLLM cannot be imported (a GPU image with torch alone and no network), 1 runs without it and 2 is
# skipped; the rest runs, and gpu_check.json says what was skipped and why.
# Writes up to four files under --out (default: $OUT, else runs/gpu_check): gpu_check.json, memory_check.json,
# parity_tests.log (when the parity tests ran) and gpu_check.log (all this script printed); the runs' folders and the Python it ran
# (gpu_check_run.py) go under --runs, so that --out stays a handful of files to bring back from a lent machine.
#
# Options:
#   --device cuda|cpu     where to run (default cuda; cpu checks the plumbing, in float32)
#   --steps N             training steps per backend (default 10; the first is warm-up, not timed)
#   --backends LIST       comma-separated, from hf,engine,vllm (default hf,engine,vllm)
#   --no-tests            skip the parity tests
#   --out DIR             where the four files go
#   --runs DIR            where the runs' folders go (default runs/gpu_check)
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
DEVICE=cuda STEPS=10 BACKENDS=hf,engine,vllm TESTS=1 OUT_DIR="${OUT:-runs/gpu_check}" RUNS_DIR=runs/gpu_check
while [[ $# -gt 0 ]]; do
  case "$1" in
    --device) DEVICE="${2:?--device needs a value}"; shift 2 ;;
    --steps) STEPS="${2:?--steps needs a value}"; shift 2 ;;
    --backends) BACKENDS="${2:?--backends needs a value}"; shift 2 ;;
    --no-tests) TESTS=0; shift ;;
    --out) OUT_DIR="${2:?--out needs a value}"; shift 2 ;;
    --runs) RUNS_DIR="${2:?--runs needs a value}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
[[ "$DEVICE" == cuda || "$DEVICE" == cpu ]] || { echo "--device must be cuda or cpu, got $DEVICE" >&2; exit 2; }
[[ "$STEPS" =~ ^[0-9]+$ && "$STEPS" -ge 2 ]] || { echo "--steps must be an integer >= 2, got $STEPS" >&2; exit 2; }
for b in ${BACKENDS//,/ }; do
  [[ "$b" == hf || "$b" == engine || "$b" == vllm ]] || { echo "--backends: unknown backend $b (choose from hf,engine,vllm)" >&2; exit 2; }
done
mkdir -p "$OUT_DIR" "$RUNS_DIR"
exec > >(tee "$OUT_DIR/gpu_check.log") 2>&1  # the whole output, also where only a tail of it comes back
# The interpreter that holds torch: a venv's `python`; some GPU images have only `python3`.
PY=$(command -v python || command -v python3) || { echo "gpu_check.sh: no python or python3 on PATH" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "nvidia-smi: not available"

# A machine without vLLM (a GPU image with torch alone, and no network to install vLLM's GBs of wheels) still
# checks the rest: the vLLM backend and the parity tests are skipped, and gpu_check.json says why.
VLLM_SKIPPED=""
if [[ ",$BACKENDS," == *,vllm,* || "$TESTS" == 1 ]] && ! "$PY" -c "import vllm" >/dev/null 2>&1; then
  VLLM_SKIPPED="vLLM is not importable here (pip install -e '.[gpu]' on a CUDA machine): its backend and parity tests are skipped"
  echo "$VLLM_SKIPPED"
  BACKENDS=$(tr ',' '\n' <<< "$BACKENDS" | grep -vx vllm | paste -sd, -) || true
  TESTS=0
fi
export DEVICE STEPS BACKENDS OUT_DIR RUNS_DIR VLLM_SKIPPED

# --- 2. the parity tests on this device (run first: a failure here explains a strange number below) ---
TESTS_RC=skipped
if [[ "$TESTS" == 1 ]]; then
  set +e
  timeout 420 "$PY" -m pytest tests/test_vllm_engine.py -q -rA -p no:cacheprovider -o addopts="" > "$OUT_DIR/parity_tests.log" 2>&1
  TESTS_RC=$?
  set -e
  tail -n 5 "$OUT_DIR/parity_tests.log"
fi
export TESTS_RC

# --- 1. the tiny world with each backend; then everything into gpu_check.json ---
# A file, not `python -`: vLLM spawns its engine processes, and spawning re-imports the main script by path.
cat > "$RUNS_DIR/gpu_check_run.py" <<'PY'
import json, os, statistics, time, traceback
from pathlib import Path

import torch

from helpers.config import get_preset
from helpers.lab.memory import GIB, TRAINER_OVERHEAD_GIB, memory_plan
from helpers.notebook import show_versions
from helpers.train import train


class CardMemory:
    """A stand-in for the live curves (``train(live=...)``): after every step, the memory in use
    on the whole card (every process: the trainer and vLLM's engine), in GiB."""

    def __init__(self, on_gpu: bool):
        self.on_gpu, self.peak = on_gpu, 0.0

    def _read(self):
        if self.on_gpu:
            free, total = torch.cuda.mem_get_info()
            self.peak = max(self.peak, (total - free) / GIB)

    def update(self, step, metrics):
        self._read()

    def record(self, step, metrics):
        self._read()

    def save(self, path):
        pass


def main():
    show_versions()
    device, out, runs = os.environ["DEVICE"], Path(os.environ["OUT_DIR"]).resolve(), Path(os.environ["RUNS_DIR"]).resolve()
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: run with --device cpu to check the plumbing only")
    on_gpu = device == "cuda"
    if not on_gpu:
        dtype, vllm_dtype = "float32", None
    elif torch.cuda.is_bf16_supported():
        dtype, vllm_dtype = "bfloat16", None
    else:  # a T4: no bf16; the trainer in float32, vLLM in float16 (the gsm8k-t4 preset's choice)
        dtype, vllm_dtype = "float32", "float16"
    gpu_gb = torch.cuda.get_device_properties(0).total_memory / GIB if on_gpu else 24.0

    record = {"device": torch.cuda.get_device_name(0) if on_gpu else "cpu", "gpu_gib": gpu_gb, "dtype": dtype,
              "vllm_dtype": vllm_dtype or dtype, "torch": torch.__version__, "backends": {}}
    if os.environ["VLLM_SKIPPED"]:
        record["skipped"] = {"vllm": os.environ["VLLM_SKIPPED"]}
    for backend in filter(None, os.environ["BACKENDS"].split(",")):
        config = get_preset("tiny-cpu", device=device, dtype=dtype, vllm_dtype=vllm_dtype, backend=backend,
                            steps=int(os.environ["STEPS"]), eval_every=0, eval_tasks=32, pass_k=0, save_every=0,
                            vllm_gpu_memory_utilization=0.15, out_dir=str(runs / f"run-{backend}"))
        plan = memory_plan(config, gpu_gb)
        print(plan)
        if on_gpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        card = CardMemory(on_gpu)
        t0 = time.perf_counter()
        try:
            result = train(config, preset_name=f"gpu-check-{backend}", live=card)
        except Exception as error:  # one backend's failure must not cost the others' (or the memory check's) numbers
            traceback.print_exc()
            record["backends"][backend] = {"error": repr(error), "traceback": traceback.format_exc()[-4000:]}
            continue
        wall = time.perf_counter() - t0
        steps = [m for m in result.history if m["step"] >= 2 and "t_update" in m]  # step 1: warm-up (kernels, allocator)
        record["backends"][backend] = {
            "steps": config.steps,
            "median_step_s": statistics.median(m["t_rollout"] + m["t_reward"] + m["t_update"] for m in steps),
            "median_rollout_s": statistics.median(m["t_rollout"] for m in steps),
            "median_update_s": statistics.median(m["t_update"] for m in steps),
            "median_rollout_tokens_per_s": statistics.median(m["tokens_per_s"] for m in steps),
            "wall_s": wall,
            "reward_first_last": [result.history[1]["reward"], result.history[-1]["reward"]],
            "trainer_peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB if on_gpu else None,
            "trainer_peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB if on_gpu else None,
            "card_peak_used_gib": card.peak if on_gpu else None,
            "predicted_peak_gib": plan.peak_gib,
            "predicted_peak_without_trainer_context_gib": plan.peak_gib - TRAINER_OVERHEAD_GIB,
            "predicted_rows": {name: gib for name, gib, _ in plan.rows},
            "before": result.before,
            "after": result.after,
        }

    tests_rc = os.environ["TESTS_RC"]
    record["parity_tests"] = {"exit_code": tests_rc}
    if tests_rc != "skipped":
        log = out / "parity_tests.log"
        record["parity_tests"] = {"exit_code": int(tests_rc), "log": str(log), "tail": log.read_text().splitlines()[-15:]}
    (out / "gpu_check.json").write_text(json.dumps(record, indent=2, default=str))
    print(json.dumps({k: v for k, v in record.items() if k != "backends"}, indent=2, default=str))
    for backend, r in record["backends"].items():
        if "error" in r:
            print(f"{backend:>6}: FAILED ({r['error']})")
            continue
        print(f"{backend:>6}: step {r['median_step_s']:.2f} s (rollout {r['median_rollout_s']:.2f}, update {r['median_update_s']:.2f}) | "
              f"peak: trainer {r['trainer_peak_reserved_gib']} GiB, card {r['card_peak_used_gib']} GiB, "
              f"plan {r['predicted_peak_gib']:.2f} GiB")
    for name, why in record.get("skipped", {}).items():
        print(f"{name:>6}: skipped ({why})")
    print(f"wrote {out / 'gpu_check.json'}")
    if any("error" in r for r in record["backends"].values()):
        raise SystemExit(1)


if __name__ == "__main__":  # vLLM starts its engine processes by spawning: they re-import this file
    main()
PY
set +e  # every part runs whatever an earlier one did; the exit code says whether all of them passed
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PY" "$RUNS_DIR/gpu_check_run.py"  # helpers from this clone
BACKENDS_RC=$?

# --- 3. the memory plan against real GRPO updates on Qwen2.5's shapes (random weights) ---
if [[ "$DEVICE" == cuda ]]; then
  MEMORY_ARGS=()
else  # the code path on a 1-layer model: one preset, one update
  MEMORY_ARGS=(--presets gsm8k-t4-tools --updates 1)
fi
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PY" scripts/gpu_memory_check.py --device "$DEVICE" "${MEMORY_ARGS[@]}" \
  --out "$OUT_DIR/memory_check.json"
MEMORY_RC=$?
echo "gpu_check: parity tests ${TESTS_RC}, tiny-world backends ${BACKENDS_RC}, memory check ${MEMORY_RC} (0: passed)"
[[ "$BACKENDS_RC" == 0 && "$MEMORY_RC" == 0 && ("$TESTS_RC" == 0 || "$TESTS_RC" == skipped) ]]
