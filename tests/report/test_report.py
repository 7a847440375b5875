"""Reports rendered from a DB filled by a real (tiny) sweep: tables equal the DB, curves hold every run."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import sqlalchemy as sa
import yaml

from ablate import runner, store
from ablate.report import RunView, build_report, draw_curves, layout_tables, load_views
from ablate.train import TrainerSettings, train
from ablate.config import TrialConfig

REPO = Path(__file__).resolve().parents[2]


def write_spec(tmp_path: Path, **changes) -> Path:
    data = yaml.safe_load((REPO / "sweeps" / "smoke.yaml").read_text())
    data.update({"budget": {"steps": 12, "hardware": "cpu"}, "eval": {"at": [0.5]}, "tokenizer": {"vocab_size": 512},
                 "dataset": {"source": "ablate:tinystories-sample", "eval": {"holdout": 24}, "packing": "pad"}})  # the small sample: fast
    data["defaults"]["context"] = 48
    data["grid"] = [{"architecture": "mixer", "d_model": [32, 64]}, {"architecture": "llama", "heads": 4, "d_model": [32, 64]}]
    data["reference"] = [{"match": {"architecture": "mixer", "d_model": 32}, "train": 2.5, "eval": 2.75}]
    data.update(changes)
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """The smoke grid (plus a second seed of one trial) really trained, in-process, into a SQLite DB."""
    tmp = tmp_path_factory.mktemp("report")
    spec = write_spec(tmp, grid=[{"architecture": "mixer", "d_model": [32, 64]},
                                 {"architecture": "mixer", "d_model": 32, "seeds": [1]},
                                 {"architecture": "llama", "heads": 4, "d_model": [32, 64]}])
    url = f"sqlite:///{tmp / 'r.db'}"
    _, _, ids = runner.register(spec, url)
    engine = store.connect(url)
    for rid in ids:
        trial = TrialConfig.model_validate(store.get_run(engine, rid).config)
        store.claim_run(engine, rid, "test")
        train(trial, TrainerSettings(artifacts=tmp / "art", db_url=url, run_id=rid, progress=False, log_points=6))
    return url, ids, tmp


def test_every_table_cell_equals_the_db(filled):
    url, ids, tmp = filled
    report = build_report("smoke", url, tmp / "out")
    engine = store.connect(url)
    with engine.connect() as conn:
        rows = {r.id: r for r in conn.execute(sa.select(store.Run))}
    tables = {t.title: t for t in report.tables}
    assert set(tables) == {"architecture=mixer", "architecture=llama"}
    mixer = tables["architecture=mixer"]
    assert mixer.columns == ["d=32", "d=64"]
    train_row = dict(mixer.rows)["Train"]
    d32 = [r for r in rows.values() if r.architecture == "mixer" and r.d_model == 32]
    assert len(d32) == 2  # two seeds: mean ± the half-width of the 95% t-interval (t(0.975, 1) = 12.706), n
    import math
    import statistics

    values = [r.final_train_loss for r in d32]
    half = 12.7062047 * statistics.stdev(values) / math.sqrt(2)
    assert train_row[0] == f"{statistics.fmean(values):.2f} ± {half:.2f} (n=2)"
    d64 = next(r for r in rows.values() if r.architecture == "mixer" and r.d_model == 64)
    assert train_row[1] == f"{d64.final_train_loss:.2f} (n=1)"  # beside a cell of two seeds, one says so
    assert dict(mixer.rows)["Test"][1].startswith(f"{d64.final_eval_loss:.2f} (n=1)")
    assert dict(mixer.rows)["Steps"] == ["12", "12"]
    assert dict(mixer.rows)["Train time (s)"][1] == f"{d64.train_seconds:.0f}"
    assert dict(mixer.rows)["Test (published)"] == ["2.75", ""]
    mean_eval = statistics.fmean(r.final_eval_loss for r in d32)
    assert dict(mixer.rows)["Test − published"][0] == f"{mean_eval - 2.75:+.2f}"
    assert not any("Noise floor" in n for n in mixer.notes)  # 12 steps < min_steps: no run enters the report's floor
    llama = tables["architecture=llama"]
    for r in rows.values():
        if r.architecture == "llama":
            col = llama.columns.index(f"d={r.d_model}")
            assert dict(llama.rows)["Train"][col] == f"{r.final_train_loss:.2f}"
            assert dict(llama.rows)["Test"][col] == f"{r.final_eval_loss:.2f} †"  # 12 steps: too few to compare
    assert any("fewer than 50 steps" in n for n in llama.notes)


def test_every_run_is_one_line_in_each_panel_of_the_curves(filled):
    url, ids, _ = filled
    engine = store.connect(url)
    spec, views = load_views(engine, "smoke")
    for table in layout_tables(spec, views):
        fig = draw_curves(engine, table)
        run_ids = [r.row.id for col in table.runs for r in col]
        assert "training wall clock (seconds)" in {ax.get_xlabel() for ax in fig.axes}
        for ax in fig.axes:
            lines = [ln for ln in ax.get_lines() if ln.get_gid()]
            assert sorted(int(ln.get_gid().split("-")[1]) for ln in lines) == sorted(run_ids)
            for line in lines:
                _, rid, split, x = line.get_gid().split("-")
                with engine.connect() as conn:
                    pts = conn.execute(sa.select(store.Metric).where(store.Metric.run_id == int(rid), store.Metric.split == split)
                                       .order_by(store.Metric.step)).all()
                assert list(line.get_ydata()) == [p.loss for p in pts]
                expected_x = [p.elapsed_seconds if x == "seconds" else p.tokens for p in pts]  # drawn in seconds: short runs
                assert list(line.get_xdata()) == pytest.approx(expected_x)


def test_output_files_and_self_contained_html(filled):
    url, ids, tmp = filled
    report = build_report("smoke", url, tmp / "files")
    names = {p.name for p in report.files}
    assert {"report.md", "report.html", "runs.csv"} <= names
    assert {"curves-architecture-mixer.png", "curves-architecture-llama.svg", "curves-together.png"} <= names
    page = (tmp / "files" / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and 'src="http' not in page  # each table's, and all on one axis
    assert "![all tables on one axis](curves-together.png)" in (tmp / "files" / "report.md").read_text()
    csv_lines = (tmp / "files" / "runs.csv").read_text().strip().splitlines()
    assert len(csv_lines) == len(ids) + 1


def test_the_families_split_into_tables_meet_in_one_figure_on_one_scale(filled):
    """The smoke report's tables are per architecture; one more figure draws every run of both on shared axes."""
    from ablate.report import draw_curves, plan_curves
    from ablate.report.tables import Table

    url, ids, tmp = filled
    report = build_report("smoke", url, tmp / "together", formats=("md", "png"))
    assert (tmp / "together" / "curves-together.png").stat().st_size > 10_000
    together = Table(title="all tables", columns=[], rows=[], runs=[runs for t in report.tables for runs in t.runs])
    fig = draw_curves(store.reader(url), together, ("tokens",), plan_curves(together))
    drawn = {line.get_gid() for line in fig.axes[1].get_lines()}  # the eval panel
    assert drawn == {f"run-{i}-eval-tokens" for i in ids}  # mixer and llama runs in the same panel, on one y scale


def test_unfinished_oom_and_running_cells_render(tmp_path):
    spec = write_spec(tmp_path)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    _, _, ids = runner.register(spec, url)
    report = build_report("smoke", url, tmp_path / "empty")  # nothing ran yet
    assert all(cell == "pending" for t in report.tables for label, cells in t.rows[:2] for cell in cells)
    engine = store.connect(url)
    store.update_run(engine, ids[0], status="oom")
    store.update_run(engine, ids[1], status="running")
    store.update_run(engine, ids[2], status="diverged")
    report = build_report("smoke", url, tmp_path / "mixed")
    mixer = next(t for t in report.tables if "mixer" in t.title)
    llama = next(t for t in report.tables if "llama" in t.title)
    assert dict(mixer.rows)["Train"] == ["oom", "running"]
    assert dict(llama.rows)["Test"] == ["diverged", "pending"]


def test_report_html_escapes_what_users_wrote(tmp_path, monkeypatch):
    """The sweep's description, a table's title, a run's notes and the completions reach report.html as text (the
    template autoescapes), never as markup."""
    from ablate.report import render

    attack = "<script>alert(1)</script>"
    block = yaml.safe_load((REPO / "sweeps" / "smoke.yaml").read_text())["report"]
    block["tables"][0]["title"] = f"Widths {attack}"
    spec = write_spec(tmp_path, description=f"Mixer vs Llama {attack}", report=block)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    _, _, ids = runner.register(spec, url)
    hardware = {"mismatch": True, "profile": "cpu", "device": f"gpu {attack}", "memory_cap_mb": None}
    store.update_run(store.connect(url), ids[0], status="completed", final_train_loss=2.0, final_eval_loss=2.5,
                     notes={"hardware": hardware}, error=attack)
    monkeypatch.setattr(render, "prompt_completions",
                        lambda views, *args, **kw: ([(ids[0], f"label {attack}", f"text {attack}")], 1))
    report = build_report("smoke", url, tmp_path / "out", formats=("html",))
    page = (report.out / "report.html").read_text()
    assert "<script" not in page
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    for said in ("Mixer vs Llama", "Widths", "gpu", "label", "text"):
        assert f"{said} {escaped}" in page
    assert f'alt="Widths {escaped} (architecture=mixer)"' in page

def test_memory_report_shows_oom_cells(tmp_path):
    data = yaml.safe_load((REPO / "sweeps" / "context-memory.yaml").read_text())
    data["dataset"] = {"source": "ablate:tinystories-sample"}
    path = tmp_path / "cm.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))  # grid order: layers outer, context inner
    url = f"sqlite:///{tmp_path / 'r.db'}"
    _, _, ids = runner.register(path, url)
    engine = store.connect(url)
    store.update_run(engine, ids[0], status="completed", peak_memory_mb=2100.4)
    store.update_run(engine, ids[1], status="oom")
    report = build_report("context-memory", url, tmp_path / "out")
    first = report.tables[0]
    cells = dict(first.rows)["Peak memory (MB)"]
    assert cells[0] == "2100" and cells[1] == "OOM"
    assert dict(first.rows)["Published (MB)"][:2] == ["2071", "2341"]


def test_report_shows_each_runs_completion_of_the_prompt(filled, capsys):
    url, ids, tmp = filled
    report = build_report("smoke", url, tmp / "samples", formats=("md",), artifacts=tmp / "art")
    text = (report.out / "report.md").read_text()
    assert "Completions of the prompt" in text
    assert sum(line.startswith("- run ") for line in text.splitlines()) == len(ids)
    progress = capsys.readouterr().err  # one line per checkpoint, each loaded once
    assert [f"({i}/{len(ids)})" in progress for i in range(1, len(ids) + 1)] == [True] * len(ids)
    assert progress.count("loading run") == len(ids)
    from ablate.cli import main

    assert main(["generate", str(ids[0]), "--prompt", "Once upon a time", "--db", url, "--max-new", "8",
                 "--artifacts", str(tmp / "art")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Once upon a time") and len(out.strip()) > len("Once upon a time")


def test_generate_without_a_checkpoint_is_a_clear_error(tmp_path):
    spec = write_spec(tmp_path)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    _, _, ids = runner.register(spec, url)
    from ablate.config.errors import AblateError
    from ablate.train.generate import load_run_model

    with pytest.raises(AblateError, match="has no checkpoint"):
        load_run_model(ids[0], url)


def test_compare_puts_two_sweeps_side_by_side(filled, tmp_path):
    url, ids, tmp = filled
    spec = write_spec(tmp_path, name="smoke-b", grid=[{"architecture": "mixer", "d_model": 32}])
    _, _, (other,) = runner.register(spec, url)
    store.update_run(store.connect(url), other, status="completed", final_train_loss=1.25, final_eval_loss=1.5)
    from ablate.report import build_comparison

    report = build_comparison(["smoke", "smoke-b"], url, tmp_path / "cmp", formats=("md", "csv"))
    (table,) = report.tables
    assert table.title == "smoke vs smoke-b"
    col = next(i for i, c in enumerate(table.columns) if c.startswith("sweep=smoke-b"))
    assert dict(table.rows)["Test"][col] == "1.50 (n=1)"  # beside cells of two seeds
    assert len((tmp_path / "cmp" / "runs.csv").read_text().strip().splitlines()) == len(ids) + 2


def test_compare_labels_an_axis_one_sweep_holds_constant_by_its_value_not_none(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    _, _, varied = runner.register(write_spec(tmp_path, name="wd-a", grid=[
        {"architecture": "mixer", "d_model": 32, "weight_decay": [0.0, 0.1]}]), url)
    _, _, (held,) = runner.register(write_spec(tmp_path, name="wd-b", grid=[{"architecture": "mixer", "d_model": 32}]),
                                    url)
    engine = store.connect(url)
    for rid in [*varied, held]:
        store.update_run(engine, rid, status="completed", final_train_loss=1.25, final_eval_loss=1.5, steps=12)
    constant = store.get_run(engine, held).config["weight_decay"]
    from ablate.report import build_comparison

    (table,) = build_comparison(["wd-a", "wd-b"], url, tmp_path / "cmp", formats=("md",)).tables
    assert not any("None" in c for c in table.columns), table.columns
    assert any(c.startswith("sweep=wd-b") and f"weight_decay={constant}" in c for c in table.columns), table.columns


def test_every_loss_table_shows_epochs_and_notes_repeated_data(filled):
    url, ids, tmp = filled
    engine = store.connect(url)
    report = build_report("smoke", url, tmp / "epochs", formats=("md",))
    runs = {r.id: r for r in runner.sweep_runs(engine, "smoke")}
    for table in report.tables:
        epochs = dict(table.rows)["Epochs"]
        for cell, column_runs in zip(epochs, table.runs):
            values = [runs[v.row.id].epochs for v in column_runs]
            assert all(v is not None and 0 < v < 1 for v in values)  # 12 steps of 8 rows: under one epoch
            assert cell == f"{sum(values) / len(values):.2f}"
        assert not any(n.startswith("Data repeated") for n in table.notes)
    llama = next(r for r in runs.values() if r.architecture == "llama")
    store.update_run(engine, llama.id, epochs=3.4)
    try:
        report = build_report("smoke", url, tmp / "epochs2", formats=("md",))
        table = next(t for t in report.tables if "llama" in t.title)
        assert any("up to 3.4 epochs" in n and f"d={llama.d_model}" in n for n in table.notes)
        assert "Data repeated" in (report.out / "report.md").read_text()
    finally:
        store.update_run(engine, llama.id, epochs=llama.epochs)


def test_the_report_says_whether_the_published_ordering_holds_computed_from_the_table(filled):
    from ablate.report import check_orderings
    from ablate.results import stats

    url, ids, tmp = filled
    engine = store.connect(url)
    spec, views = load_views(engine, "smoke")
    assert spec.report.orderings  # the smoke sweep names the study's mixer-vs-Llama ordering
    spec = spec.model_copy(update={"report": spec.report.model_copy(update={"min_steps": 10})})  # 12-step runs count
    (line,) = check_orderings(spec, views)
    for d in (32, 64):
        mixer = [v.row.final_eval_loss for v in views if v.axes["architecture"] == "mixer" and v.axes["d_model"] == d]
        llama = [v.row.final_eval_loss for v in views if v.axes["architecture"] == "llama" and v.axes["d_model"] == d]
        m, ll = stats.mean_ci(mixer), stats.mean_ci(llama)
        assert f"d_model={d}: mixer {m.text()} vs llama {ll.text()}, effect {ll.mean - m.mean:+.3f} nats → untested" in line
    assert "Verdicts: 2 untested (of 2)" in line  # one llama seed per width: no test, whatever the means say
    (short,) = check_orderings(spec.model_copy(update={"report": spec.report.model_copy(update={"min_steps": 100})}),
                               views)
    assert "d_model=32: mixer (n=0; 2 of 2 under 100 steps) vs llama (n=0; 1 of 1 under 100 steps) → too few steps" in short
    views = [replace(v, row=SimpleNamespace(**v.row._asdict())) for v in views]  # rows the test can change
    for v in views:  # three seeds a side, forced: the verdict follows the numbers, not a fixed sentence
        v.row.final_eval_loss = 1.0 if v.axes["architecture"] == "mixer" else 2.0
    three = views + [RunView(row=SimpleNamespace(**{**vars(v.row), "id": 1000 + i,
                                                    "final_eval_loss": v.row.final_eval_loss + 0.01 * i}),
                             axes={**v.axes, "seed": 10 + i}, reference=None) for i, v in enumerate(views * 2)]
    for v, noise in zip(three, [0.0, 0.02, -0.01, 0.015, -0.02, 0.01] * 10):
        v.row.final_eval_loss += noise
    assert "Verdicts: 2 holds (of 2)" in check_orderings(spec, three)[0]
    from ablate.report.notes import method_line
    from ablate.results.orderings import check_claims

    assert "Holm-adjusted over the report's 2 comparisons" in method_line(check_claims(spec, three))
    for v in three:
        v.row.final_eval_loss = (3.0 if v.axes["architecture"] == "mixer" else 2.0) + 0.01 * (v.axes["seed"] % 3)
    assert "Verdicts: 2 reversed (of 2)" in check_orderings(spec, three)[0]


def test_runs_csv_keeps_integers_and_json_that_json_loads_reads(filled):
    import csv
    import json

    url, ids, tmp = filled
    report = build_report("smoke", url, tmp / "csv", formats=("csv",))
    rows = list(csv.DictReader((report.out / "runs.csv").open()))
    assert {r["heads"] for r in rows if r["architecture"] == "llama"} == {"4"}
    assert {r["heads"] for r in rows if r["architecture"] == "mixer"} == {""}
    for r in rows:
        assert json.loads(r["config"])["d_model"] == int(r["d_model"])
        assert isinstance(json.loads(r["library_versions"]), dict)
    assert b"\r\n" not in (report.out / "runs.csv").read_bytes()


def test_completions_decode_whole_characters(tmp_path):
    """A model that emits a lone UTF-8 lead byte: the completion drops it instead of printing U+FFFD."""
    import torch

    from ablate.data import get_tokenizer
    from ablate.train.generate import complete
    from ablate.config import DatasetRef, TokenizerRef

    tok = get_tokenizer(TokenizerRef(vocab_size=300), DatasetRef(source="ablate:tinystories-sample"), tmp_path, False)
    lead = tok.convert_tokens_to_ids("â")  # byte 0xE2 alone: the start of a 3-byte character
    word = tok("T", add_special_tokens=False)["input_ids"][0]
    assert "\ufffd" in tok.decode([word, lead])  # what the old token-by-token decode showed

    class Emits(torch.nn.Module):
        def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (1, T) -> (1, T, V)
            logits = torch.zeros(1, ids.shape[1], len(tok))
            logits[0, -1, word if ids.shape[1] % 2 else lead] = 1.0
            return logits

    text = complete(Emits(), tok, "Once upon a time", context=64, max_new=6)
    assert text == "TTT"  # T, 0xE2, T, 0xE2, T, 0xE2: the lone bytes are dropped


def test_a_report_at_an_equal_budget_reads_each_run_on_its_own_curve(filled):
    import csv

    import numpy as np

    url, ids, tmp = filled
    engine = store.connect(url)
    with engine.connect() as conn:
        llama = conn.execute(sa.select(store.Run).where(store.Run.id.in_(ids), store.Run.architecture == "llama",
                                                        store.Run.d_model == 32)).one()
        pts = conn.execute(sa.select(store.Metric.tokens, store.Metric.loss).where(
            store.Metric.run_id == llama.id, store.Metric.split == "eval").order_by(store.Metric.step)).all()
    tokens = [p.tokens for p in pts]
    budget = (tokens[0] + tokens[1]) // 2 + 1  # between its first two eval points
    expected = float(np.interp(budget, tokens, [p.loss for p in pts]))
    report = build_report("smoke", url, tmp / "at", formats=("md", "csv"), at=f"tokens={budget}")
    table = next(t for t in report.tables if "llama" in t.title)
    assert table.title.endswith(f"at tokens = {budget / 1000:g}k")
    assert dict(table.rows)["Test"][table.columns.index("d=32")] == f"{expected:.2f} †"
    with (tmp / "at" / "tables.csv").open() as f:
        row = next(r for r in csv.DictReader(f) if r["table"] == table.title and r["column"] == "d=32"
                   and r["split"] == "eval")
    assert float(row["mean"]) == pytest.approx(expected, rel=1e-12) and row["n"] == "1"
    assert f"Read at tokens = {budget / 1000:g}k" in (tmp / "at" / "report.md").read_text()
    past = build_report("smoke", url, tmp / "past", formats=("md",), at=f"tokens={max(tokens) * 10}")
    assert {c for t in past.tables for c in dict(t.rows)["Test"]} == {"not reached"}
    (line,) = past.orderings  # no pair reached it: every cell is said, none vanishes
    assert "test loss at tokens" in line and line.count("→ not reached") == 2 and "2 of 2 not reached" in line


def test_a_report_grouped_by_any_axes_averages_the_rest(filled):
    import statistics

    url, ids, tmp = filled
    engine = store.connect(url)
    with engine.connect() as conn:  # the smoke sweep's runs (another test adds a sweep to this DB)
        rows = conn.execute(sa.select(store.Run).where(store.Run.id.in_(ids))).all()
    report = build_report("smoke", url, tmp / "grouped", formats=("md", "csv", "png"), group=("architecture",))
    (table,) = report.tables
    assert table.columns == ["architecture=mixer", "architecture=llama"]  # the grid's order, not alphabetical
    mixer = [r.final_eval_loss for r in rows if r.architecture == "mixer"]
    assert dict(table.rows)["Test"][0].startswith(f"{statistics.fmean(mixer):.2f} ± ")
    assert dict(table.rows)["Test"][0].split(" †")[0].endswith(f"(n={len(mixer)})")
    assert any("each cell averages its runs over seeds and d_model" in n for n in table.notes)
    from ablate.report import plan_curves

    plan = plan_curves(table, group=("architecture",))
    assert plan.is_aggregate and sorted(c.label.split(" (")[0] for c in plan.curves) == ["architecture=llama",
                                                                                         "architecture=mixer"]
    two = build_report("smoke", url, tmp / "grouped2", formats=("md",), group=("architecture", "d_model"))
    assert two.tables[0].columns == ["architecture=mixer (d=32)", "architecture=mixer (d=64)",
                                     "architecture=llama (d=32)", "architecture=llama (d=64)"]
    widths = build_report("smoke", url, tmp / "grouped3", formats=("md",), group=("d_model", "architecture"))
    assert widths.tables[0].columns == ["d=32 (architecture=mixer)", "d=32 (architecture=llama)",
                                        "d=64 (architecture=mixer)", "d=64 (architecture=llama)"]


def test_report_flags_for_at_and_group_name_the_mistake(filled, capsys):
    from ablate import cli

    url, ids, tmp = filled
    assert cli.main(["report", "smoke", "--db", url, "--out", str(tmp / "bad"), "--group", "archtecture"]) != 0
    assert "did you mean 'architecture'" in capsys.readouterr().err
    assert cli.main(["report", "smoke", "--db", url, "--out", str(tmp / "bad"), "--at", "tokens=lots"]) != 0
    assert "--at tokens=lots" in capsys.readouterr().err
    assert not (tmp / "bad").exists()  # nothing half-written
