"""What the dashboard's charts are made of, on the server: the runs a chart groups into curves, one style (colour,
dash) per configuration that is the same in the chart, its legend and the runs table, the facet each curve falls
in, and a comparison of a few runs (their fields side by side, their curves and the difference curve).

A configuration's style is decided over every run of the sweep, not over what a filter keeps: the colour says the
value of one axis (`color`, default the first axis that varies), the dash the value of a second (`dash`), and the
shade the combination of the rest among the configurations of one hue and dash, so 24 configurations read as 2 hues x 3 dashes x 4 shades rather than a
10-colour palette that repeats.
"""

from __future__ import annotations

import colorsys
from collections.abc import Callable
from typing import Any

from ablate.config.errors import AblateError
from ablate.results.bands import group_curve
from ablate.results.views import sort_key
from ablate.ui import table

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
           "#7f7f7f")  # Tableau 10: one hue per value of the colour axis
DASHES = ((), (8, 4), (2, 3), (10, 3, 2, 3), (4, 2), (1, 2))  # one per value of the dash axis (uPlot's and SVG's)


def axes_of(columns: list[str]) -> list[str]:
    """The table's columns that tell runs apart (the axes and config fields that vary), in its order."""
    return [c for c in columns if c not in table.FIRST and c not in table.LAST and c not in table.EXTRA]


def group_keys(group: str, columns: list[str], facet: str = "") -> list[str]:
    """The axes a curve is one value of: `seeds` (the default) every axis but seed; `runs` the run; else the
    named axes, comma separated (every other axis averaged). A facet axis is always among them."""
    axes = axes_of(columns)
    if facet and facet not in axes:
        raise AblateError(f"facet: no axis {facet!r}; axes: {', '.join(axes) or 'none vary'}")
    if group == "runs":
        return ["run"]
    if group in ("", "seeds"):
        keys = [c for c in axes if c != "seed"]
    else:
        keys = [k.strip() for k in group.split(",") if k.strip()]
        unknown = [k for k in keys if k not in axes]
        if unknown:
            raise AblateError(f"group: no axis {unknown[0]!r}; axes: {', '.join(axes) or 'none vary'} (or runs, seeds)")
    return keys + [facet] if facet and facet not in keys else keys


def groups(rows: list[dict[str, Any]], keys: list[str], columns: list[str]) -> dict[str, dict[str, Any]]:
    """Curve label -> {"axes": the curve's values of `keys` (a run's every axis when keys == ["run"]), "runs": ids}."""
    axes = axes_of(columns)
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        shown = axes if keys == ["run"] else keys
        values = {k: r.get(k) for k in shown}
        label = " ".join(f"{k}={v}" for k, v in values.items() if v is not None)
        label = f"run {r['run']}: {label}" if keys == ["run"] else label or "all runs"
        out.setdefault(label, {"axes": values, "runs": []})["runs"].append(r["run"])
    return out


def styles(rows: list[dict[str, Any]], keys: list[str], color: str = "", dash: str = "") -> dict[str, Any]:
    """The style of each combination of `keys` values, decided over `rows` (the whole sweep): {"color": axis,
    "dash": axis, "colors": {value: hue}, "dashes": {value: pattern}, "of": callable(values) -> (colour, dash)}."""
    keys = [k for k in keys if k not in ("run", "seed")]
    for name, chosen in (("color", color), ("dash", dash)):
        if chosen and chosen not in keys:
            raise AblateError(f"{name}: no axis {chosen!r} among the curves' axes: {', '.join(keys) or 'none vary'}")
    color = color or (keys[0] if keys else "")
    dash = dash or next((k for k in keys if k != color), "")
    if dash == color:
        dash = ""
    rest = [k for k in keys if k not in (color, dash)]
    def values(k: str) -> list[str]:  # the axis's values (as repr), in the table's order
        seen = {repr(r.get(k)): r.get(k) for r in rows}
        return sorted(seen, key=lambda v: sort_key(seen[v]))

    hue = {v: PALETTE[i % len(PALETTE)] for i, v in enumerate(values(color))} if color else {}
    pattern = {v: list(DASHES[i % len(DASHES)]) for i, v in enumerate(values(dash))} if dash else {}
    cell = lambda r: (repr(r.get(color)), repr(r.get(dash)))  # noqa: E731 - one hue and dash
    combos: dict[tuple, dict[tuple, tuple]] = {}  # per cell, the other axes' combinations there (sortable)
    for r in rows:
        combos.setdefault(cell(r), {})[tuple(repr(r.get(k)) for k in rest)] = tuple(sort_key(r.get(k)) for k in rest)
    shade = {c: {t: i for i, t in enumerate(sorted(ts, key=lambda t: ts[t]))} for c, ts in combos.items()}
    varied = [k for i, k in enumerate(rest) if any(len({t[i] for t in ts}) > 1 for ts in combos.values())]

    def of(axes: dict[str, Any]) -> tuple[str, list[int]]:
        base = hue.get(repr(axes.get(color)), PALETTE[0])
        mine = shade.get(cell(axes), {})
        k = mine.get(tuple(repr(axes.get(a)) for a in rest), 0)
        return shaded(base, k, len(mine)), pattern.get(repr(axes.get(dash)), [])

    return {"color": color, "dash": dash, "shade": varied, "of": of,
            "colors": {_text(v): c for v, c in hue.items()}, "dashes": {_text(v): d for v, d in pattern.items()}}


def _text(value_repr: str) -> str:
    return value_repr.strip("'\"")


def shaded(color: str, k: int, n: int) -> str:
    """The k-th of n shades of a hue: from darker to lighter (one shade: the hue itself)."""
    if n <= 1:
        return color
    r, g, b = (int(color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    h, lightness, s = colorsys.rgb_to_hls(r, g, b)
    lightness = min(0.82, max(0.18, lightness + (-0.22 + 0.44 * k / (n - 1))))
    return "#" + "".join(f"{round(c * 255):02x}" for c in colorsys.hls_to_rgb(h, lightness, s))


def curve(label: str, group: dict[str, Any], series: dict[int, tuple[list[float], list[float]]],
          looks: Callable[[dict[str, Any]], tuple[str, list[int]]], facet: str) -> dict[str, Any] | None:
    """One curve of a group of runs (results.bands.group_curve: the mean on the x every run reached and the min-max
    band, or the run's own points), with its colour and dash (`looks` of its axes) and its facet value; a mean cut at
    its shortest run says so in its label."""
    one = group_curve(label, group["runs"], series)
    if one is None:
        return None
    colour, pattern = looks(group["axes"])
    if one["cut"]:
        one["label"] = one["label"][:-1] + ", to its shortest run)"
    return {**one, "axes": group["axes"], "color": colour, "dash": pattern,
            "facet": None if not facet else group["axes"].get(facet)}


def band_note(curves: list[dict[str, Any]]) -> str:
    """What the chart's bands and labels mean, for the note under it."""
    if not any(c["low"] is not None for c in curves):
        return "each line is one run as logged"
    note = ("a line with (n=k) is the mean of its k runs (the seeds of a configuration, or every run of the values "
            "it names), on the x all of them reached; the band around it is their min–max")
    if any(c["cut"] for c in curves):
        note += "; '(to its shortest run)': a longer run went further, and the mean stops where its shortest run did"
    return note


def compare(rows: list[dict[str, Any]], configs: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """The fields of a few runs side by side (their table row, then their trial config flattened), each marked
    whether the runs differ in it; the differing ones first."""
    flat = {run: {**{k: v for k, v in r.items() if not k.startswith("_")}, **_flatten(configs.get(run) or {}, "config.")}
            for run, r in ((r["run"], r) for r in rows)}
    keys = list(dict.fromkeys(k for f in flat.values() for k in f))
    fields = [{"field": k, "values": [flat[r["run"]].get(k) for r in rows],
               "differ": len({repr(flat[r["run"]].get(k)) for r in rows}) > 1} for k in keys if k != "run"]
    return sorted(fields, key=lambda f: not f["differ"])


def _flatten(d: dict[str, Any], prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v if not isinstance(v, (list, dict)) else repr(v)
    return out


def differences(series: dict[int, tuple[list[float], list[float]]], runs: list[int],
                points: int = 200) -> list[dict[str, Any]]:
    """Each run's curve minus the first run's, on the x both reached (linear between logged points)."""
    import numpy as np

    if not runs or runs[0] not in series or not len(series[runs[0]][0]):
        return []
    x0, y0 = (np.asarray(a, dtype=float) for a in series[runs[0]])
    out = []
    for run in runs[1:]:
        if run not in series or not len(series[run][0]):
            continue
        x1, y1 = (np.asarray(a, dtype=float) for a in series[run])
        lo, hi = max(x0[0], x1[0]), min(x0[-1], x1[-1])
        if hi <= lo:
            continue
        grid = np.linspace(lo, hi, points)
        out.append({"label": f"run {run} − run {runs[0]}", "run": run, "x": grid.tolist(),
                    "mean": (np.interp(grid, x1, y1) - np.interp(grid, x0, y0)).tolist(), "low": None, "high": None})
    return out
