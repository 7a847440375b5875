"""Trials as processes on a host: what starts them, watches them and cancels them, and the sweep-level work around it.

host.py         facts about this host: its cores and how busy they are, its GPUs, whether a pid lives, threads per trainer,
                its name and trial queue in a cluster's pools, the results DB a dispatched trial must find here
launch.py       trainer_command: a trial's trainer's argv, from the worker's LaunchOptions (config/launch.py)
trials.py       run_trial / run_group (claim, start, watch, classify; a claim given back when the trainer cannot
                start; a fused group in one trainer process, split in two when it runs out of memory), STOP, owed (the
                one rule of a run untrained), runs_to_do, uncancel, cancel
groups.py       plan_groups: the owed runs in fused groups
sweep.py        register and prepare_data (token caches first), Registration, sweep_id/sweep_runs
warm.py         the warm helper that forks trainers with torch already imported (started as `python -m ablate.runner.warm`)
localserver.py  the local Prefect API server of `ablate sweep run`, stopped when its parent goes
keeper.py       a big sweep's study kept in the results DB for the dashboard, as its runs finish and at its end
bundle.py       `ablate bundle`: the wheels that take ablate onto an offline node, beside the node's own torch

Nothing here imports torch; warm.py's helper imports it only in its own process.
"""

from ablate.runner.host import (busy_cores, cluster_db_url, default_threads, host_cores, host_queue, pid_alive,
                               slot_devices, visible_gpus, worker_host)
from ablate.runner.launch import LaunchOptions, trainer_command
from ablate.runner.trials import (CLAIMABLE, MAX_ATTEMPTS, STOP, STOP_GRACE_SECONDS, TERMINAL, UNSETTLED, cancel,
                               classify, owed, run_group, run_trial, runs_to_do, start_trainer, uncancel)
from ablate.runner.groups import plan_groups
from ablate.runner.sweep import (Registration, check_sources, distinct_data, prepare_data, register, sweep_id,
                              sweep_runs)

__all__ = ["CLAIMABLE", "MAX_ATTEMPTS", "STOP", "STOP_GRACE_SECONDS", "TERMINAL", "UNSETTLED", "LaunchOptions",
           "Registration", "busy_cores", "cancel", "check_sources", "classify", "cluster_db_url", "default_threads",
           "distinct_data", "host_cores", "host_queue", "owed", "pid_alive", "plan_groups", "prepare_data", "register",
           "run_group", "run_trial", "runs_to_do", "slot_devices", "start_trainer", "sweep_id", "sweep_runs",
           "trainer_command", "uncancel", "visible_gpus", "worker_host"]

