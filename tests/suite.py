"""How the suite runs on several xdist workers (README command 2: `-n 2 --dist loadgroup`): what each worker keeps to
itself, which tests go to one worker together, and which start first. Imported by conftest.py for its hooks.

- Every test process has its own Prefect home (its local servers' databases and profiles): two workers' servers never
  share a database, and a developer's own ~/.prefect (a PREFECT_API_URL of theirs) is never read.
- The tests of a module whose fixtures are module-wide (a cluster, a server, a trained race) are one xdist group, so
  those fixtures start once, on one worker.
- torch computes on one thread per worker (two workers' thread pools on 2 cores slow each other down many times).
- The slow tests start first: the workers' last minutes are short tests, not one long one beside an idle worker.
- One Prefect API server per test process (`prefect_api`), for the tests that run flows and the `sweep run`s that do
  not test the local server itself: a server costs 5-10 CPU-s and 5-15 s to start, and a fresh one changes nothing
  they assert (each reads only its own flow runs).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from tests.waiting import patience

WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")


def private_prefect_home() -> None:
    """A Prefect home of this process's own, made once (an xdist worker inherits its controller's environment: the
    pid tells the home made here from one inherited); no API a developer's shell names."""
    if os.environ.get("ABLATE_TEST_PREFECT_HOME_PID") == str(os.getpid()):
        return
    home = tempfile.mkdtemp(prefix=f"ablate-prefect-{WORKER}-")
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    os.environ.update(PREFECT_HOME=home, ABLATE_TEST_PREFECT_HOME_PID=str(os.getpid()),
                      PREFECT_SERVER_ANALYTICS_ENABLED="false")
    os.environ.pop("PREFECT_API_URL", None)


private_prefect_home()


def one_thread_per_worker() -> None:
    """Under several workers, torch in each (and in the processes its tests start) computes on one thread: two
    workers' OpenMP pools of two threads each on 2 cores wait on each other's descheduled threads at every op (a
    40-step batch test of a d 32 model: 1.5 s alone, 62 s beside another worker's training). A trainer the runner
    starts gets its own share as before (`--threads`, OMP_NUM_THREADS set by the runner)."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        import torch

        torch.set_num_threads(1)
        os.environ.setdefault("OMP_NUM_THREADS", "1")


one_thread_per_worker()


def shares_module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a fixture made once for its module (or package)."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return any(d and d[-1].scope in ("module", "package") for d in defs.values())


def group_name(item: pytest.Item) -> str:
    """The xdist group of a test that shares its module's fixtures: the module's path, as in its node id."""
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None and shares_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(group_name(item)))
    # the slow tests that belong to no group first (xdist sends the groups first, the largest before): a test that
    # takes minutes never starts in the last minutes; each group keeps its place and its order
    first = [i for i in items if i.get_closest_marker("slow") and i.get_closest_marker("xdist_group") is None]
    if first:
        chosen = set(map(id, first))
        items[:] = first + [i for i in items if id(i) not in chosen]


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[str]:
    """The test process's Prefect API server, started when a test first asks: ablate's own local server, as `sweep
    run` starts it (in this process's Prefect home; it ends with this process however that ends)."""
    from ablate.runner import localserver

    limit = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"  # read as the server starts: scaled for the load
    before = os.environ.get(limit)
    os.environ[limit] = str(int(patience(120)))
    try:
        server = localserver.Server()
    finally:
        os.environ.pop(limit) if before is None else os.environ.update({limit: before})
    try:
        yield server.ready()
    finally:
        server.stop()


@pytest.fixture
def prefect_api(prefect_server: str) -> Iterator[str]:
    """The Prefect API for this test: in-process flows run against it (Prefect's settings, for the test only), and a
    subprocess is given it as PREFECT_API_URL. A test of the local server itself starts its own."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: prefect_server}):
        yield prefect_server
        _drain_to_the_api()


def _drain_to_the_api() -> None:
    """Send the logs and events this process's flows still hold, as Prefect's own test harness does at its end:
    none reaches a later test, and none is left for a server that is gone."""
    import inspect

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    async def drain() -> None:
        try:
            result = APILogWorker.instance().drain()
            if inspect.isawaitable(result):
                await result
        except RuntimeError:  # no log was sent: its worker never started
            pass
        result = EventsWorker.drain_all()
        if inspect.isawaitable(result):
            await result

    run_coro_as_sync(drain())
