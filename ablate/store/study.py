"""A sweep's study kept for the dashboard (study_cache; computed and read by ablate/results/study.py)."""

from __future__ import annotations

import sqlalchemy as sa

from ablate.store.schema import StudyCache


def keep_study(engine: sa.Engine, sweep_id: int, key: str, code: str, payload: str) -> bool:
    """Keep the sweep's study in place of the one kept before; False when another runner kept one at the same
    moment (theirs stands: the same sweep's study)."""
    try:
        with engine.begin() as conn:
            conn.execute(sa.delete(StudyCache).where(StudyCache.sweep_id == sweep_id))
            conn.execute(sa.insert(StudyCache).values(sweep_id=sweep_id, key=key, code=code, payload=payload))
    except sa.exc.IntegrityError:
        return False
    return True
