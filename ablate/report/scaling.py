"""A report's scaling section: each architecture's fitted law against size and compute (results/laws.py), in
words with α, E and their intervals and the fitted range, where two architectures cross, the points and fitted
curves drawn (log x, curves only over the sizes fitted), and scaling.csv."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from ablate.report.reading import blank
from ablate.results.laws import Laws

UNIT_WORDS = {"params": "parameters N", "flops": "training compute C (FLOPs)"}


def scaling_lines(laws: Laws) -> list[str]:
    lines = []
    for law in laws.laws:
        pooled = f" ({', '.join(law.pooled)} changing with size)" if law.pooled else ""
        for unit, fit in law.fits.items():
            lines.append(f"{law.architecture}, test loss against {UNIT_WORDS[unit]}{pooled}: {fit.text(unit)}")
    for unit, a, b, cross in laws.crossovers:
        lines.append(f"{a} vs {b} against {UNIT_WORDS[unit]}: {cross.text(unit)}")
    return lines


MAX_DOTS = 20  # a law's runs at one size drawn one by one up to this; past it, the size's mean and min–max bar
MAX_LEGEND = 20  # legend entries per panel; past it the panel says where the laws are named instead


def draw_laws(laws: Laws, title: str) -> Any:
    """Two panels (parameters, compute): each architecture's runs (every point, or per size their mean and min–max
    past MAX_DOTS runs a size) and its curve over its fitted range."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), squeeze=False)
    for ax, unit in zip(axes[0], ("params", "flops")):
        entries = 0
        for law in laws.laws:
            pts = law.points.get(unit) or []
            if not pts:
                continue
            dots = _draw_points(ax, pts, law.architecture, f"points-{law.architecture}-{unit}")
            entries += 1
            fit = law.fits.get(unit)
            if fit is not None and fit.converged:
                xs = np.geomspace(*fit.x_range, 100)
                ax.plot(xs, fit.predict(xs), color=dots.get_color(), linewidth=1.5,
                        label=f"{law.architecture}: α={fit.alpha:.3g}", gid=f"fit-{law.architecture}-{unit}")
                entries += 1
        ax.set_xscale("log")
        ax.set_xlabel(UNIT_WORDS[unit])
        ax.set_ylabel("test loss (nats)")
        ax.grid(alpha=0.3, which="both")
        if 0 < entries <= MAX_LEGEND:
            ax.legend(fontsize=8)
        elif entries:  # 25 laws' 50 entries would cover the panel (and cost more to lay out than the rest of the figure)
            ax.set_title(f"{len(laws.laws)} laws: named with their numbers in the text and scaling.csv", fontsize=8)
    fig.suptitle(f"{title}: L = E + A·x^-α per architecture (curves over the fitted range only)")
    fig.tight_layout()
    return fig


def _draw_points(ax: Any, pts: list[tuple[float, float, int]], label: str, gid: str) -> Any:
    """A law's points: every one, or (past MAX_DOTS at some size) each size's mean with its min–max as a bar."""
    sizes: dict[float, list[float]] = {}
    for x, loss, _ in pts:
        sizes.setdefault(x, []).append(loss)
    if max(len(v) for v in sizes.values()) <= MAX_DOTS:
        (dots,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", alpha=0.6, label=label, gid=gid)
        return dots
    xs = sorted(sizes)
    means = [sum(sizes[x]) / len(sizes[x]) for x in xs]
    below = [m - min(sizes[x]) for x, m in zip(xs, means)]
    above = [max(sizes[x]) - m for x, m in zip(xs, means)]
    fewest, most = min(len(v) for v in sizes.values()), max(len(v) for v in sizes.values())
    runs = f"{fewest}" if fewest == most else f"{fewest}–{most}"
    bars = ax.errorbar(xs, means, yerr=[below, above], fmt="o", capsize=2, alpha=0.8, gid=gid,
                       label=f"{label} (per size: mean of {runs} runs, min–max)")
    return bars.lines[0]


# E_at_bound: E ran to its lower bound 0 (the sizes locate no irreducible loss: E is the optimiser's, not a claim)
SCALING_COLUMNS = ("architecture", "x", "E", "E_low", "E_high", "A", "alpha", "alpha_low", "alpha_high", "x_min",
                   "x_max", "points", "sizes", "bootstrap", "converged", "reason", "E_at_bound")


def write_scaling_csv(laws: Laws, path: Path) -> Path:
    with path.open("w", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(SCALING_COLUMNS)
        for law in laws.laws:
            for unit, fit in law.fits.items():
                e_ci, a_ci = fit.E_ci or ("", ""), fit.alpha_ci or ("", "")
                x_range = fit.x_range or ("", "")
                out.writerow((law.architecture, unit, blank(fit.E), *e_ci, blank(fit.A), blank(fit.alpha), *a_ci,
                              *x_range, fit.n_points, fit.n_x, fit.bootstrap, fit.converged, fit.reason,
                              fit.E_at_bound if fit.converged else ""))
    return path
