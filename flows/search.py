"""Flow `search(spec)`: run (or continue) the Optuna search of a sweep file, its trials trained where the flow runs.

Each flow run is one or more workers on the study in the results DB, so several flow runs (on several
machines of the spec's GPU pool) share one search: each asks for trials until the study holds n_trials.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger

import ablate.search
from ablate.config.launch import launch_options


@flow(name="search")
def search(spec: str, db_url: str | None = None, artifacts: str = "results/artifacts", workers: int = 1,
           n_trials: int | None = None, seed: int | None = None, checkpoint_every: float | None = None,
           memory_cap_mb: float | None = None, poll_seconds: float = 1.0) -> dict[int, str]:
    """Ask, train and tell trials until the study holds n_trials; returns {Optuna trial number: run status} of this run."""
    log = get_run_logger()
    opts = launch_options(dict(db_url=db_url, artifacts=artifacts, checkpoint_every=checkpoint_every,
                               memory_cap_mb=memory_cap_mb), where="the search flow's parameters: ")

    def on_trial(o: ablate.search.TrialOutcome) -> None:
        value = "" if o.value is None else f", final eval loss {o.value:.4f}"
        log.info("trial %d (run %s) %s: %s%s %s", o.number, o.run_id, o.state, o.run_status, value, o.params)

    outcomes = ablate.search.run_search(spec, db_url, opts, workers=workers, n_trials=n_trials, seed=seed,
                                        poll_seconds=poll_seconds, on_trial=on_trial)
    log.info("search %s: %d trials run here", Path(spec).stem, len(outcomes))
    return {o.number: o.run_status for o in outcomes}
