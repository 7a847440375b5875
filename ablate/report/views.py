"""Runs as reports see them (RunView and load_views live in ablate/results/views.py, the read side), held aside
from the cyclic collector while a report is built; which axes vary among runs, and the labels that name them."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ablate.results.cells import one_per_configuration, varies
from ablate.results.views import RunView

UNFINISHED = ("pending", "running", "failed", "preempted", "cancelled")


@contextmanager
def long_lived() -> Iterator[Callable[[], None]]:
    """A report holds a view of every run (100,000 at a lab's scale) to its end. Python's cyclic collector would
    walk them all again each time a few hundred thousand new objects (ORM rows, metric rows) are made: half the
    CPU of loading them, and of drawing after. Collection waits while they load; `loaded()` then sets what is
    alive aside (gc.freeze) until the report is built, and the collector runs as usual on what comes after.
    Unfrozen at the end: in a long-lived process (a notebook) their cycles are collected as ever."""
    enabled = gc.isenabled()
    gc.disable()
    frozen = False

    def loaded() -> None:
        nonlocal frozen
        gc.freeze()
        frozen = True
        if enabled:
            gc.enable()

    try:
        yield loaded
    finally:
        if frozen:
            gc.unfreeze()
        if enabled:
            gc.enable()


def varying_axes(views: list[RunView], exclude: set[str]) -> list[str]:
    views = one_per_configuration(views)
    keys = sorted({k for v in views for k in v.axes} - exclude - {"seed"})
    # an option one family lacks (None) does not make an axis vary; differing values do
    return [k for k in keys if varies(views, k, none_counts=False)]


def config_label(axes: dict[str, Any], keys: list[str]) -> str:
    short = {"d_model": "d", "layers": "n", "heads": "h", "batch_size": "b", "context": "ctx"}
    return ", ".join(f"{short.get(k, k.removeprefix('options.'))}={axes.get(k)}" for k in keys)
