"""The dashboard's server side through FastAPI's test client: pages and JSON endpoints over a real results DB,
the table's filter, sort and pages, curves downsampled and grouped over seeds, the change token, the study by the
report's own code, escaping, read-only by construction, and the token a bind beyond 127.0.0.1 needs."""

from __future__ import annotations

import hashlib
import html

import numpy as np
import pytest

from ablate import store
from ablate.config.errors import AblateError
from ablate.results import live
from ablate.ui import check_bind, table
from ablate.ui.app import make_app
from tests.ui.conftest import HOSTILE, build, loss, write_curve


def test_sweeps_are_listed_with_counts_budget_and_hardware(client):
    sweeps = {s["name"]: s for s in client.get("/api/sweeps").json()["sweeps"]}
    widths = sweeps["widths"]
    assert widths["counts"] == {"completed": 7, "running": 1} and widths["runs"] == 8
    assert widths["hardware"] == "cpu" and "steps 400" in widths["budget"] and widths["recipe"] == "modern"


def test_the_runs_table_filters_sorts_and_pages(client, ui_db):
    page = client.get("/api/runs", params={"sweep": "widths", "filter": "d_model=64 status=completed",
                                           "sort": "-eval"}).json()
    assert page["total"] == 8 and page["matched"] == 3
    evals = [r["eval"] for r in page["rows"]]
    assert evals == sorted(evals, reverse=True) and {r["d_model"] for r in page["rows"]} == {64}
    assert page["columns"][:3] == ["run", "status", "progress"] and "layers" not in page["columns"]  # constant
    assert page["counts"] == {"completed": 7, "running": 1}
    words = client.get("/api/runs", params={"sweep": "widths", "filter": "llama eval<1.8"}).json()
    assert words["matched"] and all(r["architecture"] == "llama" and r["eval"] < 1.8 for r in words["rows"])
    second = client.get("/api/runs", params={"sweep": "widths", "offset": 5, "limit": 5}).json()
    assert [r["run"] for r in second["rows"]] == ui_db["ids"][5:] and second["offset"] == 5
    bad = client.get("/api/runs", params={"sweep": "widths", "filter": "model=64"})
    assert bad.status_code == 400 and "no column 'model'" in bad.json()["error"] and "d_model" in bad.json()["error"]
    assert client.get("/api/runs", params={"sweep": "nosuch"}).json()["error"].startswith("no sweep named 'nosuch'")


def test_filter_terms_compare_numbers_as_numbers_and_words_as_words():
    rows = [{"run": 1, "lr": 0.001, "architecture": "mixer"}, {"run": 2, "lr": 0.01, "architecture": "llama"},
            {"run": 3, "lr": None, "architecture": "Mixer"}]
    keep = lambda text: [r["run"] for r in table.selected(rows, text, "")]  # noqa: E731
    assert keep("lr<0.005") == [1] and keep("lr>=1e-3") == [1, 2] and keep("lr!=0.01") == [1, 3]
    assert keep("architecture=mixer") == [1, 3] and keep("MIX") == [1, 3] and keep("architecture>a") == []
    assert [r["run"] for r in table.sort_rows(rows, "-lr", ["lr"])] == [2, 1, 3]  # empty cells last both ways
    assert [r["run"] for r in table.sort_rows(rows, "lr", ["lr"])] == [1, 2, 3]
    with pytest.raises(AblateError, match="did you mean options.gate"):
        table.parse_filter("gate=1", ["run", "options.gate"])


def test_curves_are_downsampled_and_seeds_become_a_mean_with_a_band(client, ui_db):
    engine = store.reader(ui_db["url"])
    first = ui_db["ids"][0]
    train = live.curves(engine, [first], "steps", "train")[first]
    assert len(train[0]) == live.MAX_POINTS and train[0][0] == 0 and train[0][-1] == 400  # 201 points logged
    flops = live.curves(engine, [first], "flops", "eval")[first]
    run = ui_db["runs"][first]
    assert flops[0][-1] == pytest.approx(400 * 1024 * 6000.0 * run.d_model)  # tokens x FLOPs per token
    data = client.get("/api/curves", params={"sweep": "widths", "filter": "architecture=mixer d_model=32"}).json()
    (curve,) = data["series"]
    assert curve["label"] == "architecture=mixer d_model=32 (n=2)"
    seeds = [loss("mixer", 32, s, np.array(curve["x"])) + 0.05 for s in (0, 1)]
    assert np.allclose(curve["low"], seeds[0]) and np.allclose(curve["high"], seeds[1])
    assert np.allclose(curve["mean"], (seeds[0] + seeds[1]) / 2, atol=1e-6)
    per_run = client.get("/api/curves", params={"sweep": "widths", "group": "runs", "x": "tokens"}).json()["series"]
    assert len(per_run) == 8 and per_run[0]["low"] is None and per_run[0]["x"][-1] == 400 * 1024
    by_arch = client.get("/api/curves", params={"sweep": "widths", "group": "architecture"}).json()["series"]
    # llama's fourth run is still training (200 of 400 steps): its mean stops there, and its label says so
    assert [c["label"] for c in by_arch] == ["architecture=mixer (n=4)", "architecture=llama (n=4, to its shortest run)"]
    assert [c["cut"] for c in by_arch] == [False, True] and by_arch[1]["x"][-1] == 200
    assert "no axis 'width'" in client.get("/api/curves", params={"sweep": "widths", "group": "width"}).json()["error"]
    assert "x must be one of" in client.get("/api/curves", params={"sweep": "widths", "x": "epochs"}).json()["error"]


def test_the_change_token_moves_when_a_trainer_flushes_and_the_rows_follow(client, ui_db, tmp_path):
    before = client.get("/api/token", params={"sweep": "widths"}).json()["token"]
    assert client.get("/api/token", params={"sweep": "widths"}).json()["token"] == before  # nothing changed
    running = ui_db["ids"][-1]
    run = ui_db["runs"][running]
    write_curve(store.connect(ui_db["url"]), running, run.architecture, run.d_model, run.seed, range(400, 403, 2))
    page = client.get("/api/runs", params={"sweep": "widths", "filter": f"run={running}"}).json()
    assert page["token"] != before and page["rows"][0]["steps"] == 402


def test_the_study_is_the_reports_own_tables_and_claims_table(client, ui_db, tmp_path):
    from ablate.report import build_report

    study = client.get("/api/study", params={"sweep": "widths"}).json()
    report = build_report("widths", ui_db["url"], tmp_path / "out", formats=("md",))
    text = (tmp_path / "out" / "report.md").read_text()
    assert study["claims"]["rows"]
    for row in study["claims"]["rows"]:
        assert "| " + " | ".join(row) + " |" in text
    assert study["claims"]["method"] in text
    assert [t["title"] for t in study["tables"]] == [t.title for t in report.tables]
    assert study["tables"][0]["rows"][1] == ["Test", *report.tables[0].rows[1][1]]


def test_a_run_page_has_its_config_error_and_log_tail(ui_db, tmp_path):
    from fastapi.testclient import TestClient

    engine = store.reader(ui_db["url"])
    log = tmp_path / "logs" / store.database_id(engine)[:16] / f"run-{ui_db['failed']}.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"line {i}\n" for i in range(500)) + f"boom {HOSTILE}\n")
    data = TestClient(make_app(engine, artifacts=tmp_path), base_url="http://127.0.0.1").get(f"/api/run/{ui_db['failed']}").json()
    assert data["sweep"] == ui_db["hostile"] and data["fields"]["status"] == "failed"
    assert data["error"].startswith(f"RuntimeError: {HOSTILE}") and data["config"]["architecture"] == "mixer"
    lines = data["log"].splitlines()
    assert len(lines) == 200 and lines[0] == "line 301" and lines[-1] == f"boom {HOSTILE}"


def test_pages_escape_every_name_and_send_a_policy_that_forbids_inline_script(client, ui_db):
    page = client.get("/sweep", params={"name": ui_db["hostile"]})
    assert page.status_code == 200 and HOSTILE not in page.text
    assert html.escape(HOSTILE) in page.text.replace("&#34;", "&quot;").replace("&#39;", "&#x27;")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy.split("script-src")[1].split(";")[0]
    assert client.get("/static/uPlot.iife.min.js").status_code == 200  # vendored, no CDN
    assert "cdn" not in client.get("/").text.lower()


def test_nothing_writes_the_database(client, ui_db):
    digest = lambda: hashlib.sha256(ui_db["path"].read_bytes()).hexdigest()  # noqa: E731
    before = digest()
    for url in ("/", "/api/sweeps", "/sweep?name=widths", "/api/runs?sweep=widths", "/api/curves?sweep=widths",
                "/api/study?sweep=widths", f"/api/run/{ui_db['ids'][0]}", f"/run/{ui_db['ids'][0]}"):
        assert client.get(url).status_code == 200, url
    for method in ("post", "put", "delete", "patch"):
        assert getattr(client, method)("/api/runs?sweep=widths").status_code == 405
    assert digest() == before
    with pytest.raises(Exception, match="readonly|read-only|attempt to write"):
        with store.reader(ui_db["url"]).begin() as conn:
            conn.execute(store.Sweep.__table__.delete())


def test_a_token_guards_every_request_and_a_bind_beyond_localhost_needs_one(ui_db):
    from fastapi.testclient import TestClient

    client = TestClient(make_app(store.reader(ui_db["url"]), token="s3cret-t0ken"), base_url="http://127.0.0.1")
    denied = client.get("/api/sweeps")
    assert denied.status_code == 401 and "s3cret" not in denied.text
    assert client.get("/api/sweeps", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/api/sweeps", headers={"Authorization": "Bearer s3cret-t0ken"}).status_code == 200
    first = client.get("/sweep?name=widths&token=s3cret-t0ken", follow_redirects=False)
    assert first.status_code == 303 and "token" not in first.headers["location"]
    assert client.get("/api/sweeps").status_code == 200  # the cookie the first visit set
    with pytest.raises(AblateError, match="--token or ABLATE_UI_TOKEN"):
        check_bind("0.0.0.0", 0, None)
    check_bind("0.0.0.0", 0, "s3cret-t0ken")
    check_bind("127.0.0.1", 0, None)
    assert client.get("/api/sweeps", headers={"Host": "rebound.example"}).status_code == 200  # the token guards it


@pytest.mark.parametrize("host,answered", [("127.0.0.1:8765", True), ("localhost:8765", True), ("[::1]:8765", True),
                                           ("LOCALHOST", True), ("app.localhost", True), ("127.0.0.2", True),
                                           ("attacker.example:8765", False), ("127.0.0.1.attacker.example", False),
                                           ("192.168.1.5:8765", False), ("", False), ("localhost.evil.com", False)])
def test_without_a_token_only_loopback_host_names_are_answered(ui_db, host, answered):
    """A web page that rebinds its own name to 127.0.0.1 sends its name as Host: without a token, refused."""
    from fastapi.testclient import TestClient

    client = TestClient(make_app(store.reader(ui_db["url"])), base_url="http://127.0.0.1")
    got = client.get("/api/sweeps", headers={"Host": host})
    assert (got.status_code == 200) is answered, (host, got.status_code)
    if not answered:
        assert got.status_code == 403 and "DNS rebinding" in got.text and "widths" not in got.text


def test_the_dashboard_reads_a_postgres_results_db_too(postgres_url, tmp_path):
    """The same endpoints over the real PostgreSQL server: counts, filter, seeds as bands, the change token, the
    study, escaping, and a reader that cannot write."""
    from fastapi.testclient import TestClient

    db = build(postgres_url, tmp_path)
    client = TestClient(make_app(store.reader(postgres_url)), base_url="http://127.0.0.1")
    sweeps = {s["name"]: s for s in client.get("/api/sweeps").json()["sweeps"]}
    assert sweeps["widths"]["counts"] == {"completed": 7, "running": 1} and db["hostile"] in sweeps
    page = client.get("/api/runs", params={"sweep": "widths", "filter": "d_model=64", "sort": "-eval"}).json()
    assert page["matched"] == 4 and [r["eval"] for r in page["rows"]] == sorted((r["eval"] for r in page["rows"]),
                                                                                 reverse=True)
    (curve,) = client.get("/api/curves", params={"sweep": "widths", "filter": "architecture=mixer d_model=32"}
                          ).json()["series"]
    assert np.allclose(curve["mean"], [np.mean([float(loss("mixer", 32, s, x)) + 0.05 for s in (0, 1)])
                                       for x in curve["x"]])
    before = client.get("/api/token", params={"sweep": "widths"}).json()
    run = db["runs"][db["ids"][-1]]
    write_curve(store.connect(postgres_url), run.id, run.architecture, run.d_model, run.seed, range(202, 205, 2))
    after = client.get("/api/token", params={"sweep": "widths"}).json()
    assert after["token"] != before["token"] and after["finished"] == before["finished"]
    assert client.get("/api/study", params={"sweep": "widths"}).json()["claims"]["rows"]
    assert HOSTILE not in client.get("/sweep", params={"name": db["hostile"]}).text
    assert client.post("/api/runs?sweep=widths").status_code == 405
    with pytest.raises(Exception, match="read-only"):
        with store.reader(postgres_url).begin() as conn:
            conn.execute(store.Sweep.__table__.delete())


def test_searches_are_read_from_optunas_tables_without_opening_its_storage(client):
    """A study in the results DB (Optuna's own tables, written by Optuna): its trials with their states, values,
    parameters as suggested (a categorical by its value, not its index) and run ids, and the best trial."""
    (found,) = client.get("/api/sweeps").json()["searches"]
    assert found["name"] == "tiny-search" and found["counts"] == {"COMPLETE": 2, "PRUNED": 1}
    assert found["best"]["number"] == 1 and found["best"]["params"] == {"heads": 2, "lr": 3e-3}
    data = client.get("/api/search", params={"name": "tiny-search"}).json()
    assert [(t["number"], t["state"], t["value"], t["params"]["heads"], t["run"]) for t in data["trials"]] == [
        (0, "COMPLETE", 4.1, 4, 1), (1, "COMPLETE", 3.6, 2, 2), (2, "PRUNED", 5.2, 1, 3)]  # its last report
    assert data["params"] == {"heads": {"log": False, "choices": [1, 2, 4]}, "lr": {"log": True, "choices": None}}
    assert data["direction"] == "minimize" and data["sweep"] == "tiny-search"  # its runs: a sweep of its name
    assert "did you mean 'tiny-search'" in client.get("/api/search", params={"name": "tiny-serch"}).json()["error"]
    assert client.get("/search", params={"name": "tiny-search"}).status_code == 200


def test_a_db_without_searches_lists_none(tmp_path):
    from fastapi.testclient import TestClient

    from ablate import runner
    from tests.ui.conftest import spec_file

    url = f"sqlite:///{tmp_path / 'r.db'}"
    runner.register(spec_file(tmp_path, "only"), url)
    data = TestClient(make_app(store.reader(url)), base_url="http://127.0.0.1").get("/api/sweeps").json()
    assert data["searches"] == [] and [s["name"] for s in data["sweeps"]] == ["only"]


def test_a_database_that_goes_away_is_one_line_the_page_shows(tmp_path):
    from fastapi.testclient import TestClient

    from ablate import runner
    from tests.ui.conftest import spec_file

    url = f"sqlite:///{tmp_path / 'r.db'}"
    runner.register(spec_file(tmp_path, "gone"), url)
    store.migrate.close_engines()
    reader = store.reader(url)
    client = TestClient(make_app(reader), base_url="http://127.0.0.1")
    assert client.get("/api/sweeps").status_code == 200
    for path in tmp_path.glob("r.db*"):
        path.unlink()
    reader.dispose()
    gone = client.get("/api/runs", params={"sweep": "gone"})
    assert gone.status_code == 503 and gone.json()["error"].startswith("the results DB cannot be read now: ")


def test_a_run_id_past_any_integer_column_is_one_line_not_a_500(ui_db):
    from fastapi.testclient import TestClient

    client = TestClient(make_app(store.reader(ui_db["url"])), base_url="http://127.0.0.1")
    for path in ("/api/run/{}", "/api/run/{}/curves", "/api/run/{}/sample", "/run/{}"):
        for run_id in ("12345678901234567890", "0", "-3"):
            got = client.get(path.format(run_id))
            assert got.status_code == 400 and got.json() == {"error": f"no run {int(run_id)}: run ids are whole "
                                                                      "numbers from 1"}, (path, run_id, got.text)
    assert client.get(f"/api/run/{2**63 - 1}").status_code == 400  # the largest id: asked, and not there
