"""The fixtures of the node check's CUDA tests: the device they train on, and the whole GPU back after a cap."""

from __future__ import annotations

import gc

import pytest
import torch


@pytest.fixture(scope="session")
def device() -> torch.device:
    """The device every test of tests/gpu trains on: this process's CUDA device where there is one, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@pytest.fixture
def _uncapped(device: torch.device):
    """The whole GPU again after the test (a capped trainer leaves its memory fraction set for the process)."""
    yield
    if device.type == "cuda":
        gc.collect()
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        torch.cuda.empty_cache()
