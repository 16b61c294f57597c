"""Fixtures shared by the tests; importing ``helpers.worlds`` registers every built-in world (datasets, envs, presets)."""

import pytest
import torch

import helpers.worlds  # noqa: F401
from helpers.worlds.tinymodel import load_tiny


@pytest.fixture
def one_thread():
    """Tiny matrices: one thread is fastest, and on a shared CPU two threads can be 20x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny():
    """The shipped tiny model and tokenizer, loaded once per test module."""
    return load_tiny()
