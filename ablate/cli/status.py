"""A sweep's runs on screen: the status table (at most STATUS_ROWS rows, the rest counted), its csv form, and the
live view of `ablate sweep run`."""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from rich import box
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ablate.cli.common import STATUS_ROWS, console
from ablate.config.axes import AXIS_FIELDS

# a status row's columns, in the order the dashboard shows them too (results/status.py)
STATUS_HEADER = ("run", "status", "progress", *AXIS_FIELDS, "options", "steps", "train", "eval", "epochs", "reason")
SHORT = {"progress": "used", "architecture": "arch", "objective": "obj", "options": "opts", "d_model": "d",
         "layers": "L", "heads": "H", "context": "ctx", "batch_size": "bs"}  # the table's headers (the csv keeps STATUS_HEADER)
LEFT = ("architecture", "objective", "options", "status", "reason")
GIVE = ("options", "reason")  # the columns that narrow where the table is too wide: the rest stay whole
DROPPABLE = ("progress", *AXIS_FIELDS, "options", "epochs")  # said once, in the title, when the same in every row
STYLES = {"completed": "green", "running": "cyan", "oom": "yellow", "diverged": "yellow", "failed": "red",
          "preempted": "magenta"}


def runs_table(rows: Sequence[Any], title: str = "", limit: int | None = STATUS_ROWS,
               counts: dict[str, int] | None = None) -> Table:
    """One row per run (at most `limit`, None: all): axes, status, progress through the budget, the latest losses
    and the reason of a failure, from run-row columns only; a caption counts the runs by status (`counts`: the
    sweep's, where `rows` are only the candidates to show). Made to be read in 80 columns: an axis that is the same
    in every shown row goes to the title (or out, when blank), headers are short, and only the reason (and options)
    give way."""
    if counts is None:
        counts = defaultdict(int)
        for r in rows:
            counts[r.status] += 1
    total = sum(counts.values())
    shown = shown_runs(rows, limit, total) if limit else list(rows)
    cells = [_status_cells(r) for r in shown]
    same = _same_in_every_row(cells)
    table = Table(title=_title(title, same), title_justify="left", caption=_caption(counts, len(shown), total),
                  caption_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    keys = [key for key in STATUS_HEADER if key not in same]
    for key in keys:
        table.add_column(SHORT.get(key, key), justify="left" if key in LEFT else "right", no_wrap=key not in GIVE,
                         overflow="fold")
    for c in cells:
        table.add_row(*(_table_cell(key, c) for key in keys))
    return table


def _same_in_every_row(cells: list[dict[str, Any]]) -> dict[str, str]:
    """The axis columns (and budget) whose value is the same in every shown row, as the table would show it: the
    reader needs them once, not once a row."""
    if not cells:
        return {}
    return {key: _table_cell(key, cells[0]) for key in DROPPABLE if all(c[key] == cells[0][key] for c in cells)}


def _title(title: str, same: dict[str, str]) -> str:
    """The title, then the columns left out for being the same in every row, as `key=value` (blank ones unsaid)."""
    said = " ".join(f"{key}={value}" for key, value in same.items() if value not in ("", "-"))
    return " · ".join(part for part in (title, f"[dim]{said}[/]" if said else "") if part)


def _caption(counts: dict[str, int], shown: int, total: int) -> str | None:
    caption = ", ".join(f"{n:,} {status}" for status, n in sorted(counts.items()))
    if shown < total:
        caption = (f"showing {shown:,} of {total:,} runs (unfinished, the latest finished, the next pending); "
                   f"{caption}; --all for every run, --format csv for a file")
    return caption or None


def _table_cell(key: str, c: dict[str, Any]) -> Any:
    """One cell as the table shows it: markup escaped, losses to 3 decimals, the reason on one line, cut with an
    ellipsis where the width runs out (the losses before it stay whole)."""
    value = c[key]
    if key == "status":
        style = STYLES.get(value, "")
        return f"[{style}]{value}[/]" if style else value
    if key == "reason":
        return Text(value, no_wrap=True, overflow="ellipsis")
    if value is None or value == "":
        return "" if key == "options" else "-"
    if key == "lr":
        return f"{value:.3g}"
    if key == "progress":
        return f"{value:.0%}"
    if key in ("train", "eval"):
        return f"{value:.3f}"
    return escape(str(value))


def shown_runs(rows: Sequence[Any], limit: int = STATUS_ROWS, total: int | None = None) -> list[Any]:
    """At most `limit` rows, in trial order: every unfinished run that is not waiting (running, failed ...),
    then the latest finished, then the next waiting ones (`total`: the sweep's runs, where `rows` holds only
    those candidates, results.status.status_view)."""
    if (len(rows) if total is None else total) <= limit:
        return list(rows)
    import datetime as dt

    from ablate import store

    waiting = [r for r in rows if r.status == "pending"]
    done = sorted((r for r in rows if r.status in store.FINISHED),
                  key=lambda r: (r.finished_at is not None, r.finished_at or dt.datetime.min, r.id), reverse=True)
    active = [r for r in rows if r.status != "pending" and r.status not in store.FINISHED]
    keep = {r.id for r in (active + done + waiting)[:limit]}
    return [r for r in rows if r.id in keep]


def print_status_csv(rows: Sequence[Any]) -> None:
    """Every run as csv on stdout (full precision), for scripts and pipes."""
    import csv

    writer = csv.DictWriter(sys.stdout, fieldnames=STATUS_HEADER, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: "" if v is None else v for k, v in _status_cells(r).items()})


def _status_cells(r: Any) -> dict[str, Any]:
    """One run's status row as plain values (csv) keyed by column: results.status.status_row, its options as
    `key=value` text."""
    from ablate.results.status import status_row

    row = status_row(r)
    return {**row, "options": ",".join(f"{k}={v}" for k, v in row["options"].items())}


def sweep_view(engine: Any, name: str, at_once: int = 1) -> Callable[[], Table]:
    """The status table of a running sweep, titled with how many of its runs have finished and about how long the
    rest will take (results.status.eta)."""
    from ablate import store
    from ablate.results.status import eta, status_view

    def render() -> Table:
        rows, counts = status_view(engine, name, STATUS_ROWS)
        finished = sum(n for status, n in counts.items() if status in store.FINISHED)
        left = eta(engine, name, at_once)
        title = f"sweep {name}: {finished}/{sum(counts.values())} finished" + (f" · {left}" if left else "")
        return runs_table(rows, title=title, counts=counts)

    return render


def watch(render: Callable[[], Table], done: Any, engine: Any, name: str, at_once: int = 1) -> None:
    """The live table on a terminal; otherwise a status line whenever the counts change (with the time left),
    then the table."""
    import time

    from rich.live import Live

    from ablate.results.status import eta, status_counts

    if console.is_terminal:
        with Live(render(), console=console, refresh_per_second=2) as live:
            while not done.wait(1.0):
                live.update(render())
            live.update(render())
        return
    last = ""
    while not done.wait(5.0):
        line = ", ".join(f"{n} {status}" for status, n in status_counts(engine, name).items())
        if line != last:
            left = eta(engine, name, at_once)
            console.print(f"[{time.strftime('%H:%M:%S')}] {line}" + (f" · {left}" if left else ""))
            last = line
    console.print(render())
