"""Metric recording and the heartbeat: train-loss points kept on the device until read, and the recorder that
writes points to the results DB in batches, beats the run's heartbeat and tells the trainer to stop."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from ablate import store
from ablate.train.state import Dist, TrainerSettings
from ablate.config.settings import environment


# seconds a trainer told to stop (a cancel, its runner gone) may take to checkpoint and end before it is killed



class PendingLosses:
    """Train-loss points kept on the device until they are read.

    Reading a device value is a host sync (on a GPU the host waits for every queued kernel), so points logged
    every step (a budget under `log_points` steps) are read together: the loop reads them every
    `TrainerSettings.read_every` seconds, and before a stop, an eval or a checkpoint. One transfer per read, none per
    step. In DDP each point's (loss sum, count) is summed over the ranks when it is added (queued on the
    device, like the gradients' all-reduce), at log points every rank agreed on."""

    def __init__(self, dist_: Dist):
        self.dist = dist_
        self.items: list[tuple[dict[str, Any], torch.Tensor]] = []

    def add(self, loss_sum: torch.Tensor, count: torch.Tensor, **point: Any) -> None:
        both = torch.stack([loss_sum.float(), count.float()])  # a copy: the caller zeroes its running sums
        if self.dist.distributed:
            dist.all_reduce(both)
        self.items.append((point, both))

    def read(self) -> list[tuple[dict[str, Any], float, float]]:
        """Every pending point with its (loss sum, count), oldest first."""
        if not self.items:
            return []
        values = torch.stack([both for _, both in self.items]).tolist()
        out = [(point, s, c) for (point, _), (s, c) in zip(self.items, values)]
        self.items = []
        return out


class Recorder:
    """Buffers metric points and writes them to the DB in batches (rank 0 only; a no-op without a run id).

    With a claimant it also beats the run's heartbeat from a thread; `lost` turns True if another process
    took the run over (this one was thought dead), and the trainer then stops without writing more.
    """

    def __init__(self, settings: TrainerSettings, is_main: bool):
        self.run_id = settings.run_id if is_main else None
        self.engine = store.connect(settings.db_url) if self.run_id is not None else None
        self.claimant = settings.claimant
        self.buffer: list[dict[str, Any]] = []
        self.last_flush = time.monotonic()
        # read as the trainer starts, as the heartbeat below is
        self.flush_every = environment().flush_seconds if settings.flush_every is None else settings.flush_every
        self.points: list[dict[str, Any]] = []  # everything logged by this process (for callers and tests)
        self.lost = False
        self.stop_reason: str | None = None  # why this trainer was told to stop: "cancelled" or "orphaned"
        self._stop_beating = threading.Event()
        self._runner_pid = environment().runner_pid
        # how this trainer is told to stop: SIGTERM to its process (it checkpoints); a fused group's member is
        # stopped alone instead (ablate/train/fused.py)
        self.on_stop: Any = lambda: os.kill(os.getpid(), signal.SIGTERM)
        # read as the trainer starts, not at import (a warm helper's forked trainer has its own environment)
        self.heartbeat_every, self.cancel_grace = store.heartbeat_seconds(), environment().cancel_grace_seconds
        if self.engine is not None and self.claimant is not None:
            threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()

    def _beat(self) -> None:
        """Every heartbeat_every seconds: say this claimant is alive, and stop the trainer (SIGTERM to this
        process: it checkpoints) when the run was cancelled from any host, or the runner that started it is gone
        (its Prefect flow run was cancelled or killed: nobody would record this trainer's end). A trainer still
        here cancel_grace seconds after that (one step or one checkpoint write longer than that, or code that
        never returns to Python) is killed: its row already says why, and its last checkpoint is intact."""
        told_at: float | None = None
        while not self._stop_beating.wait(self.heartbeat_every):
            if told_at is not None and time.monotonic() - told_at >= self.cancel_grace:
                print(f"still running {self.cancel_grace:.0f} s after it was told to stop ({self.stop_reason}): "
                      "killed", file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            try:
                status = store.heartbeat(self.engine, self.run_id, self.claimant)
            except Exception:  # noqa: BLE001 - a database hiccup: try again next beat (stale only after many)
                status = "running"
            if status is None:
                self.lost = True
                return
            if self.stop_reason is None:
                if status == "cancelled":
                    self.stop_reason = "cancelled"
                elif self._runner_pid is not None and not store.pid_alive(self._runner_pid):
                    self.stop_reason = "orphaned"
                if self.stop_reason is not None:
                    told_at = time.monotonic()
                    self.on_stop()

    def close(self) -> None:
        self._stop_beating.set()

    def cancelled(self) -> bool:
        """Whether a user cancelled the run (told by a heartbeat, or its row says so now)."""
        if self.stop_reason == "cancelled":
            return True
        if self.engine is None:
            return False
        try:
            return store.get_run(self.engine, self.run_id).status == "cancelled"
        except Exception:  # noqa: BLE001 - no database to ask: the run is resumable, not cancelled
            return False

    def log(self, **point: Any) -> None:
        self.buffer.append(point)
        self.points.append(point)

    def maybe_flush(self) -> bool:
        return bool(self.buffer) and time.monotonic() - self.last_flush >= self.flush_every

    def flush(self) -> None:
        if self.engine is not None and self.buffer:
            store.write_metrics(self.engine, self.run_id, self.buffer)
        self.buffer = []
        self.last_flush = time.monotonic()

    def forget_after(self, step: int) -> None:
        """Drop points logged after a checkpoint's step (a resumed run logs them again); -1: every point of
        earlier attempts (a new attempt from step 0)."""
        if self.engine is not None:
            import sqlalchemy as sa

            with self.engine.begin() as conn:
                conn.execute(sa.delete(store.Metric).where(store.Metric.run_id == self.run_id, store.Metric.step > step,
                                                        store.Metric.split.in_(("train", "eval"))))
                if step < 0:  # a new attempt from step 0: nothing logged yet
                    conn.execute(sa.update(store.Run).where(store.Run.id == self.run_id).values(
                        last_step=None, last_elapsed_seconds=None, last_train_loss=None, last_eval_loss=None))

    def update(self, **fields: Any) -> None:
        if self.engine is not None and not self.lost:
            store.update_run(self.engine, self.run_id, claimant=self.claimant, **fields)
