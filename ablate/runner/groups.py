"""Fused groups on a host: the runs a sweep owes put in groups (ablate/config/fusion.py); trials.run_group trains a
group as one trainer process (`python -m ablate.train --run-ids ...`, ablate/train/fused.py) under one claim."""

from __future__ import annotations

import sqlalchemy as sa

from ablate import store
from ablate.config import TrialConfig, fusion
from ablate.config.errors import AblateError


def plan_groups(engine: sa.Engine, run_ids: list[int], mode: str, gpus: int, most: int = fusion.FUSE_MAX) -> list[list[int]]:
    """`run_ids` (in dispatch order) in fused groups under `mode` on a host with `gpus` GPUs: every id once."""
    if mode == "off" or len(run_ids) < 2:
        return [[rid] for rid in run_ids]
    with engine.connect() as conn:
        configs = dict(conn.execute(sa.select(store.Run.id, store.Run.config).where(store.Run.id.in_(run_ids))).all())
    trials: dict[int, TrialConfig | None] = {}
    for rid in run_ids:
        try:
            trials[rid] = TrialConfig.model_validate(configs[rid])
        except (ValueError, AblateError):  # one this host cannot read (a plugin it lacks) fails alone, as its trial
            trials[rid] = None
    readable = {rid: t for rid, t in trials.items() if t is not None}
    fuses = (lambda t: fusion.pays(t, gpus)) if mode == "auto" else None
    grouped = fusion.groups(readable, mode, most, fuses)
    return grouped + [[rid] for rid, t in trials.items() if t is None]
