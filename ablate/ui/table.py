"""The dashboard's runs table on the server side: a filter a user types (`d_model=64 status!=completed eval<4.5
mixer`), a sort by any column, and pages, over the light rows of results.live.run_rows."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ablate.config.errors import AblateError
from ablate.results.status import EXTRA, FIRST, LAST  # a status row's columns before and after the axes; on request
from ablate.results.views import sort_key

OPS = ("!=", ">=", "<=", "=", ">", "<")
_TERM = re.compile(r"^([A-Za-z_][\w.]*)\s*(!=|>=|<=|=|>|<)(.*)$")


@dataclass(frozen=True)
class Term:
    key: str | None  # None: the text may appear in any cell
    op: str
    value: str


def columns(rows: list[dict[str, Any]]) -> list[str]:
    """The table's columns: run, status, progress, then the axes in the rows' order, then the progress columns;
    an axis whose value is the same in every row is left out (it is in the sweep's header); EXTRA on request."""
    keys = [k for k in all_keys(rows) if k not in FIRST and k not in LAST and k not in EXTRA]
    varying = [k for k in keys if len({repr(r.get(k)) for r in rows}) > 1]
    return [*FIRST, *varying, *LAST]


def all_keys(rows: list[dict[str, Any]]) -> list[str]:
    """Every key of the rows, in first-seen order (the rows' dicts, merged at C speed)."""
    keys: dict[str, None] = {}
    for r in rows:
        keys.update(dict.fromkeys(r))
    return list(keys)


def parse_filter(text: str, known: list[str]) -> list[Term]:
    """Terms separated by spaces: `KEY=VALUE` (also != > >= < <=) on a column, or a bare word to find in any cell.
    An unknown column is refused with the ones there are."""
    terms = []
    for word in (text or "").split():
        m = _TERM.match(word)
        if not m:
            terms.append(Term(None, "~", word.lower()))
            continue
        key, op, value = m.groups()
        if key not in known:
            close = [k for k in known if k.endswith("." + key)]
            raise AblateError(f"filter: no column {key!r}" + (f" (did you mean {close[0]}?)" if close else "")
                              + f"; columns: {', '.join(known)}")
        terms.append(Term(key, op, value))
    return terms


def matches(row: dict[str, Any], terms: list[Term]) -> bool:
    return all(_holds(row, t) for t in terms)


def _holds(row: dict[str, Any], t: Term) -> bool:
    if t.key is None:
        return any(t.value in str(v).lower() for v in row.values() if v is not None)
    have = row.get(t.key)
    a, b = _number(have), _number(t.value)
    if a is not None and b is not None:
        return {"=": a == b, "!=": a != b, ">": a > b, ">=": a >= b, "<": a < b, "<=": a <= b}[t.op]
    text, want = ("" if have is None else str(have)).lower(), t.value.lower()
    if t.op in ("=", "!="):
        return (text == want) == (t.op == "=")
    return False  # an order between a number and a word, or between words: no row holds it


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return float(str(v))
    except ValueError:
        return None


def sort_rows(rows: list[dict[str, Any]], sort: str, known: list[str]) -> list[dict[str, Any]]:
    """Rows sorted by a column (`-column`: descending); empty cells always last."""
    if not sort:
        return rows
    key = sort.lstrip("-")
    if key not in known:
        raise AblateError(f"sort: no column {key!r}; columns: {', '.join(known)}")
    present = [r for r in rows if r.get(key) is not None]
    empty = [r for r in rows if r.get(key) is None]
    return sorted(present, key=lambda r: sort_key(r[key]), reverse=sort.startswith("-")) + empty


def page(rows: list[dict[str, Any]], text: str, sort: str, offset: int, limit: int,
         cols: list[str] | None = None, shown: str = "") -> dict[str, Any]:
    """One page of the filtered, sorted table, with the columns (`cols`: as `columns(rows)` gave them; `shown`:
    the ones a user chose, comma separated), every column there is, the total and the number that matched."""
    cols = columns(rows) if cols is None else cols
    every = available(rows, cols)
    cols = chosen(shown, every) or cols
    picked = selected(rows, text, sort)
    offset = max(0, offset)
    return {"columns": cols, "available": every, "rows": [{k: r.get(k) for k in cols} for r in picked[offset:offset + limit]],
            "total": len(rows), "matched": len(picked), "offset": offset, "limit": limit}


def available(rows: list[dict[str, Any]], cols: list[str]) -> list[str]:
    """Every column a user can show: the default ones, then the rest the rows have (axes that do not vary, EXTRA)."""
    return list(dict.fromkeys([*cols, *(k for r in rows[:1] for k in r if not k.startswith("_"))]))


def chosen(shown: str, every: list[str]) -> list[str]:
    """The columns named in `shown` (comma separated; `run` always first); an unknown one is refused."""
    names = [c.strip() for c in (shown or "").split(",") if c.strip()]
    unknown = [c for c in names if c not in every]
    if unknown:
        raise AblateError(f"columns: no column {unknown[0]!r}; columns: {', '.join(every)}")
    return ["run", *(c for c in names if c != "run")] if names else []


def selected(rows: list[dict[str, Any]], text: str, sort: str) -> list[dict[str, Any]]:
    """Every row the filter keeps, in the sort's order (the chart plots what the table shows)."""
    known = all_keys(rows)
    terms = parse_filter(text, known)
    return sort_rows([r for r in rows if matches(r, terms)] if terms else list(rows), sort, known)


def csv_text(rows: list[dict[str, Any]], cols: list[str]) -> str:
    """Rows as CSV. A text cell that a spreadsheet would run as a formula (=, +, -, @ first) is kept as text
    with a leading apostrophe: a run's error or a sweep's name comes from whoever wrote the spec."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(cols)
    for r in rows:
        writer.writerow([_cell(r.get(c)) for c in cols])
    return out.getvalue()


def _cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, str) and v[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + v
    return v
