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
