"""`ablate search run|report`: Optuna searches over a sweep's `search` block. `run` asks, trains and tells trials
here; `report` writes the study's best trial, importances and plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ablate.cli.common import (Ordered, about, assignments_argument, console, db_option, launch_flags, launch_of,
                               override_options, overrides_of)


@click.group(cls=Ordered, name="search", **about("Optuna searches over a sweep's `search` block"),
             subcommand_metavar="ACTION [ARGS]...")
@db_option(expose=False)
def search_group() -> None:
    pass


@search_group.command(**about("run (or continue) the search here until the study has n_trials",
                              "SPEC: sweep file with a `search:` block, e.g. sweeps/tinystories-heads-lr.yaml"))
@click.argument("spec")
@assignments_argument()
@click.option("--workers", type=int, default=1, help="trials at once here, each asking the shared study (default 1)")
@click.option("--n-trials", type=int, default=None, help="trials the study should hold (default: the spec's)")
@click.option("--seed", type=int, default=None, help="sampler seed (default: from the spec name)")
@launch_flags(threads_help="torch threads per trainer (default: free cores / workers)")
@override_options(merge=False)
@db_option()
def run(spec: str, workers: int, n_trials: int | None, seed: int | None, db: str | None, **params: Any) -> int:
    from ablate import runner, search
    from ablate.config import load_trials

    parsed, _ = load_trials(spec, overrides=overrides_of(params))  # the overrides as plan and sweep run take them
    search.check_search(parsed, spec)
    opts = launch_of(params, db)
    opts = opts.but(threads=opts.threads or runner.default_threads(workers, parsed.budget.gpus))
    total = search.planned_trials(parsed.search, n_trials)
    console.print(f"search {parsed.name}: {total} trials ({parsed.search.sampler}, pruner {parsed.search.pruner}), "
                  f"{workers} worker(s) here, {parsed.budget.describe()} each")
    _stop_on_sigterm()
    outcomes = search.run_search(parsed, db, opts, workers=workers, n_trials=n_trials, seed=seed, on_trial=_say_trial,
                                 spec_path=spec)
    console.print(f"search {parsed.name}: {len(outcomes)} trials run here; `ablate search report {parsed.name}` for "
                  "the best")
    return 0


def _say_trial(o: Any) -> None:
    value = "" if o.value is None else f" {o.value:.4f}"
    params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in o.params.items())
    console.print(f"trial {o.number}: {o.run_status}{value} (run {o.run_id}) {params}")


def _stop_on_sigterm() -> None:
    """SIGTERM as Ctrl-C: trainers checkpoint, their trials are re-queued for the next run."""
    import signal

    def stop(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


@search_group.command(**about("best trial, importances, history and slice plots (PNG)",
                              "NAME: study name (the spec's `name`)"))
@click.argument("name")
@click.option("--out", default=None, help="output folder (default results/reports/NAME)")
@db_option()
def report(name: str, out: str | None, db: str | None) -> int:
    from ablate import search

    rep = search.build_search_report(name, db, Path(out) if out else None)
    console.print(f"search {name}: " + ", ".join(f"{n} {s.lower()}" for s, n in rep.counts.items()))
    if rep.best:
        console.print(f"best: trial {rep.best['number']} (run {rep.best['run_id']}), final eval loss "
                      f"{rep.best['value']:.4f}, {rep.best['params']}")
    if rep.importances:
        console.print("importances: " + ", ".join(f"{k} {v:.2f}" for k, v in rep.importances.items()))
    console.print(f"report written to {rep.out}/ (" + ", ".join(p.name for p in rep.files) + ")")
    return 0
