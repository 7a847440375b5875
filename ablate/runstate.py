"""The state of a run between steps: settings, progress, checkpoints, data order, metric recording.

Everything `ablate.train` saves and restores so that a killed run resumes the same trajectory.
"""

from __future__ import annotations

import os
import random
import resource
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ablate import store
from ablate.config.errors import AblateError
from ablate.config import TrialConfig


# seconds a trainer told to stop (a cancel, its runner gone) may take to checkpoint and end before it is killed
CANCEL_GRACE_SECONDS = float(os.environ.get("ABLATE_CANCEL_GRACE_SECONDS", "120"))


class SimulatedOOM(RuntimeError):
    """The configured memory cap was exceeded (how an OOM is reproduced on CPU or a larger GPU)."""


@dataclass
class Settings:
    """How to run a trial (not part of its identity): where to record, checkpoint and log."""

    artifacts: Path = Path("results/artifacts")
    db_url: str | None = None
    run_id: int | None = None
    # seconds of wall time between checkpoints; None: a tenth of the run's expected length, 30 s to 10 min
    checkpoint_every: float | None = None
    log_points: int = 200  # about this many train-loss points per run
    flush_every: float = 30.0  # seconds between metric writes
    # seconds between reads of the logged train losses from the device: each read is one host sync (PendingLosses)
    read_every: float = 1.0
    warmup_steps: int = 2  # untimed steps (compile, allocator warm-up); state restored afterwards
    memory_cap_mb: float | None = None
    resume: bool = True
    progress: bool = True
    device: str | None = None
    threads: int | None = None  # torch intra-op threads; None: torch's default (every core)
    claimant: str | None = None  # the claim this process trains under (store.claim_run); writes are fenced by it
    db_id: str | None = None  # the results database's identity: keys this run's artifacts


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    # a gloo group for the loop's decisions (budget fraction, stop, log, eval, checkpoint): host values agreed on
    # the host, so agreeing on them every step never waits for the GPU (NCCL would need the flags on the device)
    control: Any = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def agree(self, *values: float) -> list[float]:
        """The largest of each value over the ranks (one tiny host-side all-reduce; itself without DDP)."""
        if self.world == 1:
            return [float(v) for v in values]
        both = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self.control)
        return both.tolist()


class PendingLosses:
    """Train-loss points kept on the device until they are read.

    Reading a device value is a host sync (on a GPU the host waits for every queued kernel), so points logged
    every step (a budget under `log_points` steps) are read together: the loop reads them every
    `Settings.read_every` seconds, and before a stop, an eval or a checkpoint. One transfer per read, none per
    step. In DDP each point's (loss sum, count) is summed over the ranks when it is added (queued on the
    device, like the gradients' all-reduce), at log points every rank agreed on."""

    def __init__(self, dist_: Dist):
        self.dist = dist_
        self.items: list[tuple[dict[str, Any], torch.Tensor]] = []

    def add(self, loss_sum: torch.Tensor, count: torch.Tensor, **point: Any) -> None:
        both = torch.stack([loss_sum.float(), count.float()])  # a copy: the caller zeroes its running sums
        if self.dist.world > 1:
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


# ---------------------------------------------------------------- recording


class Recorder:
    """Buffers metric points and writes them to the DB in batches (rank 0 only; a no-op without a run id).

    With a claimant it also beats the run's heartbeat from a thread; `lost` turns True if another process
    took the run over (this one was thought dead), and the trainer then stops without writing more.
    """

    def __init__(self, settings: Settings, is_main: bool):
        self.run_id = settings.run_id if is_main else None
        self.engine = store.connect(settings.db_url) if self.run_id is not None else None
        self.claimant = settings.claimant
        self.buffer: list[dict[str, Any]] = []
        self.last_flush = time.monotonic()
        self.flush_every = settings.flush_every
        self.points: list[dict[str, Any]] = []  # everything logged by this process (for callers and tests)
        self.lost = False
        self.stop_reason: str | None = None  # why this trainer was told to stop: "cancelled" or "orphaned"
        self._stop_beating = threading.Event()
        runner_pid = os.environ.get("ABLATE_RUNNER_PID", "")
        self._runner_pid = int(runner_pid) if runner_pid.isdigit() else None
        if self.engine is not None and self.claimant is not None:
            threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()

    def _beat(self) -> None:
        """Every HEARTBEAT_SECONDS: say this claimant is alive, and stop the trainer (SIGTERM to this process:
        it checkpoints) when the run was cancelled from any host, or the runner that started it is gone (its
        Prefect flow run was cancelled or killed: nobody would record this trainer's end). A trainer still
        here CANCEL_GRACE_SECONDS after that (one step or one checkpoint write longer than that, or code that
        never returns to Python) is killed: its row already says why, and its last checkpoint is intact."""
        told_at: float | None = None
        while not self._stop_beating.wait(store.HEARTBEAT_SECONDS):
            if told_at is not None and time.monotonic() - told_at >= CANCEL_GRACE_SECONDS:
                print(f"still running {CANCEL_GRACE_SECONDS:.0f} s after it was told to stop ({self.stop_reason}): "
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
                    os.kill(os.getpid(), signal.SIGTERM)

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


# ---------------------------------------------------------------- state


@dataclass
class Progress:
    """Everything about where a run is, saved in checkpoints."""

    step: int = 0
    samples: int = 0  # global samples consumed (the data position)
    tokens: int = 0  # global real (non-pad) tokens trained on
    elapsed: float = 0.0  # budget clock
    meters: dict[str, float] = field(default_factory=dict)
    next_eval: int = 0  # index into trial.eval.at
    intervals: list[tuple[float, float, float]] = field(default_factory=list)  # (fraction, loss sum, tokens) per log
    micro_batch: int = 0
    grad_accum: int = 1
    open_interval: tuple[float, float] = (0.0, 0.0)  # (loss sum, tokens) since the last train log
    notes: dict[str, Any] = field(default_factory=dict)
    rows: int = 0  # training rows of the corpus: epochs = samples / rows


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
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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


# ---------------------------------------------------------------- data order


class Batches:
    """Global sample position -> this rank's rows; the order is a pure function of (epoch, seed)."""

    def __init__(self, rows: Any, seed: int, dist_: Dist):
        self.rows, self.seed, self.dist = rows, seed, dist_
        self.n = len(rows)
        self._orders: dict[int, np.ndarray] = {}

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            self._orders = {epoch: self.rows.order(epoch, self.seed)}
        return self._orders[epoch]

    def take(self, position: int, per_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The micro-batch starting at global `position` for this rank."""
        start = position + self.dist.rank * per_rank
        idx = np.empty(per_rank, dtype=np.int64)
        for j in range(per_rank):
            g = start + j
            idx[j] = self._order(g // self.n)[g % self.n]
        return self.rows.batch(idx)


# ---------------------------------------------------------------- the loop


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


def run_dir(settings: Settings, trial: TrialConfig) -> Path:
    """runs/<database id>/run-<id>-<fingerprint>: run ids restart at 1 in every results database, so a
    folder is keyed by the database too (a fresh DB never resumes another DB's checkpoint)."""
    if settings.run_id is None:
        return settings.artifacts / "runs" / "unrecorded" / trial.fingerprint()
    db_id = settings.db_id or store.database_id(store.connect(settings.db_url))
    return settings.artifacts / "runs" / db_id[:16] / f"run-{settings.run_id}-{trial.fingerprint()}"
