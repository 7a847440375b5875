"""The state of a run between steps: its settings, its place in the world (ranks), its progress, its data order.

Everything `ablate.train` saves and restores so that a killed run resumes the same trajectory (checkpoint.py
writes it; recorder.py records the metrics).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ablate import store
from ablate.config import TrialConfig
from ablate.config.launch import LaunchOptions


@dataclass
class TrainerSettings:
    """How to run a trial (not part of its identity): where to record, checkpoint and log."""

    artifacts: Path = Path("results/artifacts")
    db_url: str | None = None
    run_id: int | None = None
    # seconds of wall time between checkpoints; None: a tenth of the run's expected length, 30 s to 10 min
    checkpoint_every: float | None = None
    log_points: int = 200  # about this many train-loss points per run
    flush_every: float | None = None  # seconds between metric writes; None: ABLATE_FLUSH_SECONDS (default 30)
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
    notes: dict[str, Any] | None = None  # set on the run's notes as it starts (a group that did not fuse says why)

    @classmethod
    def launched(cls, launch: LaunchOptions, **rest: Any) -> TrainerSettings:
        """The settings of a trainer started with these LaunchOptions (config/launch.py), plus the rest."""
        return cls(artifacts=launch.artifacts.resolve(), checkpoint_every=launch.checkpoint_every,
                   memory_cap_mb=launch.memory_cap_mb, threads=launch.threads, progress=not launch.quiet, **rest)


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    # a gloo group for the loop's decisions (budget fraction, stop, log, eval, checkpoint): host values agreed on
    # the host, so agreeing on them every step never waits for the GPU (NCCL would need the flags on the device)
    control: Any = None
    # a process group is up (torchrun started this rank, with one process too): DDP wraps the model and the
    # collectives run, so `torchrun --nproc_per_node 1` takes the multi-GPU path (NCCL) on a single GPU
    distributed: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def agree(self, *values: float) -> list[float]:
        """The largest of each value over the ranks (one tiny host-side all-reduce; itself without DDP)."""
        if not self.distributed:
            return [float(v) for v in values]
        both = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self.control)
        return both.tolist()


@dataclass
class Progress:
    """Everything about where a run is, saved in checkpoints."""

    step: int = 0
    samples: int = 0  # global samples consumed (the data position)
    tokens: int = 0  # global real (non-pad) tokens trained on
    elapsed: float = 0.0  # budget clock
    meters: dict[str, float] = field(default_factory=dict)
    next_eval: int = 0  # index into trial.eval.at
    evaluated_step: int = -1  # the step of the last intermediate eval (eval.every_steps: never twice at one step)
    intervals: list[tuple[float, ...]] = field(default_factory=list)  # (fraction, loss sum, tokens, step) per log
    micro_batch: int = 0
    grad_accum: int = 1
    open_interval: tuple[float, float] = (0.0, 0.0)  # (loss sum, tokens) since the last train log
    notes: dict[str, Any] = field(default_factory=dict)
    rows: int = 0  # training rows of the corpus: epochs = samples / rows


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


def run_dir(settings: TrainerSettings, trial: TrialConfig) -> Path:
    """runs/<database id>/run-<id>-<fingerprint>: run ids restart at 1 in every results database, so a
    folder is keyed by the database too (a fresh DB never resumes another DB's checkpoint)."""
    if settings.run_id is None:
        return settings.artifacts / "runs" / "unrecorded" / trial.fingerprint()
    db_id = settings.db_id or store.database_id(store.connect(settings.db_url))
    return settings.artifacts / "runs" / db_id[:16] / f"run-{settings.run_id}-{trial.fingerprint()}"
