"""The read side of the results DB: it never writes.

    sql.py       read_only_query: `ablate sql`, bounded in time, rows and bytes, through a read-only login
    sqlguard.py  the statement check in front of it: one SELECT over the readable tables, no functions that
                 read files or the server's state
    frames.py    runs(), metrics(), runs_of(), to_csv(): DataFrames for notebooks and the report

`from ablate import results; results.runs("smoke")` is the notebook's entry point.
"""

from ablate.results.frames import metrics, runs, runs_of, to_csv
from ablate.results.sql import (DEFAULT_MAX_BYTES, DEFAULT_MAX_ROWS, DEFAULT_TIMEOUT_SECONDS, READABLE, READER_ROLE,
                                read_only_query)

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_ROWS", "DEFAULT_TIMEOUT_SECONDS", "READABLE", "READER_ROLE", "metrics",
           "read_only_query", "runs", "runs_of", "to_csv"]
