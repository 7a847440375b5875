"""The statistics of reports checked on simulated data with known answers: interval coverage, p-values uniform
under the null, Holm's adjustment, verdicts, the noise floor, and the orderings of a report from synthetic runs."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats as sps

from ablate.config import SweepSpec
from ablate.results import stats
from ablate.results.orderings import TOO_FEW_STEPS, check_claims, claims_frame, noise_floor
from ablate.results.views import RunView


def test_the_95_interval_covers_the_true_mean_in_95_percent_of_1000_simulated_cells():
    rng = np.random.default_rng(7)
    for n in (3, 8):
        hits = 0
        for _ in range(1000):
            draws = rng.normal(2.0, 0.05, size=n)
            e = stats.mean_ci(list(draws))
            hits += e.low <= 2.0 <= e.high
        # binomial sd of the coverage at 1,000 draws: 0.0069; 3 sd either side
        assert 0.929 <= hits / 1000 <= 0.971, (n, hits)


def test_the_interval_is_the_textbook_t_interval_and_one_seed_has_none():
    e = stats.mean_ci([1.0, 2.0, 3.0])
    assert e.mean == 2.0 and e.n == 3 and e.std == 1.0
    assert e.half_width == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)  # t(0.975, 2) = 4.3027
    assert e.text() == "2.00 ± 2.48 (n=3)"
    one = stats.mean_ci([2.5])
    assert (one.low, one.high, one.text()) == (None, None, "2.50 (n=1)")


def test_welch_p_values_are_uniform_under_the_null_by_kolmogorov_smirnov():
    rng = np.random.default_rng(11)
    ps = []
    for _ in range(1000):
        a, b = rng.normal(3.0, 0.04, size=5), rng.normal(3.0, 0.04, size=5)
        ps.append(stats.welch(list(a), list(b)).p)
    assert sps.kstest(ps, "uniform").pvalue > 0.01
    assert 0.03 < np.mean(np.array(ps) < 0.05) < 0.07  # the test's size is its nominal 5%


def test_welch_matches_scipy_and_finds_a_real_difference():
    rng = np.random.default_rng(3)
    better, worse = list(rng.normal(2.0, 0.03, size=4)), list(rng.normal(2.2, 0.05, size=3))
    c = stats.welch(better, worse)
    reference = sps.ttest_ind(better, worse, equal_var=False, alternative="less")
    assert c.p == pytest.approx(reference.pvalue, rel=1e-9)
    assert c.p_against == pytest.approx(1 - reference.pvalue, rel=1e-9)
    assert c.effect == pytest.approx(np.mean(worse) - np.mean(better))
    assert c.low < c.effect < c.high
    assert c.p < 0.05


def test_the_t_distribution_is_scipy_stats_own_without_importing_it():
    # stats reads Student's t from scipy.special (scipy.stats' import is ~1 CPU-s of the dashboard's first study read)
    for df in (1.0, 1.7, 2.0, 3.4, 7.0, 29.9, 250.0):
        for level in (0.8, 0.9, 0.95, 0.99):
            assert stats.t_quantile(df, level) == sps.t.ppf(0.5 + level / 2, df)
    rng = np.random.default_rng(9)
    for n_better, n_worse in ((2, 2), (3, 5), (8, 4)):
        better, worse = list(rng.normal(2.0, 0.05, n_better)), list(rng.normal(2.03, 0.02, n_worse))
        c = stats.welch(better, worse)
        t = c.effect / math.sqrt(c.better.std ** 2 / n_better + c.worse.std ** 2 / n_worse)
        assert (c.p, c.p_against) == (sps.t.sf(t, c.df), sps.t.cdf(t, c.df))


def test_the_effect_interval_covers_the_true_difference_95_percent_of_the_time():
    rng = np.random.default_rng(5)
    hits = sum(c.low <= 0.1 <= c.high for c in (stats.welch(list(rng.normal(2.0, 0.03, 3)),
                                                             list(rng.normal(2.1, 0.06, 4))) for _ in range(1000)))
    assert 0.929 <= hits / 1000 <= 0.975  # Welch's df is an approximation: slightly conservative at worst


def test_holm_against_its_definition():
    assert stats.holm([0.01, 0.04, 0.03, None]) == pytest.approx([0.03, 0.06, 0.06, None])
    assert stats.holm([0.5, 0.9]) == [1.0, 1.0]
    # the family-wise error stays at 5% over 4 true nulls: without the adjustment it would be ~19%
    rng = np.random.default_rng(2)
    any_raw = any_holm = 0
    for _ in range(1000):
        ps = [stats.welch(list(rng.normal(0, 1, 6)), list(rng.normal(0, 1, 6))).p for _ in range(4)]
        any_raw += min(ps) < 0.05
        any_holm += min(stats.holm(ps)) < 0.05
    assert any_holm / 1000 < 0.07 < 0.14 < any_raw / 1000


def test_verdicts_read_the_two_sided_p_and_the_effects_sign():
    assert stats.verdict(0.01, 0.2) == stats.HOLDS
    assert stats.verdict(0.01, -0.2) == stats.REVERSED
    assert stats.verdict(0.2, 0.2) == stats.NOT_SIGNIFICANT
    assert stats.verdict(0.0, 1e-9) == stats.HOLDS  # a small effect is read by its test, never "no difference"
    assert stats.verdict(0.0, 1e-9, sesoi=0.01, p_equivalent=0.001) == "equivalent within ±0.01 nats"
    assert stats.verdict(0.0, 1e-9, sesoi=0.01, p_equivalent=0.2) == stats.HOLDS
    assert stats.verdict(None, None) == stats.UNTESTED


def test_pooled_std_is_the_within_cell_spread_not_the_spread_between_cells():
    rng = np.random.default_rng(9)
    cells = [list(rng.normal(mu, 0.02, size=3)) for mu in (1.0, 2.0, 3.0, 4.0) for _ in range(50)]
    std, n = stats.pooled_std(cells + [[5.0]])
    assert n == 200 and std == pytest.approx(0.02, rel=0.1)


# ---------------------------------------------------------------- orderings on synthetic runs


def _spec(**report) -> SweepSpec:
    return SweepSpec.model_validate({
        "name": "s", "dataset": {"source": "ablate:tinystories"}, "budget": {"steps": 100, "hardware": "cpu"},
        "report": {"orderings": [{"claim": "mixer beats llama", "better": {"architecture": "mixer"},
                                  "worse": {"architecture": "llama"}, "at": ["d_model"]}], **report}})


def _views(losses: dict[tuple[str, int], list[float]], steps: int = 200) -> list[RunView]:
    views = []
    for (arch, d), values in losses.items():
        for seed, loss in enumerate(values):
            row = SimpleNamespace(status="completed", final_eval_loss=loss, steps=steps, id=len(views) + 1)
            views.append(RunView(row=row, axes={"architecture": arch, "d_model": d, "seed": seed}, reference=None))
    return views


def test_orderings_get_effects_p_values_adjusted_together_and_verdicts():
    views = _views({("mixer", 64): [2.00, 2.01, 1.99], ("llama", 64): [2.20, 2.21, 2.19],  # holds
                    ("mixer", 128): [2.00, 2.10, 1.95], ("llama", 128): [2.02, 1.98, 2.06],  # not significant
                    ("mixer", 256): [2.30, 2.31, 2.29], ("llama", 256): [2.00, 2.01, 1.99],  # reversed
                    ("mixer", 512): [2.0], ("llama", 512): [2.1, 2.2]})  # one seed: untested
    claims = check_claims(_spec(), views)
    by_d = {c.where["d_model"]: c for c in claims.cells}
    assert [by_d[d].verdict for d in (64, 128, 256, 512)] == ["holds", "not significant", "reversed", "untested"]
    assert claims.tests == 3
    raw = sorted(by_d[d].comparison.p_two_sided for d in (64, 128, 256))
    assert sorted(by_d[d].p_adjusted for d in (64, 128, 256)) == pytest.approx(
        [min(1, 3 * raw[0]), min(1, max(3 * raw[0], 2 * raw[1])), min(1, max(3 * raw[0], 2 * raw[1], raw[2]))])
    assert by_d[64].comparison.effect == pytest.approx(0.2)
    frame = claims_frame(claims)
    assert list(frame["verdict"]) == ["holds", "not significant", "reversed", "untested"]
    assert frame["tests"].iloc[0] == 3


def test_the_noise_floor_flags_an_effect_smaller_than_the_seed_spread():
    views = _views({("mixer", 64): [2.00, 2.10, 1.90, 2.05], ("llama", 64): [2.03, 2.13, 1.93, 2.08]})
    claims = check_claims(_spec(), views)
    (cell,) = claims.cells
    floor = claims.floor["mixer"][0]
    assert floor == pytest.approx(np.std([2.00, 2.10, 1.90, 2.05], ddof=1))
    assert cell.below_floor and cell.floor == pytest.approx(max(claims.floor["mixer"][0], claims.floor["llama"][0]))


def test_runs_with_too_few_steps_get_no_verdict_and_are_left_out():
    views = _views({("mixer", 64): [2.0, 2.01, 1.99], ("llama", 64): [2.2, 2.21, 2.19]}, steps=20)
    (cell,) = check_claims(_spec(), views).cells
    assert cell.verdict == TOO_FEW_STEPS and cell.comparison is None
    assert cell.better.said() == "3 of 3 under 50 steps" and cell.worse.said() == "3 of 3 under 50 steps"
    (cell,) = check_claims(_spec(min_steps=10), views).cells
    assert cell.verdict == "holds"
    assert noise_floor(views, min_steps=100) == {}
