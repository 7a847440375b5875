"""What a trial's trainer is started with: the worker's LaunchOptions (ablate/config/launch.py) as the trainer's argv;
a fused group's the same way, with its runs."""

from __future__ import annotations

import sys

from ablate.config import TrialConfig
from ablate.config.launch import LaunchOptions


def trainer_command(trial: TrialConfig, run_id: int, opts: LaunchOptions) -> list[str]:
    """`python -m ablate.train --run-id N --launch JSON`, or torchrun with one process per GPU when the budget names
    several. The database URL travels in the environment (ABLATE_DB_URL), never in argv where `ps` shows its
    password: `--launch` holds only the trainer's fields (config/launch.TRAINER_FIELDS)."""
    args = ["-m", "ablate.train", "--run-id", str(run_id), "--launch", opts.for_trainer()]
    if trial.budget.gpus > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc_per_node={trial.budget.gpus}", *args]
    return [sys.executable, *args]


def group_command(run_ids: list[int], opts: LaunchOptions) -> list[str]:
    """`python -m ablate.train --run-ids A,B,C --launch JSON`: the runs as one fused group (ablate/train/fused.py)."""
    return [sys.executable, "-m", "ablate.train", "--run-ids", ",".join(str(r) for r in run_ids),
            "--launch", opts.for_trainer()]
