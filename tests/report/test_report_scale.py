"""Reports of big sweeps: a table of many runs draws at most MAX_CURVES configurations (seed means), and building
a report scans labels once per table and issues as many SQL statements at 400 runs as at 100."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from ablate import report, store
from ablate.report import MAX_CURVES, build_report, draw_curves, layout_tables, load_views
from ablate.report.render import KNOWN_FORMATS
from ablate.config import load_trials

pytestmark = pytest.mark.scale  # a campaign across the house: `pytest -m scale`

REPO = Path(__file__).resolve().parents[2]
EVAL_POINTS = 4


def fake_sweep(tmp: Path, name: str, grid: list[dict], points: int = 20, url: str | None = None) -> tuple[str, list[int]]:
    """A sweep registered from YAML whose runs all completed with `points` logged points each (no training):
    a run's losses follow its id and seed, so configurations differ and each has a band over its seeds."""
    data = yaml.safe_load((REPO / "sweeps" / "smoke.yaml").read_text())
    data.update(name=name, grid=grid)
    (tmp / f"{name}.yaml").write_text(yaml.safe_dump(data))
    spec, trials = load_trials(tmp / f"{name}.yaml")
    url = url or f"sqlite:///{tmp / f'{name}.db'}"
    engine = store.connect(url)
    _, ids = store.register_sweep(engine, spec, trials)
    train_points = points - EVAL_POINTS
    for rid, trial in zip(ids, trials):
        final = 2.0 + 0.01 * (rid % 97) + 0.1 * trial.seed  # the seed moves every point of a run: a band
        store.update_run(engine, rid, status="completed", final_train_loss=final - 0.1, final_eval_loss=final, epochs=0.5)
        rows = [{"step": s, "split": "train", "elapsed_seconds": float(s), "tokens": 64 * s, "loss": final + 2 - s / 10,
                 "lr": 3e-3} for s in range(1, train_points + 1)]
        rows += [{"step": k * train_points // EVAL_POINTS, "split": "eval", "elapsed_seconds": k * 2.5,
                  "tokens": 64 * k * train_points // EVAL_POINTS, "loss": final + 1 / k, "lr": None}
                 for k in range(1, EVAL_POINTS + 1)]
        store.write_metrics(engine, rid, rows)
    return url, ids


def grid(d_models: list[int], lrs: list[float], seeds: int, layers: tuple[int, ...] = (2,)) -> list[dict]:
    """Two blocks, one table each (the smoke spec's tables group by architecture)."""
    axes = {"d_model": d_models, "lr": lrs, "layers": list(layers), "seeds": seeds}
    return [{"architecture": "mixer", **axes}, {"architecture": "llama", "heads": 4, **axes}]


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """1,500 runs: 2 architectures (tables) x 75 configurations x 10 seeds, 20 points each."""
    tmp = tmp_path_factory.mktemp("big")
    url, ids = fake_sweep(tmp, "big", grid([32, 64, 96, 128, 160], [1e-3, 2e-3, 3e-3, 4e-3, 5e-3], 10, (1, 2, 3)))
    return url, ids, tmp


def curve_lines(ax) -> list:
    return [line for line in ax.get_lines() if line.get_gid()]


def test_a_big_sweep_reports_every_run_and_draws_the_best_configurations(big):
    url, ids, tmp = big
    rep = build_report("big", url, tmp / "out", formats=KNOWN_FORMATS)
    assert len(ids) == 1500 and len(rep.tables) == 2
    assert list(rep.seconds) == ["load", "tables", "figures", "scaling", "claims", "files"]  # bench/db.py's parts
    assert all(s > 0 for s in rep.seconds.values())
    assert all(len(t.columns) == 75 for t in rep.tables)  # every configuration stays a column of its table
    md = (rep.out / "report.md").read_text()
    assert md.count(f"showing {MAX_CURVES} of 75 configurations (750 runs)") == 2
    assert "every run's points in curves-architecture-mixer.csv" in md
    page = (rep.out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and page.count(f"showing {MAX_CURVES} of 75") == 2  # + all on one axis
    assert f"showing {MAX_CURVES} of 150 configurations (1500 runs)" in page
    assert len((rep.out / "runs.csv").read_text().splitlines()) == 1500 + 1
    points = list(csv.DictReader((rep.out / "curves-architecture-mixer.csv").open()))
    assert len(points) == 750 * 20 and len({p["run_id"] for p in points}) == 750  # drawn or not, every run's points
    png = rep.out / "curves-architecture-mixer.png"
    assert png in rep.files and png.read_bytes().startswith(b"\x89PNG")


def test_the_figure_of_a_big_table_draws_seed_means_of_the_lowest_test_losses(big):
    url, ids, _ = big
    engine = store.connect(url)
    spec, views = load_views(engine, "big")
    table = next(t for t in layout_tables(spec, views) if "mixer" in t.title)
    fig = draw_curves(engine, table)
    for ax in fig.axes:
        assert len(curve_lines(ax)) == MAX_CURVES
    assert fig.axes[0].get_legend().get_title().get_text().startswith(f"{MAX_CURVES} of 75 configurations")
    configs: dict[tuple, list] = {}
    for v in (r for col in table.runs for r in col):
        configs.setdefault((v.axes["d_model"], v.axes["lr"], v.axes["layers"]), []).append(v)
    assert all(len(members) == 10 for members in configs.values())
    best = sorted(configs.values(), key=lambda m: statistics.fmean(v.row.final_eval_loss for v in m))[:MAX_CURVES]
    eval_panel = fig.axes[len(spec.report.curves)]  # row 2 (eval), column 1 (seconds)
    lines = {line.get_gid().split("-")[1]: line for line in curve_lines(eval_panel)}
    for rank, members in enumerate(best):
        line = lines[str(rank)]
        assert line.get_label().endswith("(10 runs)")
        with engine.connect() as conn:
            losses = [[p.loss for p in conn.execute(sa.select(store.Metric).where(
                store.Metric.run_id == v.row.id, store.Metric.split == "eval").order_by(store.Metric.step))] for v in members]
        assert list(line.get_ydata()) == pytest.approx([statistics.fmean(k) for k in zip(*losses)])


def test_a_table_of_up_to_max_curves_runs_still_draws_one_line_per_run(tmp_path):
    url, ids = fake_sweep(tmp_path, "small", grid([32, 64, 96, 128, 160], [1e-3], 2))  # 10 runs per table
    engine = store.connect(url)
    spec, views = load_views(engine, "small")
    for table in layout_tables(spec, views):
        run_ids = sorted(r.row.id for col in table.runs for r in col)
        assert len(run_ids) == MAX_CURVES
        fig = draw_curves(engine, table)
        for ax in fig.axes:
            lines = curve_lines(ax)
            assert sorted(int(line.get_gid().split("-")[1]) for line in lines) == run_ids
            assert all(line.get_label().startswith(f"run {line.get_gid().split('-')[1]}: ") for line in lines)
            for line in lines:
                _, rid, split, _ = line.get_gid().split("-")
                with engine.connect() as conn:
                    expected = conn.execute(sa.select(store.Metric.loss).where(
                        store.Metric.run_id == int(rid), store.Metric.split == split).order_by(store.Metric.step)).scalars()
                    assert list(line.get_ydata()) == list(expected)
        assert fig.axes[0].get_legend().get_title().get_text() == ""
    rep = build_report("small", url, tmp_path / "out", formats=("md",))
    assert "showing" not in (rep.out / "report.md").read_text()


def report_costs(tmp: Path, seeds: int, monkeypatch) -> tuple[int, int, int]:
    """(runs, calls of varying_axes, SQL statements) of one report of 2 tables x 10 configurations x `seeds` runs."""
    url, ids = fake_sweep(tmp, f"s{seeds}", grid([32, 64, 96, 128, 160], [1e-3, 2e-3], seeds), points=10)
    calls, statements = [], []
    real = report.views.varying_axes
    for caller in (report.tables, report.curves, report.samples):  # patched where each caller looks it up
        monkeypatch.setattr(caller, "varying_axes", lambda *a: calls.append(1) or real(*a))

    def count(conn, cursor, statement, *rest):
        statements.append(statement)

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", count)
    try:
        build_report(f"s{seeds}", url, tmp / f"out{seeds}")
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", count)
    return len(ids), len(calls), len(statements)


def test_report_cost_does_not_grow_per_run_in_label_scans_or_queries(tmp_path, monkeypatch):
    small = report_costs(tmp_path, 5, monkeypatch)
    large = report_costs(tmp_path, 20, monkeypatch)
    assert (small[0], large[0]) == (100, 400)
    tables = 2
    assert small[1] == large[1] <= 2 * tables + 1  # a table's columns, its figure's labels (+ the completions)
    assert small[2] == large[2]  # the same statements at 4x the runs: no query per run


def test_the_report_computes_its_noise_floor_once_for_its_tables_and_its_claims(tmp_path, monkeypatch):
    # the floor is a pass over every run (about 1 CPU-s at 100,000 runs): the tables print it, the claims test against
    # it, the same numbers
    from ablate.report import render, tables
    from ablate.results import orderings

    url, _ = fake_sweep(tmp_path, "fl", grid([32, 64, 96], [1e-3, 2e-3], 3), points=8)
    data = yaml.safe_load((tmp_path / "fl.yaml").read_text())
    calls = []
    real = orderings.noise_floor
    for module in (render, tables, orderings):  # patched where each caller looks it up
        monkeypatch.setattr(module, "noise_floor", lambda *a, **k: calls.append(1) or real(*a, **k))
    rep = build_report("fl", url, tmp_path / "out", formats=("md",))
    assert len(calls) == 1
    assert data["report"].get("orderings") and rep.claims.cells  # the smoke spec's orderings were checked
    assert rep.claims.floor == real(load_views(store.reader(url), "fl")[1], rep.claims.min_steps)


def test_every_point_is_a_file_only_when_asked(tmp_path):
    """At 100,000 runs x 200 points the file of every point is 1.4 GB: the default report leaves it out and its
    caption says how to ask; `points` among the formats writes it."""
    url, _ = fake_sweep(tmp_path, "pts", grid([32, 64], [1e-3, 2e-3], 3), points=12)
    plain = build_report("pts", url, tmp_path / "plain")
    assert not list(plain.out.glob("curves-*.csv")) and (plain.out / "runs.csv").exists()
    assert "every run's points: add points to --format" in (plain.out / "report.md").read_text()
    asked = build_report("pts", url, tmp_path / "asked", formats=("md", "png", "points"))
    assert sorted(p.name for p in asked.out.glob("curves-*.csv")) == ["curves-architecture-llama.csv",
                                                                     "curves-architecture-mixer.csv"]
    assert "every run's points in curves-architecture-mixer.csv" in (asked.out / "report.md").read_text()


def test_postgresql_writes_the_points_csv_itself_with_the_same_values_as_python(tmp_path, postgres_url):
    # on PostgreSQL the server writes every point (COPY); on SQLite Python's csv writer: the same file, read back
    tables = {}
    for engine_name, url in (("sqlite", None), ("postgresql", postgres_url)):
        folder = tmp_path / engine_name
        folder.mkdir()
        url, _ = fake_sweep(folder, "pts", grid([32, 64], [1e-3, 2e-3], 3), points=12, url=url)
        out = build_report("pts", url, folder / "out", formats=("md", "points"))
        rows = list(csv.DictReader((out.out / "curves-architecture-mixer.csv").open()))
        tables[engine_name] = [{k: (float(v) if k in ("elapsed_seconds", "loss") else v) for k, v in r.items()}
                               for r in rows]
    assert len(tables["sqlite"]) == 12 * 12 and tables["postgresql"] == tables["sqlite"]
    assert tables["postgresql"][0]["configuration"].count(",") >= 1  # a quoted label with commas came through whole


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_reports_runs_csv_from_its_loaded_runs_is_the_csv_results_runs_writes(tmp_path, backend, request,
                                                                                  monkeypatch):
    # the report writes runs.csv from the runs it loaded, instead of reading them all again: the same bytes
    from ablate import results

    url = request.getfixturevalue(f"{backend}_url") if backend == "postgres" else None
    url, ids = fake_sweep(tmp_path, "same", grid([32, 64], [1e-3], 2), points=12, url=url)
    engine = store.connect(url)
    store.update_run(engine, ids[0], notes={"meters": {"eval": 1.5}, "oom_shrink": [{"step": 3}]}, status="oom",
                  error="out of memory, \"quoted\"\nsecond line", finished_at=None)
    with engine.begin() as conn:  # a config field that varies, NULL in most runs: a float column (100.0), also in
        for rid in ids[-2:]:  # a chunk of 3 rows where every run has it (8 runs: the last two)
            config = conn.execute(sa.select(store.Run.config).where(store.Run.id == rid)).scalar_one()
            conn.execute(sa.update(store.Run).where(store.Run.id == rid).values(config={**config, "warmup_steps": 100}))
    _, views = load_views(store.reader(url), "same")
    read, loaded = tmp_path / "read.csv", tmp_path / "loaded.csv"
    results.to_csv(results.runs("same", url), read)
    results.to_csv(results.runs_of([v.row for v in views], "same"), loaded)
    assert loaded.read_bytes() == read.read_bytes()
    assert len(ids) == 8 and len(read.read_text().splitlines()) > len(ids)  # a quoted error spans two lines
    # written a few rows at a time (2,000 in a report), the file is the one pandas writes of the whole frame
    monkeypatch.setattr(results.csvtext, "CSV_CHUNK", 3)
    chunked = tmp_path / "chunked.csv"
    results.to_csv(results.runs("same", url), chunked)
    whole = results.runs("same", url)
    for name in ("config", "options", "library_versions", "notes"):
        whole[name] = [None if v is None else json.dumps(v, sort_keys=True, separators=(",", ":")) for v in whole[name]]
    assert chunked.read_bytes() == read.read_bytes() == whole.to_csv(index=False, lineterminator="\n").encode()
    # and the report's runs.csv, made a few rows at a time from the loaded runs, is that file too
    made = tmp_path / "made.csv"
    results.csvtext.write_runs_csv({"same": [v.row for v in reversed(views)]}, made)
    assert made.read_bytes() == read.read_bytes() and ",100.0," in made.read_text()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_loaded_runs_hold_their_stored_json_with_a_configurations_values_shared_by_its_seeds(tmp_path, backend,
                                                                                            request):
    # load_views parses each run's config and library versions as its row is made, a seed's config holding the
    # values of its configuration's first run: every config and version dict equals what the database holds
    url = request.getfixturevalue(f"{backend}_url") if backend == "postgres" else None
    url, ids = fake_sweep(tmp_path, "seeded", grid([32, 64], [1e-3], 3), points=8, url=url)
    engine = store.connect(url)
    versions = {"torch": "2.13.0", "ablate": "0.1"}
    for rid in ids:
        store.update_run(engine, rid, library_versions={**versions, "run": rid % 2},
                         notes={"hardware": f"host {rid % 2}"} if rid % 3 else None)
    _, views = load_views(store.reader(url), "seeded")
    with sa.orm.Session(engine) as s:
        stored = {r.id: (r.config, r.library_versions, r.options, r.notes) for r in s.scalars(sa.select(store.Run))}
    assert sorted(v.row.id for v in views) == sorted(ids)
    for v in views:
        config, library, options, notes = stored[v.row.id]
        assert v.row.config == config and v.row.config["seed"] == v.axes["seed"]
        assert (v.row.library_versions, v.row.options, v.row.notes) == (library, options, notes)
    by_configuration: dict[tuple, list] = {}
    for v in views:
        by_configuration.setdefault((v.axes["architecture"], v.axes["d_model"]), []).append(v.row)
    assert sorted(len(rows) for rows in by_configuration.values()) == [3, 3, 3, 3]
    for first, *others in by_configuration.values():
        for other in others:
            assert other.config["dataset"] is first.config["dataset"] and other.config["seed"] != first.config["seed"]
    for parity in (0, 1):  # equal versions: one dict
        assert len({id(v.row.library_versions) for v in views if v.row.id % 2 == parity}) == 1


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_runs_read_a_page_at_a_time_are_every_run_once_in_trial_order(tmp_path, backend, request, monkeypatch):
    # load_views reads PAGE runs a query (the driver holds a whole result's text): pages of 3 over 16 runs, two of
    # them sharing a trial index, give the runs that one page gives, in the same order
    from ablate.results import views as views_module

    url = request.getfixturevalue(f"{backend}_url") if backend == "postgres" else None
    url, ids = fake_sweep(tmp_path, "paged", grid([32, 64], [1e-3, 2e-3], 2), points=8, url=url)
    engine = store.connect(url)
    with engine.begin() as conn:  # a trial index two runs hold: the page boundary falls between them
        conn.execute(sa.update(store.Run).where(store.Run.id == ids[3]).values(trial_index=2))
    _, whole = load_views(store.reader(url), "paged")
    monkeypatch.setattr(views_module, "PAGE", 3)
    _, paged = load_views(store.reader(url), "paged")
    assert [v.row.id for v in paged] == [v.row.id for v in whole] and len(whole) == len(ids) == 16
    assert [v.row.trial_index for v in paged] == sorted(v.row.trial_index for v in paged)
    assert [v.row for v in paged] == [v.row for v in whole] and [v.axes for v in paged] == [v.axes for v in whole]
