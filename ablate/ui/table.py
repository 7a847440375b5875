"""The dashboard's runs table on the server side: a filter a user types (`d_model=64 status!=completed eval<4.5
mixer`), a sort by any column, and pages, over the light rows of results.live.run_rows."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ablate.config.errors import AblateError
from ablate.results.status import FIRST, LAST  # a status row's columns before and after the axes
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
    an axis whose value is the same in every row is left out (it is in the sweep's header)."""
    keys: dict[str, None] = {}
    for r in rows:
        keys.update(dict.fromkeys(k for k in r if k not in FIRST and k not in LAST))
    varying = [k for k in keys if len({repr(r.get(k)) for r in rows}) > 1]
    return [*FIRST, *varying, *LAST]


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
         cols: list[str] | None = None) -> dict[str, Any]:
    """One page of the filtered, sorted table, with the columns (`cols`: as `columns(rows)` gave them), the total
    and the number that matched."""
    cols = columns(rows) if cols is None else cols
    picked = selected(rows, text, sort)
    offset = max(0, offset)
    return {"columns": cols, "rows": [{k: r.get(k) for k in cols} for r in picked[offset:offset + limit]],
            "total": len(rows), "matched": len(picked), "offset": offset, "limit": limit}


def selected(rows: list[dict[str, Any]], text: str, sort: str) -> list[dict[str, Any]]:
    """Every row the filter keeps, in the sort's order (the chart plots what the table shows)."""
    known = list(dict.fromkeys(k for r in rows for k in r))
    terms = parse_filter(text, known)
    return sort_rows([r for r in rows if matches(r, terms)] if terms else list(rows), sort, known)
