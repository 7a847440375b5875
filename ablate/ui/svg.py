"""The dashboard's chart as an SVG file (its "download SVG"): the curves the page draws, with their colours, dashes,
bands and facets, drawn by matplotlib as the report's figures are (a canvas chart has no vector form)."""

from __future__ import annotations

import io
from typing import Any


def chart_svg(data: dict[str, Any], logx: bool = False, logy: bool = False) -> str:
    """`data`: what /api/curves answers (series with x, mean, low/high, color, dash, facet)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = data["series"]
    facets = list(dict.fromkeys(s["facet"] for s in series)) if data.get("facet") else [None]
    cols = min(3, max(1, len(facets)))
    rows = -(-len(facets) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 3.8 * rows), squeeze=False, sharey=True)
    for ax, value in zip(axes.flat, facets):
        for s in (s for s in series if s["facet"] == value):
            style = (0, tuple(s["dash"])) if s["dash"] else "solid"
            ax.plot(s["x"], s["mean"], color=s["color"], linestyle=style, linewidth=1.4, label=s["label"])
            if s["low"] is not None:
                ax.fill_between(s["x"], s["low"], s["high"], color=s["color"], alpha=0.18, linewidth=0)
        if value is not None:
            ax.set_title(f"{data['facet']}={value}", fontsize=10)
        ax.set_xlabel(data["x"])
        ax.set_xscale("log" if logx else "linear")
        ax.set_yscale("log" if logy else "linear")
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(facets):]:
        ax.set_visible(False)
    axes[0][0].set_ylabel(f"{data['y']} loss")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles and len(facets) == 1 and len(handles) <= 12:
        axes[0][0].legend(fontsize=7)
    if data.get("note"):
        fig.text(0.01, 0.005, data["note"], fontsize=6, color="#555", wrap=True)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    out = io.StringIO()
    fig.savefig(out, format="svg")
    plt.close(fig)
    return out.getvalue()
