"""URLs and engines: which database (--db, ABLATE_DB_URL, the default SQLite file), an engine on it, and
what its errors mean to a user (passwords redacted)."""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from pathlib import Path
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from ablate.config.errors import AblateError
from ablate.store.schema import Meta
from ablate.config.settings import environment

DEFAULT_URL = "sqlite:///results/ablate.db"


def resolve_url(url: str | None = None) -> str:
    """--db beats ABLATE_DB_URL beats the default SQLite file; a bare path means a SQLite file."""
    url = url or environment().db_url or DEFAULT_URL
    if "://" not in url:  # a path may hold URL syntax (`%`, `?`, `#`): escaped, the URL names that very file
        url = "sqlite:///" + url.replace("%", "%25").replace("?", "%3F").replace("#", "%23")
    return url


def sqlite_path(url: sa.URL) -> Path | None:
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return Path(url.database)


def _wal(cur: Any, patience: float = 60.0) -> None:
    """Switch a SQLite file to WAL. On a new file that needs an exclusive lock, and SQLite answers "locked" at
    once (no busy wait) while another process creates or migrates the same file: wait for it here."""
    import sqlite3

    deadline = time.monotonic() + patience
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def make_engine(url: str | None = None, read_only: bool = False) -> sa.Engine:
    url_obj = sa.make_url(resolve_url(url))
    path = sqlite_path(url_obj)
    if path is not None:
        if read_only:
            if not path.exists():
                raise AblateError(f"no results database at {path}; run a sweep first or pass --db URL")
            # mode=ro: SQLite itself refuses writes on this connection. The path is percent-encoded for SQLite's
            # URI (a `#` or `?` in it would start a fragment or the options) and passed as is, not re-parsed
            url_obj = sa.URL.create("sqlite", database=f"file:{urllib.parse.quote(str(path.resolve()))}",
                                    query={"mode": "ro", "uri": "true"})
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(url_obj, connect_args={"timeout": 60}, json_deserializer=json_loads)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA busy_timeout=60000")
            if not read_only:
                _wal(cur)
            cur.execute("PRAGMA foreign_keys=ON")
            if read_only:
                cur.execute("PRAGMA query_only=ON")
            cur.close()

        return engine
    kwargs: dict[str, Any] = {"pool_pre_ping": True, "json_deserializer": json_loads}
    if read_only and url_obj.get_backend_name() == "postgresql":
        kwargs["connect_args"] = {"options": "-c default_transaction_read_only=on"}
    try:
        return sa.create_engine(url_obj, **kwargs)
    except (SQLAlchemyError, ImportError) as exc:
        raise AblateError(f"cannot use database URL {url_obj.render_as_string(hide_password=True)}: {exc}") from None


def json_loads(text: str | bytes) -> Any:
    """A JSON column's value (each run's config, options and notes) with orjson: a fifth of Python's json's CPU over
    100,000 runs. What orjson refuses (NaN, which Python's json.dumps writes) is read by Python's json."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def describe_url(url: str) -> str:
    return sa.make_url(url).render_as_string(hide_password=True)


_PASSWORD = re.compile(r"(\w[\w+.-]*://[^:/@\s]*:)([^@\s]+)(@)")


def redact(text: str) -> str:
    """Text with the password of every database URL in it replaced by ***."""
    return _PASSWORD.sub(r"\1***\3", text)


def explain(exc: BaseException, url: str | None = None) -> str | None:
    """A user-facing sentence for a database error that is about the environment (read-only, full disk), else None."""
    reason = str(getattr(exc, "orig", None) or exc).strip()
    lowered = reason.lower().replace("-", "").replace(" ", "")
    where = describe_url(resolve_url(url))
    if "readonly" in lowered:
        return (f"the results database {where} is read-only ({reason.splitlines()[0]}): point --db / ABLATE_DB_URL at a "
                "writable database; reading commands (sql, report, sweep status) work on a read-only one")
    if "diskisfull" in lowered or "nospaceleft" in lowered or "diskfull" in lowered:
        return (f"the disk is full ({reason.splitlines()[0]}): free space and run the same command "
                "again; finished runs are kept and unfinished ones resume from their last checkpoint")
    return None


_IDS: dict[str, str] = {}  # database id per URL, read once per process


def database_id(engine: sa.Engine) -> str:
    """The database's own identity (made by its migration), which keys its runs' artifacts."""
    key = str(engine.url)
    if key not in _IDS:
        with engine.connect() as conn:
            _IDS[key] = conn.execute(sa.select(Meta.value).where(Meta.key == "db_id")).scalar_one()
    return _IDS[key]


def session_factory(engine: sa.Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)
