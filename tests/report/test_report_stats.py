"""The report's statistics end to end: a real small CPU sweep with 3 seeds whose report prints verdict lines (md,
html, csv and the CLI), and a sweep whose losses follow a known scaling law, fitted back by the report."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from ablate import runner, store
from ablate.config import TrialConfig
from ablate.report import build_report
from ablate.train import TrainerSettings, train

REPO = Path(__file__).resolve().parents[2]


def _spec(tmp_path: Path, name: str, grid: list[dict], **changes) -> Path:
    data = yaml.safe_load((REPO / "sweeps" / "smoke.yaml").read_text())
    data.update({"name": name, "budget": {"steps": 60, "hardware": "cpu"}, "eval": {"at": [0.5]},
                 "tokenizer": {"vocab_size": 512}, "grid": grid,
                 "dataset": {"source": "ablate:tinystories-sample", "eval": {"holdout": 24}, "packing": "pad"}})
    data["defaults"]["context"] = 48
    data["report"].pop("prompt")
    data.update(changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.slow
def test_a_real_cpu_sweep_with_three_seeds_prints_a_verdict_for_each_ordering(tmp_path, capsys):
    spec = _spec(tmp_path, "seeds3", [{"architecture": "mixer", "d_model": 32, "seeds": 3},
                                      {"architecture": "llama", "heads": 4, "d_model": 32, "seeds": 3}])
    url = f"sqlite:///{tmp_path / 'r.db'}"
    _, _, ids = runner.register(spec, url)
    engine = store.connect(url)
    for rid in ids:
        store.claim_run(engine, rid, "test")
        train(TrialConfig.model_validate(store.get_run(engine, rid).config),
              TrainerSettings(artifacts=tmp_path / "art", db_url=url, run_id=rid, progress=False, log_points=4))
    report = build_report("seeds3", url, tmp_path / "out", formats=("md", "html", "csv"))
    (line,) = report.orderings
    (cell,) = report.claims.cells
    assert cell.comparison.better.n == 3 and cell.comparison.worse.n == 3 and cell.comparison.tested
    verdict = re.search(r"d_model=32: mixer .* \(n=3\) vs llama .* \(n=3\), effect [+-]\d\.\d{3} nats "
                        r"\[[+-]\d\.\d{3}, [+-]\d\.\d{3}\], p [=<] \d\.\d{3} one-sided, p [=<] \d\.\d{3} two-sided "
                        r"adjusted → (holds|not significant|reversed)", line)
    assert verdict and verdict.group(1) == cell.verdict
    md = (tmp_path / "out" / "report.md").read_text()
    (row,) = report_rows = [r for r in md.splitlines() if r.startswith("| 1: mixer < llama |")]
    assert f"| {cell.verdict}" in row and "| d_model=32 |" in row and report_rows
    assert "Noise floor (seed-to-seed std of test loss" in md and "_Method: Welch's t-test across seeds, two-sided" in md
    html = (tmp_path / "out" / "report.html").read_text()
    assert "<table class=verdicts>" in html and f"<td>{cell.verdict}" in html
    with (tmp_path / "out" / "claims.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert row["verdict"] == cell.verdict and int(row["better_n"]) == 3
    assert float(row["p"]) == pytest.approx(cell.comparison.p)
    for table in report.tables:
        assert dict(table.rows)["Steps"] == ["60"]
        assert dict(table.rows)["Test"][0].endswith("(n=3)")
    from ablate import cli, results

    assert list(results.claims("seeds3", url)["verdict"]) == [cell.verdict]  # the notebook's numbers are the report's
    assert cli.main(["report", "seeds3", "--db", url, "--out", str(tmp_path / "cli"), "--format", "md"]) == 0
    said = capsys.readouterr()
    assert f"→ {cell.verdict}" in said.out.replace("\n", " ")
    assert "report: reading the runs (0 s so far)" in said.err and "report: testing the claims (" in said.err  # progress


def test_a_sweep_whose_losses_follow_a_known_law_is_fitted_back_by_the_report(tmp_path):
    """Three widths x 3 seeds per architecture, registered for real, their losses written from L = E + A·N^-α
    with seed noise: the report recovers α and E, draws the fit and refuses nothing inside the range."""
    spec = _spec(tmp_path, "widths", [{"architecture": "mixer", "d_model": [32, 64, 128], "seeds": 3},
                                      {"architecture": "llama", "heads": 4, "d_model": [32, 64, 128], "seeds": 3}])
    url = f"sqlite:///{tmp_path / 'r.db'}"
    _, _, ids = runner.register(spec, url)
    engine = store.connect(url)
    truth = {"mixer": (1.9, 633.0, 0.5), "llama": (2.1, 30.0, 0.30)}  # equal at N = 800k: the mixer lower above
    rng = np.random.default_rng(0)
    for rid in ids:
        run = store.get_run(engine, rid)
        params = {32: 2e5, 64: 8e5, 128: 3.2e6}[run.d_model]
        E, A, alpha = truth[run.architecture]
        store.update_run(engine, rid, status="completed", params=int(params), steps=200, tokens=200 * 16 * 48,
                         flops_per_token=6 * params, final_train_loss=1.0,
                         final_eval_loss=float(E + A * params ** -alpha + rng.normal(0, 0.005)))
    report = build_report("widths", url, tmp_path / "out", formats=("md", "png", "csv"))
    mixer = next(line for line in report.scaling if line.startswith("mixer, test loss against parameters"))
    alpha, low, high = map(float, re.search(r"α = ([\d.]+) \[([\d.]+), ([\d.]+)\]", mixer).groups())
    assert alpha == pytest.approx(0.5, abs=0.05) and low <= 0.5 <= high
    assert "from 200k to 3.2M" in mixer and "not extrapolated" in mixer
    cross = next(line for line in report.scaling if line.startswith("llama vs mixer against parameters N"))
    at = float(re.search(r"cross at N = ([\d.]+)k; above it mixer is lower", cross).group(1))
    assert 700 <= at <= 900, cross
    assert (tmp_path / "out" / "scaling.png").stat().st_size > 10_000
    with (tmp_path / "out" / "scaling.csv").open() as f:
        rows = {(r["architecture"], r["x"]): r for r in csv.DictReader(f)}
    assert float(rows[("llama", "params")]["E"]) == pytest.approx(2.1, abs=0.05)
    assert rows[("llama", "flops")]["converged"] == "True"
    assert "**Scaling.**" in (tmp_path / "out" / "report.md").read_text()


def test_scaling_csv_flags_an_E_that_ran_to_its_bound(tmp_path):
    """A pure power law (no irreducible loss) fits E at its lower bound 0: scaling.csv says so beside the raw E, as
    the report's line does, so that a reader of the file does not take 1e-12 for a measured E."""
    from ablate.report.scaling import write_scaling_csv
    from ablate.results.laws import ArchitectureLaw, Laws
    from ablate.results.scaling import fit_power_law

    rng = np.random.default_rng(2)
    def law(name: str, E: float) -> ArchitectureLaw:
        pts = [(x, E + 30 * x ** -0.3 * (1 + rng.normal(0, 0.002)), s) for x in (1e5, 1e6, 1e7, 1e8) for s in range(3)]
        fit = fit_power_law([p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts], bootstrap=20)
        return ArchitectureLaw(name, {"params": pts}, {"params": fit})

    laws = Laws([law("pure", 0.0), law("floored", 2.0)])
    with write_scaling_csv(laws, tmp_path / "scaling.csv").open() as f:
        rows = {r["architecture"]: r for r in csv.DictReader(f)}
    assert rows["pure"]["E_at_bound"] == "True" and float(rows["pure"]["E"]) < 1e-3, rows["pure"]
    assert rows["floored"]["E_at_bound"] == "False" and float(rows["floored"]["E"]) == pytest.approx(2.0, abs=0.1)


def test_the_scaling_figure_draws_a_size_of_many_runs_as_its_mean_and_range_and_a_few_runs_one_by_one():
    """100,000 runs would be 100,000 markers (most of the figure's cost, and unreadable): past MAX_DOTS runs at
    a size, a law's size is its mean with a min–max bar; 25 laws' legend gives way to a note."""
    from ablate.report.scaling import MAX_DOTS, draw_laws
    from ablate.results.laws import ArchitectureLaw, Laws
    from ablate.results.scaling import fit_power_law

    rng = np.random.default_rng(1)
    def law(name: str, seeds: int) -> ArchitectureLaw:
        pts = [(x, 2 + 30 * x ** -0.3 + rng.normal(0, 0.01), s) for x in (1e5, 1e6, 1e7) for s in range(seeds)]
        fit = fit_power_law([p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts], bootstrap=50)
        return ArchitectureLaw(name, {"params": pts}, {"params": fit})

    many, few = law("mixer", MAX_DOTS + 1), law("llama", 3)
    ax = draw_laws(Laws([many, few]), "t").axes[0]
    lines: dict = {}
    for line in ax.get_lines():  # the first of a gid: an errorbar's data line (its caps share the gid)
        lines.setdefault(line.get_gid(), line)
    assert len(lines["points-llama-params"].get_xdata()) == 9  # every run
    means = lines["points-mixer-params"]
    assert list(means.get_xdata()) == [1e5, 1e6, 1e7] and ax.containers  # and its bars
    at = [p[1] for p in many.points["params"] if p[0] == 1e6]
    assert means.get_ydata()[1] == pytest.approx(sum(at) / len(at))
    assert "mixer (per size: mean of 21 runs, min–max)" in [t.get_text() for t in ax.get_legend().get_texts()]
    crowded = draw_laws(Laws([law(f"arch{i}", 2) for i in range(11)]), "t").axes[0]
    assert crowded.get_legend() is None and "11 laws" in crowded.get_title()


def test_a_spread_or_floor_that_rounds_to_zero_is_shown_to_one_significant_figure():
    """'± 0.00' and 'noise floor 0.000' said there was no spread where there was a small one."""
    from ablate.results.stats import Estimate, shown

    assert Estimate(3.71, 3, 0.001, 3.706, 3.714).text() == "3.71 ± 0.004 (n=3)"
    assert Estimate(3.71, 3, 0.02, 3.66, 3.76).text() == "3.71 ± 0.05 (n=3)"
    assert (shown(0.0004, 3), shown(0.0, 3), shown(0.0123, 3)) == ("0.0004", "0.000", "0.012")
