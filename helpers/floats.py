"""Denormal floats, flushed to zero: a slow path of the CPU that attention walks into.

    from helpers.floats import flush_denormals
    flush_denormals()          # once, at the start of a process, before torch starts its threads

A float32 holds numbers down to 1.2e-38 with full precision. Below that, down to 1.4e-45, it keeps
going with fewer and fewer digits: these are the *denormal* (subnormal) numbers. Many CPUs, Intel's
among them, compute with them on a slow path, up to tens of times slower per operation than with ordinary floats.

Attention makes them. A softmax over a row of scores gives the positions that score ~90 below the
best a probability of about ``exp(-90) = 8e-40``: a denormal. Every product that reads those
probabilities, the product with the values and, in training, the backward pass, then runs slowly.

Flushing sets two bits of the CPU's float control register: denormal *results* become 0 (FTZ) and
denormal *inputs* are read as 0 (DAZ). ``torch.set_flush_denormal(True)`` sets them. A probability of
8e-40 then counts as 0, which changes a sum of probabilities that add up to 1 by less than float32 can
show: the main job's figures (``python -m helpers.train --preset tiny-agent``) are the same with and
without it, and the run is faster. TensorFlow flushes by default; PyTorch leaves the choice to the user.

Simplification, named: the bits belong to a CPU thread. ``torch.set_flush_denormal`` sets them for
the thread that calls it; a thread started afterwards inherits them (POSIX), one already running keeps
its own. torch computes on a pool of threads it starts at its first parallel operation, so the commands
(``helpers.train``, ``helpers.evaluate``, ``helpers.lab.bench``, ...) and each notebook's ``device_check``
call ``flush_denormals`` before anything is computed, and ``helpers.loop.train`` calls it too. Called
later, in a process whose pool already runs, it speeds up the calling thread's share of the work only.
"""

from __future__ import annotations

import numpy as np
import torch


def flush_denormals() -> bool:
    """Flush denormal floats to zero in this thread and the threads it starts from now on (module docstring).
    Returns False on a CPU that has no such mode (then nothing changes)."""
    for dtype in (np.float16, np.float32, np.float64):  # numpy measures its float types' limits once, on first use,
        np.finfo(dtype)  # and with the mode on it would measure the smallest denormal as 0 (and warn): measure them now
    return torch.set_flush_denormal(True)
