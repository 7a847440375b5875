"""Where a trial trains and in which precision: the device, autocast, the hardware profile's memory cap."""

from __future__ import annotations

import resource
from typing import Any

import torch

from ablate.config import HARDWARE_PROFILES, TrialConfig
from ablate.train.state import Dist, TrainerSettings


def pick_device(settings: TrainerSettings, dist_: Dist) -> torch.device:
    if settings.device:
        device = torch.device(settings.device)
        if device.type == "cuda" and device.index is None:  # `--device cuda`: this rank's GPU (set_device and DDP's
            device = torch.device("cuda", dist_.local_rank)  # device_ids need an index; torch.device("cuda") has none)
        return device
    if torch.cuda.is_available():
        return torch.device("cuda", dist_.local_rank)
    return torch.device("cpu")


def autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return torch.autocast(device.type, enabled=False)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def prepare_device(device: torch.device, memory_cap_mb: float | None) -> str:
    """Select a GPU, reset its peak-memory counter and cap this process's share of it; the device's name."""
    if device.type != "cuda":
        return "cpu"
    torch.cuda.set_device(device)
    torch.cuda.reset_peak_memory_stats(device)
    if memory_cap_mb:
        total = torch.cuda.get_device_properties(device).total_memory / 2**20
        torch.cuda.set_per_process_memory_fraction(min(1.0, memory_cap_mb / total), device)
    return torch.cuda.get_device_name(device)


def resolve_precision(trial: TrialConfig, device: torch.device) -> str:
    """What `precision: auto` means here: a GPU hardware profile's (bf16 only where it has bf16, so a v100 sweep
    trains in fp16 with a loss scaler even on a newer GPU), else bf16 where this GPU supports it, else fp16;
    fp32 on CPU. The `cpu` profile (a sweep that names no hardware) says nothing of a GPU's precision. An explicit
    precision is kept as asked."""
    if trial.precision != "auto":
        return trial.precision
    if device.type != "cuda":
        return "fp32"
    profile = HARDWARE_PROFILES.get(trial.budget.hardware)
    if profile is not None and profile.device != "cpu" and not profile.bf16:
        return "fp16"
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def hardware_check(trial: TrialConfig, device: torch.device) -> dict[str, Any]:
    """The sweep's hardware profile against this device: {profile, device, mismatch, memory_cap_mb}.

    On a GPU larger than the profile's, its memory becomes the run's cap, so the study's out-of-memory cells
    reproduce; a device that is not the profile's is a mismatch (recorded in the run's notes, printed by
    reports). Unknown hardware names (a user's own work pool) have no profile: nothing is checked."""
    profile = HARDWARE_PROFILES.get(trial.budget.hardware)
    if profile is None:
        return {}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    out: dict[str, Any] = {"profile": trial.budget.hardware, "device": name,
                           "mismatch": profile.device.lower() not in name.lower()}
    if device.type == "cuda" and profile.memory_gb:
        total_mb = torch.cuda.get_device_properties(device).total_memory / 2**20
        if total_mb > profile.memory_gb * 1024:
            out["memory_cap_mb"] = profile.memory_gb * 1024
    return out


def gpu_share(device: torch.device, trials_per_gpu: int) -> float | None:
    """The memory (MB) a trainer may use on a GPU it shares with `trials_per_gpu` - 1 others (ABLATE_TRIALS_PER_GPU):
    its share of the GPU's whole memory; None where it does not share one."""
    if device.type != "cuda" or trials_per_gpu <= 1:
        return None
    return torch.cuda.get_device_properties(device).total_memory / 2**20 / trials_per_gpu


class null_context:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def to_device(batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host batch on the device; to a GPU from pinned memory, so the copy is asynchronous (from pageable memory
    the host waits for it)."""
    if device.type == "cuda":
        batch = batch.pin_memory()
    return batch.to(device, non_blocking=True)


class SimulatedOOM(RuntimeError):
    """The configured memory cap was exceeded (how an OOM is reproduced on CPU or a larger GPU)."""



def check_memory(device: torch.device, cap_mb: float | None) -> None:
    if cap_mb is not None and device.type == "cpu":
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if peak_mb > cap_mb:
            raise SimulatedOOM(f"peak memory {peak_mb:.0f} MB exceeded the cap of {cap_mb:.0f} MB")


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, (torch.OutOfMemoryError, SimulatedOOM)) or "out of memory" in str(exc).lower()
