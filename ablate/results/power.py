"""Power planning: how many seeds a side a claim needs to detect its smallest effect of interest.

`seed_spread` reads the seed-to-seed standard deviation of test loss from the results DB's earlier runs (every
sweep's), pooled over each configuration with two finished seeds or more (stats.pooled_std), for the architectures
a sweep names. `seeds_for` is the fixed design's answer: the fewest seeds a side at which one two-sided t-test at
alpha detects an effect of SESOI / SD seed-spreads with the asked power (noncentral t, 2n − 2 degrees of freedom).
A race needs at least as many as its `max`: its group-sequential boundaries cost some of the fixed design's power.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sqlalchemy as sa

from ablate import store
from ablate.results import stats

POWER = 0.8
MOST = 1000  # past this many seeds a side: "more than 1000"


@dataclass(frozen=True)
class Spread:
    sd: float | None  # None: no configuration of these architectures has two finished seeds yet
    configurations: int  # configurations pooled
    architectures: tuple[str, ...]


def seed_spread(engine: sa.Engine, architectures: set[str]) -> Spread:
    """The pooled seed SD of final test loss over the DB's completed runs of these architectures."""
    from ablate.results.race import cell_of

    query = (sa.select(store.Run.sweep_id, store.Run.architecture, store.Run.config, store.Run.final_eval_loss)
             .where(store.Run.status == "completed", store.Run.final_eval_loss.is_not(None),
                    store.Run.architecture.in_(sorted(architectures))))
    cells: dict[tuple, list[float]] = {}
    with engine.connect() as conn:
        for r in conn.execute(query):
            cells.setdefault((r.sweep_id, r.architecture, cell_of(r.config)), []).append(r.final_eval_loss)
    found = tuple(sorted({arch for (_, arch, _), values in cells.items() if len(values) >= 2}))
    sd, configurations = stats.pooled_std(list(cells.values()))
    return Spread(sd if sd and math.isfinite(sd) else None, configurations, found)


def seeds_for(effect_sd: float, alpha: float, power: float = POWER) -> int | None:
    """The fewest seeds a side (2 or more) at which one two-sided t-test at `alpha` has `power` to detect a
    difference of `effect_sd` seed-spreads; None past MOST."""
    return next((n for n in range(2, MOST + 1) if fixed_power(effect_sd, alpha, n) >= power), None)


def fixed_power(effect_sd: float, alpha: float, n: int) -> float:
    """The power of one two-sided t-test at `alpha` with n seeds a side at a difference of `effect_sd`
    seed-spreads (noncentral t, 2n − 2 degrees of freedom)."""
    from scipy import stats as st

    df = 2 * n - 2
    crit = st.t.isf(alpha / 2, df)
    nc = effect_sd * math.sqrt(n / 2)
    return float(st.nct.sf(crit, df, nc) + st.nct.cdf(-crit, df, nc))
