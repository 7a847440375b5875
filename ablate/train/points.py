"""What a run leaves behind while it trains: its train-loss points (read from the device, checked for
divergence), the progress line, and checkpoints (metrics flushed first)."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from ablate.config import TrialConfig
from ablate.config.errors import AblateError
from ablate.train.checkpoint import snapshot
from ablate.train.recorder import Recorder
from ablate.train.state import Progress


def record_losses(points: list[tuple[dict[str, Any], float, float]], progress: Progress, recorder: Recorder,
                   bar: Any, divergence_limit: float) -> str | None:
    """Record train-loss points read from the device, oldest first; the divergence error at the first loss that
    is not finite or is past the limit (the points after it are dropped), else None."""
    for point, s, c in points:
        if c <= 0:
            continue
        loss = s / c
        if not math.isfinite(loss) or loss > divergence_limit:
            return f"train loss became {loss:.4g} at step {point['step']}"
        f = point.pop("f")
        progress.intervals.append((f, s, c, point["step"]))
        recorder.log(split="train", loss=loss, **point)
        bar(f, loss)
    return None


def final_train_loss(intervals: list[tuple[float, ...]], tail: float = 0.1, steps: int | None = None) -> float | None:
    """Token-weighted mean train loss over the last `tail` of the budget, or with `steps` over the log intervals
    that end within the last `steps` optimizer steps (at least the last log interval). An interval is (budget
    fraction, loss sum, tokens, step at its end); a checkpoint from before the step was kept has none, and is read
    by the fraction."""
    if not intervals:
        return None
    if steps is not None and len(intervals[-1]) > 3:
        last = intervals[-1][3]
        chosen = [iv for iv in intervals if len(iv) > 3 and iv[3] > last - steps] or intervals[-1:]
    else:
        last_f = intervals[-1][0]
        chosen = [iv for iv in intervals if iv[0] >= last_f - tail] or intervals[-1:]
    s = sum(iv[1] for iv in chosen)
    c = sum(iv[2] for iv in chosen)
    return s / c if c else None


def checkpoint(t: Any, interval: tuple[torch.Tensor, torch.Tensor], wait: bool = False) -> None:
    """The trainer's state at this step, with the open log interval; metrics are flushed first: after a crash the
    DB holds every point up to the checkpoint. Written in a thread from a host snapshot (checkpoint.Writer), unless
    `wait`: a run that ends here has it on disk before it says so."""
    progress, clock, recorder = t.progress, t.clock, t.recorder
    progress.elapsed = clock.elapsed()
    progress.open_interval = (float(interval[0]), float(interval[1]))
    progress.meters = dict(clock.meters)
    failed: AblateError | None = None
    if t.dist.is_main:
        recorder.flush()
        try:
            state = snapshot(t.model, t.optimizer, t.scaler, progress, t.identity, copied=not wait)
            t.checkpoints.save(t.ckpt_path, state, wait)
        except AblateError as exc:  # raised after the barrier: the other ranks do not wait for rank 0 forever
            failed = exc
    if t.dist.distributed:
        dist.barrier()
    if failed is not None:
        raise failed


def progress_bar(enabled: bool, trial: TrialConfig):
    """A one-line progress display: budget fraction and current train loss."""
    if not enabled:
        return lambda f, loss: None
    label = f"{trial.architecture} d={trial.d_model} n={trial.layers}"
    last = {"t": 0.0}

    def show(f: float, loss: float) -> None:
        now = time.monotonic()
        if now - last["t"] < 1.0 and f < 1.0:
            return
        last["t"] = now
        width = 30
        done = int(min(f, 1.0) * width)
        sys.stderr.write(f"\r{label} [{'#' * done}{'.' * (width - done)}] {min(f, 1.0):6.1%} loss {loss:.3f}")
        sys.stderr.flush()
        if f >= 1.0:
            sys.stderr.write("\n")

    return show
