"""The statistics behind a report's claims, computed once for the report, the UI and notebooks.

- `mean_ci`: a cell's mean over seeds with a 95% Student-t confidence interval and n (no interval from one seed).
- `welch`: an ordering "better < worse" tested across seeds: the effect (mean of worse − mean of better, in nats;
  positive where the claim holds) with its Welch confidence interval, the one-sided Welch t-test p-values in the
  claim's direction and against it, and the two-sided p. Welch, not a permutation test: with 3 seeds a side a
  permutation test has 20 arrangements, so its smallest one-sided p is 0.05 and no claim could ever pass.
- `holm`: Holm's step-down adjustment of a family of p-values (every comparison in one report).
- `equivalence`: two one-sided tests (TOST, Schuirmann 1987) that the effect lies within ±SESOI, the smallest
  effect of interest: the larger of the two one-sided Welch p-values, so "equivalent" is wrong at most alpha of the
  time when the true effect is ±SESOI.
- `verdict`: holds / reversed / equivalent / not significant / untested, from the two-sided Holm-adjusted p, the
  effect's sign and, where the claim has a SESOI, the Holm-adjusted TOST p. Two-sided, because a report can
  conclude either direction: one-sided tests each way at alpha would give a significant verdict under the null
  twice as often as alpha (FAMILY_NOTE says so in reports). A small effect is never read as "no difference": without
  a SESOI it is "not significant", with its interval.

Non-finite values (a diverged seed's NaN or inf) never raise: a cell with one has its mean (NaN or inf) and no
interval, and a comparison with one is untested. The read side leaves such runs out of a cell and says so.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

LEVEL = 0.95  # confidence of every interval
ALPHA = 0.05  # significance of every verdict, after Holm's adjustment
HOLDS, NOT_SIGNIFICANT, REVERSED, UNTESTED = "holds", "not significant", "reversed", "untested"
EQUIVALENT = "equivalent"
# both sides' seeds gave one loss each (zero spread): no test, whatever the means (two identical seeds a side gave
# z = 37 and "holds"; a trainer that ignores its seed gives exactly this)
IDENTICAL = "the seeds gave identical losses on each side (is the seed used?)"
FAMILY_NOTE = ("two-sided, so that holds and reversed together are wrong at most 5% of the time when there is no "
               "difference (one-sided tests each way would be wrong 10% of the time); p is the one-sided p in the "
               "claim's direction, the verdict reads the two-sided p after Holm's adjustment and the effect's sign")


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

    def text(self, digits: int = 2, said: str = "") -> str:
        """'3.71 ± 0.06 (n=3)': ± the half-width of the 95% interval; '3.71 (n=1)' where one seed ran; `said`: what
        the cell left out, '(n=3; 1 of 4 diverged)'."""
        n = f"(n={self.n}; {said})" if said else f"(n={self.n})"
        if self.half_width is None:
            return f"{self.mean:.{digits}f} {n}"
        return f"{self.mean:.{digits}f} ± {shown(self.half_width, digits)} {n}"


def shown(x: float, digits: int) -> str:
    """x to `digits` decimals, but a nonzero x that would round to 0 to one significant figure ('0.004', not the
    '0.00' that says a spread or a floor is none)."""
    text = f"{x:.{digits}f}"
    return f"{x:.1g}" if x != 0 and math.isfinite(x) and float(text) == 0 else text


# Student's t through scipy.special's stdtr / stdtrit, the functions scipy.stats.t calls for its cdf, sf and ppf (the
# same numbers): importing scipy.stats costs ~1 CPU-s, scipy.special about half (the dashboard's first study read)


@functools.lru_cache(maxsize=4096)  # a table of 2,000 cells asks for a handful of df; scipy's ppf costs ~1 ms a call
def t_quantile(df: float, level: float = LEVEL) -> float:
    from scipy.special import stdtrit

    return float(stdtrit(df, 0.5 + level / 2))


# statistics' exact (and slow) sample std and variance, each kept for the last CELLS seeds' values it was given: a
# dashboard or the runner's keeper reads a sweep's study again as runs finish, and recomputes only the cells whose
# runs changed (the same numbers, from the same function)
CELLS = 65_536
_stdev = functools.lru_cache(maxsize=CELLS)(statistics.stdev)
_variance = functools.lru_cache(maxsize=CELLS)(statistics.variance)


def mean_ci(values: Sequence[float], level: float = LEVEL) -> Estimate:
    """The mean of `values` with a two-sided Student-t interval (mean ± t·s/√n). A NaN or inf counts as a value
    and makes the mean NaN or inf with no interval (a diverged seed makes the cell so, as it should)."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci of no values")
    if not all(math.isfinite(v) for v in values):
        return Estimate(mean=float(sum(values)) / n, n=n)  # nan, or ±inf (inf − inf is nan)
    mean = statistics.fmean(values)
    if n == 1:
        return Estimate(mean=mean, n=1)
    std = _stdev(tuple(values))
    half = t_quantile(n - 1, level) * std / math.sqrt(n)
    return Estimate(mean=mean, n=n, std=std, low=mean - half, high=mean + half)


@dataclass(frozen=True)
class Comparison:
    """'better' against 'worse' across seeds. effect = mean(worse) − mean(better): > 0 where the claim holds.
    p: one-sided Welch p-value of the claim's direction; p_against: of the opposite direction. No test (p None)
    with fewer than 2 seeds on a side, a NaN or inf among them, or no spread on either side (`identical`)."""

    better: Estimate
    worse: Estimate
    effect: float
    low: float | None = None
    high: float | None = None
    p: float | None = None
    p_against: float | None = None
    df: float | None = None
    se: float | None = None  # the standard error of the effect
    identical: bool = False  # each side's seeds gave one loss: no test

    @property
    def tested(self) -> bool:
        return self.p is not None

    @property
    def p_two_sided(self) -> float | None:
        return None if self.p is None else min(1.0, 2 * min(self.p, self.p_against))


def welch(better: Sequence[float], worse: Sequence[float], level: float = LEVEL) -> Comparison:
    """Welch's unequal-variance t-test of mean(better) < mean(worse), one-sided each way, with the interval of the
    difference on Welch–Satterthwaite degrees of freedom."""
    from scipy.special import stdtr

    b, w = mean_ci(better, level), mean_ci(worse, level)
    effect = w.mean - b.mean
    if b.n < 2 or w.n < 2 or not math.isfinite(effect) or b.std is None or w.std is None:
        return Comparison(better=b, worse=w, effect=effect)
    vb, vw = b.std ** 2 / b.n, w.std ** 2 / w.n
    se = math.sqrt(vb + vw)
    if se == 0:  # no spread on either side: no test (IDENTICAL)
        return Comparison(better=b, worse=w, effect=effect, identical=True)
    df = (vb + vw) ** 2 / (vb ** 2 / (b.n - 1) + vw ** 2 / (w.n - 1))
    t = effect / se
    half = t_quantile(df, level) * se
    return Comparison(better=b, worse=w, effect=effect, low=effect - half, high=effect + half,
                      p=float(stdtr(df, -t)), p_against=float(stdtr(df, t)), df=df, se=se)


def equivalence(c: Comparison, sesoi: float) -> float | None:
    """The TOST p that the effect lies within ±sesoi: the larger of the one-sided Welch p-values of effect > −sesoi
    and effect < +sesoi (None where `c` has no test). Below alpha: equivalent at level alpha."""
    from scipy.special import stdtr

    if not c.tested or c.se is None or c.df is None:
        return None
    above = float(stdtr(c.df, -(c.effect + sesoi) / c.se))  # H0: effect <= -sesoi
    below = float(stdtr(c.df, -(sesoi - c.effect) / c.se))  # H0: effect >= +sesoi
    return max(above, below)


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


def verdict(p_adjusted: float | None, effect: float | None, alpha: float = ALPHA, sesoi: float | None = None,
            p_equivalent: float | None = None) -> str:
    """From the two-sided p after Holm's adjustment and the effect (worse − better): equivalent (within ±sesoi: the
    Holm-adjusted TOST p below alpha, even where the effect is also significant: it is too small to matter), holds
    (significant, the claim's direction), reversed (significant, the other), not significant, untested (too few
    seeds, a non-finite loss, or no spread, for a test)."""
    if p_adjusted is None or effect is None or not math.isfinite(effect):
        return UNTESTED
    if sesoi is not None and p_equivalent is not None and p_equivalent < alpha:
        return equivalent_text(sesoi)
    if p_adjusted < alpha:
        return HOLDS if effect > 0 else REVERSED
    return NOT_SIGNIFICANT


def equivalent_text(sesoi: float) -> str:
    """The verdict of a claim shown equivalent: 'equivalent within ±0.01 nats'."""
    return f"{EQUIVALENT} within ±{sesoi:g} nats"


def parity_text(said: str, sesoi: float) -> str:
    """A verdict in a parity claim's words (the claim is that the sides are equal within ±sesoi): equivalent is
    holds, a significant difference either way is reversed, not significant is undecided."""
    if said == equivalent_text(sesoi):
        return f"{HOLDS}: equal within ±{sesoi:g} nats"
    if said in (HOLDS, REVERSED):
        return f"{REVERSED}: the sides differ"
    if said.startswith(NOT_SIGNIFICANT):
        return f"undecided: neither equal within ±{sesoi:g} nats nor different" + said[len(NOT_SIGNIFICANT):]
    return said


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
        total += (len(finite) - 1) * _variance(tuple(finite))
    return (math.sqrt(total / dof) if dof else None), cells
