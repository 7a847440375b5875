"""Hardening of the results DB: atomic claims and fencing, concurrent registration, read-only, newer and
foreign databases, migrations that fail half way, reading commands that never create a database.

(A campaign across the house: `pytest -m hardening` runs all of it.)
"""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from ablate import runner, store
from ablate.config.errors import AblateError

from tests.helpers import at_once, grid_spec


pytestmark = pytest.mark.hardening


def test_racing_claims_on_one_run_have_exactly_one_winner(any_url, tmp_path):
    _, _, ids = runner.register(grid_spec(tmp_path), any_url)
    engine = store.connect(any_url)
    outcomes, errors = at_once(lambda i: (f"contender-{i}", store.claim_run(engine, ids[0], f"contender-{i}")), 8)
    wins = [who for who, won in outcomes if won]
    assert not errors and len(wins) == 1
    run = store.get_run(engine, ids[0])
    assert run.claimed_by == wins[0] and run.status == "running" and run.attempts == 1


def test_a_stale_claim_is_taken_over_and_the_old_claimant_is_fenced_off(any_url, tmp_path):
    _, _, ids = runner.register(grid_spec(tmp_path), any_url)
    engine = store.connect(any_url)
    assert store.claim_run(engine, ids[0], "host-a:1:x")
    assert not store.claim_run(engine, ids[0], "host-b:1:y")  # live: refused
    stale = store.utcnow() - dt.timedelta(seconds=store.stale_seconds() + 5)
    store.update_run(engine, ids[0], heartbeat_at=stale)  # host-a died
    assert store.claim_run(engine, ids[0], "host-b:1:y")
    assert not store.heartbeat(engine, ids[0], "host-a:1:x")  # a back-from-the-dead host learns it lost the run
    assert not store.update_run(engine, ids[0], claimant="host-a:1:x", status="completed")
    run = store.get_run(engine, ids[0])
    assert run.status == "running" and run.claimed_by == "host-b:1:y" and run.attempts == 2


def test_claims_do_not_take_finished_or_cancelled_runs(sqlite_url, tmp_path):
    _, _, ids = runner.register(grid_spec(tmp_path), sqlite_url)
    engine = store.connect(sqlite_url)
    store.update_run(engine, ids[0], status="completed")
    store.update_run(engine, ids[1], status="cancelled")
    assert not store.claim_run(engine, ids[0], "a", runner.CLAIMABLE)
    assert not store.claim_run(engine, ids[1], "a", runner.CLAIMABLE)
    assert store.claim_run(engine, ids[1], "a", runner.CLAIMABLE + ("cancelled",))  # --retry-failed


def test_concurrent_registration_of_one_sweep_does_not_fail(any_url, tmp_path):
    spec = grid_spec(tmp_path, d_models=(32, 48, 64, 80, 96, 112))
    results, errors = at_once(lambda _: runner.register(spec, any_url)[2], 4)
    assert not errors
    assert len({tuple(r) for r in results}) == 1 and len(results[0]) == 6


def test_a_read_only_database_says_read_only(postgres_url, tmp_path, capsys):
    from ablate.cli import main

    spec = grid_spec(tmp_path)
    runner.register(spec, postgres_url)
    store.migrate._ENGINES.clear()
    name = sa.make_url(postgres_url).database
    admin = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on'))
    admin.dispose()
    spec.write_text(spec.read_text().replace("- 64", "- 64\n  - 80"))  # one more trial to write
    assert main(["sweep", "register", str(spec), "--db", postgres_url]) == 2
    err = capsys.readouterr().err
    assert "read-only" in err and "start the server" not in err.lower()


def test_a_newer_schema_and_a_foreign_database_get_one_clear_message(tmp_path, capsys):
    from ablate.cli import main

    url = f"sqlite:///{tmp_path / 'newer.db'}"
    engine = store.connect(url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {store.VERSION_TABLE} SET version_num = '0099'"))
    store.migrate._ENGINES.clear()
    for argv in (["sweep", "status", "x"], ["sweep", "register", str(grid_spec(tmp_path))]):
        assert main([*argv, "--db", url]) == 2
        assert "newer than this ablate" in capsys.readouterr().err
    foreign = tmp_path / "foreign.db"
    with sa.create_engine(f"sqlite:///{foreign}").begin() as conn:
        conn.execute(sa.text("CREATE TABLE runs (id INTEGER PRIMARY KEY, what TEXT)"))
    assert main(["sweep", "register", str(grid_spec(tmp_path)), "--db", str(foreign)]) == 2
    assert "did not create" in capsys.readouterr().err
    with sa.create_engine(f"sqlite:///{foreign}").connect() as conn:
        assert set(sa.inspect(conn).get_table_names()) == {"runs"}  # nothing added


def test_a_sqlite_migration_that_fails_half_way_leaves_the_database_as_it_was(tmp_path):
    from tests.store.test_db import at_revision

    engine = at_revision(f"sqlite:///{tmp_path / 'm.db'}", "0004")
    with engine.begin() as conn:  # something in the way of 0005's second step
        conn.execute(sa.text("CREATE TABLE ablate_meta (x INTEGER)"))
    with pytest.raises(AblateError, match="rolled back"):
        store.upgrade_schema(engine)
    assert store.current_revision(engine) == "0004"
    with engine.connect() as conn:
        assert "claimed_by" not in {c["name"] for c in sa.inspect(conn).get_columns("runs")}  # step one undone


def test_reading_commands_never_create_a_database(tmp_path, monkeypatch, capsys):
    from ablate.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "status", "smoke"]) == 2
    assert main(["report", "smoke"]) == 2
    assert main(["generate", "1", "--prompt", "x"]) == 2
    assert "no results database" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def test_processes_opening_a_new_sqlite_file_at_once_all_get_it(tmp_path):
    """Switching a new file to WAL answers "locked" at once to all but one opener (seen 3 in 40 rounds)."""
    for round_ in range(20):
        url = f"sqlite:///{tmp_path / f'fresh-{round_}.db'}"
        _, errors = at_once(lambda _: store.connect(url), 6)
        store.migrate._ENGINES.pop(url, None)
        assert not errors, errors
