"""Scaling laws of a sweep's runs: per architecture, the test loss against model size, L(N) = E + A·N^-α (N: the
run's parameter count), and against training compute, L(C) (C: tokens × training FLOPs per token at the run's
end), fitted by scaling.fit_power_law with a bootstrap over seeds; and where two architectures' curves cross.

A sweep gets fits when an architecture has runs at 3 sizes or more; runs that trained fewer than the report's
`min_steps` steps, and runs with no finite loss, are left out. An axis that differs between runs of one size (a
weight decay the grid varies, say) makes another configuration: each gets its own law, named by it, and crossovers
compare architectures at equal such axes. An axis that changes only with size (a learning rate per width) is
part of the size; the report says which.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from ablate.results.cells import differing, varies
from ablate.results.orderings import comparable
from ablate.results.scaling import Crossover, Fit, crossover, fit_power_law
from ablate.results.views import RunView

MIN_SIZES = 3
SIZE_AXES = ("d_model", "layers", "heads", "kv_heads", "context")  # axes that change a run's size


@dataclass
class ArchitectureLaw:
    """One architecture's points and fits: x as parameters (N) and as compute (C)."""

    architecture: str  # the law's name: the architecture, with the axes that tell its configurations apart
    points: dict[str, list[tuple[float, float, int]]]  # "params"/"flops" -> (x, loss, seed)
    fits: dict[str, Fit]
    pooled: list[str] = field(default_factory=list)  # other axes that change with size within the law
    where: dict[str, Any] = field(default_factory=dict)  # the configuration's axes beyond size (split laws only)
    family: str = ""  # the architecture alone


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
    """The fits of every architecture's configurations with runs at MIN_SIZES sizes or more (none: an empty Laws)."""
    by_arch: dict[str, list[RunView]] = {}
    for v in views:
        loss = v.row.final_eval_loss if v.row.status == "completed" else None
        if loss is not None and math.isfinite(loss) and comparable(v, min_steps):
            by_arch.setdefault(str(v.axes.get("architecture")), []).append(v)
    result = Laws()
    for arch, runs in sorted(by_arch.items()):
        for where, members in _configurations(runs):
            law = _law(arch, where, members, bootstrap)
            if law is not None:
                result.laws.append(law)
    for a, b in combinations(result.laws, 2):
        if a.family == b.family or not _same_where(a, b):
            continue
        for unit in ("params", "flops"):
            if unit in a.fits and unit in b.fits:
                result.crossovers.append((unit, a.architecture, b.architecture,
                                          crossover(a.architecture, a.fits[unit], b.architecture, b.fits[unit])))
    return result


def _configurations(runs: list[RunView]) -> list[tuple[dict[str, Any], list[RunView]]]:
    """An architecture's runs split by the axes that differ between runs of one size (another configuration)."""
    sizes: dict[Any, list[RunView]] = {}
    for r in runs:
        sizes.setdefault(tuple(repr(r.axes.get(k)) for k in SIZE_AXES), []).append(r)
    split = sorted({k for members in sizes.values() for k in differing(members, exclude={"architecture", *SIZE_AXES})})
    groups: dict[tuple, list[RunView]] = {}
    for r in runs:
        groups.setdefault(tuple(repr(r.axes.get(k)) for k in split), []).append(r)
    return [({k: members[0].axes.get(k) for k in split}, members) for members in groups.values()]


def _law(arch: str, where: dict[str, Any], runs: list[RunView], bootstrap: int) -> ArchitectureLaw | None:
    points = {unit: [(x, r.row.final_eval_loss, r.axes.get("seed") or 0) for r in runs
                     if (x := _x(r, unit)) is not None and x > 0] for unit in ("params", "flops")}
    points["flops"] = _per_size(runs, points["flops"])
    if len({x for x, _, _ in points["params"]}) < MIN_SIZES:
        return None
    fits = {unit: fit_power_law([p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts],
                                bootstrap=bootstrap) for unit, pts in points.items() if pts}
    name = arch + (" (" + ", ".join(f"{k}={x}" for k, x in where.items()) + ")" if where else "")
    return ArchitectureLaw(name, points, fits, _pooled(runs), where, arch)


def _same_where(a: ArchitectureLaw, b: ArchitectureLaw) -> bool:
    return all(repr(a.where.get(k)) == repr(b.where.get(k)) for k in {*a.where, *b.where})


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
    return [k for k in keys if varies(runs, k)]
