"""The run folder on disk: checkpoints (save, load, checksums, damage), the RNG state, the lock, the resume check.

    write_checkpoint(run_dir / "checkpoint-20", model, state)   # atomic: a tmp folder, flushed, renamed into place
    latest_checkpoint(run_dir)                                  # the newest complete one, or None
    checkpoint_damage(run_dir / "checkpoint-20")                # why it cannot be trusted, or None
    with run_folder_lock(run_dir): ...                          # one run per folder
    resumable_checkpoint(run_dir, config)                       # the one a resumed run continues from

A checkpoint folder holds the adapter (peft's format, loadable by ``PeftModel.from_pretrained`` and vLLM), the
trainer's state (optimizer, scheduler, RNG, counters, the loop's own position) and the sha256 of every other file.
``helpers.grpo.LoRAGRPO`` saves and loads through this module; ``helpers.loop`` keeps the folder's other files.

Taught in notebooks/06_training_loop.ipynb.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import re
import shutil
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from helpers.config import TrainConfig
from helpers.paths import in_repo

ADAPTER = "adapter_model.safetensors"  # what peft's save_pretrained writes
TRAINER_STATE = "trainer_state.pt"  # optimizer, scheduler, RNG, step, extra state (next to the adapter files)
CHECKSUMS = "checksums.json"  # sha256 of every other file of the checkpoint, written with it
CHECKPOINT_FILES = (ADAPTER, TRAINER_STATE, CHECKSUMS)
CHECKPOINT_NAME = re.compile(r"checkpoint-\d+")  # what write_checkpoint renames into place; "checkpoint-20.tmp-..." is not one
KEEP_CHECKPOINTS = 2  # older checkpoint folders are deleted (a GSM8K adapter with its AdamW moments is hundreds of MB)
TRAJECTORY_DIR, EVAL_DIR = "trajectories", "eval"  # the run folder's sub-folders of episodes
# Fields a resumed run may change: they decide where and what is logged, saved and evaluated, or how many
# cores compute it, not what is trained (a run folder copied to another machine resumes there). An evaluation
# setting changed on resume applies from then on: the evaluation before training stays as it was measured.
RESUME_FREE = ("resume", "out_dir", "report_to", "save_every", "log_trajectories_every", "torch_threads", "log_kl",
               "eval_every", "eval_tasks", "eval_subset", "pass_k")
# Fields a resumed run may raise: more steps continue the run, the learning-rate schedule re-planned for the new
# total from the step reached (helpers.loop.replan_schedule). Fewer would end a run its schedule did not plan for.
RESUME_GROWS = ("steps",)


class ResumeError(ValueError):
    """A run cannot be resumed as asked (its settings differ from the run it would continue)."""


class RunFolderBusy(RuntimeError):
    """Another run holds the run folder."""


# ----------------------------------------------------------------------------------------------
# One checkpoint folder
# ----------------------------------------------------------------------------------------------


def rng_state() -> dict:
    """Every random generator a training step touches (LoRA dropout, data shuffles, sampling)."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def write_checkpoint(directory: str | Path, model, state: dict) -> Path:
    """Write ``model``'s adapter and ``state`` (with the RNG state added) into ``directory``, atomically.

    Everything is written into ``<directory>.tmp-<pid>``, flushed to disk, then renamed to ``directory`` in
    one step: a process killed at any moment leaves either the old checkpoint or the new one, never a
    half-written file that a resume would trip over (``checkpoints`` ignores leftover ``.tmp-`` folders).
    The sha256 of every file goes with it (``checksums.json``), so damage done later (a disk error, a file
    copied over) is found by ``checkpoint_damage`` before the checkpoint is loaded.
    """
    directory = Path(directory)
    temporary = directory.with_name(f"{directory.name}.tmp-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir(parents=True)
    model.save_pretrained(temporary)
    torch.save({**state, "rng": rng_state()}, temporary / TRAINER_STATE)
    (temporary / CHECKSUMS).write_text(json.dumps(file_checksums(temporary), indent=1))
    _fsync_tree(temporary)
    if directory.exists():  # saving the same step twice: move the old one aside, then drop it
        stale = directory.with_name(f"{directory.name}.old-{os.getpid()}")
        directory.rename(stale)
        temporary.rename(directory)
        shutil.rmtree(stale, ignore_errors=True)
    else:
        temporary.rename(directory)
    _fsync(directory.parent)  # the rename itself
    return directory


def read_checkpoint(directory: str | Path, model, device: torch.device | str) -> dict:
    """Load a checkpoint's adapter into ``model`` and restore its RNG state; return the state ``write_checkpoint`` saved."""
    from peft import set_peft_model_state_dict  # peft is imported where an adapter is handled: a command's refusals need none

    directory = Path(directory)
    missing = [name for name in CHECKPOINT_FILES if not (directory / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{directory} is not a complete checkpoint (no {missing[0]})")
    set_peft_model_state_dict(model, load_file(directory / ADAPTER, device=str(device)))
    state = torch.load(directory / TRAINER_STATE, map_location="cpu", weights_only=False)  # our own file
    set_rng_state(state["rng"])
    return state


def file_checksums(folder: Path) -> dict[str, str]:
    """sha256 of every file in ``folder`` except the checksum file itself: name -> hex digest."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.is_file() and p.name != CHECKSUMS}


def checkpoint_damage(directory: str | Path) -> str | None:
    """Why the checkpoint in ``directory`` cannot be trusted (a file missing, changed or added since
    it was saved), or None when every file matches the checksums written with it."""
    directory = Path(directory)
    try:
        saved = json.loads((directory / CHECKSUMS).read_text())
    except (OSError, ValueError) as e:
        return f"its {CHECKSUMS} cannot be read ({type(e).__name__})"
    now = file_checksums(directory)
    for name in sorted(set(saved) | set(now)):
        if name not in now:
            return f"{name} is missing"
        if saved.get(name) != now[name]:
            return f"{name} does not match its checksum" if name in saved else f"{name} was not part of it"
    return None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    """Flush every file of ``folder``, and the folder itself, to disk (a rename is only as
    durable as what it renames)."""
    for path in [*folder.iterdir(), folder]:
        _fsync(path)


# ----------------------------------------------------------------------------------------------
# The run folder
# ----------------------------------------------------------------------------------------------


def checkpoints(out_dir: str | Path) -> list[Path]:
    """The complete ``checkpoint-<step>`` folders under out_dir, newest first.

    Complete means renamed into place by ``write_checkpoint`` (a save killed half-way
    leaves only a ``.tmp-`` folder, which is ignored) with all of its files present.
    """
    done = [p for p in Path(out_dir).glob("checkpoint-*")
            if CHECKPOINT_NAME.fullmatch(p.name) and all((p / name).is_file() for name in CHECKPOINT_FILES)]
    return sorted(done, key=lambda p: int(p.name.split("-")[-1]), reverse=True)


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint under out_dir, or None (``checkpoints``; not yet verified)."""
    return next(iter(checkpoints(out_dir)), None)


def run_dir_for(config: TrainConfig, preset_name: str | None) -> Path:
    """The run folder ``config.out_dir`` names, with the preset and seed filled in, relative to the repository root."""
    return in_repo(config.out_dir.format(preset=preset_name or "custom", seed=config.seed))


def clear_run_dir(run_dir: Path) -> None:
    """A fresh (non-resumed) run replaces what an earlier run wrote in the same folder."""
    for name in ["metrics.jsonl", "summary.json", "curves.png", "config.json"]:
        (run_dir / name).unlink(missing_ok=True)
    for folder in [run_dir / TRAJECTORY_DIR, run_dir / EVAL_DIR, *run_dir.glob("checkpoint-*")]:
        shutil.rmtree(folder, ignore_errors=True)


def save_checkpoint(trainer, run_dir: Path, step: int, extra_state: dict) -> None:
    """Save this step's checkpoint (``trainer.save_checkpoint``, atomic), then delete all but the newest
    ``KEEP_CHECKPOINTS`` (and any ``.tmp-`` folder a killed save left behind)."""
    trainer.save_checkpoint(run_dir / f"checkpoint-{step}", extra_state=extra_state)
    folders = list(run_dir.glob("checkpoint-*"))
    done = sorted((p for p in folders if CHECKPOINT_NAME.fullmatch(p.name)), key=lambda p: int(p.name.split("-")[-1]))
    for old in done[:-KEEP_CHECKPOINTS] + [p for p in folders if not CHECKPOINT_NAME.fullmatch(p.name)]:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def run_folder_lock(run_dir: Path):
    """Hold an exclusive lock on ``run_dir`` (``run_dir/.lock``, ``fcntl.flock``) while the block runs.

    The operating system releases it when the process ends, however it ends (``kill -9`` too), so a
    lock is never left behind; a second run on the folder raises ``RunFolderBusy`` at once.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise RunFolderBusy(f"{run_dir} is in use by another run ({handle.read().strip() or 'a process'}); "
                                "wait for it to end, or give this run another out_dir") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        yield


def resumable_checkpoint(run_dir: Path, config: TrainConfig) -> Path | None:
    """The checkpoint a resumed run continues from: the newest one whose files match their checksums
    (a damaged newest one is reported and the one before it taken), or None when there is none.

    Raises ``ResumeError`` when ``config`` differs from the run's own (``config.json``) in a field
    that changes what is trained (all but ``RESUME_FREE``, and ``RESUME_GROWS`` raised): the restored
    optimizer, scheduler and adapter belong to the old settings, so continuing with new ones would train
    something no config describes. The message names every field that differs.
    """
    for candidate in checkpoints(run_dir):
        damage = checkpoint_damage(candidate)
        if damage is None:
            break
        print(f"resume: {candidate.name} is damaged ({damage}); falling back to the checkpoint before it", flush=True)
    else:
        print(f"resume: no intact checkpoint in {run_dir}, starting from scratch", flush=True)
        return None
    if not (run_dir / "config.json").is_file():
        raise ResumeError(f"resume: {run_dir} has checkpoints but no config.json, so its settings are unknown; start a new run")
    saved = saved_config(run_dir, config)
    now = json.loads(json.dumps(asdict(config)))  # as config.json holds it (tuples as lists)
    changed = [f"{name} {saved.get(name)!r} -> {value!r}" for name, value in now.items()
               if name not in RESUME_FREE and saved.get(name) != value
               and not (name in RESUME_GROWS and value > saved.get(name))]
    if changed:
        raise ResumeError(f"resume: {run_dir.name} was trained with other settings ({'; '.join(changed)}); "
                          "resume with the run's own settings, or start a new run in another out_dir")
    return candidate


def saved_config(run_dir: Path, config: TrainConfig) -> dict:
    """The run's own settings (its ``config.json``); a field added to the config after the run was saved is the
    value the run used, what is now its default."""
    saved = json.loads((run_dir / "config.json").read_text())
    return {**json.loads(json.dumps(asdict(type(config)()))), **saved}
