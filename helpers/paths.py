"""Where things live in the repository, so that code and notebooks never guess.

Notebooks run from ``notebooks/``, the CLI from the repository root, tests from
anywhere: all of them find data through these paths.

Simplification: ``ROOT`` is found from this file's location, which is the
repository root for the editable install the README uses (``pip install -e .``).
A non-editable install puts ``helpers`` in site-packages, where ``data/`` does
not exist; the workbook is meant to be used from a clone.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository root
DATA = ROOT / "data"  # small files the project ships
TINY_DIR = DATA / "tiny"  # the tiny world's model and tokenizer
GSM8K_SAMPLE = DATA / "gsm8k_sample.jsonl"  # ~50 GSM8K-format problems written for the workbook
NOTEBOOKS = ROOT / "notebooks"
RUNS = ROOT / "runs"  # training output (git-ignored)


def in_repo(path: str | Path) -> Path:
    """``path`` as the workbook reads it: a relative path is relative to the repository root, wherever Python
    was started (a notebook in ``notebooks/``, a server process); an absolute one is kept."""
    path = Path(path)
    return path if path.is_absolute() else ROOT / path
