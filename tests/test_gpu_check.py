"""scripts/gpu_check.sh's CPU-safe parts, as CI runs them: the tiny world's training path and the memory check's
code path on Qwen2.5's shapes (one layer, random weights), with no network. On a GPU the same script measures."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import ROOT

pytestmark = pytest.mark.slow


def test_gpu_check_cpu_parts_on_a_machine_without_vllm(tmp_path):
    """The default backends (hf, vllm) and parity tests, on a machine where ``import vllm`` fails (a GPU image with
    torch alone, like the lent GPU machines, which cannot install vLLM offline): vLLM is skipped with the reason, the rest runs."""
    hidden = tmp_path / "hide_vllm" / "vllm"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text('raise ImportError("vLLM hidden by the test")\n')
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(hidden.parent)}
    out = tmp_path / "out"
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "--device", "cpu", "--steps", "2", "--out", str(out), "--runs", str(tmp_path / "runs")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((out / "gpu_check.json").read_text())
    assert record["device"] == "cpu" and list(record["backends"]) == ["hf", "engine"]
    assert all(r["steps"] == 2 and r["median_step_s"] > 0 for r in record["backends"].values())
    assert "vLLM is not importable" in record["skipped"]["vllm"] and record["parity_tests"] == {"exit_code": "skipped"}
    assert "vllm: skipped" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json", "gpu_check.log", "memory_check.json"]  # a few files to bring back
    assert "memory check 0" in (out / "gpu_check.log").read_text()  # the whole output is in the log
    (row,) = json.loads((out / "memory_check.json").read_text())
    assert row["preset"] == "gsm8k-t4-tools" and row["measured_allocated_gib"] is None  # a CPU measures no GPU memory
    assert row["seconds_per_update"] > 0 and row["loss"] == row["loss"]  # a real update ran; its loss is a number
    assert "plan GiB" in done.stdout and "gsm8k-t4-tools" in done.stdout  # the table


def test_a_preset_that_fails_costs_no_other_presets_row(tmp_path, monkeypatch, capsys):
    """On a lent GPU every minute counts: a preset that fails (an out-of-memory is a finding too) is a row of its own,
    the other presets are still measured, the rows are written after each preset, and the exit code says one failed."""
    spec = importlib.util.spec_from_file_location("gpu_memory_check", ROOT / "scripts" / "gpu_memory_check.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    def check(preset, device, updates, workdir):
        if preset == "gsm8k-24gb":
            raise RuntimeError("CUDA out of memory (simulated)")
        return {"preset": preset, "batch": "1 x 1 tok / 1 micro", "planned_trainer_gib": 1.0, "planned_without_context_gib": 0.5,
                "measured_allocated_gib": None, "measured_reserved_gib": None, "seconds_per_update": 1.0, "tokens_per_s": 1.0}

    monkeypatch.setattr(script, "check", check)
    out = tmp_path / "rows.json"
    with pytest.raises(SystemExit) as failed:
        script.main(["--device", "cpu", "--presets", "gsm8k-t4,gsm8k-24gb,gsm8k-t4-tools", "--out", str(out)])
    assert failed.value.code == 1
    rows = json.loads(out.read_text())
    assert [r["preset"] for r in rows] == ["gsm8k-t4", "gsm8k-24gb", "gsm8k-t4-tools"] and "out of memory" in rows[1]["error"]
    assert "gsm8k-24gb           FAILED: RuntimeError('CUDA out of memory (simulated)')" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="unknown preset"):
        script.main(["--device", "cpu", "--presets", "gsm8k-t4,no-such-preset"])


def test_shipped_configs_are_qwen25s_shapes():
    """The configs the check builds its models from have the parameter counts of Qwen2.5's model cards."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from helpers.lab.memory import QWEN25

    for name in ("0.5B", "1.5B"):
        config = AutoConfig.from_pretrained(ROOT / "data" / "model_configs" / f"Qwen2.5-{name}-Instruct")
        with torch.device("meta"):  # shapes only, no memory
            model = AutoModelForCausalLM.from_config(config)
        assert sum(p.numel() for p in model.parameters()) == QWEN25[f"Qwen2.5-{name}"].n_params()
        assert config.vocab_size == 151936


def test_the_saved_gpu_run_measured_todays_plan():
    """Notebook 07 and the README set the memory measured on a GPU (``notebooks/runs_saved/gpu_check/``, written by
    scripts/gpu_check.sh) beside the plan. If a preset's batch or the plan's arithmetic changes, that run no longer
    measured what the plan says, and this fails until the script runs on a GPU again."""
    from helpers.lab.memory import memory_plan

    saved = ROOT / "notebooks" / "runs_saved" / "gpu_check"
    card = json.loads((saved / "gpu_check.json").read_text())
    rows = json.loads((saved / "memory_check.json").read_text())
    assert {r["preset"] for r in rows} == {"gsm8k-24gb-tools", "gsm8k-24gb", "gsm8k-t4-tools", "gsm8k-t4", "bfcl-multiturn-24gb"}
    for r in rows:
        plan = memory_plan(r["preset"], gpu_gb=card["gpu_gib"])
        c = plan.config
        assert r["batch"] == f"{c.tasks_per_step * c.num_generations} x {c.max_total_tokens} tok / {c.grad_accum} micro", r["preset"]
        assert (r["dtype"], r["planned_trainer_gib"]) == (c.dtype, pytest.approx(plan.trainer_gib, abs=1e-9)), r["preset"]
