"""Scaling-law fits: the numbers (recovery, interval coverage, crossovers), and the refusals (too few sizes, a loss
that does not fall, extrapolation)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ablate.results import scaling
from ablate.results.scaling import Crossover, crossover, fit_power_law

E, A, ALPHA = 1.8, 40.0, 0.3
SIZES = np.geomspace(1e5, 1e7, 5)


def law(x, e=E, a=A, alpha=ALPHA):
    return e + a * np.asarray(x, dtype=float) ** -alpha


def seeds(rng: np.random.Generator, n_seeds: int = 3, sd: float = 0.01):
    """Points at SIZES, n_seeds each, with gaussian noise: (x, loss, seed label)."""
    x = np.repeat(SIZES, n_seeds)
    return x, law(x) + rng.normal(0.0, sd, x.size), np.tile(np.arange(n_seeds), SIZES.size)


def exact(sizes, e, a, alpha):
    """A fit of noiseless points (one per size: no interval, which is all a crossover needs)."""
    fit = fit_power_law(sizes, law(sizes, e, a, alpha))
    assert fit.converged, fit.reason
    return fit


def test_fit_recovers_a_known_law_from_three_noisy_seeds_and_its_intervals_hold_the_truth():
    x, y, seed = seeds(np.random.default_rng(20240601))
    fit = fit_power_law(x, y, groups=seed)
    assert fit.converged and fit.reason == ""
    assert abs(fit.alpha - ALPHA) < 0.05 and abs(fit.E - E) < 0.05
    assert fit.alpha_ci[0] <= ALPHA <= fit.alpha_ci[1]
    assert fit.E_ci[0] <= E <= fit.E_ci[1]
    assert fit.A_ci[0] <= A <= fit.A_ci[1]
    assert fit.alpha_ci[0] <= fit.alpha <= fit.alpha_ci[1]  # the point estimate sits inside its own interval
    assert fit.x_range == (float(x.min()), float(x.max())) == (1e5, 1e7)
    assert (fit.n_points, fit.n_x, fit.bootstrap) == (15, 5, 1000)


def test_noiseless_points_are_recovered_to_1e_3():
    fit = fit_power_law(SIZES, law(SIZES), bootstrap=0)
    assert fit.converged
    assert fit.E == pytest.approx(E, abs=1e-3)
    assert fit.alpha == pytest.approx(ALPHA, abs=1e-3)
    assert fit.A == pytest.approx(A, rel=1e-3)  # A is reported for the unscaled x, not x over its geometric mean
    assert fit.alpha_ci is None and fit.note == "bootstrap=0"


def test_fit_of_flops_sized_x_is_as_good_as_of_params():
    """x near 1e20: the fit runs on x over its geometric mean, so the scale of x changes nothing."""
    x = np.geomspace(1e18, 1e21, 6)
    fit = fit_power_law(x, law(x, 1.7, 3e5, 0.28), bootstrap=0)
    assert fit.alpha == pytest.approx(0.28, abs=1e-3) and fit.E == pytest.approx(1.7, abs=1e-3)
    assert fit.A == pytest.approx(3e5, rel=1e-2)


def test_the_95_percent_interval_for_alpha_covers_the_true_alpha_in_most_simulated_sweeps():
    """100 sweeps of 5 sizes x 3 seeds, 200 resamples each (about 4 CPU-s). A percentile bootstrap with three
    seeds per size in a three-parameter nonlinear fit covers about 91% (measured on 500 sweeps), not 95%: the
    resamples of three points have short tails. 85% leaves two binomial standard deviations (2.9% at n=100)
    below that, and catches a bootstrap that has lost its spread (resampling without the sqrt(n/(n-1)) spread
    covered 87%; one that resampled across sizes or reused the point estimate would cover far less)."""
    rng = np.random.default_rng(7)
    runs, covered, widths = 100, 0, []
    for k in range(runs):
        x, y, seed = seeds(rng)
        fit = fit_power_law(x, y, groups=seed, bootstrap=200, seed=k)
        assert fit.converged, fit.reason
        covered += fit.alpha_ci[0] <= ALPHA <= fit.alpha_ci[1]
        widths.append(fit.alpha_ci[1] - fit.alpha_ci[0])
    assert covered >= 0.85 * runs, f"alpha's 95% interval covered the truth in {covered} of {runs} sweeps"
    assert np.median(widths) < 0.1  # and is not bought with useless width


def test_seed_groups_of_one_point_resample_like_single_points():
    x, y, seed = seeds(np.random.default_rng(3))
    assert fit_power_law(x, y, groups=seed, bootstrap=200) == fit_power_law(x, y, bootstrap=200)


def test_checkpoints_of_one_seed_move_together_in_the_bootstrap():
    """Two points per (size, seed), identical: as one unit per seed the interval is the one of the seeds alone;
    as separate points, the spread correction would use 6 units, not 3, and give another interval."""
    x, y, seed = seeds(np.random.default_rng(4))
    twice = fit_power_law(np.repeat(x, 2), np.repeat(y, 2), groups=np.repeat(seed, 2), bootstrap=200)
    once = fit_power_law(x, y, groups=seed, bootstrap=200)
    assert twice.alpha == pytest.approx(once.alpha, abs=1e-6)
    assert twice.alpha_ci == pytest.approx(once.alpha_ci, abs=1e-6)
    assert twice.alpha_ci != fit_power_law(np.repeat(x, 2), np.repeat(y, 2), bootstrap=200).alpha_ci


def test_each_resample_fitted_on_its_size_means_lands_where_a_fit_of_its_every_point_does():
    """The bootstrap fits a resample's per-size means weighted by their points, all resamples at once
    (results/resample.py); a scipy fit of the same resample's every point, one at a time, finds the same minimum."""
    from scipy.optimize import curve_fit

    from ablate.results.resample import fit_many

    rng = np.random.default_rng(11)
    x, y, seed = seeds(rng, n_seeds=6, sd=0.02)
    u = x / np.exp(np.log(x).mean())
    sizes = np.unique(u)
    resamples = [np.concatenate([rng.choice(np.flatnonzero(u == s), 6 + k % 3) for s in sizes]) for k in range(20)]
    means = np.array([[y[idx][u[idx] == s].mean() for s in sizes] for idx in resamples])
    counts = np.array([[np.sum(u[idx] == s) for s in sizes] for idx in resamples], dtype=float)
    start = fit_power_law(x, y, bootstrap=0)
    p0 = (start.E, start.A * np.exp(np.log(x).mean()) ** -start.alpha, start.alpha)
    batched = fit_many(sizes, means, counts, p0, (np.inf, np.inf, scaling.ALPHA_MAX))
    for idx, got in zip(resamples, batched):
        want, _ = curve_fit(scaling._model, u[idx], y[idx], p0=p0, jac=scaling._jac, method="lm", xtol=1e-12,
                            ftol=1e-12)
        assert got == pytest.approx(want, rel=1e-6)


def test_a_resample_the_batched_fit_leaves_outside_the_bounds_is_refitted_with_them():
    """Losses that rise with size past the middle: an unbounded fit of some resamples wants alpha < 0 or E < 0;
    those come back NaN from fit_many, the bounded refit gives them numbers within the bounds."""
    from ablate.results.resample import fit_many

    sizes = np.geomspace(0.1, 10, 5)
    means = np.array([[3.0, 2.5, 2.2, 2.25, 2.3], [3.0, 2.6, 2.4, 2.3, 2.25]])
    fitted = fit_many(sizes, means, np.ones_like(means), (1.0, 1.0, 0.5), (np.inf, np.inf, scaling.ALPHA_MAX))
    assert np.isnan(fitted[0]).all() and np.isfinite(fitted[1]).all()
    units = [[np.array([i])] for i in range(5)]
    refitted = scaling._bootstrap(sizes, means[0], units, (1.0, 1.0, 0.5), 3, seed=0)
    assert refitted.shape == (3, 3)
    assert (refitted[:, :2] >= 0).all() and ((refitted[:, 2] >= 0) & (refitted[:, 2] <= scaling.ALPHA_MAX)).all()


@pytest.mark.parametrize("n_sizes", [1, 2])
def test_fewer_than_three_distinct_sizes_is_no_fit(n_sizes):
    x = np.repeat(SIZES[:n_sizes], 3)
    fit = fit_power_law(x, law(x))
    assert not fit.converged
    assert f"fewer than 3 distinct sizes ({n_sizes})" in fit.reason
    assert (fit.E, fit.A, fit.alpha, fit.alpha_ci) == (None, None, None, None)
    assert (fit.n_points, fit.n_x) == (3 * n_sizes, n_sizes)
    assert fit.text() == f"no fit: {fit.reason}"


@pytest.mark.parametrize("loss", [
    np.full(SIZES.size, 2.5),  # flat
    2.0 + 0.05 * np.log10(SIZES),  # rising
    2.5 + np.array([0.0, 0.02, -0.01, 0.03, 0.04]),  # noisy, rising on the whole
])
def test_a_loss_that_does_not_fall_with_size_is_no_fit(loss):
    fit = fit_power_law(SIZES, loss)
    assert not fit.converged
    assert "loss does not fall with size" in fit.reason
    text = fit.text()
    assert text.startswith("no fit: ") and not re.search(r"\d", text), text


def test_a_loss_that_falls_off_a_cliff_then_stays_is_no_power_law():
    fit = fit_power_law([1e5, 1e6, 1e7, 1e8], [3.0, 2.0, 2.0, 2.0])
    assert not fit.converged and "upper bound" in fit.reason


def test_one_point_per_size_fits_without_an_interval_and_says_so():
    noisy = law(SIZES) + np.array([0.01, -0.01, 0.0, 0.01, -0.005])
    fit = fit_power_law(SIZES, noisy)
    assert fit.converged and fit.bootstrap == 0 and fit.alpha_ci is None
    assert "no interval: one point per size" in fit.text()


def test_text_gives_the_law_intervals_and_range():
    x, y, seed = seeds(np.random.default_rng(20240601))
    fit = fit_power_law(x, y, groups=seed)
    text = fit.text()
    assert text.startswith(f"L(N) = {fit.E:.3g} + {fit.A:.3g}·N^-{fit.alpha:.3g}; α = {fit.alpha:.3g} "
                           f"[{fit.alpha_ci[0]:.3g}, {fit.alpha_ci[1]:.3g}], E = {fit.E:.3g} ")
    assert "(95% bootstrap, 1000 resamples; fitted on N from 100k to 10M, 15 points; not extrapolated)" in text
    assert fit.text("flops").startswith("L(C) = ")


def test_predict_works_inside_the_fitted_range_and_refuses_outside():
    fit = exact(SIZES, E, A, ALPHA)
    assert fit.predict(1e6) == pytest.approx(law(1e6), abs=1e-4)
    assert fit.predict(1e5) == pytest.approx(law(1e5), abs=1e-4)  # the ends are inside
    assert fit.predict([1e5, 1e7]) == pytest.approx(law([1e5, 1e7]), abs=1e-4)
    for x in (9.9e4, 1.01e7, 1e9, [1e6, 2e7], float("nan")):
        with pytest.raises(ValueError, match=r"outside the fitted range \[100000, 1e\+07\]"):
            fit.predict(x)


def test_predict_extrapolates_only_as_far_as_EXTRAPOLATE_allows(monkeypatch):
    fit = exact(SIZES, E, A, ALPHA)
    monkeypatch.setattr(scaling, "EXTRAPOLATE", 2.0)
    assert fit.predict(1.9e7) == pytest.approx(law(1.9e7), abs=1e-4)
    with pytest.raises(ValueError, match=r"\[50000, 2e\+07\]"):
        fit.predict(2.1e7)
    assert "predicted up to ×2 past the data" in fit.text()


def test_predict_of_no_fit_says_why():
    fit = fit_power_law(SIZES[:2], law(SIZES[:2]))
    with pytest.raises(ValueError, match="fewer than 3 distinct sizes"):
        fit.predict(1e5)


def test_crossover_of_equal_exponents_is_where_the_algebra_puts_it():
    """1.7 + 60 x^-0.3 = 2.0 + 30 x^-0.3  <=>  x^-0.3 = 0.3 / 30  <=>  x = 100^(1/0.3) = 4.64e6."""
    sizes = np.geomspace(1e5, 1e7, 6)
    cross = crossover("big", exact(sizes, 1.7, 60.0, 0.3), "small", exact(sizes, 2.0, 30.0, 0.3))
    assert cross.x == pytest.approx(100 ** (1 / 0.3), rel=0.02)
    assert cross.lower_above == "big"  # the lower E wins above the crossing
    assert cross.within == (1e5, 1e7)
    assert "above it big is lower" in cross.text()


def test_crossover_of_different_exponents_matches_a_fine_grid():
    sizes = np.geomspace(1e5, 1e7, 8)
    a, b = (2.0, 20.0, 0.25), (1.6, 200.0, 0.4)
    grid = np.geomspace(1e5, 1e7, 1_000_001)
    gap = law(grid, *a) - law(grid, *b)
    k = int(np.flatnonzero(np.diff(np.sign(gap)))[0])
    truth = grid[k] - gap[k] * (grid[k + 1] - grid[k]) / (gap[k + 1] - gap[k])
    cross = crossover("a", exact(sizes, *a), "b", exact(sizes, *b))
    assert cross.x == pytest.approx(truth, rel=0.02)
    assert cross.lower_above == "b"
    swapped = crossover("b", exact(sizes, *b), "a", exact(sizes, *a))
    assert swapped.x == pytest.approx(cross.x, rel=1e-9) and swapped.lower_above == "b"


def test_crossover_outside_the_overlap_of_the_ranges_is_none():
    """The laws cross at 4.64e6: inside a's range, outside b's, so outside the overlap [1e5, 2e6]."""
    a = exact(np.geomspace(1e5, 1e7, 6), 1.7, 60.0, 0.3)
    b = exact(np.geomspace(1e4, 2e6, 6), 2.0, 30.0, 0.3)
    cross = crossover("big", a, "small", b)
    assert cross.x is None
    assert cross.within == (1e5, 2e6)
    assert cross.lower_above == "small"  # lower across the whole overlap
    assert "do not cross" in cross.reason


def test_crossover_of_ranges_that_do_not_overlap_or_of_no_fit_is_none():
    a = exact(np.geomspace(1e5, 1e6, 4), 1.7, 60.0, 0.3)
    b = exact(np.geomspace(2e6, 1e7, 4), 2.0, 30.0, 0.3)
    assert crossover("a", a, "b", b) == Crossover(None, None, None, "the fitted ranges do not overlap")
    none = crossover("a", a, "flat", fit_power_law(SIZES, np.full(SIZES.size, 2.5)))
    assert none.x is None and none.reason.startswith("flat has no fit: ")


@pytest.mark.parametrize("x, loss, message", [
    ([1e5, 1e6], [2.0], "x has 2 values and loss 1"),
    ([0.0, 1e6, 1e7], [3.0, 2.5, 2.0], "x must be > 0"),
    ([1e5, 1e6, 1e7], [3.0, float("nan"), 2.0], "must be finite"),
])
def test_malformed_points_are_a_value_error(x, loss, message):
    with pytest.raises(ValueError, match=message):
        fit_power_law(x, loss)
