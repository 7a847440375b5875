"""What a report says beside its tables: notes on how runs were computed, the recipes they trained with, and
whether each ordering the study published holds in our numbers."""

from __future__ import annotations

from ablate.config import SweepSpec, describe_recipe
from ablate.config.units import parse_at
from ablate.results import stats
from ablate.results.orderings import ClaimCell, Claims, check_claims, label_of, side_name, worst_text
from ablate.results.views import RunView


def run_notes(views: list[RunView]) -> list[str]:
    """What a table's reader must know about how its runs were computed: non-causal training losses, and runs
    whose device was not the sweep's hardware profile."""
    from ablate.config import registry

    notes = []
    for name in dict.fromkeys(v.axes.get("architecture") for v in views):  # families that route by design (mod)
        family = registry.families().get(name)
        module = family.options_module() if family is not None else None
        if getattr(module, "TRAIN_MODE_CAUSAL", True) is False:
            notes.append(f"{name}: its train loss is not causal ({getattr(module, 'TRAIN_MODE_NOTE', '') or 'declared'})"
                         "; its test loss is.")
    elsewhere = {}
    for v in views:
        hw = (v.row.notes or {}).get("hardware") if isinstance(v.row.notes, dict) else None
        if hw and hw.get("mismatch"):
            elsewhere.setdefault((hw.get("profile"), hw.get("device"), hw.get("memory_cap_mb")), []).append(v.row.id)
    for (profile, device, cap), ids in elsewhere.items():
        capped = f", memory capped at {cap / 1024:g} GB" if cap else ""
        notes.append(f"Hardware: run(s) {_ids(ids)} ran on {device}, not the sweep's {profile}{capped}; speeds and "
                     "wall-clock budgets differ from the study.")
    return notes + fused_notes(views)


def fused_notes(views: list[RunView]) -> list[str]:
    """Runs trained in fused groups (ablate/train/fused.py), and how a fused run read a wall-clock budget."""
    fused: dict[int, list[int]] = {}
    read: dict[tuple, list[int]] = {}
    for v in views:
        notes = v.row.notes if isinstance(v.row.notes, dict) else {}
        group = notes.get("fused")
        if isinstance(group, dict) and group.get("members"):
            fused.setdefault(group["members"], []).append(v.row.id)
        if isinstance(notes.get("budget_read"), dict):
            r = notes["budget_read"]
            read.setdefault((r.get("wall_clock_seconds"), r.get("steps"), r.get("solo_step_seconds"), r.get("device")),
                            []).append(v.row.id)
    lines = [f"Fused: run(s) {_ids(ids)} trained {k} at a time in one process as one batched model, each with its own "
             "seed, data order, schedule and budget (equal to its solo run up to rounding); its seconds and tokens/s "
             "are its group's time." for k, ids in sorted(fused.items())]
    lines += [f"Budget read: run(s) {_ids(ids)} trained their {seconds:g} s wall clock as the {steps:,} steps a solo "
              f"run makes in it on {device} ({step:.3g} s a step, measured by a short solo run)"
              for (seconds, steps, step, device), ids in read.items()]
    return lines


def _ids(ids: list[int]) -> str:
    return f"{', '.join(map(str, ids[:10]))}{' …' if len(ids) > 10 else ''}"


def recipe_lines(views: list[RunView]) -> list[str]:
    """The optimisation recipe(s) the runs used, with the precision each actually trained in."""
    found: dict[str, set[str]] = {}
    for v in views:
        if v.trial is not None:
            found.setdefault(describe_recipe(v.trial), set()).add(getattr(v.row, "precision", None) or "not yet run")
    return [f"Recipe: {text} (ran in {', '.join(sorted(ran))})" for text, ran in found.items()] + code_lines(views)


def code_lines(views: list[RunView]) -> list[str]:
    """The plugin code each architecture's runs ran ('name@identity'), when any run came from a plugin; two
    versions of one plugin also split its cells (`code` is then a varying axis)."""
    found: dict[str, set[str]] = {}
    for v in views:
        if v.trial is not None and v.trial.code:
            found.setdefault(v.trial.architecture, set()).add(v.trial.code)
    return [f"Plugin code of {name}: {', '.join(sorted(codes))}" for name, codes in found.items()]


def method_line(claims: Claims) -> str:
    """How every verdict was reached, in one sentence (under the claims table; `ablate report` prints it)."""
    holm = (f"Holm-adjusted over the report's {claims.tests} comparisons" if claims.tests > 1 else
            "one comparison" if claims.tests == 1 else "no comparison tested yet")
    bounded = sorted({c.sesoi for c in claims.cells if c.sesoi is not None})
    equivalence = (f"; equivalent: two one-sided Welch tests (TOST) put the effect within ±SESOI "
                   f"({', '.join(f'{s:g}' for s in bounded)} nats), Holm-adjusted over the claims with one"
                   if bounded else "; no claim has a smallest effect of interest (report.sesoi), so none can be "
                   "shown equivalent: not significant is not no difference")
    return (f"Welch's t-test across seeds, {stats.FAMILY_NOTE}; {holm}{equivalence}; a side that lost seeds to "
            "divergence, where leaving them out would flatter it, is tested with each counted at the comparison's "
            "worst finished loss")


def sentence(text: str) -> str:
    """A claim as a sentence: its own closing punctuation, or a full stop (the report's next sentence follows)."""
    text = text.rstrip()
    return text if text.endswith((".", "!", "?")) else text + "."


def check_orderings(spec: SweepSpec, views: list[RunView], claims: Claims | None = None) -> list[str]:
    """For each published ordering in the spec: each configuration pair's test loss on both sides (mean, 95%
    interval, n, what was left out), the effect with its interval, p and the verdict; then the verdicts counted."""
    claims = claims or check_claims(spec, views)
    at = parse_at(spec.report.at)
    measured = f" at {at.text()}" if at else ""
    lines = []
    for order in spec.report.orderings:
        cells = claims.of(order)
        if not cells:
            lines.append(f"Study: {sentence(order.claim)} Here: {claims.why_none(order)}.")
            continue
        counts: dict[str, int] = {}
        for c in cells:
            counts[c.verdict] = counts.get(c.verdict, 0) + 1
        tally = ", ".join(f"{n} {verdict}" for verdict, n in counts.items())
        lines.append(f"Study: {sentence(order.claim)} Here, test loss{measured}: "
                     + "; ".join(cell_text(c) for c in cells)
                     + f". Verdicts: {tally} (of {len(cells)}).")
    return lines


def floor_line(claims: Claims) -> str | None:
    """The noise floor the verdicts are read against: each architecture's seed-to-seed std of test loss."""
    known = [(arch, std, n) for arch, (std, n) in claims.floor.items() if std is not None]
    if not known:
        return None
    parts = ", ".join(f"{arch} {stats.shown(std, 3)} ({n} configuration{'s' * (n > 1)})" for arch, std, n in known)
    return (f"Noise floor (seed-to-seed std of test loss, pooled over each architecture's configurations, runs under "
            f"{claims.min_steps} steps left out): {parts}. An effect smaller than the floor of either side is flagged.")


def where_text(cell: ClaimCell) -> str:
    return ", ".join(f"{k}={x}" for k, x in cell.where.items()) or "overall"


def side_text(cell: ClaimCell, side: str) -> str:
    """'mixer 3.11 ± 0.02 (n=3; 1 of 4 diverged)'; a side with no number: its label and what it left out."""
    label = label_of(side_name(cell, side))
    seeds = getattr(cell, side)
    estimate = getattr(cell.comparison, side) if cell.comparison is not None else None
    if estimate is None:
        return f"{label} (n={seeds.n}; {seeds.said()})" if seeds.left else f"{label} (n=0)"
    return f"{label} {estimate.text(said=seeds.said())}"


def verdict_notes(cell: ClaimCell) -> list[str]:
    """What qualifies a verdict: diverged seeds counted at the worst loss, no test, the noise floor."""
    notes = []
    if cell.counted_worst is not None:
        alone = f"; the finished seeds alone: one-sided p = {p_text(cell.comparison.p)}" if cell.comparison.tested else ""
        # the worst loss widens the side's spread: a careful test, but a weaker one (a race's verdict too)
        cost = ("; counting them so costs the test power: this verdict may be theirs, not the effect's"
                if str(cell.verdict).startswith(stats.NOT_SIGNIFICANT) else "")
        notes.append(worst_text(cell) + alone + cost)
    if cell.comparison is not None and cell.comparison.identical:
        notes.append(stats.IDENTICAL)
    elif cell.comparison is not None and not cell.comparison.tested:
        notes.append("one seed on a side, or a non-finite loss: no test")
    if cell.below_floor:
        notes.append(f"below the noise floor {stats.shown(cell.floor, 3)}")
    return notes


def cell_text(cell: ClaimCell) -> str:
    text = f"{where_text(cell)}: {side_text(cell, 'better')} vs {side_text(cell, 'worse')}"
    c = cell.comparison
    if c is None:
        return text + f" → {cell.verdict} (no verdict)"
    if c.tested:
        text += f", effect {c.effect:+.3f} nats [{c.low:+.3f}, {c.high:+.3f}], p = {p_text(c.p)} one-sided"
        if cell.p_adjusted is not None:
            text += f", {_p(cell.p_adjusted)} two-sided adjusted"
        if cell.p_equivalent is not None:
            text += f", equivalence (±{cell.sesoi:g}) {_p(cell.p_equivalent)} adjusted"
    else:
        text += f", effect {c.effect:+.3f} nats"
    text += f" → {cell.verdict}"
    notes = verdict_notes(cell)
    return text + (f" ({'; '.join(notes)})" if notes else "")


def p_text(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def _p(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"
