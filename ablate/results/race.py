"""A race of claims over seeds: after each round every undecided claim is tested, and a decided one gets no more.

Each hypothesis (a claim cell: one configuration of an ordering's better side against one of its worse side) is
looked at once per round, at the seeds the round has (`RaceDesign.planned`: `min`, `min + step`, ... up to `max`
a side). A look's Welch test becomes a z (sequential.z_of) and is compared with its group-sequential boundary
(sequential.boundaries: Lan-DeMets alpha spending over the looks so far), its nominal level lowered where the
sides' seed spreads differ (calibration.scale: Welch at a few seeds a side errs there), so that the chance of any
false "holds" or "reversed" stays at most alpha however many rounds are looked at.

Across hypotheses, Holm's procedure in its group-sequential form (Maurer & Bretz, "Multiple testing in group
sequential trials using graphical approaches", Stat. Biopharm. Res. 2013): every hypothesis starts at level
alpha/m; once one is rejected, the others are tested at alpha/(m − rejected) from then on, their boundaries
recomputed at that level (within a round too, until no new one is rejected). The family-wise error stays at most
alpha.

Equivalence: a hypothesis with a smallest effect of interest (the claim's SESOI) is first tested, at each look,
for lying within ±SESOI by two one-sided tests (TOST) against one-sided group-sequential boundaries at its level
(each side's boundary of the two-sided boundaries at twice the level), in its own Holm family (the hypotheses with
a SESOI), so that a false "equivalent" at |effect| = SESOI stays at most alpha however many rounds are looked at;
equivalent before holds, as in the report (an effect shown within ±SESOI is too small to matter, significant or
not), and never stopped for futility (a flat trend is what equivalence looks like). A small effect without a SESOI
is never a decision: it races on to "not significant".

Futility (optional, non-binding: the boundaries ignore it, so stopping early only makes the test more careful): a
hypothesis whose conditional power under the trend seen so far (sequential.conditional_power) is below
`futility_power` stops, from `futility_after` of the information on: "not significant (stopped for futility at
n=6)". One still undecided at the last planned
round is "not significant" there. A decision is a pure function of the looks, so a race replayed from its results
gives the same decisions (`decide`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ablate.results import stats
from ablate.results.calibration import scale, spread_ratio
from ablate.results.sequential import SPENDINGS, boundaries, conditional_power, information_fraction, known, z_of

CONTINUE, FUTILITY, MAX_REACHED = "continue", "futility", "max reached"


@dataclass(frozen=True)
class RaceDesign:
    """How seeds are spent: `min` a side first, then `step` more a round for undecided claims, up to `max`."""

    min: int = 2
    max: int = 10
    step: int = 1
    alpha: float = stats.ALPHA
    spending: str = "pocock"
    futility: bool = True
    futility_power: float = 0.1  # stop a claim whose conditional power at the observed trend is below this
    # ... from this information fraction on (half of max seeds a side): the trend of 2 or 3 seeds is too noisy to
    # stop on (stopping from the first look cost 13% of the power at 2 seed-spreads in the bench, from half 1%)
    futility_after: float = 0.5

    def __post_init__(self) -> None:
        if not 2 <= self.min <= self.max:
            raise ValueError(f"seeds: min {self.min} and max {self.max} need 2 <= min <= max")
        if self.step < 1 or not 0 < self.alpha < 0.5 or not known(self.spending):
            raise ValueError(f"step {self.step} >= 1, alpha {self.alpha} in (0, 0.5), spending one of {SPENDINGS}")

    @classmethod
    def of(cls, block: Any) -> RaceDesign:
        """The design a sweep's `adaptive:` block (ablate/config/adaptive.py) asks for."""
        return cls(min=block.seeds.min, max=block.seeds.max, step=block.step, alpha=block.alpha,
                   spending=block.spending, futility=block.futility and block.mode == "claims")

    def planned(self) -> list[int]:
        """Seeds a side at each round: min, min + step, ..., and max last."""
        rounds = list(range(self.min, self.max, self.step))
        return rounds + [self.max]


@dataclass(frozen=True)
class Look:
    """One hypothesis at one round: the seeds each side has finished and Welch's test of them."""

    n_better: int
    n_worse: int
    effect: float | None  # mean(worse) − mean(better): > 0 where the claim holds
    p_two_sided: float | None  # None: untested (a side with fewer than 2 finished seeds, a non-finite loss)
    sesoi: float | None = None  # the claim's smallest effect of interest (nats): tested for equivalence
    p_equivalent: float | None = None  # the look's TOST p within ±sesoi (one-sided, the larger of the two)
    parity: bool = False  # a parity claim's: its decisions are said in its words (stats.parity_text)
    spread: float | None = None  # the sides' standard errors' ratio, larger over smaller (calibration.scale)

    @classmethod
    def of(cls, better: Sequence[float], worse: Sequence[float], sesoi: float | None = None,
           parity: bool = False) -> Look:
        if not better or not worse:
            return cls(len(better), len(worse), None, None, sesoi, parity=parity)
        c = stats.welch(better, worse)
        return cls.of_test(len(better), len(worse), c, sesoi, parity)

    @classmethod
    def of_test(cls, n_better: int, n_worse: int, c: stats.Comparison, sesoi: float | None,
                parity: bool = False) -> Look:
        """A look at a comparison already made (a claim cell's test)."""
        equivalent = stats.equivalence(c, sesoi) if sesoi is not None else None
        return cls(n_better, n_worse, c.effect, c.p_two_sided, sesoi, equivalent, parity,
                   spread_ratio(_se(c.better), _se(c.worse)))


@dataclass(frozen=True)
class Decision:
    """What one round decided for one hypothesis: the statistic against its boundary at the level it had."""

    round: int
    n_better: int
    n_worse: int
    z: float | None
    boundary: float | None
    level: float  # the hypothesis's share of alpha at this round (Holm: alpha / (m − rejected))
    decision: str  # CONTINUE, or final: holds, reversed, equivalent, futility, max reached, untested
    power: float | None = None  # the conditional power futility read
    sesoi: float | None = None  # the hypothesis's smallest effect of interest
    parity: bool = False  # a parity claim's decision: said in its words

    @property
    def final(self) -> bool:
        return self.decision != CONTINUE

    def verdict(self) -> str:
        """The claim's verdict in the report's words (a parity claim's in its own: stats.parity_text)."""
        said = self._said()
        return stats.parity_text(said, self.sesoi) if self.parity and self.sesoi is not None else said

    def _said(self) -> str:
        if self.decision == FUTILITY:
            return f"{stats.NOT_SIGNIFICANT} (stopped for futility at n={min(self.n_better, self.n_worse)})"
        if self.decision == MAX_REACHED:
            return f"{stats.NOT_SIGNIFICANT} (max seeds reached, n={min(self.n_better, self.n_worse)})"
        if self.decision == stats.EQUIVALENT and self.sesoi is not None:
            return stats.equivalent_text(self.sesoi)
        return self.decision


def cell_of(config: dict[str, Any]) -> str:
    """A run's cell: its trial's fingerprint without the seed (the seeds of one cell share it)."""
    from ablate.config.trial import trial_fingerprint

    return trial_fingerprint({**config, "seed": 0})


def claim_text(cell: Any) -> str:
    """A claim cell (results/orderings.ClaimCell) in words, stable across rounds: the claim, where it is held, its
    two sides. The key of its decisions in the DB, the report and the dashboard."""
    from ablate.results.orderings import label_of, side_name

    where = ", ".join(f"{k}={v}" for k, v in cell.where.items())
    head = f"{cell.ordering.claim} [{where}]: " if where else f"{cell.ordering.claim}: "
    relation = " ≈ " if cell.ordering.parity else " < "
    return head + label_of(side_name(cell, "better")) + relation + label_of(side_name(cell, "worse"))


def decide(design: RaceDesign, looks: Sequence[Sequence[Look]]) -> list[list[Decision]]:
    """Replay a race: looks[h][r] is hypothesis h's look at round r (a hypothesis may have looks past its decision,
    given by another claim that shares its cells: they are not read). Returns each hypothesis's decisions, one per
    round up to and including its final one."""
    m = len(looks)
    planned = design.planned()
    out: list[list[Decision]] = [[] for _ in looks]
    fractions: list[list[float]] = [[] for _ in looks]  # of each hypothesis's tested looks
    rejected = 0
    bounded = sum(1 for h in looks if any(look.sesoi is not None for look in h))  # the equivalence family's m
    shown = 0  # equivalences shown so far (Holm within that family)
    for r in range(max((len(h) for h in looks), default=0)):
        last = r == len(planned) - 1
        todo = [h for h in range(m) if r < len(looks[h]) and not (out[h] and out[h][-1].final)]
        pending: dict[int, tuple[float, list[float]]] = {}  # h -> (t, fractions with this look)
        for h in todo:
            look = looks[h][r]
            t = 1.0 if last else information_fraction(max(look.n_better, 1), max(look.n_worse, 1), design.max)
            if look.p_two_sided is None or look.effect is None or not math.isfinite(look.effect):
                # a side whose seeds give no number (oom, diverged, failed) and gained none since the last round:
                # more seeds of it would end the same way, so it stops here, untested
                stuck = r > 0 and _fewest(looks[h][r - 1]) >= _fewest(look)
                out[h].append(_untested(r, look, design, m, rejected, last or stuck))
            elif fractions[h] and t <= fractions[h][-1]:  # no information since its last look: not looked at again
                out[h].append(_untested(r, look, design, m, rejected, last))
            else:
                pending[h] = (t, [*fractions[h], t])
        shown += _equivalences(design, looks, r, pending, out, fractions, bounded, shown)
        while pending:  # Holm: each rejection raises the others' level, within this round too
            level = design.alpha / max(m - rejected, 1)
            newly = [h for h, (_, ts) in pending.items()
                     if abs(_z(design, looks[h][r], level)) >= boundaries(ts, level, design.spending)[-1]]
            if not newly:
                break
            for h in newly:
                t, ts = pending.pop(h)
                look = looks[h][r]
                z = _z(design, look, level)
                out[h].append(Decision(r, look.n_better, look.n_worse, z, boundaries(ts, level, design.spending)[-1],
                                       level, stats.HOLDS if z > 0 else stats.REVERSED, sesoi=look.sesoi,
                                       parity=look.parity))
                fractions[h] = ts
            rejected += len(newly)
        level = design.alpha / max(m - rejected, 1)
        for h, (t, ts) in pending.items():
            look = looks[h][r]
            z = _z(design, look, level)
            bound = boundaries(ts, level, design.spending)[-1]
            fractions[h] = ts
            power = None
            if last:
                decision = MAX_REACHED
            else:
                future = [information_fraction(n, n, design.max) for n in planned[r + 1:-1]] + [1.0]
                whole = boundaries([*ts, *(f for f in future if f > t)], level, design.spending)
                power = conditional_power(z, t, whole[-1])
                # a claim with a SESOI races on to equivalence: a flat trend is what equivalence looks like
                hopeless = (design.futility and look.sesoi is None and t >= design.futility_after
                            and power < design.futility_power)
                decision = FUTILITY if hopeless else CONTINUE
            out[h].append(Decision(r, look.n_better, look.n_worse, z, bound, level, decision, power, look.sesoi,
                                   look.parity))
    return out


def _equivalences(design: RaceDesign, looks: Sequence[Sequence[Look]], r: int,
                  pending: dict[int, tuple[float, list[float]]], out: list[list[Decision]],
                  fractions: list[list[float]], bounded: int, shown: int) -> int:
    """The pending hypotheses with a SESOI whose TOST crosses its one-sided boundary at this look end equivalent,
    Holm within the equivalence family (each one shown raises the others' level, within the round too). How many
    this look showed."""
    from statistics import NormalDist

    before = shown
    while True:
        level = design.alpha / max(bounded - shown, 1)
        newly = []
        for h, (_, ts) in pending.items():
            look = looks[h][r]
            if look.p_equivalent is None:
                continue
            p = look.p_equivalent / _scale(design, look, 2 * level)  # one side of the two-sided at 2 x level
            z = -NormalDist().inv_cdf(min(max(p, 1e-300), 1 - 1e-16))
            bound = boundaries(ts, 2 * level, design.spending)[-1]  # one side of the two-sided at 2 x level
            if z >= bound:
                newly.append((h, z, bound))
        if not newly:
            return shown - before
        for h, z, bound in newly:
            _, ts = pending.pop(h)
            look = looks[h][r]
            out[h].append(Decision(r, look.n_better, look.n_worse, z, bound, level, stats.EQUIVALENT,
                                   sesoi=look.sesoi, parity=look.parity))
            fractions[h] = ts
        shown += len(newly)


def _scale(design: RaceDesign, look: Look, level: float) -> float:
    return scale(tuple(design.planned()), design.max, level, design.spending, look.spread)


def _z(design: RaceDesign, look: Look, level: float) -> float:
    """The look's Welch p at the nominal level lowered where its sides' spreads differ (calibration.scale), as a
    z signed like the effect."""
    return z_of(min(1.0, look.p_two_sided / _scale(design, look, level)), look.effect)


def _se(side: stats.Estimate) -> float | None:
    return None if side.std is None or side.n < 1 else side.std / math.sqrt(side.n)


def _fewest(look: Look) -> int:
    return min(look.n_better, look.n_worse)


def _untested(r: int, look: Look, design: RaceDesign, m: int, rejected: int, last: bool) -> Decision:
    return Decision(r, look.n_better, look.n_worse, None, None, design.alpha / max(m - rejected, 1),
                    stats.UNTESTED if last else CONTINUE)


def naive(alpha: float, looks: Sequence[Sequence[Look]]) -> list[str]:
    """What testing after every round at the fixed-sample level would conclude (Holm over the family at each round,
    a claim stopping at its first significant look): the procedure a race must not be. For the bench and tests."""
    verdicts = [MAX_REACHED] * len(looks)
    for r in range(max((len(h) for h in looks), default=0)):
        todo = [h for h in range(len(looks)) if verdicts[h] == MAX_REACHED and r < len(looks[h])]
        adjusted = stats.holm([looks[h][r].p_two_sided for h in todo])
        for h, p in zip(todo, adjusted):
            v = stats.verdict(p, looks[h][r].effect, alpha)
            if v in (stats.HOLDS, stats.REVERSED):
                verdicts[h] = v
    return verdicts
