"""Optuna searches over the results DB: one study per spec with a `search` block, one run row per trial.

The study lives in the results database beside `runs` (Optuna's tables: studies, trials, trial_values,
trial_params, ...), named after the spec. Each Optuna trial samples its parameters, becomes a run row
(`runs.study_name`, `runs.study_trial`), trains through the runner, and reports the run's intermediate
evals (Optuna step k = the k-th fraction of `eval.at`) so the pruner can stop it. Workers (threads here,
or processes on any machine using the same DB) ask and tell on the shared storage until the study holds
n_trials trials; a study stopped half-way continues where it stopped.

A worker that dies leaves its trial RUNNING with a stale heartbeat: the next worker to ask marks it FAIL
and re-queues its parameters, which map to the same run row (same fingerprint), so the run resumes from
its checkpoint, or is told from its row if its trainer finished on its own.

space.py     check_search (what pydantic cannot see), grid_space, planned_trials, suggest_trial (one trial's config)
claims.py    trials_counted, requeue (a dead or interrupted worker's trial), study_lock, claim (the next trial)
study.py     open_storage (Optuna's tables on the results DB), create_study, make_sampler, make_pruner, load_study,
             default_seed; the heartbeat and grace periods
follower.py  the eval follower: a run's intermediate evals reported to its trial, the heartbeat, the pruner's word
gate.py      Gate: the parallel workers' runs gathered into fused groups, each member pruned alone
trial.py     TrialOutcome and run_one: register and link the run row, train, follow or read it, tell the study
loop.py      run_worker (claim, run, tell until n_trials) and run_search (the study, then its worker threads)
report.py    build_search_report: best trial, importances, plots, trials.csv and summary.md

Each imports only those above it in this list. Nothing here imports torch at import time (`run_search` asks torch
for the GPU count only when several workers share a machine).
"""

from ablate.search.claims import COUNTED, MAX_REQUEUES, claim, requeue, study_lock, trials_counted
from ablate.search.loop import run_search, run_worker
from ablate.search.report import SearchReport, build_search_report
from ablate.search.space import check_search, grid_space, planned_trials, suggest_trial
from ablate.search.study import (GRACE_SECONDS, HEARTBEAT_SECONDS, MEDIAN_STARTUP_TRIALS, create_study, default_seed,
                                 load_study, make_pruner, make_sampler, open_storage)
from ablate.search.trial import TrialOutcome, register_trial, run_one

__all__ = ["COUNTED", "GRACE_SECONDS", "HEARTBEAT_SECONDS", "MAX_REQUEUES", "MEDIAN_STARTUP_TRIALS", "SearchReport",
           "TrialOutcome", "register_trial", "build_search_report", "check_search", "claim", "create_study",
           "default_seed", "grid_space", "load_study", "make_pruner", "make_sampler", "open_storage", "planned_trials",
           "requeue", "run_one", "run_search", "run_worker", "study_lock", "suggest_trial", "trials_counted"]
