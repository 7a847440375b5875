"""Checkpoints: every generator's state, a host snapshot, the atomic write (in a thread: Writer) and the safe read
(tensors and plain values only)."""

from __future__ import annotations

import contextlib
import copy
import os
import random
import threading
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
        # one state per GPU the writer saw: a run resumed where fewer are visible (a checkpoint of a 4-GPU node
        # read on a 1-GPU worker) takes the first ones, device by device, as torch numbers them there
        for index, saved in enumerate(state["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(saved.cpu(), index)


def snapshot(model: torch.nn.Module, optimizer: Any, scaler: Any, progress: Progress,
             identity: dict[str, Any] | None = None, copied: bool = True) -> dict[str, Any]:
    """What a checkpoint holds; `copied`: copied to the host as it is now, so training may go on while it is written
    (a GPU's tensors into pinned memory, copied at once, with one wait). A checkpoint written at once (a run's last)
    needs no copy of its tensors."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scaler": scaler.state_dict() if scaler is not None else None,
             "progress": copy.deepcopy(dict(progress.__dict__)), "rng": rng_state(), "identity": copy.deepcopy(identity)}
    if not copied:
        return state
    on_gpu = [False]

    def host(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if value.device.type == "cuda":
                on_gpu[0] = True
                return torch.empty(value.shape, dtype=value.dtype, pin_memory=True).copy_(value, non_blocking=True)
            return value.detach().clone()
        if isinstance(value, dict):
            return {k: host(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(host(v) for v in value)
        return value

    state["model"], state["optimizer"] = host(state["model"]), host(state["optimizer"])
    if on_gpu[0]:
        torch.cuda.synchronize()
    return state


def write_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """`state` (a snapshot) written atomically: to a temporary file, then renamed over the old checkpoint. Tensors and
    plain types only, so that `torch.load(..., weights_only=True)` reads it. A write that fails (full disk) leaves
    the previous checkpoint and no partial file."""
    tmp = path.with_suffix(".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:  # torch reports a failed write as RuntimeError ("file write failed")
        with contextlib.suppress(OSError):  # (a folder that is a file: NotADirectoryError here too)
            tmp.unlink()
        raise AblateError(f"cannot write checkpoint {path} ({type(exc).__name__}: {str(exc).splitlines()[0]}); the "
                          "previous checkpoint is kept. If the disk is full, free space and run the sweep again: "
                          "the run resumes from its last checkpoint") from exc


class Writer:
    """Checkpoints written in a thread from a host snapshot, so training goes on while the file is written (on a GPU
    at minutes of budget, a synchronous write cost 2-6% of the run). One write at a time: the next one, or `wait`,
    waits for the last and raises its error. A kill mid-write leaves the previous checkpoint (the write is atomic),
    and the metrics already flushed past it are logged again on resume (Recorder.forget_after)."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(self, path: Path, state: dict[str, Any], wait: bool = False) -> None:
        """Write `state` to `path` in the thread, or now with `wait` (a newer checkpoint on disk: an earlier write's
        error no longer matters, and this one's is raised here)."""
        if wait:
            self.settle()
            write_checkpoint(path, state)
            return
        self.wait()
        self._thread = threading.Thread(target=self._write, args=(path, state), name="checkpoint", daemon=True)
        self._thread.start()

    def _write(self, path: Path, state: dict[str, Any]) -> None:
        try:
            write_checkpoint(path, state)
        except BaseException as exc:  # noqa: BLE001 - raised in the training thread at the next save or wait
            self._error = exc

    def settle(self) -> None:
        """The last write finished, its error dropped (the run ends: it has said what it has)."""
        try:
            self.wait()
        except BaseException:  # noqa: BLE001, S110 - the run's outcome is recorded either way
            pass

    def wait(self) -> None:
        """The last write finished; its error, if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def load_checkpoint(path: Path, map_location: Any = "cpu") -> dict[str, Any]:
    """A checkpoint's contents, loaded with weights_only=True: a file that needs arbitrary code is refused."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file: say which and what to do
        raise AblateError(f"checkpoint {path} cannot be read safely ({type(exc).__name__}: {str(exc).splitlines()[0][:300]}); "
                          "ablate writes checkpoints of tensors and plain values only, so it is damaged, from an older "
                          "ablate, or not ablate's: delete it to restart the run from step 0") from None
