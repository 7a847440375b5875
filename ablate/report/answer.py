"""The answer in words: each claim cell's verdict as one sentence, who is lower, by how much, how sure, and what
that says of the study's claim ("llama is lower than mixer at d_model=64 by 0.39 nats [0.36, 0.43], adjusted p <
0.001: the study's claim is reversed here"). report.md and report.html open with them, `ablate report` prints them
first; when no claim is decided, they say so and how a sweep would decide them."""

from __future__ import annotations

from ablate.config import SweepSpec
from ablate.report.notes import p_text, where_text
from ablate.results import stats
from ablate.results.orderings import ClaimCell, Claims, label_of, side_name

ADAPTIVE = "adaptive: {seeds: {min: 2, max: 10}}"


def answer(spec: SweepSpec, claims: Claims) -> list[str]:
    """One sentence per claim cell (or per claim with no cell), then, where no claim is decided, why and how."""
    lines: list[str] = []
    for i, order in enumerate(spec.report.orderings, 1):
        cells = claims.of(order)
        if not cells:
            lines.append(f"Claim {i}: {claims.why_none(order)}.")
        lines += [f"Claim {i}: {cell_sentence(cell)}" for cell in cells]
    decided = [c for c in claims.cells if str(c.verdict).startswith((stats.HOLDS, stats.REVERSED, stats.EQUIVALENT))]
    undecided = [c for c in claims.cells if str(c.verdict).startswith(stats.NOT_SIGNIFICANT)]
    if undecided and not decided:
        how = ("the race adds seeds only where a claim is undecided, up to its max" if spec.adaptive is not None else
               f"`{ADAPTIVE}` in place of `seeds:` adds seeds only where a claim is undecided")
        lines.append(f"No claim is decided: at these seeds every difference is within the seeds' spread. {how[0].upper()}"
                     f"{how[1:]}; `ablate plan` says how many seeds a smallest effect of interest (report.sesoi) "
                     "needs.")
    return lines


def cell_sentence(cell: ClaimCell) -> str:
    """'llama is lower than mixer at d_model=64 by 0.390 nats [0.355, 0.425], adjusted p < 0.001: the study's claim
    is reversed here.'"""
    better, worse = label_of(side_name(cell, "better")), label_of(side_name(cell, "worse"))
    where = "" if not cell.where else f" at {where_text(cell)}"
    c, verdict = cell.comparison, str(cell.verdict)
    if c is None or not c.tested or c.low is None or c.high is None:
        return f"{better} against {worse}{where}: {verdict}."
    p = f"adjusted p {'= ' if cell.p_adjusted is not None and cell.p_adjusted >= 0.001 else ''}" + (
        p_text(cell.p_adjusted) if cell.p_adjusted is not None else "not computed")
    if cell.ordering.parity:
        return (f"{better} ≈ {worse}{where}: {c.effect:+.3f} nats [{c.low:+.3f}, {c.high:+.3f}], {p}: "
                f"{verdict}.")
    if verdict.startswith(stats.EQUIVALENT):
        return (f"{better} and {worse} are equal{where} within ±{cell.sesoi:g} nats ({c.effect:+.3f} "
                f"[{c.low:+.3f}, {c.high:+.3f}]): too small a difference to matter, as the study's SESOI says.")
    if verdict.startswith(stats.NOT_SIGNIFICANT):
        return (f"{better} and {worse} are not told apart{where}: {c.effect:+.3f} nats [{c.low:+.3f}, "
                f"{c.high:+.3f}] ({worse} minus {better}), {p}: {verdict}, neither the study's claim nor its reverse.")
    lower, higher, low, high = ((better, worse, c.low, c.high) if c.effect > 0 else
                                (worse, better, -c.high, -c.low))
    said = ("the study's claim holds here" if verdict.startswith(stats.HOLDS) else
            "the study's claim is reversed here" if verdict.startswith(stats.REVERSED) else verdict)
    return (f"{lower} is lower than {higher}{where} by {abs(c.effect):.3f} nats [{low:.3f}, {high:.3f}], {p}: "
            f"{said}.")
