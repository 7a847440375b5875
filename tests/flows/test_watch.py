"""`ablate sweep watch` from the results DB alone (no Prefect API: a sweep run here); the cluster tests follow
one through its sweep flow run and a server restart (tests/flows/test_cluster.py)."""

from __future__ import annotations

import threading
import time

import pytest

from ablate import store
from ablate.cli import main
from ablate.config import parse_spec
from ablate.config.errors import AblateError
from flows.watch import CANCELLED, COMPLETED, FAILED, watch_sweep

SPEC = {"name": "w", "dataset": {"source": "ablate:tinystories-sample", "eval": {"holdout": 16}},
        "tokenizer": {"vocab_size": 384}, "budget": {"steps": 5, "hardware": "cpu"},
        "defaults": {"architecture": "mixer", "d_model": 32, "layers": 1, "context": 64, "batch_size": 8, "lr": 1e-3},
        "grid": [{"d_model": [32, 48, 64]}]}


@pytest.fixture
def sweep(sqlite_url):
    from ablate.config import expand_grid

    spec = parse_spec(SPEC)
    engine = store.connect(sqlite_url)
    _, ids = store.register_sweep(engine, spec, expand_grid(spec))
    return engine, ids


def _set(engine, ids, *statuses, error=None):
    for rid, status in zip(ids, statuses):
        store.update_run(engine, rid, status=status, error=error if status == "failed" else None)


def test_the_watch_follows_the_runs_until_none_is_owed_and_exits_by_how_the_sweep_ended(sweep, sqlite_url):
    engine, ids = sweep
    _set(engine, ids, "completed", "running", "pending")
    said: list[str] = []

    def the_sweep_goes_on() -> None:
        time.sleep(1.5)
        _set(engine, ids, "completed", "completed", "running")
        time.sleep(1.5)
        _set(engine, ids, "completed", "completed", "completed")

    other = threading.Thread(target=the_sweep_goes_on)
    other.start()
    code = watch_sweep("w", sqlite_url, said.append, poll_seconds=0.5, use_api=False)
    other.join()
    assert code == COMPLETED
    assert said[0] == "sweep w: 1/3 finished (1 completed), 1 pending, 1 running"
    assert said[-1] == "sweep w: 3/3 finished (3 completed)"
    assert "sweep w: 2/3 finished (2 completed), 1 running" in said


def test_a_failed_run_exits_1_with_its_first_error_and_a_cancel_exits_3(sweep, sqlite_url):
    engine, ids = sweep
    _set(engine, ids, "completed", "failed", "oom", error="RuntimeError: boom (at loop.py:3)\nmore")
    said: list[str] = []
    assert watch_sweep("w", sqlite_url, said.append, poll_seconds=0.5, use_api=False) == FAILED
    assert f"run {ids[1]} failed: RuntimeError: boom (at loop.py:3)" in said
    _set(engine, ids, "completed", "cancelled", "oom")
    assert watch_sweep("w", sqlite_url, said.append, poll_seconds=0.5, use_api=False) == CANCELLED


def test_a_sweep_never_registered_is_said_after_the_start_timeout(sqlite_url):
    store.connect(sqlite_url)
    with pytest.raises(AblateError, match="sweep nope was not registered within 1 s"):
        watch_sweep("nope", sqlite_url, print, poll_seconds=0.5, start_seconds=1, use_api=False)


def test_the_command_exits_with_the_watchs_code(sweep, sqlite_url, monkeypatch, capsys):
    engine, ids = sweep
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    _set(engine, ids, "completed", "cancelled", "completed")
    assert main(["sweep", "watch", "w", "--db", sqlite_url, "--poll", "0.5"]) == CANCELLED
    assert "sweep w: 3/3 finished (1 cancelled, 2 completed)" in capsys.readouterr().out


def test_a_completed_sweep_flow_run_with_a_run_untrained_exits_1_naming_it(sweep, sqlite_url):
    """The watch's end uses the sweep flow's rule of owed (runner.owed): a flow run that says Completed while a
    run is still pending (or claimed by a process that is gone) does not make the watch exit 0."""
    from prefect.states import Completed

    from flows.watch import _outcome

    engine, ids = sweep
    _set(engine, ids, "completed", "completed", "pending")
    said: list[str] = []
    assert _outcome(engine, "w", {"completed": 2, "pending": 1}, Completed(), said.append) == FAILED
    assert f"1 run(s) still owed, never trained: run {ids[2]} (pending)" in said
    _set(engine, ids, "completed", "completed", "completed")
    assert _outcome(engine, "w", {"completed": 3}, Completed(), said.append) == COMPLETED


def test_the_watch_follows_a_new_deployment_run_that_has_not_labelled_itself_yet(sweep, sqlite_url, prefect_api):
    """A second `prefect deployment run sweep/w` is Scheduled without the sweep's labels (the flow labels itself
    once it has registered the sweep): the watch follows it, not the labelled flow run that ended before it, and one
    that renames the sweep (`--param budget=...`) is not taken for this sweep. A real Prefect API server."""
    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Running

    from flows.cancel import DB_LABEL, SWEEP_LABEL
    from flows.watch import _newest_sweep_flow_run

    engine, ids = sweep
    database = store.database_id(engine)
    _set(engine, ids, "completed", "completed", "completed")
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name("sweep")
        deployment = client.create_deployment(flow_id=flow_id, name="w")
        old = client.create_flow_run_from_deployment(deployment)
        client.update_flow_run_labels(old.id, {SWEEP_LABEL: "w", DB_LABEL: database})
        client.set_flow_run_state(old.id, Completed(), force=True)
        assert _newest_sweep_flow_run("w", database).id == old.id
        renamed = client.create_flow_run_from_deployment(deployment, parameters={"budget": "steps=9"})
        assert _newest_sweep_flow_run("w", database).id == old.id  # sweep w-steps-9's, not w's
        new = client.create_flow_run_from_deployment(deployment)
        assert renamed.id != new.id and _newest_sweep_flow_run("w", database).id == new.id
        said: list[str] = []

        def the_new_run_goes_on() -> None:
            time.sleep(1.5)
            client.set_flow_run_state(new.id, Running(), force=True)
            time.sleep(1.5)
            client.set_flow_run_state(new.id, Completed(), force=True)

        other = threading.Thread(target=the_new_run_goes_on)
        other.start()
        started = time.monotonic()
        code = watch_sweep("w", sqlite_url, said.append, poll_seconds=0.5)
        other.join()
    assert code == COMPLETED and time.monotonic() - started >= 3, said  # it waited for the new run's end
    assert any(new.name in line and "Scheduled" in line for line in said), said
    assert said[-1].endswith(f"flow run {new.name}: Completed"), said
