"""`ablate sql`: a query over the results DB that cannot write, run too long or return too much (the SQL guard
checks the statement; the database's own read-only login, timeout and authorizer enforce it)."""

from __future__ import annotations

import gc
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from ablate import store
from ablate.results import sqlguard
from ablate.store import readlogin
from ablate.config.errors import AblateError

DEFAULT_TIMEOUT_SECONDS = 30.0
DEFAULT_MAX_ROWS = 10_000
DEFAULT_MAX_BYTES = 64 << 20  # of the whole result, counted as the rows arrive (a single huge value included)
BATCH_ROWS = 1000  # rows fetched at a time at most (fewer while large rows would pass the byte cap)
READER_ROLE = store.READER_ROLE  # made by migration 0005 (or an administrator): SELECT on READABLE (+ Optuna's tables)
READABLE = ("sweeps", "runs", "metrics", "run_results", "best_runs", "eval_curve", "race_decisions")
_READER_USABLE = (f"SELECT r IS NOT NULL AND pg_has_role(current_user, r, 'MEMBER') "
                  f"AND has_table_privilege(r, 'runs', 'SELECT') FROM to_regrole('{READER_ROLE}') AS r")


def read_only_query(query: str, url: str | None = None, *, max_rows: int = DEFAULT_MAX_ROWS,
                    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS, max_bytes: int = DEFAULT_MAX_BYTES,
                    ) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run one guarded read-only statement in a transaction that is always rolled back; (columns, rows).

    `max_rows` / `timeout_seconds` / `max_bytes` of 0 mean no limit. It never creates, migrates or writes the
    database.
    """
    if max_rows < 0 or timeout_seconds < 0 or max_bytes < 0:
        raise AblateError(f"max_rows ({max_rows}), timeout_seconds ({timeout_seconds}) and max_bytes ({max_bytes}) "
                          "must be >= 0 (0: no limit)")
    # on PostgreSQL with ABLATE_READ_URL: the read-only login, which has no role above it (ablate/readlogin.py)
    engine = readlogin.engine_for(url) or store.reader(url)
    dialect = engine.dialect.name
    if dialect not in ("postgresql", "sqlite"):
        raise AblateError(f"`ablate sql` runs on SQLite and PostgreSQL results databases; {dialect} is not supported")
    statement = sqlguard.check(query, dialect)
    try:
        with engine.connect() as conn:
            try:
                if dialect == "postgresql":
                    return _fetch(_execute_postgres(conn, statement, timeout_seconds), max_rows, max_bytes)
                with _sqlite_limits(conn, timeout_seconds, max_bytes):
                    # no_parameters: the text goes to the driver as written (no `%` or `:name` placeholders)
                    return _fetch(conn.execution_options(no_parameters=True).exec_driver_sql(statement), max_rows,
                                  max_bytes)
            finally:
                conn.rollback()
    except SQLAlchemyError as exc:
        raise _failure(exc, timeout_seconds, max_bytes) from None


def _execute_postgres(conn: sa.Connection, statement: str, timeout_seconds: float) -> sa.CursorResult:
    """The statement in a READ ONLY transaction with a statement timeout, as `ablate_reader` where we may be it."""
    conn.exec_driver_sql("SET TRANSACTION READ ONLY")  # the first statement of this transaction
    conn.exec_driver_sql("SET LOCAL standard_conforming_strings = on")  # strings lex as the guard read them
    conn.exec_driver_sql(f"SET LOCAL statement_timeout = {max(1, round(timeout_seconds * 1000)) if timeout_seconds else 0}")
    if conn.exec_driver_sql(_READER_USABLE).scalar():
        conn.exec_driver_sql(f"SET LOCAL ROLE {READER_ROLE}")
    if conn.exec_driver_sql("SHOW transaction_read_only").scalar() != "on":
        raise AblateError("the PostgreSQL transaction of `ablate sql` did not become read-only; nothing was run")
    if sqlguard.first_keyword(statement) == "EXPLAIN":  # no cursor can hold an EXPLAIN
        return conn.execution_options(no_parameters=True).exec_driver_sql(statement)
    # a server-side cursor: rows arrive only as fetched, and the server takes exactly one statement
    return conn.execution_options(stream_results=True, no_parameters=True).exec_driver_sql(statement)


def _sqlite_authorize(action: int, arg1: str | None, arg2: str | None, _db: str | None, _trigger: str | None) -> int:
    """SQLite's authorizer for `ablate sql`: reading only, and none of the functions the guard refuses."""
    import sqlite3

    if action == sqlite3.SQLITE_FUNCTION:
        return sqlite3.SQLITE_DENY if (arg2 or "").lower() in ("load_extension", "fts3_tokenizer") else sqlite3.SQLITE_OK
    reading = (sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE)
    return sqlite3.SQLITE_OK if action in reading else sqlite3.SQLITE_DENY


@contextmanager
def _sqlite_limits(conn: sa.Connection, timeout_seconds: float, max_bytes: int) -> Iterator[None]:
    """While inside: SQLite interrupts the statement past the deadline, authorizes reading only, and refuses to
    make any string or blob longer than `max_bytes` (zeroblob(900000000) fails at once, not in the client)."""
    import sqlite3

    raw = conn.connection.dbapi_connection
    deadline = time.monotonic() + timeout_seconds
    if timeout_seconds:
        raw.set_progress_handler(lambda: time.monotonic() > deadline, 1000)
    raw.set_authorizer(_sqlite_authorize)
    length = raw.getlimit(sqlite3.SQLITE_LIMIT_LENGTH)
    if max_bytes:
        # the limit holds for a whole result record too (its header included): a little room above the cap, which
        # the rows are counted against as they arrive
        raw.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, min(max_bytes + 4096, length))
    try:
        yield
    finally:  # the connection goes back to the pool for other readers
        raw.set_progress_handler(None, 0)
        raw.set_authorizer(None)
        raw.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, length)


def _fetch(result: sa.CursorResult, max_rows: int, max_bytes: int = 0) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The rows, fetched in batches (a server-side cursor on PostgreSQL) and counted as they arrive: rows, and
    bytes (text by its length, other values 8, NULL 1). A batch is only as many rows as fit in what is left of
    `max_bytes` at the largest row seen so far (one row at first), so the cap is passed by at most one row."""
    if not result.returns_rows:
        raise AblateError(f"that statement returns no rows; {sqlguard.ONE_STATEMENT}")
    columns = list(result.keys())
    rows: list[tuple[Any, ...]] = []
    size = largest = 0
    batch_rows = 1 if max_bytes else BATCH_ROWS
    enabled = gc.isenabled()
    gc.disable()  # every row is kept to the end: the cyclic collector would walk them again and again (~25% of 100k)
    try:
        while batch := result.fetchmany(batch_rows):
            block = [tuple(row) for row in batch]
            if max_bytes:
                sizes = [_row_bytes(row) for row in block]
                size += sum(sizes)
                if size > max_bytes:
                    raise AblateError(_too_big(max_bytes))
                largest = max(largest, *sizes)
                batch_rows = max(1, min(BATCH_ROWS, 2 * len(block), (max_bytes - size) // max(largest, 1)))
            rows += block
            if max_rows and len(rows) > max_rows:
                raise AblateError(f"the query returns more than {max_rows:,} rows; add LIMIT, or pass --max-rows N "
                                  "(0: no limit)")
    finally:
        if enabled:
            gc.enable()
        try:
            result.close()
        except SQLAlchemyError:  # e.g. a server-side cursor whose statement was cancelled: nothing left to close
            pass
    return columns, rows


def _row_bytes(row: tuple[Any, ...]) -> int:
    return sum([len(v) if isinstance(v, (str, bytes, bytearray, memoryview)) else 1 if v is None else 8 for v in row])


def _too_big(max_bytes: int) -> str:
    limit = f"{max_bytes / (1 << 20):g} MiB" if max_bytes >= 1 << 20 else f"{max_bytes:,}-byte"
    return f"the query's result is over the {limit} limit; select fewer or shorter values, or pass --max-bytes N (0: no limit)"


def _failure(exc: SQLAlchemyError, timeout_seconds: float, max_bytes: int = 0) -> AblateError:
    """A user-facing sentence for a failed query (passwords in URLs redacted)."""
    reason = store.redact(str(getattr(exc, "orig", None) or exc).strip().splitlines()[0])
    lowered = reason.lower()
    if "string or blob too big" in lowered and max_bytes:
        return AblateError(_too_big(max_bytes))
    if "statement timeout" in lowered or lowered == "interrupted":
        return AblateError(f"the query ran past the {timeout_seconds:g} s limit; narrow it or pass --timeout SECONDS")
    if re.search(r"permission denied for (table|view|relation)", lowered):
        return AblateError(f"refused: {reason}; `ablate sql` reads the results tables and views: {', '.join(READABLE)}")
    if any(word in lowered for word in ("permission denied", "not authorized", "authorization denied", "must be a member of")):
        return AblateError(f"refused: {reason}; `ablate sql` reads the results tables and views "
                           f"({', '.join(READABLE)}) and nothing else")
    if "readonly" in lowered.replace("-", "").replace(" ", ""):
        return AblateError(f"refused: `ablate sql` is read-only ({reason}); change results through ablate commands")
    return AblateError(f"SQL error: {reason}")
