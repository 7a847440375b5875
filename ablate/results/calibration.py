"""Welch's test looked at every round of a race, held at its level when the sides' seed spreads differ.

A race compares each look's Welch p with the nominal level of its group-sequential boundary (sequential.z_of),
which assumes the looks' statistics are a Brownian motion. At 2 to 10 seeds a side they are not: each look's
t divides by spreads estimated from the same few seeds, and where one side's spread dominates, Welch's degrees of
freedom overstate what the data hold. With equal spreads the default race errs at 0.043 (alpha 0.05); at spreads
1:3 at 0.059, at 1:10 at 0.072, and at the levels Holm gives a family of three claims nearly twice its share
(0.028 for 0.0167). Unequal spreads are ordinary: d_model 4 against 64, a learning rate near divergence.

The fix is a calibration by simulation, per design and level (`scale`): a look's nominal level is multiplied by

    λ(q) = λ0 · (1 − (1 − floor) · x(q)),  x = clip(ln(q / 1.3) / ln(3 / 1.3), 0, 1)

where q ≥ 1 is the ratio of the sides' standard errors at the look (the larger over the smaller): the level is
lowered most where the spreads differ, since that is where Welch errs. For each `floor` of FLOORS, λ0 (at most 1)
is the largest value at which no true ratio of spreads in RATIOS (equal to 1000:1) gives more than the level of
false verdicts over RACES simulated null races of the planned rounds; the pair kept is the one that errs most
(the least careful) at equal spreads. On independent draws the default race then errs at 0.038 (equal spreads),
0.045 (1:3), 0.046 (1:10) and 0.050 for three claims at 1:10 (100,000 races a row; `python -m bench race`), for
power at a 1-seed-spread effect 0.386 → 0.360 at equal spreads.

The simulation is seeded, so a race replayed from its results gives the same decisions; it costs about a second
per design and level the first time (then cached for the process).
"""

from __future__ import annotations

import math
from functools import lru_cache

RATIOS = (1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 1000.0)  # true SD ratios the level must hold at
FLOORS = (1.0, 0.8, 0.7, 0.6, 0.5, 0.4, 0.35, 0.3, 0.25)  # below 0.25: a level cut 4x where spreads differ for
# under 0.001 of null rate (of power) at equal spreads
RACES = 40_000  # simulated null races per ratio
LOW, HIGH = 1.3, 3.0  # the standard-error ratios between which the level is lowered to its floor
SEED = 20261203


def scale(planned: tuple[int, ...], n_max: int, level: float, spending: str, q: float | None) -> float:
    """The factor on the nominal level of a look whose sides' standard errors are in ratio q (None: unknown,
    taken as equal) in a race of `planned` rounds to n_max seeds a side at this level."""
    lam0, floor = calibrated(tuple(planned), n_max, round(level, 12), spending)
    return lam0 if q is None or q <= LOW else lam0 * float(_shrink(q, floor))


def _shrink(q, floor: float):
    """`scale`'s factor over λ0 (q: a ratio or an array of them): 1 up to q = LOW, `floor` from q = HIGH on,
    log-linear between."""
    import numpy as np

    x = np.clip(np.log(q / LOW) / math.log(HIGH / LOW), 0.0, 1.0)
    return 1.0 - (1.0 - floor) * x


@lru_cache(maxsize=256)
def calibrated(planned: tuple[int, ...], n_max: int, level: float, spending: str) -> tuple[float, float]:
    """(λ0, floor) for this design and level: see the module's docstring."""
    import numpy as np

    from ablate.results.sequential import boundaries, information_fraction

    fractions = [information_fraction(n, n, n_max) for n in planned[:-1]] + [1.0]
    nominal = np.array([2 * _normal_sf(c) for c in boundaries(fractions, level, spending)])
    p, q = _null_looks(planned, n_max)  # ratios × races × looks
    k = max(int(level * RACES), 1)  # at most k false verdicts in RACES per ratio
    best: tuple[float, float, float] | None = None
    for floor in FLOORS:
        # a race errs at λ0 once some look has p <= nominal · λ0 · shrink: its smallest such λ0
        needed = (p / (nominal * _shrink(q, floor))).min(axis=2)
        kth = np.partition(needed, k, axis=1)[:, k]  # per ratio: the largest λ0 with at most k errors
        lam0 = float(min(1.0, kth.min() * (1 - 1e-9)))
        at_equal = float((needed[0] <= lam0).mean())
        if best is None or at_equal > best[2]:
            best = (lam0, floor, at_equal)
    assert best is not None
    return best[0], best[1]


@lru_cache(maxsize=1)  # a design's levels (Holm's) in a row share the draws
def _null_looks(planned: tuple[int, ...], n_max: int):
    """Welch's two-sided p and the standard-error ratio of every look of RACES null races per ratio of RATIOS."""
    import numpy as np
    from scipy.special import stdtr

    rng = np.random.default_rng(SEED)
    ps, qs = [], []
    for ratio in RATIOS:
        better = rng.standard_normal((RACES, n_max))
        worse = ratio * rng.standard_normal((RACES, n_max))
        p_looks, q_looks = [], []
        for n in planned:
            vb = better[:, :n].var(axis=1, ddof=1) / n
            vw = worse[:, :n].var(axis=1, ddof=1) / n
            t = (worse[:, :n].mean(axis=1) - better[:, :n].mean(axis=1)) / np.sqrt(vb + vw)
            df = (vb + vw) ** 2 / (vb ** 2 / (n - 1) + vw ** 2 / (n - 1))
            p_looks.append((2 * stdtr(df, -np.abs(t))).astype(np.float32))
            q_looks.append(np.sqrt(np.maximum(vb, vw) / np.minimum(vb, vw)).astype(np.float32))
        ps.append(np.stack(p_looks, axis=1))
        qs.append(np.stack(q_looks, axis=1))
    return np.stack(ps), np.stack(qs)


def _normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2))


def spread_ratio(se_better: float | None, se_worse: float | None) -> float | None:
    """q: the larger of the sides' standard errors over the smaller (None where either is unknown; inf where one
    side has no spread)."""
    if se_better is None or se_worse is None:
        return None
    low, high = sorted((se_better, se_worse))
    return math.inf if low == 0 else high / low
