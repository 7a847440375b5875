"""Fused groups on the device (ablate/train/fused.py): a group trained in the device's precision equals its solo runs
to that precision's rounding, a resumed run's RNG state fits the GPUs visible here, and a sweep that names no
hardware trains in the GPU's own precision. On CPU, tests/train/test_fused.py holds the contract at fp32."""

from __future__ import annotations

import pytest
import torch

from ablate import store
from ablate.train import train
from ablate.train.checkpoint import rng_state, set_rng_state
from ablate.train.device import resolve_precision
from ablate.train.fused import train_group
from tests.gpu.common import needs_cuda, settings, tiny
from tests.train.test_fused import register

pytestmark = pytest.mark.gpu


def test_a_fused_group_in_bf16_equals_its_solo_runs_to_bf16s_rounding(device, tmp_path, record_property):
    """Four seeds fused against each alone, bf16 autocast on the GPU (solo: fused AdamW; the group: its own update):
    every member completes, marked fused, its final losses within 2% of its solo run's (bf16 keeps 8 bits)."""
    needs_cuda(device, "bf16 and the batched kernels are the GPU's; CPU fp32 is tests/train/test_fused.py")
    trials = [tiny(seed=seed, precision="bf16", layers=2, eval={"at": [0.5]}) for seed in range(4)]
    url = f"sqlite:///{tmp_path / 'solo.db'}"
    solo = [train(t, settings(device, tmp_path / "solo", db_url=url, run_id=rid))
            for t, rid in zip(trials, register(url, trials))]
    url = f"sqlite:///{tmp_path / 'fused.db'}"
    ids = register(url, trials)
    fused = train_group(trials, [settings(device, tmp_path / "fused", db_url=url, run_id=rid) for rid in ids])
    worst = 0.0
    for a, b, rid in zip(solo, fused, ids):
        assert b["status"] == "completed" and store.get_run(store.connect(url), rid).notes["fused"]["members"] == 4
        for key in ("final_train_loss", "final_eval_loss"):
            worst = max(worst, abs(a[key] - b[key]) / a[key])
    record_property("worst_relative_difference", f"{worst:.1e}")
    assert worst < 0.02, worst


def test_a_checkpoint_from_a_node_with_more_gpus_resumes_here(device):
    """A checkpoint's RNG holds one CUDA state per GPU its writer saw (4 on a V100 node); a worker with fewer
    visible restores the first ones (it failed with a length mismatch before)."""
    needs_cuda(device, "CUDA RNG states exist only where CUDA does")
    state = rng_state()
    state["cuda"] = [state["cuda"][0]] * (torch.cuda.device_count() + 3)
    set_rng_state(state)


def test_a_sweep_that_names_no_hardware_trains_in_the_gpus_precision(device):
    needs_cuda(device, "which precision a GPU has")
    expected = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    assert resolve_precision(tiny(precision="auto"), device) == expected


def test_a_trainer_that_shares_its_gpu_caps_itself_at_its_share(device, tmp_path, monkeypatch, whole_gpu_after):
    """ABLATE_TRIALS_PER_GPU=4 (`--trials-per-gpu 4`): the trainer caps its memory at a quarter of the GPU and says so
    in its notes; on CPU there is no GPU to share: no cap, no note."""
    monkeypatch.setenv("ABLATE_TRIALS_PER_GPU", "4")
    out = train(tiny(), settings(device, tmp_path / "art"))
    assert out["status"] == "completed", out
    if device.type != "cuda":
        assert "gpu_share" not in (out["notes"] or {})
        return
    total = torch.cuda.get_device_properties(device).total_memory / 2**20
    assert out["notes"]["gpu_share"] == {"trials_per_gpu": 4, "memory_cap_mb": round(total / 4)}
