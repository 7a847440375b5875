"""What a report says beside its tables: notes on how runs were computed, the recipes they trained with, and
whether each ordering the study published holds in our numbers."""

from __future__ import annotations

from typing import Any

from ablate.config import Ordering, SweepSpec, describe_recipe
from ablate.config.units import parse_at
from ablate.results import stats
from ablate.results.orderings import ClaimCell, Claims, check_claims
from ablate.results.views import RunView


def run_notes(views: list[RunView]) -> list[str]:
    """What a table's reader must know about how its runs were computed: non-causal training losses, and runs
    whose device was not the sweep's hardware profile."""
    from ablate.config import registry

    notes = []
    if any(v.axes.get("architecture") == "mod" for v in views):
        from ablate.models.mod_options import TRAINING_NOTE

        notes.append(f"Mixture-of-depths: {TRAINING_NOTE}.")
    for name in dict.fromkeys(v.axes.get("architecture") for v in views):  # plugins that route by design
        family = registry.families().get(name) if name != "mod" else None
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
        notes.append(f"Hardware: run(s) {', '.join(map(str, ids[:10]))}{' …' if len(ids) > 10 else ''} ran on "
                     f"{device}, not the sweep's {profile}{capped}; speeds and wall-clock budgets differ from the study.")
    return notes


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


def check_orderings(spec: SweepSpec, views: list[RunView], claims: Claims | None = None) -> list[str]:
    """For each published ordering in the spec: at each value of its `at` axes, both sides' test loss (mean, 95%
    interval, n), the effect with its interval, the one-sided p-value (Holm-adjusted with several comparisons)
    and the verdict; then the verdicts counted."""
    claims = claims or check_claims(spec, views)
    at = parse_at(spec.report.at)
    measured = f" at {at.text()}" if at else ""
    lines = []
    method = "Welch's t-test across seeds, one-sided in the claim's direction"
    if claims.tests > 1:
        method += f"; p Holm-adjusted over the report's {claims.tests} comparisons"
    for order in spec.report.orderings:
        cells = claims.of(order)
        if not cells:
            lines.append(f"Study: {order.claim} Here: no completed pair of runs to compare yet.")
            continue
        counts: dict[str, int] = {}
        for c in cells:
            counts[c.verdict] = counts.get(c.verdict, 0) + 1
        tally = ", ".join(f"{n} {verdict}" for verdict, n in counts.items())
        lines.append(f"Study: {order.claim} Here, test loss{measured} ({method}): "
                     + "; ".join(_cell_text(order, c, claims.min_steps) for c in cells)
                     + f". Verdicts: {tally} (of {len(cells)}).")
    return lines


def floor_line(claims: Claims) -> str | None:
    """The noise floor the verdicts are read against: each architecture's seed-to-seed std of test loss."""
    known = [(arch, std, n) for arch, (std, n) in claims.floor.items() if std is not None]
    if not known:
        return None
    parts = ", ".join(f"{arch} {std:.3f} ({n} configuration{'s' * (n > 1)})" for arch, std, n in known)
    return (f"Noise floor (seed-to-seed std of test loss, pooled over each architecture's configurations): {parts}. "
            "An effect smaller than the floor of either side is flagged.")


def _cell_text(order: Ordering, cell: ClaimCell, min_steps: int) -> str:
    where = ", ".join(f"{k}={x}" for k, x in cell.where.items()) or "overall"
    c = cell.comparison
    if c is None:
        return f"{where}: {cell.verdict} (every run of a side trained fewer than {min_steps} steps; no verdict)"
    text = f"{where}: {_label_of(order.better)} {c.better.text()} vs {_label_of(order.worse)} {c.worse.text()}"
    if c.tested:
        text += f", effect {c.effect:+.3f} nats [{c.low:+.3f}, {c.high:+.3f}], {_p(cell.p_adjusted)}"
        if cell.verdict == stats.REVERSED:
            text += f" (against it: {_p(cell.p_against_adjusted)})"
    else:
        text += f", effect {c.effect:+.3f} nats"
    text += f" → {cell.verdict}"
    if not c.tested:
        text += " (one seed on a side: no test)"
    if cell.below_floor:
        text += f" (below the noise floor {cell.floor:.3f})"
    if cell.left_out:
        text += f" ({cell.left_out} run(s) under {min_steps} steps left out)"
    return text


def _p(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def _label_of(match: dict[str, Any]) -> str:
    return " ".join(str(v) for v in match.values())
