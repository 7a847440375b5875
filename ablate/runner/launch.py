"""What a trial's trainer is started with: the worker's LaunchOptions, and the argv they become."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.config import TrialConfig


@dataclass(frozen=True)
class LaunchOptions:
    """How this worker starts trainers (not part of any trial's identity), declared once: `ablate sweep run` and
    `ablate search run` build it from their flags, the flows from their parameters (the same names:
    `flow_parameters` is what a sweep flow hands each trial flow), and `trainer_command` turns it into the
    trainer's argv. Flow parameters arrive as JSON: `artifacts` may be a string and `gpu_ids` a list."""

    db_url: str | None = None
    artifacts: Path = Path("results/artifacts")
    checkpoint_every: float | None = None  # None: the trainer's default, proportional to the budget
    memory_cap_mb: float | None = None
    gpu_ids: tuple[int, ...] | None = None  # CUDA_VISIBLE_DEVICES for this trial; None: inherit
    quiet: bool = True
    threads: int | None = None  # torch intra-op threads per trainer process; None: every core
    extra_env: dict[str, str] = field(default_factory=dict)
    # fork single-process trainers from this process's warm helper where it applies (warm.enabled); worth it
    # only for a process that runs several trials: its start costs about what one cold trainer's imports do
    warm: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "artifacts", Path(self.artifacts))
        if self.gpu_ids is not None:
            object.__setattr__(self, "gpu_ids", tuple(self.gpu_ids))

    def flow_parameters(self) -> dict[str, Any]:
        """The settings every `trial` flow run of a sweep gets, as that flow's parameters (JSON values). A local
        trial adds its `gpu_ids` and `warm`; a deployment's trial keeps their defaults (no GPU pinning, cold)."""
        return {"db_url": self.db_url, "artifacts": str(self.artifacts), "checkpoint_every": self.checkpoint_every,
                "memory_cap_mb": self.memory_cap_mb, "threads": self.threads}


def trainer_command(trial: TrialConfig, run_id: int, opts: LaunchOptions) -> list[str]:
    """`python -m ablate.train`, or torchrun with one process per GPU when the budget names several.
    The database URL travels in the environment (ABLATE_DB_URL), never in argv where `ps` shows its password."""
    args = ["-m", "ablate.train", "--run-id", str(run_id), "--artifacts", str(opts.artifacts)]
    if opts.checkpoint_every:
        args += ["--checkpoint-every", str(opts.checkpoint_every)]
    if opts.memory_cap_mb:
        args += ["--memory-cap-mb", str(opts.memory_cap_mb)]
    if opts.quiet:
        args.append("--quiet")
    if opts.threads:
        args += ["--threads", str(opts.threads)]
    if trial.budget.gpus > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc_per_node={trial.budget.gpus}", *args]
    return [sys.executable, *args]

