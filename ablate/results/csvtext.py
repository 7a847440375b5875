"""runs.csv and claims.csv written with the csv module: the bytes pandas' `to_csv` gives of the frames that
`runs_of` and `claims_frame` make, without importing pandas (64 MiB resident, a report's peak at 100,000 runs).

Each column's cells are formatted the way pandas formats the type it would infer from them: integers as
integers (a runs-table integer column stays one where NULL, as `frames._integers` keeps it), numbers with a
float or a gap as floats ("100.0"), datetimes at the finest precision any of them needs, anything else as `str`,
and a gap as an empty field. pandas decides a datetime column's format per chunk it writes, so do these (per
CSV_CHUNK rows, the chunk `frames.to_csv` hands it)."""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from ablate import store

CSV_CHUNK = 2_000  # rows made cells (pandas: a frame, its JSON columns text) at one time
INT64 = (-(2**63), 2**63 - 1)


def write_runs_csv(by_sweep: dict[str, list[Any]], path: Any) -> None:
    """runs.csv of sweeps' runs already in memory: the file `frames.to_csv` writes of their `runs_of` frames one
    after the other. Each sweep's varying config fields are columns typed over the whole sweep, as `runs_of` makes
    them (an integer field NULL in some run is float everywhere), and a column another sweep lacks is empty in
    its rows."""
    table = [*(name for name, _ in table_keys()), "sweep"]
    columns, sweeps = list(table), []
    for name, rows in by_sweep.items():
        rows = sorted(rows, key=lambda r: r.id)
        varying = {key: cells(values) for key, values in varying_fields(rows, table).items()}
        columns += [key for key in varying if key not in columns]
        sweeps.append((name, rows, varying))
    kinds = [_table_cells(column) for column in store.Run.__table__.columns] + [cells]
    with open(path, "w", encoding="utf-8", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        if sweeps:
            out.writerow(columns)
        for name, rows, varying in sweeps:
            for start in range(0, len(rows), CSV_CHUNK):
                part = records(rows[start:start + CSV_CHUNK], name)
                made = [kind(values) for kind, values in zip(kinds, zip(*part))]
                made += [varying[key][start:start + CSV_CHUNK] if key in varying else [""] * len(part)
                         for key in columns[len(kinds):]]
                out.writerows(zip(*made))


def write_records_csv(rows: Sequence[Sequence[Any]], columns: Sequence[str], path: Any) -> None:
    """`pd.DataFrame.from_records(rows, columns=columns).to_csv(path, index=False, lineterminator="\\n")`."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(columns)
        for start in range(0, len(rows), CSV_CHUNK):
            part = [[_python(v) for v in row] for row in rows[start:start + CSV_CHUNK]]
            out.writerows(zip(*(cells(values) for values in zip(*part))))


def table_keys() -> list[tuple[str, str]]:
    """The runs table's columns, each with the ORM attribute that holds it."""
    mapper = sa.inspect(store.Run)
    return [(column.name, mapper.get_property_by_column(column).key) for column in store.Run.__table__.columns]


def records(rows: Iterable[Any], sweep: str) -> list[tuple[Any, ...]]:
    """Each run's values in the runs table's column order, then its sweep's name. A run is a row of the runs table
    (load_views: its values as they are) or an ORM Run."""
    keys = table_keys()
    names = tuple(name for name, _ in keys)
    made = []
    table_rows: dict[Any, bool] = {}  # per result a row came from (its _fields: 2.5 µs a call)
    for run in rows:
        if isinstance(run, sa.Row) and table_rows.setdefault(run._parent, run._fields == names):
            made.append((*run, sweep))
        else:
            made.append((*(getattr(run, key) for _, key in keys), sweep))
    return made


def cells(values: Sequence[Any]) -> list[str]:
    """A column's values as pandas writes the column it infers from them."""
    gaps = [v is None or (type(v) is float and v != v) for v in values]  # what pandas writes empty: None, NaN
    present = [v for v, gap in zip(values, gaps) if not gap]
    types = {type(v) for v in present}
    if types <= {int, float} and (float in types or len(present) < len(values)) and \
            all(INT64[0] <= v <= INT64[1] for v in present if type(v) is int):
        return ["" if gap else repr(float(v)) for v, gap in zip(values, gaps)]
    if present and types == {dt.datetime} and not any(v.tzinfo for v in present):
        return _datetimes(values, present)
    return ["" if gap else str(v) for v, gap in zip(values, gaps)]


def varying_fields(rows: list[Any], columns: Any) -> dict[str, list[Any]]:
    """The config fields that differ between the runs and are not among `columns`: each one's value per run."""
    return varying_of([r.config for r in rows], columns) if rows else {}


def varying_of(configs: list[Any], columns: Any) -> dict[str, list[Any]]:
    """Each config field that differs between `configs` and is not among `columns`: its value in every run."""
    from ablate.config.trial import fields_that_differ

    varying, flats = fields_that_differ(configs, skip=("seed", "options", "objective_options"))
    return {key: [flat.get(key) for flat in flats] for key in varying if key not in columns}


def _table_cells(column: sa.Column) -> Callable[[Sequence[Any]], list[str]]:
    """How a runs-table column is written: JSON as sorted JSON text, integers as integers (Int64) even where
    NULL, the rest by what its values are."""
    if isinstance(column.type, sa.JSON):
        return _json_cells
    if isinstance(column.type, sa.Integer):
        return lambda values: ["" if v is None else str(int(v)) for v in values]
    return cells


def _json_cells(values: Sequence[Any]) -> list[str]:
    import orjson

    as_text = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
    return ["" if v is None else orjson.dumps(v, option=as_text).decode() for v in values]


def _datetimes(values: Sequence[Any], present: list[dt.datetime]) -> list[str]:
    """pandas' default: the date alone when every one is midnight, else seconds and the fraction the finest needs."""
    values = [None if v is None or type(v) is float else v for v in values]  # a NaN in a datetime column: NaT
    if all(v.hour == v.minute == v.second == v.microsecond == 0 for v in present):
        return ["" if v is None else v.strftime("%Y-%m-%d") for v in values]
    if any(v.microsecond % 1000 for v in present):
        return ["" if v is None else v.strftime("%Y-%m-%d %H:%M:%S.%f") for v in values]
    if any(v.microsecond for v in present):
        return ["" if v is None else f"{v:%Y-%m-%d %H:%M:%S}.{v.microsecond // 1000:03d}" for v in values]
    return ["" if v is None else v.strftime("%Y-%m-%d %H:%M:%S") for v in values]


def _python(value: Any) -> Any:
    """A numpy scalar (a statistic's mean, a count) as the Python value pandas reads it as."""
    return value.item() if type(value).__module__ == "numpy" and hasattr(value, "item") else value
