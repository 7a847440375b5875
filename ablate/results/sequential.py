"""Group-sequential boundaries: a test looked at after every round stays a test at level alpha.

A claim raced over seeds is tested at every round; testing each look at alpha would say "holds" about a true null
far more often than alpha (the bench, `python -m bench race`, measures it). Lan and DeMets' alpha spending (1983)
lets the looks come when they come: a spending function α(t) says how much of the two-sided alpha may be spent by
information fraction t (the look's information over the information at the planned last look), and the boundary
of look k is the z that makes the probability, under the null, of crossing first at look k equal to
α(t_k) − α(t_{k−1}). The statistics at the looks are those of a Brownian motion observed at t_1 < t_2 < ...
(Jennison & Turnbull, "Group Sequential Methods", 2000, ch. 7): the probability of crossing first at k is computed
by recursive numerical integration (Armitage, McPherson & Rowe 1969) of the density of not having crossed.

- `spent(t, alpha, spending)`: Pocock-type, α·ln(1 + (e − 1)·t), spends evenly and stops big effects early (the
  default of an adaptive sweep, whose first looks have 2 seeds a side); O'Brien-Fleming-type,
  4 − 4Φ(z_{1−α/4}/√t) (each side's one-sided function at α/2, as gsDesign and ldbounds tabulate it), keeps nearly
  all of alpha for the last look; `power-R`: Kim & DeMets' α·t^R (1987), the family between them (R 1 spends
  about as Pocock's, 3 as O'Brien-Fleming's), for the bench's scan of spendings (`python -m bench race`).
- `boundaries(fractions, alpha, spending)`: the two-sided z boundary of each look.
- `information_fraction(n_better, n_worse, n_max)`: for a difference of two means, 1/(1/n_b + 1/n_w) over its
  value at n_max seeds a side.
- `z_of(comparison)`: a look's Welch t as the z with the same two-sided p (t → p → z), signed like the effect:
  at 2 seeds a side a t has 2 degrees of freedom and heavy tails that z boundaries would not allow for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from statistics import NormalDist

SPENDINGS = ("pocock", "obrien-fleming")
GRID = 801  # points of the density grid per look: boundaries to ~1e-4 in z
NO_BOUND = 12.0  # the boundary of a look that may spend nothing (P(|Z| > 12) ~ 1e-33)
_NORMAL = NormalDist()  # the standard normal of the per-look arithmetic (scipy's costs ~50 µs a call)


def spent(t: float, alpha: float, spending: str) -> float:
    """The two-sided alpha a Lan-DeMets spending function allows by information fraction t (capped at 1)."""
    from scipy.stats import norm

    t = min(max(t, 0.0), 1.0)
    if t == 0.0:
        return 0.0
    if spending == "pocock":
        return alpha * math.log(1 + (math.e - 1) * t)
    if spending == "obrien-fleming":  # each side spends alpha/2 as the one-sided function does
        return float(4 - 4 * norm.cdf(norm.isf(alpha / 4) / math.sqrt(t)))
    if known(spending):  # power-R
        return alpha * t ** float(spending.removeprefix("power-"))
    raise ValueError(f"spending {spending!r}: use one of {', '.join(SPENDINGS)}")


def known(spending: str) -> bool:
    """A spending `spent` computes: one of SPENDINGS, or power-R with R > 0."""
    if spending in SPENDINGS:
        return True
    try:
        return spending.startswith("power-") and float(spending.removeprefix("power-")) > 0
    except ValueError:
        return False


def boundaries(fractions: Sequence[float], alpha: float, spending: str = "pocock") -> tuple[float, ...]:
    """The two-sided z boundary of each look at the given increasing information fractions: under the null, the
    chance of crossing first at look k is what the spending function allows between look k−1 and look k."""
    return _boundaries(tuple(round(t, 12) for t in fractions), float(alpha), spending)


@lru_cache(maxsize=4096)
def _boundaries(fractions: tuple[float, ...], alpha: float, spending: str) -> tuple[float, ...]:
    import numpy as np
    from scipy.optimize import brentq
    from scipy.stats import norm

    if any(b <= a for a, b in zip(fractions, fractions[1:])) or not fractions or fractions[0] <= 0:
        raise ValueError(f"information fractions must increase from above 0: {fractions}")
    bounds: list[float] = []
    before = 0.0  # alpha spent at the looks before
    x = density = None  # B(t) = Z·√t on a grid, and the density of having crossed no boundary yet
    t_prev = 0.0
    for t in fractions:
        allowed = spent(t, alpha, spending) - before
        if density is None:  # the first look: Z is standard normal
            c = float(norm.isf(allowed / 2)) if allowed > 0 else NO_BOUND
        else:
            sd = math.sqrt(t - t_prev)

            def crossing(c: float) -> float:  # P(no crossing before, |B(t)| >= c·√t)
                b = c * math.sqrt(t)
                return float(np.trapezoid(density * (norm.cdf((-b - x) / sd) + norm.sf((b - x) / sd)), x))

            if allowed <= 0 or crossing(NO_BOUND) >= allowed:
                c = NO_BOUND
            else:
                c = float(brentq(lambda c: crossing(c) - allowed, 0.0, NO_BOUND, xtol=1e-7))
        before += allowed
        y = np.linspace(-c * math.sqrt(t), c * math.sqrt(t), GRID)
        if density is None:
            density = norm.pdf(y / math.sqrt(t)) / math.sqrt(t)
        else:  # the density at y of not crossing at any look so far: the previous one moved by N(0, t − t_prev)
            kernel = norm.pdf((y[:, None] - x[None, :]) / sd) / sd
            density = np.trapezoid(kernel * density[None, :], x, axis=1)
        x, t_prev = y, t
        bounds.append(c)
    return tuple(bounds)


def information_fraction(n_better: int, n_worse: int, n_max: int) -> float:
    """A difference of two means' information at n_b and n_w seeds over its value at n_max seeds a side."""
    return min(1.0, (1 / (1 / n_better + 1 / n_worse)) / (n_max / 2))


def z_of(p_two_sided: float, effect: float) -> float:
    """The z with the same two-sided p, signed like the effect (worse − better: positive where the claim holds)."""
    z = -_NORMAL.inv_cdf(min(max(p_two_sided, 1e-300), 1.0) / 2)
    return math.copysign(z, effect)


def conditional_power(z: float, t: float, final_bound: float) -> float:
    """The chance that the last look crosses `final_bound` (either way) if the effect goes on as observed so far:
    B(1) ~ N(B(t) + θ̂(1 − t), 1 − t) with θ̂ = B(t)/t (Lan & Wittes' B-value, 1988). 0 or 1 at t = 1."""
    if t >= 1.0:
        return 1.0 if abs(z) >= final_bound else 0.0
    drift = abs(z) / math.sqrt(t)  # E[B(1)] under the observed trend
    sd = math.sqrt(1 - t)
    return 1 - _NORMAL.cdf((final_bound - drift) / sd) + _NORMAL.cdf((-final_bound - drift) / sd)
