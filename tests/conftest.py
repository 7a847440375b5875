"""Shared fixtures: an offline hub, a fresh SQLite file and a fresh PostgreSQL database per test."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.pop("ABLATE_DB_URL", None)

REPO = Path(__file__).resolve().parent.parent
TEST_DATA = REPO / "tests" / "data"  # everything the tests read lives in the repository
SAMPLE = REPO / "ablate" / "corpora" / "tinystories-valid-head.txt"
# The server .ci/run starts (trust auth). Override with ABLATE_TEST_PG_URL.
PG_ADMIN_URL = os.environ.get("ABLATE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


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


def throwaway_postgres(prefix: str = "ablate_test"):
    """A new database on the real PostgreSQL server, dropped afterwards (a generator: yields its URL). Fails in CI
    and skips elsewhere when the server is not reachable."""
    import sqlalchemy as sa

    if not _pg_available():
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL is not reachable at {PG_ADMIN_URL}; .ci/run must start it")
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}")
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    yield sa.make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def postgres_url():
    """A throwaway database on the real PostgreSQL server; dropped afterwards."""
    yield from throwaway_postgres()


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
