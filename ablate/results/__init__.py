"""The read side of the results DB: it never writes.

    sql.py       read_only_query: `ablate sql`, bounded in time, rows and bytes, through a read-only login
    sqlguard.py  the statement check in front of it: one SELECT over the readable tables, no functions that
                 read files or the server's state
    frames.py    runs(), metrics(), claims(), runs_of(), to_csv(): DataFrames for notebooks
    csvtext.py   runs.csv and claims.csv of a report written as pandas would, without importing it
    views.py     RunView, load_views: runs with their axes and published numbers, as the report reads them
    cells.py     what a cell is: one configuration (every field the sweep's trials differ in), its seeds, what it
                 left out and why
    stats.py     means with confidence intervals, Welch's test, Holm's adjustment, verdicts
    sequential.py group-sequential boundaries (Lan-DeMets alpha spending), the look's z, conditional power
    race.py      a race of claims over seeds: each round's decisions (Holm across claims, futility),
                 replayed from the looks
    orderings.py the study's orderings tested on the runs (check_claims), the noise floor
    equal.py     runs read at an equal budget of another kind (flops, tokens, seconds, steps) on their curves
    points.py    runs' metric points, read in chunks (rows, or one array per run and split)
    status.py    a sweep's runs as status rows: one row, column order, progress and reason for the terminal
                 and the dashboard (live.py: the dashboard's sweeps, rows, change tokens and curves)
    study.py     the dashboard's study: the report's tables, claims and race as data, computed, or as a big
                 sweep's runner kept them (runner/keeper.py, store.keep_study)
    liveviews.py a sweep's views held between reads: each read re-reads only the runs that changed
    scaling.py   L(x) = E + A·x^-α fitted with bootstrap intervals, crossovers; laws.py: per architecture

`from ablate import results; results.runs("smoke")` is the notebook's entry point.
"""

from ablate.results.frames import claims, metrics, runs, runs_of, to_csv
from ablate.results.sql import (DEFAULT_MAX_BYTES, DEFAULT_MAX_ROWS, DEFAULT_TIMEOUT_SECONDS, READABLE, READER_ROLE,
                                read_only_query)

__all__ = ["claims", "DEFAULT_MAX_BYTES", "DEFAULT_MAX_ROWS", "DEFAULT_TIMEOUT_SECONDS", "READABLE", "READER_ROLE", "metrics",
           "read_only_query", "runs", "runs_of", "to_csv"]
