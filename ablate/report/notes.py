"""What a report says beside its tables: notes on how runs were computed, the recipes they trained with, and
whether each ordering the study published holds in our numbers."""

from __future__ import annotations

import statistics
from typing import Any

from ablate.config import SweepSpec, describe_recipe
from ablate.report.views import RunView, _matches, _sort_key


def run_notes(views: list[RunView]) -> list[str]:
    """What a table's reader must know about how its runs were computed: non-causal training losses, and runs
    whose device was not the sweep's hardware profile."""
    notes = []
    if any(v.axes.get("architecture") == "mod" for v in views):
        from ablate.models.mod_options import TRAINING_NOTE

        notes.append(f"Mixture-of-depths: {TRAINING_NOTE}.")
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


def check_orderings(spec: SweepSpec, views: list[RunView]) -> list[str]:
    """For each published ordering in the spec: does our table agree, at each value of its `at` axes?"""
    lines = []
    for order in spec.report.orderings:
        cells: dict[tuple, dict[str, list[float]]] = {}
        for v in views:
            if v.row.status != "completed" or v.row.final_eval_loss is None:
                continue
            for side in ("better", "worse"):
                if _matches(v, getattr(order, side)):
                    key = tuple(v.axes.get(k) for k in order.at)
                    cells.setdefault(key, {"better": [], "worse": []})[side].append(v.row.final_eval_loss)
        verdicts = []
        for key in sorted(cells, key=lambda k: [_sort_key(x) for x in k]):
            better, worse = cells[key]["better"], cells[key]["worse"]
            if not better or not worse:
                continue
            b, w = statistics.fmean(better), statistics.fmean(worse)
            where = ", ".join(f"{k}={x}" for k, x in zip(order.at, key)) or "overall"
            verdicts.append((b < w, f"{where}: {_label_of(order.better)} {b:.2f} vs {_label_of(order.worse)} {w:.2f} "
                                    f"({'agrees' if b < w else 'disagrees'})"))
        if not verdicts:
            lines.append(f"Study: {order.claim} Here: no completed pair of runs to compare yet.")
            continue
        agree = sum(ok for ok, _ in verdicts)
        overall = "agrees" if agree == len(verdicts) else "disagrees" if agree == 0 else "agrees in part"
        lines.append(f"Study: {order.claim} Here, test loss: " + "; ".join(text for _, text in verdicts)
                     + f". Our ordering {overall} with the study's ({agree} of {len(verdicts)}).")
    return lines


def _label_of(match: dict[str, Any]) -> str:
    return " ".join(str(v) for v in match.values())
