"""What the node check's CUDA tests share (tests/gpu): a tiny trial, settings for a run on the device, the checks
that a run learned (the fixtures `device` and `whole_gpu_after` are in tests/conftest.py).

Every test trains on one device: CUDA where `torch.cuda.is_available()`, else the CPU, where every property that
means something there runs too (so this code is exercised in CI before a GPU ever sees it). A property only CUDA
has skips on CPU with "needs CUDA: <why>". Memory caps on CUDA go through
`torch.cuda.set_per_process_memory_fraction`, which stays set for the process: a test that sets one puts the
fraction back (`whole_gpu_after`). Caps are computed from the need measured on this device, never guessed.
"""

from __future__ import annotations

import gc
import math
from pathlib import Path

import pytest
import torch

from ablate.config import TrialConfig
from ablate.train import TrainerSettings
from tests.train.test_train import metric_rows

VOCAB = 384
REPO = Path(__file__).resolve().parents[2]


def needs_cuda(device: torch.device, why: str) -> None:
    if device.type != "cuda":
        pytest.skip(f"needs CUDA: {why}")


def tiny(**over) -> TrialConfig:
    """A tiny mixer trial, compile off unless asked (a trial's default compiles on CUDA: seconds to minutes)."""
    base = {"architecture": "mixer", "d_model": 32, "layers": 2, "context": 64, "lr": 3e-3, "batch_size": 8,
            "precision": "fp32", "compile": False,
            "dataset": {"source": "ablate:tinystories-sample", "eval": {"holdout": 16}},
            "tokenizer": {"vocab_size": VOCAB}, "budget": {"steps": 30}, "eval": {"at": []}, "warmup": 0.1}
    base.update(over)
    return TrialConfig(**base)


def settings(device: torch.device, art: Path, **over) -> TrainerSettings:
    """TrainerSettings for one in-process run on `device`. `device.type` ("cuda", no index) is what `--device cuda`
    hands the trainer; no resume unless asked (unrecorded runs of one trial share a run folder)."""
    base = {"artifacts": art, "progress": False, "device": device.type, "log_points": 10, "resume": False}
    base.update(over)
    return TrainerSettings(**base)


def device_name(device: torch.device) -> str:
    """What the trainer records as the run's device_name on `device`."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def assert_learns(url: str, run_id: int, out: dict) -> list[float]:
    """The run's recorded train losses are finite and fall well below where they started; its eval loss is finite
    and below a uniform guess over the vocabulary."""
    losses = [r.loss for r in metric_rows(url, run_id, "train")]
    assert len(losses) >= 5 and all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < losses[0] - 0.5, losses
    assert math.isfinite(out["final_eval_loss"]) and out["final_eval_loss"] < math.log(VOCAB), out
    return losses


def fresh(device: torch.device) -> None:
    """Nothing cached from earlier runs: a measured need, or a cap, starts from this process's live tensors only."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
