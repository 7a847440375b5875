"""The statistics behind a report's claims, computed once for the report, the UI and notebooks.

- `mean_ci`: a cell's mean over seeds with a 95% Student-t confidence interval and n (no interval from one seed).
- `welch`: an ordering "better < worse" tested across seeds: the effect (mean of worse − mean of better, in nats;
  positive where the claim holds) with its Welch confidence interval, and one-sided Welch t-test p-values in the
  claim's direction and against it. Welch, not a permutation test: with 3 seeds a side a permutation test has
  20 arrangements, so its smallest one-sided p is 0.05 and no claim could ever pass.
- `holm`: Holm's step-down adjustment of a family of p-values (every comparison in one report).
- `verdict`: holds / not significant / reversed / untested, from the adjusted p-values.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

LEVEL = 0.95  # confidence of every interval
ALPHA = 0.05  # significance of every verdict, after Holm's adjustment

HOLDS, NOT_SIGNIFICANT, REVERSED, UNTESTED = "holds", "not significant", "reversed", "untested"


@dataclass(frozen=True)
class Estimate:
    """A mean over n seeds with its 95% t-interval (low, high); one seed has no interval (low = high = None)."""

    mean: float
    n: int
    std: float | None = None
    low: float | None = None
    high: float | None = None
    method: str = "t"

    @property
    def half_width(self) -> float | None:
        return None if self.high is None else (self.high - self.low) / 2

    def text(self, digits: int = 2) -> str:
        """'3.71 ± 0.06 (n=3)': ± the half-width of the 95% interval; '3.71 (n=1)' where one seed ran."""
        if self.half_width is None:
            return f"{self.mean:.{digits}f} (n={self.n})"
        return f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f} (n={self.n})"


def t_quantile(df: float, level: float = LEVEL) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.5 + level / 2, df))


def mean_ci(values: Sequence[float], level: float = LEVEL) -> Estimate:
    """The mean of `values` with a two-sided Student-t interval (mean ± t·s/√n); NaNs count as values (a diverged
    seed makes the cell NaN, as it should)."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci of no values")
    mean = statistics.fmean(values)
    if n == 1:
        return Estimate(mean=mean, n=1)
    std = statistics.stdev(values)
    half = t_quantile(n - 1, level) * std / math.sqrt(n)
    return Estimate(mean=mean, n=n, std=std, low=mean - half, high=mean + half)


@dataclass(frozen=True)
class Comparison:
    """'better' against 'worse' across seeds. effect = mean(worse) − mean(better): > 0 where the claim holds.
    p: one-sided Welch p-value of the claim's direction; p_against: of the opposite direction. No test (p None)
    with fewer than 2 seeds on a side."""

    better: Estimate
    worse: Estimate
    effect: float
    low: float | None = None
    high: float | None = None
    p: float | None = None
    p_against: float | None = None
    df: float | None = None

    @property
    def tested(self) -> bool:
        return self.p is not None


def welch(better: Sequence[float], worse: Sequence[float], level: float = LEVEL) -> Comparison:
    """Welch's unequal-variance t-test of mean(better) < mean(worse), one-sided each way, with the interval of the
    difference on Welch–Satterthwaite degrees of freedom."""
    from scipy import stats

    b, w = mean_ci(better, level), mean_ci(worse, level)
    effect = w.mean - b.mean
    if b.n < 2 or w.n < 2:
        return Comparison(better=b, worse=w, effect=effect)
    vb, vw = b.std ** 2 / b.n, w.std ** 2 / w.n
    se = math.sqrt(vb + vw)
    if se == 0 or not math.isfinite(se):  # identical seeds on both sides (or a NaN): the sign decides
        p = 0.0 if effect > 0 else 1.0 if effect < 0 else 0.5
        return Comparison(better=b, worse=w, effect=effect, low=effect, high=effect, p=p, p_against=1.0 - p
                          if effect != 0 else 0.5)
    df = (vb + vw) ** 2 / (vb ** 2 / (b.n - 1) + vw ** 2 / (w.n - 1))
    t = effect / se
    half = t_quantile(df, level) * se
    return Comparison(better=b, worse=w, effect=effect, low=effect - half, high=effect + half,
                      p=float(stats.t.sf(t, df)), p_against=float(stats.t.cdf(t, df)), df=df)


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment (controls the family-wise error at any dependence): the k-th smallest of m
    p-values is multiplied by (m − k + 1), then made monotone and capped at 1. None (untested) stays None and does
    not count in m."""
    tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m = len(tested)
    adjusted: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for k, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - k) * p))
        adjusted[i] = running
    return adjusted


def verdict(p_adjusted: float | None, p_against_adjusted: float | None, alpha: float = ALPHA) -> str:
    """holds: the claim's direction is significant after adjustment; reversed: the opposite direction is;
    not significant: neither; untested: too few seeds for a test."""
    if p_adjusted is None:
        return UNTESTED
    if p_adjusted < alpha:
        return HOLDS
    if p_against_adjusted is not None and p_against_adjusted < alpha:
        return REVERSED
    return NOT_SIGNIFICANT


def pooled_std(groups: Sequence[Sequence[float]]) -> tuple[float | None, int]:
    """The seed-to-seed standard deviation pooled over cells (each a configuration's seeds): √(Σ(nᵢ−1)sᵢ² / Σ(nᵢ−1)),
    and how many cells had 2 seeds or more. None when none had."""
    dof = 0
    total = 0.0
    cells = 0
    for values in groups:
        finite = [v for v in values if math.isfinite(v)]
        if len(finite) < 2:
            continue
        cells += 1
        dof += len(finite) - 1
        total += (len(finite) - 1) * statistics.variance(finite)
    return (math.sqrt(total / dof) if dof else None), cells
