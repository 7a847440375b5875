"""The studies' comparison tables: rows Train / Test (or peak memory), columns the varying axis, published numbers
beside ours, and the cells' formatting (mean ± seed std, a status word for a cell with no final loss yet)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from ablate.config import SweepSpec, TableSpec
from ablate.config.units import parse_at
from ablate.report.notes import run_notes
from ablate.results.equal import BEFORE_FIRST, NO_FLOPS, NOT_REACHED
from ablate.results.cells import read_seeds, split_axes
from ablate.results.orderings import comparable, noise_floor
from ablate.results import stats
from ablate.results.stats import mean_ci
from ablate.report.views import config_label, varying_axes
from ablate.results.views import RunView, matches_where, sort_key


@dataclass
class Table:
    """One table of a report: its column labels, its rows of formatted cells, the runs behind each column and the
    notes under it. `markdown()` is report.md's text; report.html draws it from its template."""

    title: str
    columns: list[str]  # column labels
    rows: list[tuple[str, list[str]]]  # (row label, cells)
    runs: list[list[RunView]] = field(default_factory=list)  # runs behind each column
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        head = "| | " + " | ".join(self.columns) + " |"
        rule = "| --- |" + " --- |" * len(self.columns)
        body = ["| " + label + " | " + " | ".join(cells) + " |" for label, cells in self.rows]
        notes = [f"\n_{n}_" for n in self.notes]
        return "\n".join([f"**{self.title}**", "", head, rule, *body, *notes])


def layout_tables(spec: SweepSpec, views: list[RunView], floor: dict[str, tuple[float | None, int]] | None = None
                  ) -> list[Table]:
    """The spec's tables; `floor`: the claims' noise floor when they were checked already (the same numbers)."""
    at = parse_at(spec.report.at)
    if floor is None:
        floor = noise_floor(views, spec.report.min_steps)  # the report's one floor, as its claims read it
    if spec.report.group:  # one table: the group axes' combinations, every other axis averaged
        tables = [one_table(spec, TableSpec(title=spec.name, group_by=(), columns=spec.report.group[0]), views,
                             extra=list(spec.report.group[1:]), floor=floor)] if views else []
    else:
        tables = _spec_tables(spec, views, floor)
    for t in tables if at else ():
        t.title += f" at {at.text()}"
    return tables


def _spec_tables(spec: SweepSpec, views: list[RunView], floor: dict[str, tuple[float | None, int]]) -> list[Table]:
    tables = []
    for tspec in spec.report.tables:
        chosen = [v for v in views if matches_where(v, tspec.where)]
        groups: dict[tuple, list[RunView]] = {}
        for v in chosen:
            groups.setdefault(tuple(repr(v.axes.get(k)) for k in tspec.group_by), []).append(v)
        for key, members in groups.items():
            tables.append(one_table(spec, tspec, members, floor=floor))
    return tables


def one_table(spec: SweepSpec, tspec: TableSpec, members: list[RunView], extra: list[str] | None = None,
               floor: dict[str, tuple[float | None, int]] | None = None) -> Table:
    """A table whose columns are `tspec.columns` × `extra` (default: every other axis that varies, so that each
    column is one configuration); `floor`: the report's noise floor (default: these runs')."""
    col_axis = tspec.columns
    averaged = [] if extra is None else varying_axes(members, {col_axis, *extra})
    if extra is None:
        extra = varying_axes(members, set(tspec.group_by) | {col_axis})
        extra = split_axes(members, [col_axis, *extra])[1:]  # and whatever else still differs within a column
    columns: dict[tuple, list[RunView]] = {}
    for v in sorted(members, key=_grid_order(members, [col_axis, *extra])):
        columns.setdefault((repr(v.axes.get(col_axis)), *[repr(v.axes.get(k)) for k in extra]), []).append(v)
    group_label = config_label(members[0].axes, list(tspec.group_by)) if tspec.group_by else ""
    title = tspec.title or group_label or spec.name
    if tspec.title and group_label and len(tspec.group_by) and tspec.where.keys() != set(tspec.group_by):
        title = f"{tspec.title} ({group_label})" if group_label not in tspec.title else tspec.title
    labels = []
    for runs in columns.values():
        label = config_label(runs[0].axes, [col_axis])
        if extra:
            label += " (" + config_label(runs[0].axes, extra) + ")"
        labels.append(label)
    if spec.report.kind == "memory":
        rows = [("Peak memory (MB)", [_memory_cell(runs) for runs in columns.values()]),
                ("Published (MB)", [_ref_memory(runs) for runs in columns.values()])]
        return Table(title=title, columns=labels, rows=rows, runs=list(columns.values()))
    cols = list(columns.values())
    mixed = len({len(finished_values(runs, "final_eval_loss")) for runs in cols} - {0}) > 1  # some cells one seed
    short = [any(not comparable(r, spec.report.min_steps) for r in runs if r.row.status == "completed")
             for runs in cols]
    rows = [("Train", [_loss_cell(runs, "final_train_loss", mixed) for runs in cols]),
            ("Test", [_loss_cell(runs, "final_eval_loss", mixed, said=True) + " †" * flag
                      for runs, flag in zip(cols, short)]),
            ("Steps", [_range_cell([r.row.steps for r in runs], "{:.0f}") for runs in cols]),
            ("Epochs", [_epochs_cell(runs) for runs in cols])]
    if any(_bits_per_byte(r) is not None for runs in cols for r in runs):  # under Test: its loss per byte
        rows.insert(2, ("Test (bits/byte)", [_loss_cell(runs, _bits_per_byte, mixed) for runs in cols]))
    if any(_train_routing(r) is not None for runs in cols for r in runs):  # MoD: also as its training routes
        rows.insert(2, (TRAIN_ROUTING_ROW, [_loss_cell(runs, _as_routed_in_training, mixed) for runs in cols]))
    if spec.budget.kind != "wall_clock":  # the budget is work: say how long each cell took to do it
        rows.append(("Train time (s)", [_range_cell([r.row.train_seconds for r in runs], "{:.0f}") for runs in cols]))
    if any(getattr(r.row, "final_eval_accuracy", None) is not None for runs in cols for r in runs):
        rows.append(("Test accuracy", [_loss_cell(runs, "final_eval_accuracy", mixed) for runs in cols]))
    notes = _uncertainty_notes(cols, spec.report.min_steps, short) + _speed_notes(cols, labels)
    if any(label == TRAIN_ROUTING_ROW for label, _ in rows):
        notes.append(f"{TRAIN_ROUTING_ROW}: the routed runs' test split once more with top-k routing over each whole "
                     "sequence, as they train: later tokens decide which earlier ones a block computes, so it is not "
                     "a causal loss, but it is what the mixture-of-depths blog reported as validation loss (its model "
                     "had no causal inference); compare the blog's claims there. A run that does not route has one "
                     "test loss, the same in both rows.")
    if averaged:
        notes.append(f"Grouped by {', '.join([col_axis, *extra])}: each cell averages its runs over seeds and "
                     f"{', '.join(averaged)} (n counts runs).")
    repeated = [label for label, runs in zip(labels, columns.values()) if _max_epochs(runs) > 1]
    if repeated:
        most = max(_max_epochs(runs) for runs in columns.values())
        notes.append(f"Data repeated: {', '.join(repeated)} saw the training data more than once (up to {most:.1f} "
                     "epochs), so their test − train gap includes memorisation and the budget compares unequal data.")
    if any(r[0].reference for r in columns.values()):
        rows.append(("Train (published)", [_ref_cell(runs, "train") for runs in columns.values()]))
        rows.append(("Test (published)", [_ref_cell(runs, "eval") for runs in columns.values()]))
        rows.append(("Test − published", [_diff_cell(runs) for runs in columns.values()]))
        notes.append(_tokenizers_note(spec))
    floor = noise_floor(members, spec.report.min_steps) if floor is None else floor
    archs = dict.fromkeys(str(r.axes.get("architecture")) for runs in cols for r in runs)
    known = [(a, floor[a][0]) for a in archs if floor.get(a, (None, 0))[0] is not None]
    if known:
        notes.append("Noise floor (seed std of test loss, pooled over each architecture's configurations, runs under "
                     f"{spec.report.min_steps} steps left out): " + ", ".join(f"{a} {stats.shown(s, 3)}" for a, s in known)
                     + "; differences smaller than that are not wins.")
    notes += run_notes([v for runs in columns.values() for v in runs])
    notes.append("Losses are token-weighted cross-entropy in nats (the studies averaged per-batch means).")
    return Table(title=title, columns=labels, rows=rows, runs=list(columns.values()), notes=notes)


def _grid_order(members: list[RunView], axes: list[str]):
    """A sort key for runs by `axes`: an axis of numbers in ascending order, any other in the order the grid first
    names its values (runs come in trial order), not alphabetically: mixer before llama when the sweep says so."""
    first: dict[tuple[str, str], int] = {}
    for v in members:
        for k in axes:
            first.setdefault((k, repr(v.axes.get(k))), len(first))
    numeric = {k for k in axes if all(sort_key(v.axes.get(k))[0] == 0 for v in members)}
    return lambda v: tuple(sort_key(v.axes.get(k)) if k in numeric else (1, first[(k, repr(v.axes.get(k)))], "")
                           for k in axes)


# ---------------------------------------------------------------- cells


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _status_of(runs: list[RunView]) -> str | None:
    """A status word for a cell whose runs have no final loss yet (or ended without one)."""
    statuses = {r.row.status for r in runs}
    for s in ("oom", "diverged", "pruned", "running", "failed", "preempted", "pending", "cancelled", NOT_REACHED,
              BEFORE_FIRST, NO_FLOPS):
        if s in statuses and all(r.row.status != "completed" for r in runs):
            return s
    return None


def finished_values(runs: list[RunView], column: str) -> list[float]:
    """The column's values of the runs that completed with a finite one (a cell's, or a configuration's, numbers)."""
    return read_seeds(runs, lambda v: getattr(v.row, column)).values


def _loss_cell(runs: list[RunView], column: str | Callable[[RunView], float | None], say_n: bool = False,
               said: bool = False) -> str:
    """mean ± the half-width of its 95% t-interval (n); one seed: the value, with (n=1) beside cells that have more;
    `said`: with the runs it left out and why, '(n=3; 1 of 4 diverged)'. `column`: a run row's column, or a value
    read off a run."""
    seeds = read_seeds(runs, column if callable(column) else lambda v: getattr(v.row, column))
    if not seeds.values:
        return _status_of(runs) or (seeds.reason() if seeds.left else "-")
    estimate = mean_ci(seeds.values)
    left = seeds.said() if said else ""
    return estimate.text(said=left) if estimate.n > 1 or say_n or left else f"{estimate.mean:.2f}"


def _bits_per_byte(v: RunView) -> float | None:
    """A causal LM run's test loss in bits per UTF-8 byte of the eval text (its trainer recorded the bytes per scored
    token of the token cache): comparable across tokenizers, where a loss per token is not."""
    per_token = (v.row.notes or {}).get("eval_bytes_per_token")
    loss = v.row.final_eval_loss
    if not per_token or loss is None or (v.trial is not None and v.trial.objective != "clm"):
        return None
    return loss / math.log(2) / per_token


TRAIN_ROUTING_ROW = "Test, top-k routing (not causal)"


def _train_routing(v: RunView) -> float | None:
    """A routed run's test loss with the model routing as in training (top-k over each sequence: not causal)."""
    return (v.row.notes or {}).get("eval_loss_train_routing") if isinstance(v.row.notes, dict) else None


def _as_routed_in_training(v: RunView) -> float | None:
    """The row's value: a routed run's train-routing test loss; a run that does not route computes its test loss one
    way only (the same in both modes), so that one."""
    value = _train_routing(v)
    return value if value is not None else v.row.final_eval_loss


def _tokenizers_note(spec: SweepSpec) -> str:
    """Which tokenizer the published numbers used, beside ours: a loss per token compares only under the same one."""
    theirs = spec.report.reference_tokenizer or "not recorded in the sweep (report.reference_tokenizer)"
    return (f"Tokenizers: ours {spec.tokenizer.describe()}; the published numbers' {theirs}. Losses per token compare "
            "only under the same tokenizer; bits per byte compare across tokenizers.")


def _range_cell(values: list[float | None], fmt: str) -> str:
    """One number, or min–max where the seeds differ."""
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    low, high = fmt.format(min(known)), fmt.format(max(known))
    return low if low == high else f"{low}–{high}"


def _uncertainty_notes(cols: list[list[RunView]], min_steps: int, short: list[bool]) -> list[str]:
    notes = []
    seeds = [len(finished_values(runs, "final_eval_loss")) for runs in cols]
    if max(seeds, default=0) > 1:
        notes.append("Cells: mean ± half-width of the 95% Student-t confidence interval over seeds (n seeds).")
    elif max(seeds, default=0) == 1:
        notes.append("One seed per cell: no confidence intervals (`seeds: 3` in a grid block repeats its trials).")
    if any(short):
        notes.append(f"†: a run of this cell trained fewer than {min_steps} steps (report.min_steps): too few to "
                     "compare; the orderings leave it out.")
    return notes


SPEED_SPREAD = 2.0  # seeds of one configuration this many times apart in tokens/s: the machine's load, not theirs


def _speed_notes(cols: list[list[RunView]], labels: list[str]) -> list[str]:
    """A cell whose seeds (one configuration, one shape) trained more than SPEED_SPREAD times apart in tokens/s:
    the machine was busier for some, so whatever is read in seconds measures the machine as much as the model."""
    said = []
    for label, runs in zip(labels, cols):
        speeds = [r.row.tokens_per_second for r in runs if r.row.status == "completed"
                  and (getattr(r.row, "tokens_per_second", None) or 0) > 0]
        if len(speeds) > 1 and max(speeds) > SPEED_SPREAD * min(speeds):
            said.append(f"{label}: {min(speeds):,.0f}–{max(speeds):,.0f} tokens/s ({max(speeds) / min(speeds):.1f}×)")
    if not said:
        return []
    return [f"Speed: seeds of one configuration trained more than {SPEED_SPREAD:g}× apart in tokens/s ("
            + "; ".join(said) + "): the machine's load differed between them, so their seconds (Train time, a "
            "wall-clock budget, a seconds axis) measure the machine as much as the architecture; steps and tokens "
            "do not."]


def _epochs_of(runs: list[RunView]) -> list[float]:
    return [r.row.epochs for r in runs if r.row.epochs is not None]


def _max_epochs(runs: list[RunView]) -> float:
    return max(_epochs_of(runs), default=0.0)


def _epochs_cell(runs: list[RunView]) -> str:
    values = _epochs_of(runs)
    return f"{statistics.fmean(values):.2f}" if values else "-"


def _ref_cell(runs: list[RunView], which: str) -> str:
    ref = runs[0].reference
    return _fmt(getattr(ref, which)) if ref is not None else ""


def _diff_cell(runs: list[RunView]) -> str:
    ref = runs[0].reference
    values = finished_values(runs, "final_eval_loss")
    if ref is None or ref.eval is None or not values:
        return ""
    return f"{statistics.fmean(values) - ref.eval:+.2f}"


def _memory_cell(runs: list[RunView]) -> str:
    r = runs[0].row
    if r.status == "oom":
        return "OOM"
    if r.status == "completed" and r.peak_memory_mb is not None:
        return f"{r.peak_memory_mb:.0f}"
    return r.status


def _ref_memory(runs: list[RunView]) -> str:
    ref = runs[0].reference
    if ref is None or ref.memory_mb is None:
        return ""
    return ref.memory_mb if isinstance(ref.memory_mb, str) else f"{ref.memory_mb:.0f}"
