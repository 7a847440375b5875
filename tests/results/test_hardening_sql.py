"""`ablate sql` is read-only by construction: one guarded statement, in a read-only transaction (on PostgreSQL as
the role `ablate_reader`), under a timeout and a row limit, on a database it never creates or migrates."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.helpers import one_seed_smoke
from ablate import results, store
from ablate.results import sqlguard
from ablate.cli import main
from ablate.config.errors import AblateError
from ablate.config import load_trials
from tests.waiting import patience

pytestmark = pytest.mark.hardening  # a campaign across the house: `pytest -m hardening`

REPO = Path(__file__).resolve().parents[2]
SMOKE = one_seed_smoke()  # the smoke sweep with one seed per cell: 4 trials


@pytest.fixture
def registered(db_url: str) -> str:
    """A results database (SQLite or PostgreSQL) holding the smoke sweep's four pending runs."""
    spec, trials = load_trials(SMOKE)
    store.register_sweep(store.connect(db_url), spec, trials)
    return db_url


def snapshot(url: str) -> list[tuple]:
    """What an attack would change: every run's id, status and attempts, and the sweeps."""
    with store.connect(url).connect() as conn:
        return (conn.execute(sa.text("SELECT id, status, attempts, claimed_by FROM runs ORDER BY id")).all()
                + conn.execute(sa.text("SELECT id, name FROM sweeps ORDER BY id")).all())


def refused(url: str, query: str, **limits: float) -> str:
    with pytest.raises(AblateError) as info:
        results.read_only_query(query, url, **limits)
    return str(info.value)


def is_postgres(url: str) -> bool:
    return url.startswith("postgresql")


# ---------------------------------------------------------------- the attacks that worked, one by one


def test_set_transaction_read_write_then_commit_is_refused_and_commits_nothing(registered):
    before = snapshot(registered)
    attack = "SET TRANSACTION READ WRITE; UPDATE runs SET status = 'failed'; COMMIT; SELECT 1"
    assert "runs one read-only statement" in refused(registered, attack) and "got 4 statements" in refused(registered, attack)
    assert "SET controls the transaction" in refused(registered, "SET TRANSACTION READ WRITE")
    assert "COMMIT controls the transaction" in refused(registered, "COMMIT")
    assert snapshot(registered) == before


@pytest.mark.parametrize("target", ["TO PROGRAM 'touch {path}'", "TO '{path}'"])
def test_copy_to_a_program_or_a_server_file_is_refused_and_leaves_no_file(registered, target):
    path = Path(f"/tmp/ablate-sql-{uuid.uuid4().hex}")  # where the server could write, were it allowed
    try:
        message = refused(registered, f"COPY (SELECT 1) {target.format(path=path)}")
        assert message.startswith("refused: COPY") and "--format csv" in message
        message = refused(registered, f"copy runs {target.format(path=path)}")
        assert message.startswith("refused: COPY")
        assert not path.exists()
    finally:
        path.unlink(missing_ok=True)


def test_pg_terminate_backend_is_refused_and_another_session_survives(registered):
    other = sa.create_engine(registered)
    try:
        with other.connect() as conn:
            pid = conn.execute(sa.text("SELECT pg_backend_pid()" if is_postgres(registered) else "SELECT 1")).scalar()
            message = refused(registered, f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = {pid}")
            assert message == "refused: pg_terminate_backend() acts on other sessions; `ablate sql` may not call it"
            assert "pg_cancel_backend()" in refused(registered, f"select PG_CATALOG.pg_cancel_backend ({pid})")
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1  # still connected
    finally:
        other.dispose()


@pytest.mark.parametrize("query", ["SET ROLE postgres", "RESET ROLE", "set local role postgres",
                                   "SELECT set_config('role', 'postgres', true)",
                                   "SELECT pg_catalog.set_config('role', 'postgres', false)",
                                   'SELECT "set_config"(\'role\', \'postgres\', true)',
                                   "SELECT set_config /* a comment */ ('role', 'postgres', true)"])
def test_changing_the_role_or_the_session_is_refused(registered, query):
    message = refused(registered, query)
    assert message.startswith("refused:") and ("controls the transaction or the session" in message
                                              or "set_config() changes the session" in message)


def test_a_data_modifying_with_deletes_nothing(registered):
    before = snapshot(registered)
    for attack in ("WITH x AS (DELETE FROM runs RETURNING *) SELECT * FROM x",
                   "WITH x AS (SELECT 1) UPDATE runs SET status = 'failed'",
                   "with gone as materialized (delete from runs returning id) select count(*) from gone"):
        assert "changes the database" in refused(registered, attack)
    assert "creates a table" in refused(registered, "SELECT * INTO copied FROM runs")
    assert snapshot(registered) == before


def test_the_database_refuses_writes_even_past_the_guard(registered, monkeypatch):
    """Defence in depth: with the guard switched off, the transaction (PostgreSQL: read-only, as ablate_reader, one
    statement per cursor) or the connection (SQLite: mode=ro, query_only, an authorizer) still refuses each attack."""
    monkeypatch.setattr(sqlguard, "check", lambda query, dialect="postgresql": query)
    path = Path(f"/tmp/ablate-sql-{uuid.uuid4().hex}")
    before = snapshot(registered)
    attacks = ["UPDATE runs SET status = 'failed'", "DELETE FROM runs", "DROP TABLE metrics",
               "SELECT 1; UPDATE runs SET status = 'failed'",
               "WITH x AS (DELETE FROM runs RETURNING *) SELECT * FROM x"]
    if is_postgres(registered):
        attacks += [f"COPY (SELECT 1) TO PROGRAM 'touch {path}'", f"COPY runs TO '{path}'",
                    "SELECT pg_terminate_backend({pid})",
                    "SET TRANSACTION READ WRITE", "SELECT * INTO copied FROM runs",
                    f"SELECT query_to_xml('COPY (SELECT 1) TO PROGRAM ''touch {path}''', true, false, '')"]
    else:
        attacks += [f"ATTACH '{path}' AS other", "PRAGMA query_only = 0", "SELECT load_extension('x')",
                    f"VACUUM INTO '{path}'", "CREATE TEMP TABLE t (x)"]
    other = sa.create_engine(registered)
    try:
        with other.connect() as conn:  # the session an attack would end
            pid = conn.execute(sa.text("SELECT pg_backend_pid()" if is_postgres(registered) else "SELECT 1")).scalar()
            for attack in attacks:
                refused(registered, attack.format(pid=pid))
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1
        assert snapshot(registered) == before and not path.exists()
    finally:
        other.dispose()
        path.unlink(missing_ok=True)


# ---------------------------------------------------------------- the guard reads SQL as the server does


@pytest.mark.parametrize("query", [
    "SELECT 1; DELETE FROM runs",
    "SELECT 1 ; ; DELETE FROM runs",
    "SELECT 'it''s;' ; DELETE FROM runs",  # '' is a quote inside the string
    "SELECT 1 /* ; */ ; DELETE FROM runs",
    "SELECT 1 -- ;\n; DELETE FROM runs",
    "SELECT $$;$$; DELETE FROM runs",
    "SELECT $q$ $$ ; $q$; DELETE FROM runs",
    "SELECT E'\\';'; DELETE FROM runs",  # E'' strings: \' is a quote inside
    'SELECT ";"; DELETE FROM runs',
    "/* /* nested */ ; */ SELECT 1; DELETE FROM runs",
])
def test_a_second_statement_is_found_wherever_the_semicolon_hides(query):
    assert "got 2 statements" in str(pytest.raises(AblateError, sqlguard.check, query, "postgresql").value)


@pytest.mark.parametrize(("query", "dialect", "statement"), [
    ("SELECT ';' AS semi, $$;$$ AS dollar, E'\\';' AS e, \";\" FROM runs;", "postgresql",
     "SELECT ';' AS semi, $$;$$ AS dollar, E'\\';' AS e, \";\" FROM runs"),
    ("  -- the best runs\nSELECT 1 ; -- done\n /* really */ ", "postgresql", "SELECT 1"),
    ("(SELECT 1) UNION (SELECT 2);", "postgresql", "(SELECT 1) UNION (SELECT 2)"),
    ("/* /* */ SELECT 1; DELETE FROM runs */ SELECT 2", "postgresql", "SELECT 2"),  # PostgreSQL nests comments
    ("EXPLAIN (ANALYZE, BUFFERS) SELECT * FROM runs", "postgresql", "EXPLAIN (ANALYZE, BUFFERS) SELECT * FROM runs"),
    ("TABLE runs", "postgresql", "TABLE runs"),
    ("VALUES (1), (2)", "sqlite", "VALUES (1), (2)"),
    ("EXPLAIN QUERY PLAN SELECT [a;b] FROM runs", "sqlite", "EXPLAIN QUERY PLAN SELECT [a;b] FROM runs"),
    ("SELECT id FROM runs FOR UPDATE", "postgresql", "SELECT id FROM runs FOR UPDATE"),  # the transaction refuses it
    ("SELECT pg_sleep(1)", "postgresql", "SELECT pg_sleep(1)"),  # the timeout handles it
    # what a user writes, past the function allow-list: keywords and types before a parenthesis are not calls
    ("WITH RECURSIVE t(n) AS (VALUES (1) UNION ALL SELECT n + 1 FROM t WHERE n < 5) SELECT * FROM t", "postgresql",
     "WITH RECURSIVE t(n) AS (VALUES (1) UNION ALL SELECT n + 1 FROM t WHERE n < 5) SELECT * FROM t"),
    ("WITH a(x) AS MATERIALIZED (SELECT 1), b(y) AS NOT MATERIALIZED (SELECT 2) SELECT * FROM a, b", "postgresql",
     "WITH a(x) AS MATERIALIZED (SELECT 1), b(y) AS NOT MATERIALIZED (SELECT 2) SELECT * FROM a, b"),
    ("SELECT CAST(lr AS numeric(10, 2)), lr::numeric(10,2), name::character varying(5) FROM runs", "postgresql",
     "SELECT CAST(lr AS numeric(10, 2)), lr::numeric(10,2), name::character varying(5) FROM runs"),
    ("SELECT avg(x) FILTER (WHERE x > 0) OVER (PARTITION BY y), percentile_cont(0.5) WITHIN GROUP (ORDER BY x) "
     "FROM t TABLESAMPLE BERNOULLI(10) WHERE x IN (SELECT 1) AND EXISTS (SELECT 1) AND NOT (x = 2)", "postgresql",
     "SELECT avg(x) FILTER (WHERE x > 0) OVER (PARTITION BY y), percentile_cont(0.5) WITHIN GROUP (ORDER BY x) "
     "FROM t TABLESAMPLE BERNOULLI(10) WHERE x IN (SELECT 1) AND EXISTS (SELECT 1) AND NOT (x = 2)"),
    ("SELECT g.n, pg_catalog.lower('A') FROM generate_series(1, 3) AS g(n)", "postgresql",
     "SELECT g.n, pg_catalog.lower('A') FROM generate_series(1, 3) AS g(n)"),
    ("SELECT j.value, json_extract(config, '$.lr'), printf('%.3f', 1.0) FROM runs, json_each(runs.config) AS j",
     "sqlite", "SELECT j.value, json_extract(config, '$.lr'), printf('%.3f', 1.0) FROM runs, json_each(runs.config) AS j"),
])
def test_one_read_only_statement_passes_the_guard(query, dialect, statement):
    assert sqlguard.check(query, dialect) == statement


@pytest.mark.parametrize(("query", "dialect", "said"), [
    ("/* /* */ SELECT 1; DELETE FROM runs */ SELECT 2", "sqlite", "got 2 statements"),  # SQLite does not nest them
    ("DELETE FROM runs", "postgresql", "DELETE is not a read-only statement"),
    ("drop table runs", "sqlite", "drop is not a read-only statement"),
    ("BEGIN", "postgresql", "BEGIN controls the transaction"),
    ("DO $$ BEGIN PERFORM 1; END $$", "postgresql", "DO controls the transaction"),
    ("CALL p()", "postgresql", "CALL controls"),
    ("LISTEN x", "postgresql", "LISTEN controls"),
    ("LOCK runs", "postgresql", "LOCK controls"),
    ("PREPARE p AS DELETE FROM runs", "postgresql", "PREPARE controls"),
    ("DISCARD ALL", "postgresql", "DISCARD controls"),
    ("PRAGMA query_only = 0", "sqlite", "PRAGMA changes how the database is opened"),
    ("ATTACH 'x.db' AS x", "sqlite", "ATTACH changes how the database is opened"),
    ("EXPLAIN ANALYZE DELETE FROM runs", "postgresql", "EXPLAIN of DELETE"),
    ("SELECT load_extension('/tmp/x.so')", "sqlite", "load_extension() loads code"),
    ("SELECT pg_read_file('/etc/passwd')", "postgresql", "pg_read_file() reads or writes files"),
    ("SELECT lo_import('/etc/passwd')", "postgresql", "lo_import() reads or writes files"),
    ("SELECT r.pg_read_file FROM (SELECT '/etc/passwd') AS r", "postgresql", "pg_read_file() reads"),  # row.f is f(row)
    ("SELECT pg_advisory_lock(1)", "postgresql", "pg_advisory_lock() takes locks"),
    ("SELECT pg_try_advisory_xact_lock(1)", "postgresql", "pg_try_advisory_xact_lock() takes locks"),
    ("SELECT * FROM dblink_exec('x')", "postgresql", "dblink_exec() runs SQL text"),
    ("SELECT nextval('runs_id_seq')", "postgresql", "nextval() changes sequences"),
    ("SELECT pg_reload_conf()", "postgresql", "pg_reload_conf() changes the server"),
    ('SELECT U&"\\0073et_config"(\'role\', \'postgres\', true)', "postgresql", 'U&"..." identifiers'),
    # functions outside the allow-list: SQL text run where the guard cannot read it, and anything unknown
    ("SELECT * FROM ts_stat('SELECT to_tsvector(set_config(''role'', ''ablate'', true))')", "postgresql",
     "ts_stat() at character 15 is not a function `ablate sql` calls"),
    ("SELECT pg_catalog.ts_stat('x')", "postgresql", "ts_stat() at character 19 is not a function"),
    ('SELECT "ts_stat"(\'x\')', "postgresql", "ts_stat() at character 8 is not a function"),
    ("SELECT * FROM (SELECT 'x' AS q) s, LATERAL ts_stat(q) AS (w text, n int, e int)", "postgresql",
     "ts_stat() at character 44 is not a function"),  # a column definition list is not a CTE's column list
    ("SELECT database_to_xml(true, true, '')", "postgresql", "database_to_xml() at character 8 is not a function"),
    ("SELECT xpath('/a', '<a/>')", "postgresql", "xpath() at character 8 is not a function"),
    ("SELECT my_udf(1)", "sqlite", "my_udf() at character 8 is not a function"),
    ("SELECT 'never closed", "postgresql", "string opened at character 8 that is never closed"),
    ("SELECT $a$ never closed", "postgresql", "$a$-quoted string opened at character 8"),
    ("SELECT 1 /* never closed", "postgresql", "comment opened at character 10"),
    ("  ;  -- nothing", "postgresql", "the query is empty"),
])
def test_the_guard_says_what_it_refused(query, dialect, said):
    message = str(pytest.raises(AblateError, sqlguard.check, query, dialect).value)
    assert message.startswith("refused: ") and said in message, message


# ---------------------------------------------------------------- limits


def test_a_long_query_stops_at_the_timeout_with_a_clear_message(registered):
    query = ("SELECT pg_sleep(5)" if is_postgres(registered) else
             "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1000000000) SELECT count(*) FROM c")
    start = time.monotonic()
    message = refused(registered, query, timeout_seconds=1)
    assert time.monotonic() - start < patience(2.5)  # the 1 s limit, then at once
    assert message == "the query ran past the 1 s limit; narrow it or pass --timeout SECONDS"
    # the pooled connection is usable afterwards, its handler and authorizer gone
    assert results.read_only_query("SELECT 1 AS one", registered) == (["one"], [(1,)])
    assert results.runs(url=registered)["status"].tolist() == ["pending"] * 4


def test_the_timeout_flag_from_the_cli(registered, capsys):
    query = "SELECT pg_sleep(3)" if is_postgres(registered) else \
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1000000000) SELECT count(*) FROM c"
    start = time.monotonic()
    assert main(["sql", query, "--timeout", "0.5", "--db", registered]) == 2
    assert time.monotonic() - start < patience(2)  # the 0.5 s limit, then at once
    assert "ran past the 0.5 s limit" in capsys.readouterr().err


def test_more_rows_than_the_limit_is_a_clear_error_and_zero_means_no_limit(registered, capsys, monkeypatch):
    query = "VALUES (1), (2), (3)"
    assert refused(registered, query, max_rows=2) == \
        "the query returns more than 2 rows; add LIMIT, or pass --max-rows N (0: no limit)"
    assert results.read_only_query(query, registered, max_rows=3)[1] == [(1,), (2,), (3,)]
    assert results.read_only_query(query, registered, max_rows=0)[1] == [(1,), (2,), (3,)]
    assert main(["sql", "SELECT id FROM runs", "--max-rows", "3", "--db", registered]) == 2
    assert "more than 3 rows" in capsys.readouterr().err
    assert main(["sql", "SELECT id FROM runs", "--max-rows", "0", "--format", "csv", "--db", registered]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 5
    monkeypatch.setenv("ABLATE_SQL_MAX_ROWS", "2")  # the environment sets the default; the flag beats it
    assert main(["sql", "SELECT id FROM runs", "--db", registered]) == 2
    assert "more than 2 rows" in capsys.readouterr().err
    assert main(["sql", "SELECT id FROM runs", "--max-rows", "4", "--format", "json", "--db", registered]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 4


def test_a_result_over_the_byte_cap_is_refused_quickly_with_the_limit(registered, capsys, monkeypatch):
    # one huge value (made by the server), and many moderate ones adding up
    huge = "SELECT length(zeroblob(900000000))" if not is_postgres(registered) else None
    one = "SELECT zeroblob(900000000)" if not is_postgres(registered) else "SELECT repeat('x', 300000000)"
    many = ("SELECT hex(zeroblob(600000)) FROM runs, runs AS b, runs AS c" if not is_postgres(registered) else
            "SELECT repeat('x', 1000000) FROM generate_series(1, 100)")
    for query in (one, many):
        t0 = time.monotonic()
        message = refused(registered, query, max_bytes=64 << 20)
        assert message == ("the query's result is over the 64 MiB limit; select fewer or shorter values, or pass "
                           "--max-bytes N (0: no limit)"), message
        assert time.monotonic() - t0 < patience(20), query
    if huge:  # a value made inside the query and never returned is capped too (SQLite's own length limit)
        assert "64 MiB" in refused(registered, huge, max_bytes=64 << 20)
    assert results.read_only_query("SELECT 'abc'", registered, max_bytes=3)[1] == [("abc",)]
    assert "over the 3-byte limit" in refused(registered, "SELECT 'abcd'", max_bytes=3)
    monkeypatch.setenv("ABLATE_SQL_MAX_BYTES", "10")  # the environment sets the default; the flag beats it
    capsys.readouterr()
    assert main(["sql", "SELECT 'more than ten bytes'", "--db", registered]) == 2
    assert "--max-bytes" in capsys.readouterr().err
    assert main(["sql", "SELECT 'more than ten bytes'", "--max-bytes", "0", "--format", "csv", "--db", registered]) == 0
    assert "more than ten bytes" in capsys.readouterr().out


PEAK = """
import resource, sys
from ablate import results
from ablate.config.errors import AblateError
results.read_only_query("SELECT 1", sys.argv[1])  # imports and the connection, before the baseline
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    results.read_only_query(sys.argv[2], sys.argv[1])
except AblateError as exc:
    print(str(exc))
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


def test_the_byte_cap_is_counted_as_rows_arrive_not_after_a_batch_is_in_memory(registered):
    """20 rows of 60 MB against the 64 MiB cap: refused at the second row (peak 1.35 GB on SQLite and 2.4 GB on
    PostgreSQL when a 1000-row batch was fetched before counting), and the cursor closes without a traceback."""
    import subprocess
    import sys

    from tests.helpers import cli_env

    rows = ("SELECT repeat('x', 60000000) FROM generate_series(1, 20)" if is_postgres(registered) else
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20) "
            "SELECT hex(zeroblob(30000000)) FROM n")
    done = subprocess.run([sys.executable, "-c", PEAK, registered, rows], capture_output=True, text=True,
                          env=cli_env(), timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    said, peak_mb = done.stdout.splitlines()
    assert said.startswith("the query's result is over the 64 MiB limit")
    assert int(peak_mb) < 400, peak_mb  # two rows (120 MB) and their copies in flight


def test_bad_limits_say_where_they_came_from(registered, capsys, monkeypatch):
    monkeypatch.setenv("ABLATE_SQL_TIMEOUT", "soon")
    assert main(["sql", "SELECT 1", "--db", registered]) == 2
    assert "ABLATE_SQL_TIMEOUT=soon is not a number" in capsys.readouterr().err
    monkeypatch.delenv("ABLATE_SQL_TIMEOUT")
    assert main(["sql", "SELECT 1", "--max-rows", "-1", "--db", registered]) == 2
    assert "--max-rows -1 is negative" in capsys.readouterr().err
    monkeypatch.setenv("ABLATE_SQL_TIMEOUT", "-2")
    assert main(["sql", "SELECT 1", "--db", registered]) == 2
    assert "ABLATE_SQL_TIMEOUT=-2 is negative; give --timeout or ABLATE_SQL_TIMEOUT a number >= 0" in capsys.readouterr().err


# ---------------------------------------------------------------- reading never writes


@pytest.mark.parametrize("name", ["a#b.db", "a?b.db", "x%41.db", "sp ace#?.db"])
def test_a_sqlite_path_with_url_characters_is_the_file_every_command_opens(tmp_path, capsys, name):
    folder = tmp_path / "runs#1?v=2"
    folder.mkdir()
    path = folder / name
    spec, trials = load_trials(SMOKE)
    store.register_sweep(store.connect(str(path)), spec, trials)  # a bare path, as --db takes it
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file() and p.suffix == ".db") == [name]
    for url in (str(path), sa.URL.create("sqlite", database=str(path)).render_as_string()):  # a path; its URL
        capsys.readouterr()
        assert main(["sql", "SELECT count(*) AS n FROM runs", "--format", "csv", "--db", url]) == 0
        assert capsys.readouterr().out.split() == ["n", "4"], url
        assert main(["sweep", "status", "smoke", "--format", "csv", "--db", url]) == 0
        assert len(capsys.readouterr().out.splitlines()) == 5
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file() and p.suffix == ".db") == [name]  # no other file


def test_no_database_is_a_clear_error_and_creates_nothing(tmp_path, capsys):
    path = tmp_path / "nowhere" / "ablate.db"
    assert main(["sql", "SELECT 1", "--db", str(path)]) == 2
    assert f"no results database at {path}" in capsys.readouterr().err
    assert not path.parent.exists()


def test_a_foreign_sqlite_file_is_not_touched(tmp_path, capsys):
    path = tmp_path / "notes.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    schema = sqlite3.connect(path).execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
    assert main(["sql", "SELECT * FROM notes", "--db", str(path)]) == 2
    err = capsys.readouterr().err
    assert "is not an ablate results database (it has tables notes" in err
    assert sqlite3.connect(path).execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall() == schema
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


@pytest.mark.bare_database
def test_an_empty_database_stays_empty(db_url, capsys):
    if not is_postgres(db_url):
        Path(sa.make_url(db_url).database).touch()
    assert main(["sql", "SELECT 1", "--db", db_url]) == 2
    assert "is not an ablate results database (it is empty)" in capsys.readouterr().err
    engine = store.make_engine(db_url)
    assert sa.inspect(engine).get_table_names() == []
    engine.dispose()


@pytest.mark.bare_database  # migrated from an older revision
def test_an_older_database_is_not_migrated(db_url, capsys):
    from alembic import command

    engine = store.make_engine(db_url)
    cfg = store.migrate._alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0004")
    assert main(["sql", "SELECT count(*) FROM runs", "--db", db_url]) == 2
    assert "run `ablate db upgrade` once" in capsys.readouterr().err
    assert store.current_revision(engine) == "0004" and "ablate_meta" not in sa.inspect(engine).get_table_names()
    engine.dispose()


# ---------------------------------------------------------------- who runs it, and what the user sees


def test_on_postgres_the_statement_runs_as_ablate_reader_in_a_read_only_transaction(postgres_url):
    spec, trials = load_trials(SMOKE)
    store.register_sweep(store.connect(postgres_url), spec, trials)
    columns, rows = results.read_only_query(
        "SELECT current_user, current_setting('transaction_read_only'), current_setting('statement_timeout')",
        postgres_url, timeout_seconds=7)
    assert rows == [("ablate_reader", "on", "7s")]
    message = refused(postgres_url, "SELECT * FROM ablate_meta")
    assert "permission denied for table ablate_meta" in message
    assert "`ablate sql` reads the results tables and views: sweeps, runs, metrics, run_results, best_runs, eval_curve, " \
        "race_decisions" \
        in message
    assert results.read_only_query("SELECT count(*) FROM best_runs", postgres_url)[1] == [(0,)]


def test_after_a_search_the_reader_reads_optunas_tables_and_the_race_but_not_ablates_own_or_stored_code(
        postgres_url):
    """A search creates Optuna's tables after the migrations and grants the reader those: only those. Before,
    it granted every table in the schema, ablate_meta and the stored plugin sources included."""
    from ablate.search.study import open_storage

    open_storage(postgres_url, create=True)
    assert results.read_only_query("SELECT count(*) FROM trials", postgres_url)[1] == [(0,)]
    assert results.read_only_query("SELECT count(*) FROM race_decisions", postgres_url)[1] == [(0,)]  # 0013
    for table in ("ablate_meta", "plugin_sources", "ablate_alembic_version"):
        assert f"permission denied for table {table}" in refused(postgres_url, f"SELECT * FROM {table}")


def test_upgrading_takes_back_what_an_older_search_granted_the_reader(postgres_url):
    """A database where a search granted the reader every table (before 0013): upgrading revokes ablate's own."""
    engine = store.connect(postgres_url)

    def readable(table: str) -> bool:
        with engine.connect() as conn:
            return conn.exec_driver_sql(f"SELECT has_table_privilege('ablate_reader', '{table}', 'SELECT')").scalar()

    with engine.begin() as conn:
        conn.exec_driver_sql("GRANT SELECT ON ALL TABLES IN SCHEMA public TO ablate_reader")
        conn.exec_driver_sql("REVOKE SELECT ON race_decisions FROM ablate_reader")
        conn.exec_driver_sql("DROP TABLE study_cache")  # as a database at 0012 is
        conn.exec_driver_sql("UPDATE ablate_alembic_version SET version_num = '0012'")
    assert readable("ablate_meta") and readable("plugin_sources") and not readable("race_decisions")
    assert main(["db", "upgrade", "--db", postgres_url]) == 0
    assert [readable(t) for t in ("ablate_meta", "plugin_sources", "plugin_facts", "race_decisions")] == \
        [False, False, False, True]
    assert "permission denied for table plugin_sources" in refused(postgres_url, "SELECT * FROM plugin_sources")
    engine.dispose()


def test_the_cli_exits_2_with_the_refusal_and_no_traceback(registered, capsys):
    before = snapshot(registered)
    for attack, said in [("SELECT 1; DELETE FROM runs", "got 2 statements"),
                         ("COPY runs TO PROGRAM 'true'", "refused: COPY"),
                         ("UPDATE runs SET status = 'failed'", "read-only"),
                         ("SELECT pg_terminate_backend(1)", "pg_terminate_backend()")]:
        assert main(["sql", attack, "--db", registered]) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err
    assert main(["sql", "SELECT count(*) AS n, 'a%' AS pct, ':x' AS colon FROM runs", "--format", "json",
                 "--db", registered]) == 0  # % and :name are text, not placeholders
    assert json.loads(capsys.readouterr().out) == [{"n": 4, "pct": "a%", "colon": ":x"}]
    assert snapshot(registered) == before


def test_passwords_in_error_text_are_redacted(registered):
    message = refused(registered, 'SELECT * FROM "postgresql://someone:s3cret@example.org/db"')
    assert "s3cret" not in message and "someone:***@example.org" in message


# ---------------------------------------------------------------- a login that can only read (PostgreSQL)


@pytest.fixture
def compose_like(postgres_url, monkeypatch):
    """docker-compose.yml's setup on the real server: an ordinary writer login that owns its database and belongs
    to ablate_reader, no superuser anywhere in ablate's URLs; (writer URL, reader URL, admin engine)."""
    from tests.conftest import PG_ADMIN_URL

    tag = uuid.uuid4().hex[:8]
    writer, name = f"ablate_writer_{tag}", f"ablate_compose_{tag}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {writer} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
        conn.exec_driver_sql(f"CREATE DATABASE {name} OWNER {writer}")
        conn.exec_driver_sql("DO $$ BEGIN CREATE ROLE ablate_reader NOLOGIN; EXCEPTION WHEN duplicate_object THEN "
                             "NULL; END $$")
        conn.exec_driver_sql(f"GRANT ablate_reader TO {writer}")
    base = sa.make_url(PG_ADMIN_URL)
    writer_url = base.set(username=writer, password=None, database=name).render_as_string(hide_password=False)
    reader_url = base.set(username="ablate_reader", password=None, database=name).render_as_string(hide_password=False)
    monkeypatch.delenv("ABLATE_READ_URL", raising=False)
    try:
        yield writer_url, reader_url, admin
    finally:
        from ablate.store import readlogin

        readlogin._checked.cache_clear()
        for engine in list(store.migrate._READERS.values()):
            engine.dispose()
        store.migrate._READERS.clear()
        with admin.connect() as conn:
            conn.exec_driver_sql("ALTER ROLE ablate_reader NOLOGIN")
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            conn.exec_driver_sql(f"DROP OWNED BY {writer}")
            conn.exec_driver_sql(f"DROP ROLE IF EXISTS {writer}")


def test_with_its_own_read_login_ablate_sql_cannot_become_the_writer_even_past_the_guard(compose_like, monkeypatch,
                                                                                        capsys):
    writer_url, reader_url, admin = compose_like
    spec, trials = load_trials(SMOKE)
    store.register_sweep(store.connect(writer_url), spec, trials)
    writer = store.connect(writer_url)
    before = snapshot(writer_url)
    # `ablate db upgrade` with ABLATE_READ_URL: the writer may not make roles, so it prints the SQL for the admin
    monkeypatch.setenv("ABLATE_READ_URL", reader_url)
    capsys.readouterr()
    assert main(["db", "upgrade", "--db", writer_url]) == 0
    said = capsys.readouterr().out
    assert "an administrator runs: ALTER ROLE ablate_reader LOGIN" in said, said
    with admin.connect() as conn:
        conn.exec_driver_sql("ALTER ROLE ablate_reader LOGIN")
    assert results.read_only_query("SELECT current_user, session_user, count(*) FROM runs GROUP BY 1, 2",
                                   writer_url)[1] == [("ablate_reader", "ablate_reader", 4)]
    # the escape: SQL the guard cannot see (here the guard is switched off) tries to return to the writer's role
    # and end the writer's sessions; the login has no role above it
    monkeypatch.setattr(sqlguard, "check", lambda query, dialect: query)
    with writer.connect() as victim:
        pid = victim.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        name = sa.make_url(writer_url).username
        for attack in (f"SELECT set_config('role', '{name}', true)",
                       f"SELECT pg_terminate_backend({pid})",
                       f"SELECT query_to_xml('SELECT set_config(''role'', ''{name}'', true)', true, false, '')"):
            message = refused(writer_url, attack)
            assert "permission denied" in message or "refused" in message or "not permitted" in message, message
        assert victim.exec_driver_sql("SELECT 1").scalar() == 1  # the writer's session survived
    assert snapshot(writer_url) == before
    # the CLI says nothing about logins when it has the read-only one, and names the fix when it has not
    monkeypatch.undo()
    monkeypatch.setenv("ABLATE_READ_URL", reader_url)
    capsys.readouterr()
    assert main(["sql", "SELECT count(*) AS n FROM runs", "--format", "csv", "--db", writer_url]) == 0
    assert "note:" not in capsys.readouterr().err
    monkeypatch.delenv("ABLATE_READ_URL")
    assert main(["sql", "SELECT count(*) AS n FROM runs", "--format", "csv", "--db", writer_url]) == 0
    assert "set ABLATE_READ_URL" in capsys.readouterr().err


def test_without_a_read_login_sql_inside_a_string_is_refused_by_the_function_allow_list(compose_like):
    """The escape of turn 3 on a compose-like server (a non-superuser writer that switches to ablate_reader for
    each statement, no read login): ts_stat() runs its SQL text, where `set_config('role', ...)` returned to the
    writer's role and pg_terminate_backend ended the writer's sessions. The allow-list refuses the call."""
    writer_url, _, _ = compose_like
    spec, trials = load_trials(SMOKE)
    store.register_sweep(store.connect(writer_url), spec, trials)
    before = snapshot(writer_url)
    name = sa.make_url(writer_url).username
    with store.connect(writer_url).connect() as victim:
        pid = victim.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        inner = f"SELECT to_tsvector(set_config('role', '{name}', true) || pg_terminate_backend({pid})::text)"
        attack = f"SELECT * FROM ts_stat('{inner.replace(chr(39), chr(39) * 2)}')"
        message = refused(writer_url, attack)
        assert "ts_stat() at character 15 is not a function `ablate sql` calls" in message, message
        assert victim.exec_driver_sql("SELECT 1").scalar() == 1  # the writer's session survived
    assert snapshot(writer_url) == before
    # and a user's ordinary query still runs under the same guard
    assert results.read_only_query("WITH t(n) AS (SELECT count(*) FROM runs) SELECT current_user, "
                                   "CAST(n AS numeric(6, 1)) FROM t", writer_url)[1] == [("ablate_reader", 4)]


def test_a_read_url_that_can_write_or_opens_another_database_is_refused(compose_like, monkeypatch):
    from ablate.store import readlogin

    writer_url, reader_url, _ = compose_like
    spec, trials = load_trials(SMOKE)
    store.register_sweep(store.connect(writer_url), spec, trials)
    monkeypatch.setenv("ABLATE_READ_URL", writer_url)  # the writer's own login given as the reader
    message = refused(writer_url, "SELECT 1")
    assert "is not a read-only login" in message and "it can write the runs table" in message, message
    readlogin._checked.cache_clear()
    monkeypatch.setenv("ABLATE_READ_URL", sa.make_url(reader_url).set(database="postgres").render_as_string(False))
    assert "point both at the same database" in refused(writer_url, "SELECT 1")
