"""Scaling laws of a sweep's runs: per architecture, the test loss against model size, L(N) = E + A·N^-α (N: the
run's parameter count), and against training compute, L(C) (C: tokens × training FLOPs per token at the run's
end), fitted by scaling.fit_power_law with a bootstrap over seeds; and where two architectures' curves cross.

A sweep gets fits when an architecture has runs at 3 sizes or more; runs that trained fewer than the report's
`min_steps` steps, and runs with no loss, are left out. Other axes that vary within an architecture (a learning
rate, say) are pooled into its points, and the report says which.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from ablate.results.orderings import comparable
from ablate.results.scaling import Crossover, Fit, crossover, fit_power_law
from ablate.results.views import RunView

MIN_SIZES = 3
SIZE_AXES = ("d_model", "layers", "heads", "kv_heads", "context")  # axes that change a run's size


@dataclass
class ArchitectureLaw:
    """One architecture's points and fits: x as parameters (N) and as compute (C)."""

    architecture: str
    points: dict[str, list[tuple[float, float, int]]]  # "params"/"flops" -> (x, loss, seed)
    fits: dict[str, Fit]
    pooled: list[str] = field(default_factory=list)  # other axes varying within the architecture


@dataclass
class Laws:
    laws: list[ArchitectureLaw] = field(default_factory=list)
    crossovers: list[tuple[str, str, str, Crossover]] = field(default_factory=list)  # (unit, a, b, crossover)


def _x(view: RunView, unit: str) -> float | None:
    row = view.row
    if unit == "params":
        return float(row.params) if row.params else None
    if row.tokens and row.flops_per_token:
        return float(row.tokens) * float(row.flops_per_token)
    return None


def fit_laws(views: list[RunView], min_steps: int = 0, bootstrap: int = 1000) -> Laws:
    """The fits of every architecture with runs at MIN_SIZES sizes or more (none: an empty Laws)."""
    by_arch: dict[str, list[RunView]] = {}
    for v in views:
        loss = v.row.final_eval_loss if v.row.status == "completed" else None
        if loss is not None and math.isfinite(loss) and comparable(v, min_steps):
            by_arch.setdefault(str(v.axes.get("architecture")), []).append(v)
    result = Laws()
    for arch, runs in sorted(by_arch.items()):
        points = {unit: [(x, r.row.final_eval_loss, r.axes.get("seed") or 0) for r in runs
                         if (x := _x(r, unit)) is not None and x > 0] for unit in ("params", "flops")}
        points["flops"] = _per_size(runs, points["flops"])
        if len({x for x, _, _ in points["params"]}) < MIN_SIZES:
            continue
        fits = {unit: fit_power_law([p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts],
                                    bootstrap=bootstrap) for unit, pts in points.items() if pts}
        result.laws.append(ArchitectureLaw(arch, points, fits, _pooled(runs)))
    for a, b in combinations(result.laws, 2):
        for unit in ("params", "flops"):
            if unit in a.fits and unit in b.fits:
                result.crossovers.append((unit, a.architecture, b.architecture,
                                          crossover(a.architecture, a.fits[unit], b.architecture, b.fits[unit])))
    return result


def _per_size(runs: list[RunView], points: list[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    """Compute points at their size's mean compute: seeds of one size read a few more or fewer tokens (packing),
    and the bootstrap resamples seeds within a size, so they share one x."""
    if len(points) != len(runs):  # some runs lack FLOPs: keep the points as they are
        return points
    sizes: dict[Any, list[float]] = {}
    for r, (x, _, _) in zip(runs, points):
        sizes.setdefault(r.row.params, []).append(x)
    return [(sum(sizes[r.row.params]) / len(sizes[r.row.params]), loss, seed) for r, (_, loss, seed) in zip(runs, points)]


def _pooled(runs: list[RunView]) -> list[str]:
    keys = sorted({k for r in runs for k in r.axes} - {"seed", "architecture", *SIZE_AXES})
    return [k for k in keys if len({repr(r.axes.get(k)) for r in runs}) > 1]
