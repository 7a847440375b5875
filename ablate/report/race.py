"""An adaptive sweep's race in the report: each claim's decisions round by round (n a side, the statistic against
its boundary, the level Holm gave it, the decision and when), the method, and the compute it spent against a fixed
design of `max` seeds a cell. Read from `race_decisions`, which the sweep wrote as it raced."""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlalchemy as sa

from ablate import store
from ablate.config import SweepSpec
from ablate.results.orderings import Claims
from ablate.results.race import cell_of, claim_text
from ablate.results.views import RunView

HEAD = ("claim", "round", "n (better/worse)", "|z| : boundary", "level", "decision", "decided at")
SPENDING = {"pocock": "Pocock-type", "obrien-fleming": "O'Brien-Fleming-type"}
CALIBRATED = (" (its level lowered where the sides' seed spreads differ, as simulated null races of the design "
              "require: Welch at a few seeds errs there)")


@dataclass
class RaceTable:
    head: tuple[str, ...] = HEAD
    rows: list[list[str]] = field(default_factory=list)
    method: str = ""
    spent: str = ""

    def markdown(self) -> str:
        lines = ["**The race** (adaptive seeds)", "", "| " + " | ".join(self.head) + " |",
                 "|" + " --- |" * len(self.head)]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in self.rows]
        return "\n".join(lines + ["", f"_{self.spent}_", "", f"_Method: {self.method}._"])


def read_race(engine: sa.Engine, spec: SweepSpec, views: list[RunView]
              ) -> tuple[RaceTable | None, dict[str, str] | None]:
    """An adaptive sweep's race table and each claim cell's verdict by its text (results.race.claim_text): the
    last decision of a decided claim, "racing" for one still undecided. (None, None) for a sweep that is not."""
    race = spec.adaptive
    if race is None or not views:
        return None, None
    decisions = store.read_decisions(engine, views[0].row.sweep_id)
    verdicts: dict[str, str] = {}
    for d in decisions:  # by round: the last one stands
        racing = f"racing (after round {d.round + 1}, n={d.n_better})"
        verdicts[d.claim] = d.decision if d.decision != "continue" else racing
    return race_table(spec, views, decisions), (verdicts if race.mode == "claims" else None)


def apply_race(claims: Claims, verdicts: dict[str, str] | None) -> None:
    """Give each claim cell its race's verdict (an adaptive sweep's verdicts are the race's, not a fixed-sample test
    of however many seeds it ran): the claims table, the printed orderings, claims.csv and the dashboard read them."""
    if verdicts is None:
        return
    for cell in claims.cells:
        cell.verdict = verdicts.get(claim_text(cell), "not raced yet")


def race_table(spec: SweepSpec, views: list[RunView], decisions: list[store.RaceDecision]) -> RaceTable:
    unit = "CPU-hours" if spec.budget.hardware == "cpu" else "GPU-hours"  # a CPU sweep's hours are not a GPU's
    table = RaceTable(method=method_of(spec), spent=spent_line(views, spec.adaptive.seeds.max,
                                                               decisions if spec.adaptive.mode == "claims" else None,
                                                               unit))
    for d in decisions:
        z = "" if d.statistic is None else f"{abs(d.statistic):.2f}"
        bound = "" if d.boundary is None else f"{d.boundary:.2f}"
        table.rows.append([d.claim, str(d.round + 1), f"{d.n_better}/{d.n_worse}",
                           f"{z} : {bound}" if z else "untested", f"{d.level:.3g}", d.decision,
                           d.decided_at.strftime("%Y-%m-%d %H:%M")])
    if not table.rows:
        table.rows.append(["no round decided yet", "", "", "", "", "", ""])
    return table


def method_of(spec: SweepSpec) -> str:
    race = spec.adaptive
    futility = ("non-binding futility stop when the conditional power at the observed trend (Lan & Wittes 1988) is "
                "under 10%, from half of max seeds on" if race.futility else "no futility stop")
    if race.mode == "best":
        return (f"best of k: each round, every cell still racing against the one of lowest mean so far (chosen on "
                f"the same seeds, as F-race and irace do), Welch's t as the z of its two-sided p{CALIBRATED} against "
                f"group-sequential boundaries of {SPENDING[race.spending]} Lan-DeMets alpha spending (1983) up to "
                f"{race.seeds.max} seeds a side, Holm across the cells (Maurer & Bretz 2013), alpha {race.alpha:g}; a "
                f"cell significantly worse stops getting seeds; seeds {race.seeds.min} to {race.seeds.max}, "
                f"{race.step} more a round")
    return (f"each round's Welch t as the z of its two-sided p{CALIBRATED}, against group-sequential boundaries of "
            f"{SPENDING[race.spending]} Lan-DeMets alpha spending (1983) over the information up to {race.seeds.max} "
            f"seeds a side; Holm across the claims in its group-sequential form (Maurer & Bretz 2013), family-wise "
            f"alpha {race.alpha:g}; {futility}; seeds {race.seeds.min} to {race.seeds.max}, {race.step} more a round")


def spent_line(views: list[RunView], n_max: int, decisions: list[store.RaceDecision] | None = None,
               unit: str = "GPU-hours") -> str:
    """'Trained 12 runs, 0.01 GPU-hours: 50% of the 24 runs (0.02 GPU-hours) of 6 fixed seeds a cell', and with a
    claims race's `decisions`, what the seeds not run bought: a saving is said only for the claims it decided
    (6 fixed seeds a cell test every claim with at least the race's power)."""
    cells: dict[str, list[float]] = {}
    for v in views:
        cells.setdefault(cell_of(v.row.config), []).append((v.row.train_seconds or 0.0) * (v.row.gpus or 1))
    spent = sum(sum(s) for s in cells.values()) / 3600
    fixed = sum(sum(s) / len(s) * n_max for s in cells.values()) / 3600
    share = f"{spent / fixed:.0%} of" if fixed > 0 else "against"
    line = (f"Trained {len(views)} runs, {spent:.3g} {unit}: {share} the {len(cells) * n_max} runs ({fixed:.3g} "
            f"{unit}) of {n_max} fixed seeds a cell")
    last = {d.claim: d for d in decisions or []}  # by round: the last one stands
    if not last:
        return line
    decided = [d for d in last.values() if _decided(d.decision)]
    if not decided:
        return (f"{line}; no claim decided, so nothing was saved: {n_max} fixed seeds a cell would test every claim "
                "with at least the race's power")
    mean = sum(min(d.n_better, d.n_worse) for d in decided) / len(decided)
    return (f"{line}; {len(decided)} of {len(last)} claims decided, at {mean:.3g} seeds a side on average where "
            f"{n_max} fixed seeds test them with at least the race's power")


def _decided(decision: str) -> bool:
    """A verdict the race reached (holds, reversed, equivalent, in a parity claim's words too), not a stop without
    one (continue, not significant or a parity claim's undecided, untested)."""
    from ablate.results import stats

    return decision != "continue" and not decision.startswith((stats.NOT_SIGNIFICANT, stats.UNTESTED, "undecided",
                                                               stats.IDENTICAL))
