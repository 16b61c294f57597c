"""The scale-out script for real: TRL + accelerate, two CPU training processes, the tiny worlds.

* The commands the README documents run to the end and save the adapter: GSM8K's smoke
  preset (single turn) and the shop world (multi-turn: TRL's tool loop calls the env's tools).
* Two processes make the same update as one: the same batch (recorded from a one-process
  run, then replayed with each process taking its share) gives the same adapter weights
  after one optimizer step, within 1e-5. That is what ``helpers.ecosystem.trl_bridge.batch_split``
  promises (one step still sees ``tasks_per_step x G`` completions), and what DDP's
  gradient averaging and TRL's loss normaliser must deliver together.
* A process count that does not fit the batch is refused before anything is loaded, with
  the counts that do fit.

Run as a file under ``accelerate launch``, this module is also the driver of the
equality check (``driver`` below): the script's own ``build_trainer``, with TRL's
generation replaced by the recorded batch.
"""

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The command README.md shows for the CPU scale-out run (2 processes, each 1 micro-batch of 2 completions).
README_COMMAND = "accelerate launch --cpu --num_processes 2 scripts/trl_multi_gpu.py --preset gsm8k-cpu-smoke --grad-accum 2"
# The multi-turn one: the shop world through environment_factory, 2 steps of 2 tasks x 2 episodes, one micro-batch per process.
SHOP_COMMAND = ("accelerate launch --cpu --num_processes 2 scripts/trl_multi_gpu.py --preset tiny-agent --steps 2 "
                "--tasks-per-step 2 --num-generations 2 --grad-accum 2")
# A mix of worlds: TRL's dict of environments, each row routed by its environment column; 2 tasks x 2 episodes.
MIX_COMMAND = ("accelerate launch --cpu --num_processes 2 scripts/trl_multi_gpu.py --preset tiny-mix --steps 1 "
               "--tasks-per-step 2 --num-generations 2 --grad-accum 2 --max-train-tasks 12")
# The equality check: the one-call world, multi-turn (the calculator in TRL's tool loop), 4 x G = 4 episodes per step
# in 2 micro-batches. Its reward, plus the length penalty: episodes differ in length, so the batch has a learning signal
# where all are right, and each process's share carries tool replies masked out of the loss (tool_mask).
# lr: Adam's first step moves every weight with a gradient by about lr, and turns float summation-order noise in
# near-zero gradients into weight noise of up to ~lr/1000 (measured: 7.8e-6 at lr=1e-2), so lr = 2e-3 keeps that
# noise well under the 1e-5 tolerance and the step itself 200x above it.
EQUALITY_FLAGS = ["--preset", "tiny-cpu", "--rewards", "correct=1.0,length=1.0", "--tasks-per-step", "4",
                  "--num-generations", "4", "--grad-accum", "2", "--max-total-tokens", "128", "--steps", "1", "--lr", "2e-3",
                  "--save-every", "0"]
TOLERANCE = 1e-5


def load_script():
    spec = importlib.util.spec_from_file_location("trl_multi_gpu", ROOT / "scripts" / "trl_multi_gpu.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def launch(command: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    """Run a command from the repository root, one torch thread per process (2 shared cores)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{shlex.join(command)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def test_the_readme_command_trains_on_two_cpu_processes(tmp_path):
    launch(shlex.split(README_COMMAND) + ["--output-dir", str(tmp_path / "trl")])
    assert (tmp_path / "trl" / "adapter_config.json").exists()  # the LoRA adapter, as notebook 07 loads it


def test_the_shop_world_trains_multi_turn_on_two_cpu_processes(tmp_path):
    out = launch(shlex.split(SHOP_COMMAND) + ["--output-dir", str(tmp_path / "trl")])
    assert (tmp_path / "trl" / "adapter_config.json").exists()
    calls = [float(v) for v in re.findall(r"'tools/call_frequency': '([0-9.e-]+)'", out.stdout + out.stderr)]
    assert calls and max(calls) > 0, "TRL's tool loop made no tool call"


def test_a_mix_of_worlds_trains_on_two_cpu_processes(tmp_path):
    launch(shlex.split(MIX_COMMAND) + ["--output-dir", str(tmp_path / "trl")])
    assert (tmp_path / "trl" / "adapter_config.json").exists()


def test_two_processes_make_the_same_update_as_one(tmp_path):
    import torch

    batch = tmp_path / "batch.pt"
    accelerate = ["accelerate", "launch", "--cpu", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    driver = [str(Path(__file__)), *EQUALITY_FLAGS, "--batch", str(batch)]
    launch(accelerate + ["--num_processes", "1", *driver, "--record", "--weights", str(tmp_path / "one.pt")])
    launch(accelerate + ["--num_processes", "2", *driver, "--weights", str(tmp_path / "two.pt")])

    recorded = torch.load(batch)
    assert recorded["advantages"].abs().sum() > 0  # the batch carries a learning signal (the update is not zero)
    assert (recorded["tool_mask"] == 0).any()  # and tool replies, masked out of the loss
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert one["before"].keys() == two["before"].keys()
    assert all(torch.equal(one["before"][k], two["before"][k]) for k in one["before"])  # same LoRA initialisation
    moved = max((one["after"][k] - one["before"][k]).abs().max().item() for k in one["after"])
    diff = max((one["after"][k] - two["after"][k]).abs().max().item() for k in one["after"])
    print(f"one step: adapter moved up to {moved:.1e}; 1 vs 2 processes differ by at most {diff:.1e}")
    assert moved > 100 * TOLERANCE
    assert diff < TOLERANCE


def test_a_process_count_that_does_not_fit_says_which_do(monkeypatch):
    script = load_script()
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setattr(script, "build_trainer", lambda *a, **k: pytest.fail("loaded before checking the batch split"))
    with pytest.raises(ValueError, match=r"possible process counts: \[1, 2, 4, 8, 16\]"):
        script.main(["--preset", "gsm8k-24gb"])  # 16 micro-batches cannot be shared by 3 processes


# ----------------------------------------------------------------------------------------------
# The driver: run under accelerate launch by test_two_processes_make_the_same_update_as_one
# ----------------------------------------------------------------------------------------------


def driver(argv: list[str]) -> None:
    """One optimizer step of the script's trainer on a fixed batch; rank 0 saves the LoRA weights
    before and after. ``--record`` (one process): sample the batch with TRL and save it.
    Otherwise: load it, and let process r train on its r-th share, as TRL's sampler would split it."""
    import torch

    from helpers.config import get_preset
    from helpers.train import build_parser

    parser = build_parser()
    parser.add_argument("--batch", required=True)
    parser.add_argument("--weights", required=True)
    parser.add_argument("--record", action="store_true")
    args = vars(parser.parse_args(argv))
    batch, weights, record = args.pop("batch"), args.pop("weights"), args.pop("record")
    config = get_preset(args.pop("preset"), **args)
    script = load_script()
    trainer = script.build_trainer(config, str(Path(weights).parent / "trl"), script.world_size(), use_vllm=False)
    rank, processes = trainer.accelerator.process_index, trainer.accelerator.num_processes

    if record:
        assert processes == 1, "record the batch with one process"
        generate_and_score = trainer._generate_and_score_completions

        def recorded(rows):
            out = generate_and_score(rows)
            torch.save(out, batch)
            return out

        trainer._generate_and_score_completions = recorded
    else:
        fixed = torch.load(batch)
        n = len(fixed["advantages"])
        share = n // processes

        def replayed(rows):  # this process's rows of the recorded batch; the global token count stays as it was
            return {k: v[rank * share : (rank + 1) * share] if torch.is_tensor(v) and v.dim() > 0 and len(v) == n else v
                    for k, v in fixed.items()}

        trainer._generate_and_score_completions = replayed

    def lora():
        return {k: p.detach().clone() for k, p in trainer.model.named_parameters() if "lora_" in k}

    before = lora()
    trainer.train()
    if rank == 0:
        torch.save({"before": before, "after": lora()}, weights)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    driver(sys.argv[1:])


def test_the_documented_command_is_the_one_tested():
    """README.md and notebook 07 show the CPU scale-out command this file runs, letter for letter."""
    from helpers.paths import ROOT

    for doc in ("README.md", "notebooks/07_gsm8k_24gb.ipynb"):
        assert README_COMMAND in (ROOT / doc).read_text(), f"{doc} does not show {README_COMMAND!r}"
    for doc in ("README.md", "scripts/trl_multi_gpu.py"):
        assert SHOP_COMMAND in (ROOT / doc).read_text(), f"{doc} does not show {SHOP_COMMAND!r}"
    assert MIX_COMMAND in (ROOT / "scripts" / "trl_multi_gpu.py").read_text()
