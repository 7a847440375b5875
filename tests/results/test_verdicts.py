"""Verdicts on results DBs with known answers: a cell is one configuration (every field the grid varies splits it),
every run left out is said, diverged seeds cannot flatter a side, `--at` holds runs to min_steps at the budget
read, the verdicts' family-wise error over both directions by simulation, ties, NaN, and the report's one floor."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from scipy import stats as sps

from ablate import results, runner, store
from ablate.config import SweepSpec
from ablate.config.errors import AblateError
from ablate.report.notes import check_orderings
from ablate.report.tables import layout_tables
from ablate.results import stats
from ablate.results.equal import BEFORE_FIRST, At, read_at
from ablate.results.orderings import TOO_FEW_STEPS, check_claims
from ablate.results.views import RunView, load_views

ORDERING = {"claim": "mixer beats llama", "better": {"architecture": "mixer"}, "worse": {"architecture": "llama"},
            "at": ["d_model"]}


def _register(tmp_path, url, grid, name="v") -> tuple[list[int], object]:
    spec = {"name": name, "dataset": {"source": "ablate:tinystories", "eval": {"holdout": 200}},
            "tokenizer": {"vocab_size": 1024}, "budget": {"steps": 100, "hardware": "cpu"},
            "defaults": {"layers": 1, "context": 64, "batch_size": 4, "lr": 1e-3, "d_model": 32},
            "grid": grid, "report": {"orderings": [ORDERING], "min_steps": 10}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    _, _, ids = runner.register(path, url)
    return ids, store.connect(url)


def _finish(engine, rid, loss, status="completed", steps=100):
    store.update_run(engine, rid, status=status, steps=steps, final_eval_loss=loss, final_train_loss=loss)


def test_a_grid_varying_weight_decay_gets_one_cell_per_configuration_not_n4(tmp_path, any_url):
    ids, engine = _register(tmp_path, any_url, [
        {"architecture": "mixer", "weight_decay": [0.0, 0.1], "seeds": 2},
        {"architecture": "llama", "heads": 4, "weight_decay": [0.0, 0.1], "seeds": 2}])
    truth = {("mixer", 0.0): 2.00, ("mixer", 0.1): 2.50, ("llama", 0.0): 2.10, ("llama", 0.1): 2.60}
    for rid in ids:
        run = store.get_run(engine, rid)
        wd = run.config["weight_decay"]
        _finish(engine, rid, truth[(run.architecture, wd)] + 0.01 * run.seed)
    spec, views = load_views(store.reader(any_url), "v")
    assert {v.axes["weight_decay"] for v in views} == {0.0, 0.1}  # derived from the frozen configs
    claims = check_claims(spec, views)
    assert [c.where for c in claims.cells] == [{"d_model": 32, "weight_decay": 0.0}, {"d_model": 32, "weight_decay": 0.1}]
    for cell in claims.cells:
        assert cell.comparison.better.n == 2 and cell.comparison.worse.n == 2  # seeds 0 and 1, once each
        assert cell.comparison.effect == pytest.approx(0.10)
    true_spread = np.std([0.0, 0.01], ddof=1)
    assert claims.floor["mixer"][0] == pytest.approx(true_spread) and claims.floor["mixer"][1] == 2
    tables = layout_tables(spec, views)
    assert sorted(c for t in tables for c in t.columns) == sorted(
        f"d={32} (weight_decay={wd})" for wd in (0.0, 0.1) for _ in (0, 1))
    assert len(results.claims("v", any_url)) == 2
    assert sorted(results.runs("v", any_url)["weight_decay"]) == [0.0] * 4 + [0.1] * 4  # a column in notebooks too
    from ablate.results import live

    rows = live.run_rows(store.reader(any_url), views[0].row.sweep_id)  # and in the dashboard's runs table
    assert sorted(r["weight_decay"] for r in rows) == [0.0] * 4 + [0.1] * 4 and "budget.steps" not in rows[0]
    assert "d_model=32, weight_decay=0.1: mixer 2.50" in check_orderings(spec, views, claims)[0]


def test_configuration_keys_made_once_per_configuration_are_each_runs_own():
    # config_keys reuses a key where a run holds the same objects as one before it (its configuration's other
    # seeds): never where the values differ, whatever objects hold them
    from ablate.results.cells import config_key, config_keys

    shared = {"architecture": "mixer", "lr": 1e-3, "d_model": 512, "options.norm": [1, 2]}
    views = [SimpleNamespace(axes={**shared, "seed": s}) for s in range(3)]
    views += [SimpleNamespace(axes={**shared, "lr": 2e-3, "seed": 0}), SimpleNamespace(axes={**shared, "d_model": 512.0}),
              SimpleNamespace(axes={**shared, "options.norm": [1, 2.0]}), SimpleNamespace(axes=dict(reversed(shared.items())))]
    keys = config_keys(views)
    assert keys == [config_key(v) for v in views]
    assert len({keys[0], keys[1], keys[2], keys[6]}) == 1 and len(set(keys)) == 4


def test_runs_that_share_a_trial_config_are_read_once_for_what_differs(tmp_path, sqlite_url):
    # load_views gives a configuration's seeds one TrialConfig: cells.py reads one run of each for what differs and
    # keys them by it; the answers are those of the same runs told apart by their values alone
    from dataclasses import replace

    from ablate.report.views import varying_axes
    from ablate.results.cells import config_keys, differing, one_per_configuration, split_axes

    ids, _ = _register(tmp_path, sqlite_url, [{"architecture": "mixer", "weight_decay": [0.0, 0.1], "seeds": 3},
                                              {"architecture": "llama", "heads": 4, "seeds": 2}])
    _, views = load_views(store.reader(sqlite_url), "v")
    assert len({id(v.trial) for v in views}) == 3 and len(one_per_configuration(views)) == 3
    assert [v.axes.get("seed") for v in one_per_configuration(views)] == [0, 0, 0]
    by_value = [replace(v, trial=None) for v in views]
    assert config_keys(views) == config_keys(by_value) and len(set(config_keys(views))) == 3
    assert differing(views) == differing(by_value) and set(differing(views)) >= {"architecture", "weight_decay"}
    assert split_axes(views, ["architecture"]) == split_axes(by_value, ["architecture"])
    assert varying_axes(views, set()) == varying_axes(by_value, set())


def test_two_runs_of_one_configuration_with_one_seed_are_refused_naming_both(tmp_path, sqlite_url):
    # kernel 1 is the mixer's default: written out, it is a new fingerprint but the same configuration
    ids, engine = _register(tmp_path, sqlite_url, [{"architecture": "mixer"},
                                                   {"architecture": "mixer", "options": {"kernel": 1}},
                                                   {"architecture": "llama", "heads": 4}])
    assert len(ids) == 3
    for rid in ids:
        _finish(engine, rid, 2.0)
    with pytest.raises(AblateError, match=rf"runs {ids[0]} and {ids[1]} of sweep v are one configuration with one "
                                          r"seed \(0\), written differently \(options\)"):
        load_views(store.reader(sqlite_url), "v")


def _synthetic(cells: dict[tuple[str, int], list[tuple[str, float | None]]]) -> list[RunView]:
    views = []
    for (arch, d), runs in cells.items():
        for seed, (status, loss) in enumerate(runs):
            row = SimpleNamespace(id=len(views) + 1, status=status, final_eval_loss=loss, final_train_loss=loss, steps=200,
                                  flops_per_token=1.0, epochs=None, train_seconds=None, notes=None)
            views.append(RunView(row=row, axes={"architecture": arch, "d_model": d, "seed": seed}, reference=None))
    return views


def _spec(**report) -> SweepSpec:
    return SweepSpec.model_validate({"name": "s", "dataset": {"source": "ablate:tinystories"},
                                     "budget": {"steps": 100, "hardware": "cpu"},
                                     "report": {"orderings": [ORDERING], **report}})


def test_a_diverged_seed_is_said_and_cannot_flatter_the_better_side():
    mixer = [("completed", 2.00), ("completed", 2.02), ("completed", 2.04), ("diverged", None)]
    llama = [("completed", x) for x in (2.07, 2.08, 2.09, 2.08)]
    views = _synthetic({("mixer", 64): mixer, ("llama", 64): llama})
    (cell,) = check_claims(_spec(), views).cells
    assert cell.better.said() == "1 of 4 diverged" and cell.worse.said() == ""
    finished = stats.welch([2.00, 2.02, 2.04], [2.07, 2.08, 2.09, 2.08])
    assert finished.p_two_sided < 0.05  # the three that finished alone would hold
    counted = stats.welch([2.00, 2.02, 2.04, 2.09], [2.07, 2.08, 2.09, 2.08])  # at the worst finished loss
    assert cell.p_adjusted == pytest.approx(counted.p_two_sided) and cell.verdict == stats.NOT_SIGNIFICANT
    assert cell.counted_worst == ("better", 1, 2.09)
    (line,) = check_orderings(_spec(), views)
    assert "mixer 2.02 ± 0.05 (n=3; 1 of 4 diverged)" in line
    assert "1 diverged seed of mixer counted at 2.090 (the comparison's worst finished loss)" in line
    assert "counting them so costs the test power: this verdict may be theirs, not the effect's" in line, line
    # a diverged seed on the worse side cannot flatter a claim that holds: left out, said, not counted
    views = _synthetic({("mixer", 64): [("completed", x) for x in (2.00, 2.01, 2.02)],
                        ("llama", 64): llama[:3] + [("completed", math.nan)]})  # a NaN final loss is divergence
    (cell,) = check_claims(_spec(), views).cells
    assert cell.verdict == stats.HOLDS and cell.counted_worst is None and cell.worse.said() == "1 of 4 diverged"


def test_every_kind_of_run_left_out_is_said():
    views = _synthetic({("mixer", 64): [("completed", 2.0), ("completed", 2.01), ("oom", None), ("running", None)],
                        ("llama", 64): [("completed", 2.2), ("completed", 2.21), ("pending", None)]})
    (cell,) = check_claims(_spec(), views).cells
    assert cell.better.said() == "1 of 4 oom, 1 of 4 running" and cell.worse.said() == "1 of 3 pending"
    table = layout_tables(_spec(tables=[{"group_by": ["architecture"], "columns": "d_model"}]), views)
    test_cells = [dict(t.rows)["Test"][0] for t in table]
    assert any("(n=2; 1 of 4 oom, 1 of 4 running)" in c for c in test_cells)


def _curves(views, first_step=10, last_step=200):
    steps = np.arange(first_step, last_step + 1, 10, dtype=float)
    out = {}
    for v in views:
        final = v.row.final_eval_loss
        loss = final + 1.0 / steps  # falling to its final loss
        out[(v.row.id, "eval")] = np.column_stack([steps, steps * 100, steps, loss])
    return out


def test_under_at_min_steps_holds_at_the_budget_read_and_no_cell_vanishes():
    views = _synthetic({("mixer", 64): [("completed", x) for x in (2.00, 2.01, 2.02)],
                        ("llama", 64): [("completed", x) for x in (2.20, 2.21, 2.22)]})
    spec = _spec(min_steps=50)
    (cell,) = check_claims(spec, read_at(views, At("steps", 20), _curves(views))).cells
    assert cell.verdict == TOO_FEW_STEPS and cell.better.said() == "3 of 3 under 50 steps"  # 20 < 50, not 200
    (cell,) = check_claims(spec, read_at(views, At("steps", 100), _curves(views))).cells
    assert cell.verdict == stats.HOLDS
    (cell,) = check_claims(spec, read_at(views, At("steps", 20), _curves(views, first_step=40))).cells
    assert cell.verdict == BEFORE_FIRST and cell.better.said() == "3 of 3 before 1st eval"
    (line,) = check_orderings(spec, read_at(views, At("steps", 20), _curves(views, first_step=40)))
    assert "d_model=64: mixer (n=0; 3 of 3 before 1st eval)" in line


def _simulate(m: int, effect: float, n: int, draws: int, rng) -> tuple[float, float]:
    """P(any verdict holds or reversed) over `draws` reports of m comparisons, and P(holds) of the first."""
    any_verdict = first_holds = 0
    for _ in range(draws):
        comparisons = [stats.welch(rng.normal(0, 1, n), rng.normal(effect, 1, n)) for _ in range(m)]
        adjusted = stats.holm([c.p_two_sided for c in comparisons])
        verdicts = [stats.verdict(p, c.effect) for p, c in zip(adjusted, comparisons)]
        any_verdict += any(v in (stats.HOLDS, stats.REVERSED) for v in verdicts)
        first_holds += verdicts[0] == stats.HOLDS
    return any_verdict / draws, first_holds / draws


@pytest.mark.parametrize("m", [1, 4])
def test_under_the_null_holds_or_reversed_comes_at_most_5_percent_of_the_time(m):
    rate, _ = _simulate(m, 0.0, 4, 2000, np.random.default_rng(m))
    assert rate <= 0.05 + 2.5 * math.sqrt(0.05 * 0.95 / 2000)  # one-sided tests each way gave 10% at m = 1


def test_the_power_at_a_known_effect_is_the_two_sided_t_tests():
    n, effect = 5, 2.0
    _, power = _simulate(1, effect, n, 2000, np.random.default_rng(7))
    df, nc = 2 * n - 2, effect / math.sqrt(2 / n)
    crit = sps.t.ppf(0.975, df)
    expected = sps.nct.sf(crit, df, nc) + sps.nct.cdf(-crit, df, nc)  # 0.79 (Welch's df is a little lower)
    assert expected - 0.05 <= power <= expected + 0.02


def test_seeds_with_no_spread_are_untested_saying_why_and_nan_never_raises():
    c = stats.welch([2.0] * 3, [2.0 + 1e-9] * 3)  # two seeds a side that gave one loss: z = 37 before, "holds"
    assert c.identical and not c.tested and c.p is None
    assert stats.verdict(stats.holm([c.p_two_sided])[0], c.effect) == stats.UNTESTED
    views = _synthetic({("mixer", 64): [("completed", 2.0)] * 2, ("llama", 64): [("completed", 2.5)] * 2})
    (cell,) = check_claims(_spec(), views).cells
    assert cell.verdict == stats.UNTESTED and cell.p_adjusted is None
    (line,) = check_orderings(_spec(), views)
    assert "→ untested (the seeds gave identical losses on each side (is the seed used?))" in line
    e = stats.mean_ci([1.0, math.nan, 2.0])
    assert math.isnan(e.mean) and e.low is None and e.n == 3
    assert stats.mean_ci([1.0, math.inf]).mean == math.inf
    assert not stats.welch([1.0, math.inf, 2.0], [3.0, 3.1, 3.2]).tested
    assert stats.verdict(None, math.nan) == stats.UNTESTED


def test_the_report_prints_one_noise_floor_per_architecture():
    views = _synthetic({("mixer", 64): [("completed", x) for x in (2.00, 2.02, 2.04)],
                        ("llama", 64): [("completed", x) for x in (2.20, 2.21, 2.22)],
                        ("mixer", 128): [("completed", x) for x in (1.90, 1.95, 2.00)]})
    for v in views[:3]:
        v.row.steps = 5  # short runs: the floor of the claims leaves them out, and so must the tables'
    spec = _spec(min_steps=10, tables=[{"group_by": [], "columns": "d_model"}])
    claims = check_claims(spec, views)
    (table,) = layout_tables(spec, views)
    (note,) = [n for n in table.notes if n.startswith("Noise floor")]
    assert f"mixer {claims.floor['mixer'][0]:.3f}" in note and f"{np.std([1.90, 1.95, 2.00], ddof=1):.3f}" in note


def test_e_at_its_bound_is_flagged_not_printed_as_a_number():
    from ablate.results.scaling import fit_power_law

    x = np.array([1e5, 2e5, 4e5, 8e5] * 3)
    fit = fit_power_law(x, 30 * x ** -0.3 + np.repeat([0.0, 0.01, -0.01], 4), np.repeat([0, 1, 2], 4))
    assert fit.E_at_bound and "E at its lower bound 0" in fit.text() and "E = " not in fit.text()
    fit = fit_power_law(x, 1.5 + 30 * x ** -0.3 + np.repeat([0.0, 0.01, -0.01], 4), np.repeat([0, 1, 2], 4))
    assert not fit.E_at_bound and "E = 1.5" in fit.text()


def test_scaling_fits_one_law_per_configuration_and_keeps_an_lr_that_changes_with_size():
    from ablate.results.laws import fit_laws

    views = []
    for arch, base in (("mixer", 1.5), ("llama", 1.4)):
        for d, params in ((32, 1e5), (64, 4e5), (128, 1.6e6)):
            for wd in (0.0, 0.1):
                for seed in (0, 1):
                    loss = base + 0.5 * wd + 30 * params ** -0.3 + 0.01 * seed
                    row = SimpleNamespace(id=len(views) + 1, status="completed", final_eval_loss=loss, steps=200,
                                          params=params, tokens=None, flops_per_token=None)
                    axes = {"architecture": arch, "d_model": d, "seed": seed, "weight_decay": wd, "lr": 1e-3 / d}
                    views.append(RunView(row=row, axes=axes, reference=None))
    laws = fit_laws(views, bootstrap=50)
    assert sorted(law.architecture for law in laws.laws) == [
        "llama (weight_decay=0.0)", "llama (weight_decay=0.1)", "mixer (weight_decay=0.0)", "mixer (weight_decay=0.1)"]
    assert all(law.pooled == ["lr"] for law in laws.laws)  # lr changes only with size: part of the size
    for law in laws.laws:
        assert law.fits["params"].E == pytest.approx(1.4 + (0.1 if "mixer" in law.architecture else 0)
                                                     + 0.5 * law.where["weight_decay"] + 0.005, abs=1e-3)
    assert sorted((a, b) for _, a, b, _ in laws.crossovers) == [
        ("llama (weight_decay=0.0)", "mixer (weight_decay=0.0)"), ("llama (weight_decay=0.1)", "mixer (weight_decay=0.1)")]


def _equivalent(effect: float, sesoi: float, n: int, draws: int, rng, sd: float = 1.0) -> tuple[float, list[str]]:
    """P("equivalent") of one claim with a SESOI over `draws` reports, and every verdict given."""
    verdicts = []
    for _ in range(draws):
        c = stats.welch(rng.normal(0, sd, n), rng.normal(effect, sd, n))
        verdicts.append(stats.verdict(c.p_two_sided, c.effect, sesoi=sesoi, p_equivalent=stats.equivalence(c, sesoi)))
    return sum(v == stats.equivalent_text(sesoi) for v in verdicts) / draws, verdicts


@pytest.mark.parametrize("effect", [1.0, -1.0])
def test_equivalent_is_said_at_most_5_percent_of_the_time_when_the_effect_is_the_sesoi(effect):
    rate, _ = _equivalent(effect, 1.0, 8, 3000, np.random.default_rng(11 + int(effect > 0)))
    assert rate <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 3000)


def test_equivalence_at_no_effect_has_the_power_of_two_one_sided_t_tests():
    n, sesoi = 20, 1.0
    rate, _ = _equivalent(0.0, sesoi, n, 2000, np.random.default_rng(5))
    se, crit = math.sqrt(2 / n), sps.t.ppf(0.95, 2 * n - 2)
    expected = 2 * sps.norm.cdf(sesoi / se - crit) - 1  # 0.86 (the normal approximation, a little above the t's)
    assert expected - 0.06 <= rate <= expected + 0.02


def test_a_real_one_sd_effect_is_never_no_difference_at_a_tiny_seed_spread():
    """The rule this replaces: |effect| < 1e-4 nats was "no difference" at any n; at a seed SD of 2e-4 nats a
    1-SD effect ended so in about a third of reports. Now it is holds (with its power) or not significant."""
    sd = 2e-4
    rng = np.random.default_rng(3)
    verdicts = []
    for _ in range(2000):
        c = stats.welch(rng.normal(0, sd, 5), rng.normal(sd, sd, 5))
        verdicts.append(stats.verdict(c.p_two_sided, c.effect))
    assert set(verdicts) <= {stats.HOLDS, stats.REVERSED, stats.NOT_SIGNIFICANT}
    df, nc = 8, 1 / math.sqrt(2 / 5)
    power = sps.nct.sf(sps.t.ppf(0.975, df), df, nc)  # 0.29
    assert power - 0.05 <= verdicts.count(stats.HOLDS) / 2000 <= power + 0.03


def test_a_report_sesoi_or_a_claims_own_makes_a_flat_claim_equivalent_and_says_how():
    flat = _synthetic({("mixer", 64): [("completed", 2.0 + 0.001 * i) for i in range(6)],
                       ("llama", 64): [("completed", 2.0005 + 0.001 * i) for i in range(6)]})
    (cell,) = check_claims(_spec(), flat).cells
    assert cell.verdict == stats.NOT_SIGNIFICANT and cell.sesoi is None and cell.p_equivalent is None
    spec = _spec(sesoi=0.01)
    (cell,) = check_claims(spec, flat).cells
    assert cell.verdict == "equivalent within ±0.01 nats" and cell.p_equivalent < 0.05 and cell.sesoi == 0.01
    (line,) = check_orderings(spec, flat)
    assert re.search(r"equivalence \(±0\.01\) p (< 0\.001|= 0\.0[0-4]\d) adjusted → equivalent within ±0\.01 nats",
                     line), line
    own = SweepSpec.model_validate({**spec.model_dump(), "report": {
        **spec.report.model_dump(), "orderings": [{**ORDERING, "sesoi": 0.0001}]}})
    (cell,) = check_claims(own, flat).cells  # the claim's own, tighter than the effect: not equivalent
    assert cell.sesoi == 0.0001 and cell.verdict == stats.NOT_SIGNIFICANT
    from ablate.report.notes import method_line

    assert "within ±SESOI (0.01 nats)" in method_line(check_claims(spec, flat))
    assert "none can be shown equivalent" in method_line(check_claims(_spec(), flat))


def test_a_sesoi_is_a_positive_number_and_leaves_a_sweeps_identity_as_it_was():
    assert "sesoi" not in _spec().report.model_dump() and "sesoi" not in _spec().report.orderings[0].model_dump()
    assert _spec(sesoi=0.01).fingerprint() != _spec().fingerprint()  # it changes what a race decides
    for bad in (0, -0.01, float("nan"), "small"):
        with pytest.raises(ValueError, match="sesoi"):
            _spec(sesoi=bad)


def test_a_parity_claim_holds_when_equal_within_its_bound_and_is_reversed_when_the_sides_differ():
    parity = {"claim": "mixer matches llama", "better": {"architecture": "mixer"},
              "matches": {"architecture": "llama"}, "within": 0.01, "at": ["d_model"]}
    spec = SweepSpec.model_validate({**_spec().model_dump(), "report": {"orderings": [parity]}})
    flat = _synthetic({("mixer", 64): [("completed", 2.0 + 0.001 * i) for i in range(6)],
                       ("llama", 64): [("completed", 2.0005 + 0.001 * i) for i in range(6)]})
    apart = _synthetic({("mixer", 64): [("completed", 2.0 + 0.001 * i) for i in range(6)],
                        ("llama", 64): [("completed", 2.1 + 0.001 * i) for i in range(6)]})
    noisy = _synthetic({("mixer", 64): [("completed", 2.0 + 0.05 * i) for i in range(3)],
                        ("llama", 64): [("completed", 2.0 + 0.05 * i) for i in range(3)]})
    verdicts = [check_claims(spec, views).cells[0].verdict for views in (flat, apart, noisy)]
    assert verdicts == ["holds: equal within ±0.01 nats", "reversed: the sides differ",
                        "undecided: neither equal within ±0.01 nats nor different"], verdicts
    from ablate.report.verdicts import verdict_table

    assert verdict_table(spec, check_claims(spec, flat)).rows[0][0] == "1: mixer ≈ llama"


def test_a_claim_whose_side_matches_no_run_names_that_side_and_the_method_says_nothing_was_tested():
    from ablate.report.notes import method_line
    from ablate.report.verdicts import verdict_table

    views = _synthetic({("mixer", 64): [("completed", 2.0), ("completed", 2.1)]})  # no llama ran, or will
    spec = _spec()
    claims = check_claims(spec, views)
    (line,) = check_orderings(spec, views, claims)
    assert "Here: no run matches its worse {architecture: llama}." in line
    assert verdict_table(spec, claims).rows[0][2] == "no run matches its worse {architecture: llama}"
    assert "no comparison tested yet" in method_line(claims) and "one comparison" not in method_line(claims)
    both = _synthetic({("mixer", 64): [("pending", None)], ("llama", 32): [("pending", None)]})
    (line,) = check_orderings(spec, both)  # both sides ran, never at one d_model: no side is missing
    assert "no pair of runs to compare yet" in line


def test_a_claim_without_its_full_stop_does_not_run_into_the_next_sentence():
    from ablate.report.notes import sentence

    assert sentence("every-block position input is detrimental (masked-mixers-1.md)") == (
        "every-block position input is detrimental (masked-mixers-1.md).")
    assert sentence("wider is better. ") == "wider is better." and sentence("does it hold?") == "does it hold?"


def test_the_answer_says_who_is_lower_by_how_much_how_sure_and_what_of_the_claim():
    """'mixer < llama ... reversed' was a double negative: each claim cell's verdict is one sentence, and when no
    claim is decided the answer says so and which block would decide them."""
    from ablate.report.answer import answer

    llama_lower = {("mixer", 64): [("completed", x) for x in (2.50, 2.52, 2.51)],
                   ("llama", 64): [("completed", x) for x in (2.10, 2.12, 2.11)],
                   ("mixer", 128): [("completed", x) for x in (2.00, 2.01, 2.02)],
                   ("llama", 128): [("completed", x) for x in (2.20, 2.21, 2.22)]}
    spec = _spec()
    lines = answer(spec, check_claims(spec, _synthetic(llama_lower)))
    assert lines[0].startswith("Claim 1: llama is lower than mixer at d_model=64 by 0.400 nats [")
    assert lines[0].endswith("adjusted p < 0.001: the study's claim is reversed here."), lines[0]
    assert lines[1].startswith("Claim 1: mixer is lower than llama at d_model=128 by 0.200 nats [")
    assert lines[1].endswith(": the study's claim holds here."), lines[1]
    assert len(lines) == 2  # decided: no advice
    tied = {("mixer", 64): [("completed", x) for x in (2.10, 2.30, 2.20)],
            ("llama", 64): [("completed", x) for x in (2.15, 2.35, 2.05)]}
    (line, advice) = answer(spec, check_claims(spec, _synthetic(tied)))
    assert "mixer and llama are not told apart at d_model=64: " in line and "neither the study's claim nor" in line
    assert advice.startswith("No claim is decided") and "`adaptive: {seeds: {min: 2, max: 10}}`" in advice
    (none,) = answer(spec, check_claims(spec, _synthetic({("mixer", 64): [("completed", 2.0)] * 2})))
    assert none.startswith("Claim 1: ") and "llama" in none, none


def test_seeds_of_one_configuration_trained_at_very_different_speeds_are_said_beside_their_seconds():
    """On a shared machine a report compared runs trained at load 8 with runs at load 47: when the seeds of one
    configuration differ more than 2x in tokens/s, the table says their seconds measure the machine."""
    views = _synthetic({("mixer", 64): [("completed", x) for x in (2.00, 2.02, 2.04)],
                        ("llama", 64): [("completed", x) for x in (2.20, 2.21, 2.22)]})
    for v, speed in zip(views, (1000.0, 1200.0, 2900.0, 5000.0, 5100.0, 5200.0)):
        v.row.tokens_per_second = speed
    spec = _spec(tables=[{"group_by": [], "columns": "architecture"}])
    (table,) = layout_tables(spec, views)
    (note,) = [n for n in table.notes if n.startswith("Speed:")]
    assert "mixer: 1,000–2,900 tokens/s (2.9×)" in note and "llama" not in note, note
    for v in views[:3]:
        v.row.tokens_per_second = 1500.0
    (table,) = layout_tables(spec, views)
    assert not [n for n in table.notes if n.startswith("Speed:")]
