"""The claims as a table: one row per configuration pair of an ordering (claim, at, both sides' mean ± CI and n with
what each left out, the effect and its interval, p, adjusted p, the verdict and the noise floor), the published
statements it numbers, and the method line under it. report.md, report.html and the dashboard draw the same rows;
claims.csv holds the numbers behind them (results.orderings.claims_frame)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ablate.config import SweepSpec
from ablate.report.notes import floor_line, method_line, p_text, side_text, verdict_notes, where_text
from ablate.results import stats
from ablate.results.orderings import Claims, label_of

HEAD = ("claim", "at", "better", "worse", "effect (nats) [95% CI]", "p (one-sided)", "adjusted p (two-sided)",
        "verdict", "noise floor")


@dataclass
class VerdictTable:
    head: tuple[str, ...] = HEAD
    rows: list[list[str]] = field(default_factory=list)
    statements: list[str] = field(default_factory=list)  # "1: <the study's claim>", the numbers the rows cite
    method: str = ""
    floor: str | None = None

    def markdown(self) -> str:
        lines = ["**Claims against the study**", ""]
        lines += [f"{s}  " for s in self.statements] + [""]
        lines += ["| " + " | ".join(self.head) + " |", "|" + " --- |" * len(self.head)]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in self.rows]
        lines += ["", f"_Method: {self.method}._"]
        return "\n".join(lines + ([f"\n_{self.floor}_"] if self.floor else []))


RACED = ("the verdicts of this adaptive sweep are its race's (the race table: group-sequential, valid however many "
         "rounds were looked at); the p-values beside them test the seeds run as if their number had been fixed, for "
         "reading only")


def verdict_table(spec: SweepSpec, claims: Claims, race: dict[str, str] | None = None) -> VerdictTable | None:
    """The table of every claim cell; None where the report has no orderings. `race`: an adaptive sweep's verdicts
    (report/race.read_race), already given to the cells (report/race.apply_race): the method says whose they are."""
    if not spec.report.orderings:
        return None
    method = method_line(claims) + ("; " + RACED if race is not None else "")
    table = VerdictTable(method=method, floor=floor_line(claims))
    for i, order in enumerate(spec.report.orderings, 1):
        short = f"{i}: {label_of(order.better)} {'≈' if order.parity else '<'} {label_of(order.worse)}"
        table.statements.append(f"{i}: {order.claim}")
        cells = claims.of(order)
        if not cells:
            table.rows.append([short, "-", claims.why_none(order), "", "", "", "", "", ""])
        for cell in cells:
            c = cell.comparison
            effect = ("" if c is None else f"{c.effect:+.3f} [{c.low:+.3f}, {c.high:+.3f}]" if c.tested
                      else f"{c.effect:+.3f}")
            notes = verdict_notes(cell)
            table.rows.append([short, where_text(cell), side_text(cell, "better"), side_text(cell, "worse"), effect,
                               "" if c is None or c.p is None else p_text(c.p),
                               "" if cell.p_adjusted is None else p_text(cell.p_adjusted),
                               cell.verdict + (f" ({'; '.join(notes)})" if notes else ""),
                               "" if cell.floor is None else stats.shown(cell.floor, 3)])
    return table
