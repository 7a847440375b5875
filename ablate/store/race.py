"""An adaptive sweep's race in the DB: each round's decision per claim cell, written once however many runners
replay the race (the rows are derived from the runs, so a replay writes the same ones)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from ablate.store.schema import RaceDecision


def record_decisions(engine: sa.Engine, sweep_id: int, rows: Iterable[dict[str, Any]]) -> int:
    """Insert the decisions (dicts of RaceDecision's columns but sweep_id) not recorded yet; how many were new.
    Two runners at once: the loser of an insert race finds the rows there and writes nothing."""
    rows = list(rows)
    if not rows:
        return 0
    for attempt in range(5):
        try:
            with engine.begin() as conn:
                have = set(conn.execute(sa.select(RaceDecision.round, RaceDecision.claim_key)
                                        .where(RaceDecision.sweep_id == sweep_id)).all())
                new = [{**r, "sweep_id": sweep_id} for r in rows if (r["round"], r["claim_key"]) not in have]
                if new:
                    conn.execute(sa.insert(RaceDecision), new)
                return len(new)
        except sa.exc.IntegrityError:  # another runner wrote them first: read theirs
            if attempt == 4:
                raise
    return 0


def read_decisions(engine: sa.Engine, sweep_id: int) -> list[RaceDecision]:
    """The race's decisions, by round then claim."""
    from sqlalchemy.orm import Session

    with Session(engine) as session:
        return list(session.scalars(sa.select(RaceDecision).where(RaceDecision.sweep_id == sweep_id)
                                    .order_by(RaceDecision.round, RaceDecision.claim)))
