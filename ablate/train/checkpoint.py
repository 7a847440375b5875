"""Checkpoints: every generator's state, the atomic write and the safe read (tensors and plain values only)."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ablate.config.errors import AblateError
from ablate.train.state import Progress


def rng_state() -> dict[str, Any]:
    """Every generator's state as tensors and plain types (a checkpoint loads with weights_only=True)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    numpy_state = {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                   "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    state = {"torch": torch.get_rng_state(), "numpy": numpy_state, "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Every generator as `rng_state` saved it. The states are read on the host: a checkpoint loaded with
    map_location on a GPU has them there, and torch takes an RNG state only as a CPU ByteTensor."""
    torch.set_rng_state(state["torch"].cpu())
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].cpu().numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def save_checkpoint(path: Path, model: torch.nn.Module, optimizer: Any, scaler: Any, progress: Progress,
                    identity: dict[str, Any] | None = None) -> None:
    """Atomic: written to a temporary file, then renamed over the old checkpoint. Tensors and plain types
    only, so that `torch.load(..., weights_only=True)` reads it. A write that fails (full disk) leaves
    the previous checkpoint and no partial file."""
    tmp = path.with_suffix(".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({
            "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "progress": dict(progress.__dict__), "rng": rng_state(), "identity": identity,
        }, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:  # torch reports a failed write as RuntimeError ("file write failed")
        tmp.unlink(missing_ok=True)
        raise AblateError(f"cannot write checkpoint {path} ({type(exc).__name__}: {str(exc).splitlines()[0]}); the "
                          "previous checkpoint is kept. If the disk is full, free space and run the sweep again: "
                          "the run resumes from its last checkpoint") from exc


def load_checkpoint(path: Path, map_location: Any = "cpu") -> dict[str, Any]:
    """A checkpoint's contents, loaded with weights_only=True: a file that needs arbitrary code is refused."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file: say which and what to do
        raise AblateError(f"checkpoint {path} cannot be read safely ({type(exc).__name__}: {str(exc).splitlines()[0][:300]}); "
                          "ablate writes checkpoints of tensors and plain values only, so it is damaged, from an older "
                          "ablate, or not ablate's: delete it to restart the run from step 0") from None
