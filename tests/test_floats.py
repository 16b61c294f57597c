"""helpers.floats: denormal floats flushed to zero, in the calling thread and the threads it starts afterwards;
the commands and the notebooks' opening turn it on before torch computes anything."""

import subprocess
import sys

DENORMAL = 1e-39  # below float32's smallest normal number, 1.2e-38


def run(code: str) -> list[str]:
    """The words ``code`` prints, run in a fresh Python (the mode belongs to threads: this test process may have it on already)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()


def test_numpy_still_knows_its_float_limits():
    """numpy measures a float type's limits on first use; measured with the mode on, the smallest denormal came out 0,
    with a warning (seen in ``python -m helpers.lab.mismatch``). ``flush_denormals`` has them measured first."""
    (smallest,) = run("""
import warnings
warnings.simplefilter("error")
import numpy as np
from helpers.floats import flush_denormals
flush_denormals()
print(np.finfo(np.float32).smallest_subnormal)
""")
    assert float(smallest) > 0


def test_flush_denormals_zeroes_them_here_and_in_threads_started_after():
    before, after, in_thread = run(f"""
import threading, torch
from helpers.floats import flush_denormals
x = torch.tensor([{DENORMAL}])
before = (x * 1.0).item()
assert flush_denormals()
box = []
thread = threading.Thread(target=lambda: box.append((x * 1.0).item()))
thread.start(); thread.join()
print(before, (x * 1.0).item(), box[0])
""")
    assert float(before) > 0  # a denormal, as it is by default
    assert float(after) == 0.0 and float(in_thread) == 0.0


def test_the_notebooks_device_check_flushes_them():
    (value,) = run(f"""
import torch
from helpers.notebook import device_check
device_check()
print((torch.tensor([{DENORMAL}]) * 1.0).item())
""")[-1:]
    assert float(value) == 0.0
