"""Curves of several runs as one: the mean over the runs that differ only by seed (or over every axis a view does
not group by), with the min and max as a band. The report's figures and the dashboard's charts draw the same
runs the same way through `mean_band`.

The runs are read on a common x: the range every one of them reached (no run is extrapolated past its last
point), at evenly spaced points, each run interpolated linearly between its own logged points. Seeds of a
wall-clock budget log at different tokens and steps, so their k-th points do not line up on those axes.
"""

from __future__ import annotations

from typing import Any

MAX_POINTS = 200  # points per curve drawn, whatever a run logged


def thin(n: int, max_points: int) -> Any:
    """Indices of at most `max_points` of n points: evenly spaced, the first and the last always among them."""
    import numpy as np

    if n <= max_points:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, max_points).round().astype(int))


def mean_band(series: list[tuple[Any, Any]], max_points: int = MAX_POINTS) -> tuple[Any, Any, Any, Any] | None:
    """(x, mean, min, max) of `series` (one (xs, losses) per run, xs ascending) on their common x; None when they
    share no range (one run, or a run of one point): draw the first run as logged then. A NaN loss stays NaN."""
    import numpy as np

    have = [(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)) for xs, ys in series if len(xs)]
    if len(have) < 2:
        return None
    lo, hi = max(float(xs.min()) for xs, _ in have), min(float(xs.max()) for xs, _ in have)
    if hi <= lo:
        return None
    grid = np.linspace(lo, hi, min(max_points, max(len(xs) for xs, _ in have)))
    ys = np.array([np.interp(grid, xs, vals) for xs, vals in have])
    return grid, ys.mean(0), ys.min(0), ys.max(0)


def group_curve(label: str, ids: list[int], series: dict[int, tuple[list[float], list[float]]],
                max_points: int = MAX_POINTS) -> dict[str, Any] | None:
    """One curve of a group of runs, as the dashboard sends it: the mean and band of `mean_band`, labelled with its n,
    and `cut` when a run went further than the mean (which stops where its shortest run did); a group of one run (or
    of runs with no common range) is its first run's curve as logged; None when no run has a point."""
    have = [series[i] for i in ids if i in series and len(series[i][0])]
    if not have:
        return None
    band = mean_band(have, max_points)
    if band is None:
        return {"label": label, "runs": ids, "n": 1, "cut": False, "x": have[0][0], "mean": have[0][1], "low": None,
                "high": None}
    x, mean, low, high = band
    return {"label": label + f" (n={len(have)})", "runs": ids, "n": len(have),
            "cut": max(float(xs[-1]) for xs, _ in have) > float(x[-1]), "x": x.tolist(), "mean": mean.tolist(),
            "low": low.tolist(), "high": high.tolist()}
