"""Shared fixtures: an offline hub, a fresh SQLite file and a fresh PostgreSQL database per test."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

# a hook (xdist groups, the slow tests first) and the test process's Prefect API (tests/suite.py)
from tests.suite import prefect_api, prefect_server, pytest_collection_modifyitems  # noqa: F401

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.pop("ABLATE_DB_URL", None)

REPO = Path(__file__).resolve().parent.parent
TEST_DATA = REPO / "tests" / "data"  # everything the tests read lives in the repository
SAMPLE = REPO / "ablate" / "corpora" / "tinystories-valid-head.txt"
# A PostgreSQL server the suite may create and drop databases and roles on, as a superuser: only where
# ABLATE_TEST_PG_URL names one (.ci/run sets it to the server it starts), never whatever answers on a user's laptop
PG_ADMIN_URL = os.environ.get("ABLATE_TEST_PG_URL") or None
PG_UNSET = ("PostgreSQL tests create and drop databases and roles: they run where ABLATE_TEST_PG_URL names a server "
            "they may use as a superuser, e.g. ABLATE_TEST_PG_URL=postgresql+psycopg://postgres@127.0.0.1:5432/postgres "
            "(.ci/run sets it)")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ablate.db'}"


def _pg_available() -> bool:
    import sqlalchemy as sa

    try:
        engine = sa.create_engine(PG_ADMIN_URL)
        with engine.connect():
            pass
        engine.dispose()
        return True
    except Exception:  # noqa: BLE001 - any failure to connect means no server here
        return False


def throwaway_postgres(prefix: str = "ablate_test", migrated: bool = True):
    """A new database on the real PostgreSQL server, dropped afterwards (a generator: yields its URL): a copy of this
    process's template at ablate's schema (0.1 s against 0.4 s to create and migrate one, under load), or empty
    (`migrated=False`, for a test of what a bare database meets). Skips, saying how to run it, without
    ABLATE_TEST_PG_URL; fails when the server it names is not reachable."""
    import sqlalchemy as sa

    if PG_ADMIN_URL is None:
        pytest.skip(PG_UNSET)
    if not _pg_available():
        pytest.fail(f"PostgreSQL is not reachable at ABLATE_TEST_PG_URL={sa.make_url(PG_ADMIN_URL)!s}: start it, "
                    "or unset ABLATE_TEST_PG_URL to skip the PostgreSQL tests")
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    template = f' TEMPLATE "{_migrated_template(admin)}"' if migrated else ""
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"{template}'))
    if migrated:  # its own identity, as its own migration would have made it (it keys the runs' artifacts)
        copy = sa.create_engine(_url_of(name))
        with copy.begin() as conn:
            conn.execute(sa.text("UPDATE ablate_meta SET value = :id WHERE key = 'db_id'"), {"id": uuid.uuid4().hex})
        copy.dispose()
    yield _url_of(name)
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _url_of(database: str) -> str:
    import sqlalchemy as sa

    return sa.make_url(PG_ADMIN_URL).set(database=database).render_as_string(hide_password=False)


_TEMPLATE: list[str] = []


def _migrated_template(admin) -> str:
    """This process's template database, made once at the schema's head with no connection left open (a database
    being copied must have none), dropped at exit."""
    import atexit

    import sqlalchemy as sa

    from ablate import store

    if not _TEMPLATE:
        name = f"ablate_template_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}_{os.getpid()}"
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        engine = store.make_engine(_url_of(name))
        store.upgrade_schema(engine)
        engine.dispose()

        def drop() -> None:
            with sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT").connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

        atexit.register(drop)
        _TEMPLATE.append(name)
    return _TEMPLATE[0]


@pytest.fixture
def postgres_url(request: pytest.FixtureRequest):
    """A throwaway database on the real PostgreSQL server, at ablate's schema (`@pytest.mark.bare_database`: empty,
    as sqlite_url's file is); dropped afterwards."""
    yield from throwaway_postgres(migrated=request.node.get_closest_marker("bare_database") is None)


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Both backends: every DB test runs on SQLite and on the real PostgreSQL server."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture
def tinystories(tmp_path: Path) -> Path:
    """A private copy of the embedded TinyStories sample (tests never write into the package)."""
    dst = tmp_path / "tinystories.txt"
    dst.write_bytes(SAMPLE.read_bytes())
    return dst


# a test of the results DB on both backends
@pytest.fixture(params=["sqlite", "postgres"])
def any_url(request):
    return request.getfixturevalue(f"{request.param}_url")


# the node check's CUDA tests (tests/gpu): here, not in a tests/gpu/conftest.py, which would shadow this module for
# the tests that `from conftest import ...`


@pytest.fixture(scope="session")
def device():
    """The device every test of tests/gpu trains on: this process's CUDA device where there is one, else the CPU."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@pytest.fixture
def whole_gpu_after(device):
    """The whole GPU again after the test (a capped trainer leaves its memory fraction set for the process)."""
    yield
    if device.type == "cuda":
        import gc

        import torch

        gc.collect()
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        torch.cuda.empty_cache()
