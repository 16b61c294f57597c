"""kill -9 during a checkpoint save never leaves a run that cannot resume.

A real training process (``python -m helpers.train``) is killed with SIGKILL at three
moments of saving its second checkpoint: half-way through writing ``trainer_state.pt``,
after every file is written but before the rename, and right after the rename. Each time
``--resume true`` must start from a complete checkpoint and end with exactly the adapter
of a run that was never killed.

The kill comes from inside the process (a patched function sends SIGKILL to itself), so
it lands at a known point of the save; nothing the process could clean up runs after it.
"""

import os
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from helpers.checkpoint import latest_checkpoint
from helpers.paths import ROOT

ARGS = ["--preset", "tiny-cpu", "--steps", "4", "--tasks-per-step", "2", "--num-generations", "4",
        "--max-new-tokens", "16", "--max-total-tokens", "128", "--eval-tasks", "2", "--pass-k", "0",
        "--eval-every", "0", "--save-every", "2", "--log-trajectories-every", "0",
        "--rewards", "correct=1.0,length=1.0", "--lr", "1e-3"]

# Python run in the training process before main(): make one function of the save kill the process.
KILL_AT = {
    # torch.save of step 4's trainer_state.pt writes half of its bytes, then the process dies
    "mid-file": """
real = torch.save
def save(obj, path, *a, **k):
    if grpo.step_being_saved() == 4:
        import io; buf = io.BytesIO(); real(obj, buf)
        open(path, "wb").write(buf.getvalue()[: len(buf.getvalue()) // 2]); die()
    return real(obj, path, *a, **k)
checkpoint.torch.save = save
""",
    # every file of checkpoint-4 written and flushed, not yet renamed into place
    "before-rename": """
real = checkpoint._fsync_tree
def fsync_tree(folder):
    real(folder)
    if folder.name.startswith("checkpoint-4"): die()
checkpoint._fsync_tree = fsync_tree
""",
    # renamed into place; the older checkpoints not yet pruned
    "after-rename": """
real = checkpoint._fsync
def fsync(path):
    real(path)
    if (path / "checkpoint-4").is_dir(): die()
checkpoint._fsync = fsync
""",
}

DRIVER = """
import os, signal, sys, torch
import helpers.checkpoint as checkpoint
import helpers.grpo as grpo
def die(): os.kill(os.getpid(), signal.SIGKILL)
_save = grpo.LoRAGRPO.save_checkpoint
def save_checkpoint(self, directory, extra_state=None):
    grpo.step_being_saved = lambda: self.step
    return _save(self, directory, extra_state)
grpo.LoRAGRPO.save_checkpoint = save_checkpoint
grpo.step_being_saved = lambda: None
{patch}
from helpers.train import main
main(sys.argv[1:])
"""


def train(out_dir, *extra, patch=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WORKBOOK_SMOKE": "1"}
    code = DRIVER.format(patch=patch) if patch else "from helpers.train import main; import sys; main(sys.argv[1:])"
    return subprocess.run([sys.executable, "-c", code, *ARGS, "--out-dir", str(out_dir), *extra], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def adapter(run_dir):
    return load_file(run_dir / "checkpoint-4" / "adapter_model.safetensors")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight")
    done = train(run_dir)
    assert done.returncode == 0, done.stderr[-2000:]
    return adapter(run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("moment", list(KILL_AT))
def test_kill_during_save_then_resume_matches_the_uninterrupted_run(tmp_path, uninterrupted, moment):
    killed = train(tmp_path, patch=KILL_AT[moment])
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    expected = "checkpoint-4" if moment == "after-rename" else "checkpoint-2"
    assert latest_checkpoint(tmp_path).name == expected  # a half-written save is never taken for a checkpoint

    resumed = train(tmp_path, "--resume", "true")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from {tmp_path.name}/{expected}" in resumed.stdout
    got = adapter(tmp_path)
    assert got.keys() == uninterrupted.keys() and all(torch.equal(got[k], uninterrupted[k]) for k in got)
    assert not [p.name for p in tmp_path.glob("checkpoint-*.tmp-*")]  # leftovers of the killed save are cleaned up
