"""Scaling-law fits for reports: L(x) = E + A * x**(-alpha) through (size, loss) points, with bootstrap intervals.

x is a size (parameter count, FLOPs, tokens; all > 0) and L the loss reached at that size. E is the irreducible
loss, A the scale and alpha the exponent; the fit constrains alpha > 0 and E >= 0, so a loss that does not fall
with size gets no numbers, only a reason ("no fit: ..."), rather than a curve that means nothing.

`fit_power_law` fits with scipy's curve_fit on x divided by its geometric mean (the three parameters then have
comparable scales and the jacobian is well conditioned; A is reported for the unscaled x). Its 95% intervals are
percentile intervals of a bootstrap over seeds: each resample draws, within each distinct x, as many points
(or seed groups) as that x has, with replacement, and is refitted from the point estimate. Resampling n points
shrinks their spread by a factor sqrt((n-1)/n) (a third of the variance with 3 seeds), so the points are first
spread about their size's mean by sqrt(n/(n-1)): the bootstrap then sees the unbiased variance of each size.
A size with a single point stays fixed in every resample; with no size of two or more there is no interval.

A fit describes only the sizes it saw: `Fit.predict` refuses an x outside the fitted range widened by the factor
EXTRAPOLATE (1.0: no extrapolation at all), and `crossover` looks for the size where two fits' curves cross only
inside the overlap of their ranges.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ablate.config.units import short_count
from ablate.results.resample import fit_many, resampled_means

EXTRAPOLATE = 1.0  # predict() accepts x in [low / EXTRAPOLATE, high * EXTRAPOLATE] of the fitted sizes
ALPHA_MAX = 5.0  # alpha's upper bound: a fit that runs to it has found a cliff, not a power law
E_BOUND = 1e-6  # an E under this share of the lowest fitted loss sits at its lower bound 0
_ALPHA_MIN = 1e-3  # below this the curve is flat over any range a sweep covers: "alpha is not positive"
_GRID = np.geomspace(0.02, ALPHA_MAX, 48)  # starting exponents tried for the point estimate
_MIN_SUCCESS = 0.5  # the share of bootstrap resamples that must refit for the intervals to be reported
_SYMBOLS = {"params": "N", "parameters": "N", "flops": "C", "compute": "C", "tokens": "D", "data": "D"}

Interval = tuple[float, float]


@dataclass(frozen=True)
class Fit:
    """A fit of L(x) = E + A * x**(-alpha); when not `converged`, no numbers, and `reason` says why."""

    E: float | None
    A: float | None
    alpha: float | None
    E_ci: Interval | None
    A_ci: Interval | None
    alpha_ci: Interval | None
    x_range: Interval | None  # (min, max) of the fitted x; None only for no points at all
    n_points: int
    n_x: int  # distinct x values
    converged: bool
    reason: str  # empty when converged
    bootstrap: int  # resamples that refitted (0: no intervals)
    note: str = ""  # why there are no intervals although the fit converged

    @property
    def E_at_bound(self) -> bool:
        """E ran to its lower bound 0: the sizes fitted do not locate an irreducible loss (1.15e-11 is not a
        number to print)."""
        if self.E is None or self.x_range is None:
            return False
        return self.E <= E_BOUND * float(_curve(self, np.asarray(self.x_range[1], dtype=float)))

    def _E_interval(self) -> str:
        """E's interval; a low end at the bound 0 is written as the bound (2.01e-18 is the optimiser's, not data's)."""
        low, high = self.E_ci
        floor = E_BOUND * float(_curve(self, np.asarray(self.x_range[1], dtype=float)))
        return f"[0 (its bound), {_num(high)}]" if low <= floor else _ci(self.E_ci)

    def predict(self, x: Any) -> Any:
        """The fitted loss at x (a number or an array); a ValueError for any x outside the fitted range."""
        if not self.converged:
            raise ValueError(f"no fit to predict from: {self.reason}")
        values = np.asarray(x, dtype=float)
        low, high = self.x_range[0] / EXTRAPOLATE, self.x_range[1] * EXTRAPOLATE
        outside = ~((values >= low) & (values <= high))  # NaN is outside too
        if np.any(outside):
            bad = values[outside] if values.ndim else values
            raise ValueError(f"x = {float(np.ravel(bad)[0]):g} is outside the fitted range [{low:g}, {high:g}] "
                             f"(EXTRAPOLATE = {EXTRAPOLATE:g}): a power law fitted on these sizes says nothing "
                             "about others")
        out = _curve(self, values)
        return float(out) if out.ndim == 0 else out

    def text(self, unit: str = "params") -> str:
        """One line for a report: the law, alpha and E with their intervals, and what it was fitted on."""
        if not self.converged:
            return f"no fit: {self.reason}"
        s = _SYMBOLS.get(unit.lower(), unit)
        law = f"L({s}) = {_num(self.E)} + {_num(self.A)}·{s}^-{_num(self.alpha)}"
        e_text = ("E at its lower bound 0 (these sizes locate no irreducible loss: no E is claimed, and α is a pure "
                  "power law's)" if self.E_at_bound else None)
        if self.E_at_bound:
            law = f"L({s}) = {_num(self.A)}·{s}^-{_num(self.alpha)}"
        if self.bootstrap:
            values = (f"α = {_num(self.alpha)} {_ci(self.alpha_ci)}, "
                      + (e_text or f"E = {_num(self.E)} {self._E_interval()}"))
            how = f"95% bootstrap, {self.bootstrap} resamples"
        else:
            values = f"α = {_num(self.alpha)}, " + (e_text or f"E = {_num(self.E)}")
            how = f"no interval: {self.note}" if self.note else "no interval"
        reach = "not extrapolated" if EXTRAPOLATE == 1.0 else f"predicted up to ×{EXTRAPOLATE:g} past the data"
        where = f"fitted on {s} from {_size(self.x_range[0])} to {_size(self.x_range[1])}, {self.n_points} points"
        return f"{law}; {values} ({how}; {where}; {reach})"


@dataclass(frozen=True)
class Crossover:
    """Where two fits' curves cross inside the overlap `within` of their ranges; x None when they do not."""

    x: float | None
    lower_above: str | None  # the name lower above x (with no crossing: lower across the whole overlap)
    within: Interval | None  # None when the ranges do not overlap
    reason: str = ""  # why x is None

    def text(self, unit: str = "params") -> str:
        s = _SYMBOLS.get(unit.lower(), unit)
        if self.x is None:
            return f"no crossover: {self.reason}"
        return f"the curves cross at {s} = {_size(self.x)}; above it {self.lower_above} is lower"


def fit_power_law(x: Sequence[float], loss: Sequence[float], groups: Sequence[Any] | None = None,
                  bootstrap: int = 1000, seed: int = 0) -> Fit:
    """Fit L = E + A * x**(-alpha) to the points, with percentile intervals from a bootstrap over seeds.

    `groups` labels each point (e.g. its seed): the points that share an x and a label are one unit of the
    bootstrap (several checkpoints of one run move together). Without it each point is its own unit.
    """
    xs, ys = np.asarray(x, dtype=float).ravel(), np.asarray(loss, dtype=float).ravel()
    if xs.shape != ys.shape:
        raise ValueError(f"x has {xs.size} values and loss {ys.size}")
    if groups is not None and len(groups) != xs.size:
        raise ValueError(f"groups has {len(groups)} labels for {xs.size} points")
    if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))):
        raise ValueError("x and loss must be finite (leave out diverged runs before fitting)")
    if np.any(xs <= 0):
        raise ValueError(f"x must be > 0; got {float(xs.min()):g}")
    sizes = np.unique(xs)
    shape = dict(x_range=(float(xs.min()), float(xs.max())) if xs.size else None, n_points=int(xs.size),
                 n_x=int(sizes.size))
    if sizes.size < 3:
        return _refused(f"fewer than 3 distinct sizes ({sizes.size}): three parameters need three", **shape)
    means = np.array([ys[xs == s].mean() for s in sizes])
    if np.polyfit(np.log(sizes), means, 1)[0] >= 0:
        return _refused("alpha is not positive: loss does not fall with size", **shape)

    x0 = float(np.exp(np.log(xs).mean()))
    u = xs / x0
    try:
        E, B, alpha = _point(u, ys)
    except (RuntimeError, ValueError) as exc:
        return _refused(f"curve_fit did not converge: {exc}", **shape)
    if not np.all(np.isfinite([E, B, alpha])):
        return _refused("curve_fit did not converge: non-finite parameters", **shape)
    if alpha >= 0.99 * ALPHA_MAX:  # the start is clipped to 0.999 * ALPHA_MAX; a fit that stays there is stuck
        return _refused(f"alpha ran to its upper bound {ALPHA_MAX:g}: the loss stops falling within the range, "
                        "which no power law describes", **shape)
    drop = B * (u.min() ** -alpha - u.max() ** -alpha)
    if alpha < _ALPHA_MIN or drop <= 1e-9 * max(1.0, abs(float(ys.mean()))):
        return _refused("alpha is not positive: loss does not fall with size", **shape)

    A = B * x0**alpha
    units = _units(xs, groups)
    if bootstrap <= 0 or all(len(at) < 2 for at in units):
        note = "bootstrap=0" if bootstrap <= 0 else "one point per size, nothing to resample"
        return Fit(E, A, alpha, None, None, None, converged=True, reason="", bootstrap=0, note=note, **shape)
    samples = _bootstrap(u, _spread(ys, units), units, (E, B, alpha), bootstrap, seed)
    if len(samples) < _MIN_SUCCESS * bootstrap:
        return _refused(f"only {len(samples)} of {bootstrap} bootstrap resamples refitted: the fit is unstable",
                        **shape)
    Es, Bs, alphas = samples.T
    return Fit(E, A, alpha, _pct(Es), _pct(Bs * x0**alphas), _pct(alphas), converged=True, reason="",
               bootstrap=len(samples), **shape)


def crossover(name_a: str, a: Fit, name_b: str, b: Fit) -> Crossover:
    """The x inside both fits' ranges where their curves cross, and which is lower above it; never extrapolates.

    Two such curves cross at most twice; with two crossings inside the overlap the upper one is reported (above
    it the order holds to the end of the data). Crossings closer together than 1/256 of the log range are missed.
    """
    from scipy.optimize import brentq

    for name, fit in ((name_a, a), (name_b, b)):
        if not fit.converged:
            return Crossover(None, None, None, f"{name} has no fit: {fit.reason}")
    low, high = max(a.x_range[0], b.x_range[0]), min(a.x_range[1], b.x_range[1])
    if low >= high:
        return Crossover(None, None, None, "the fitted ranges do not overlap")

    def gap(t: float) -> float:  # a minus b at x = e**t
        x = float(np.clip(np.exp(t), low, high))
        return float(_curve(a, x) - _curve(b, x))

    t = np.linspace(np.log(low), np.log(high), 257)
    d = np.array([gap(v) for v in t])
    if np.all(d == 0):
        return Crossover(None, None, (low, high), "the curves coincide")
    lower = name_b if d[np.flatnonzero(d)[-1]] > 0 else name_a  # at the top of the overlap
    signed = np.flatnonzero(d)
    changes = [(i, j) for i, j in zip(signed[:-1], signed[1:]) if np.sign(d[i]) != np.sign(d[j])]
    if not changes:
        return Crossover(None, lower, (low, high),
                         f"the curves do not cross between {_size(low)} and {_size(high)}; {lower} is lower")
    i, j = changes[-1]
    root = brentq(gap, t[i], t[j], xtol=1e-12) if j == i + 1 else t[i + 1]  # a grid point exactly on it
    return Crossover(float(np.clip(np.exp(root), low, high)), lower, (low, high))


def _curve(fit: Fit, x: Any) -> np.ndarray:
    return fit.E + fit.A * np.asarray(x, dtype=float) ** -fit.alpha


def _model(u: np.ndarray, E: float, B: float, alpha: float) -> np.ndarray:
    return E + B * u**-alpha


def _jac(u: np.ndarray, E: float, B: float, alpha: float) -> np.ndarray:
    p = u**-alpha
    return np.column_stack([np.ones_like(u), p, -B * p * np.log(u)])


_LOWER, _UPPER = [0.0, 0.0, 0.0], [np.inf, np.inf, ALPHA_MAX]


def _refit(u: np.ndarray, y: np.ndarray, p0: Sequence[float], max_nfev: int = 200,
           sigma: np.ndarray | None = None) -> np.ndarray:
    """One bounded curve_fit (trust-region reflective: the bounds keep E >= 0, B >= 0, 0 <= alpha <= ALPHA_MAX);
    `sigma`: each point's standard error (a size's mean of n points: n**-0.5)."""
    from scipy.optimize import curve_fit

    start = np.clip(p0, [0.0, 0.0, _ALPHA_MIN], [np.inf, np.inf, ALPHA_MAX * 0.999])
    params, _ = curve_fit(_model, u, y, p0=start, jac=_jac, bounds=(_LOWER, _UPPER), method="trf",
                          max_nfev=max_nfev, sigma=sigma)
    return params


def _point(u: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """The least-squares (E, B, alpha): curve_fit from the best of a grid of exponents and from alpha 0.3, the
    better one kept. For a fixed alpha the model is linear in E and B, so each grid start is solved exactly.
    Where curve_fit fails and the grid's best exponent is ALPHA_MAX, the grid's answer stands (the caller then
    says alpha ran to its bound: the points fall off a cliff, and curve_fit creeps after an ever steeper one)."""
    grid = _linear_start(u, y)
    starts = [grid, (0.9 * float(y.min()), max(float(y.max() - y.min()), 1e-6), 0.3)]
    best, best_sse, failure = None, np.inf, None
    for p0 in starts:
        try:
            params = _refit(u, y, p0, max_nfev=1000)
        except (RuntimeError, ValueError) as exc:
            failure = exc
            continue
        sse = float(np.sum((_model(u, *params) - y) ** 2))
        if sse < best_sse:
            best, best_sse = params, sse
    if best is None:
        if grid[2] >= ALPHA_MAX:
            return grid
        raise failure
    return float(best[0]), float(best[1]), float(best[2])


def _linear_start(u: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(E, B, alpha) minimising the squared error over the exponents in _GRID, E and B by least squares."""
    z = u[None, :] ** -_GRID[:, None]
    zc, yc = z - z.mean(axis=1, keepdims=True), y - y.mean()
    B = np.maximum((zc @ yc) / np.maximum((zc * zc).sum(axis=1), 1e-300), 0.0)
    E = y.mean() - B * z.mean(axis=1)
    negative = E < 0  # E = 0, the best B through the origin
    B[negative] = np.maximum((z[negative] @ y) / (z[negative] ** 2).sum(axis=1), 0.0)
    E[negative] = 0.0
    sse = ((E[:, None] + B[:, None] * z - y) ** 2).sum(axis=1)
    k = int(np.argmin(sse))
    return float(E[k]), float(B[k]), float(_GRID[k])


def _units(xs: np.ndarray, groups: Sequence[Any] | None) -> list[list[np.ndarray]]:
    """Per distinct x, the bootstrap's units: arrays of point indices (one point each, or one seed group)."""
    out = []
    for s in np.unique(xs):
        at = np.flatnonzero(xs == s)
        if groups is None:
            out.append([np.array([i]) for i in at])
        else:
            labels: dict[Any, list[int]] = {}
            for i in at:
                labels.setdefault(groups[i], []).append(int(i))
            out.append([np.array(v) for v in labels.values()])
    return out


def _spread(ys: np.ndarray, units: list[list[np.ndarray]]) -> np.ndarray:
    """The losses spread about their size's mean by sqrt(m/(m-1)), m the size's units: resampling m units
    would otherwise understate the variance by (m-1)/m."""
    out = ys.copy()
    for at in units:
        m = len(at)
        if m >= 2:
            idx = np.concatenate(at)
            mean = ys[idx].mean()
            out[idx] = mean + np.sqrt(m / (m - 1)) * (ys[idx] - mean)
    return out


def _bootstrap(u: np.ndarray, y: np.ndarray, units: list[list[np.ndarray]], p0: Sequence[float], n: int,
               seed: int) -> np.ndarray:
    """(E, B, alpha) of each resample that refitted, as rows; resamples that fail are skipped. Each resample is
    fitted on its per-size means weighted by their points (resample.py: the same minimum as on every point); the
    rare one the batched fit leaves outside the bounds is refitted with them."""
    sizes = np.array([u[at[0][0]] for at in units])
    means, counts = resampled_means(y, units, n, seed)
    params = fit_many(sizes, means, counts, p0, _UPPER)
    for k in np.flatnonzero(np.isnan(params).any(axis=1)):
        try:
            params[k] = _refit(sizes, means[k], p0, sigma=counts[k] ** -0.5)
        except (RuntimeError, ValueError):
            continue
    return params[np.isfinite(params).all(axis=1)]


def _pct(values: np.ndarray) -> Interval:
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def _refused(reason: str, **shape: Any) -> Fit:
    return Fit(None, None, None, None, None, None, converged=False, reason=reason, bootstrap=0, **shape)


def _num(v: float) -> str:
    """Three significant figures, exponents without '+' or leading zeros (1.23e5)."""
    return f"{v:.3g}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")


def _size(v: float) -> str:
    """A size as people write it: 950, 1.2M, 19M, 3B, 1.2e18."""
    return short_count(v)


def _ci(interval: Interval) -> str:
    return f"[{_num(interval[0])}, {_num(interval[1])}]"
