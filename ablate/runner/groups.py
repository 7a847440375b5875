"""Fused groups on a host: the runs a sweep owes put in groups (ablate/config/fusion.py), and a group trained as
one trainer process (`python -m ablate.train --run-ids ...`, ablate/train/fused.py) under one claim; a group that
runs out of memory is trained again as two halves. A group of one is a solo trial (trials.run_trial)."""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa

from ablate import store
from ablate.config import TrialConfig, fusion
from ablate.config.errors import AblateError
from ablate.runner.launch import LaunchOptions, group_command, trainer_command
from ablate.runner.trials import (CLAIMABLE, STOP, classify, release, run_trial, start_trainer, trainer_setup,
                                  wait_for)

SPLIT_EXIT = 4  # the group trainer's exit code when it ran out of memory (ablate.train.fused.SPLIT_EXIT; no torch here)


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


def run_group(run_ids: list[int], opts: LaunchOptions, should_stop: Callable[[], bool] | None = None,
              poll_seconds: float = 1.0, statuses: tuple[str, ...] = CLAIMABLE,
              on_claimed: Callable[[], None] | None = None) -> dict[int, str]:
    """Claim the runs and train them as one fused group; {run id: final status}. Runs another process holds or has
    finished are left alone (the group trains the rest); one run claimed trains solo. Stopping (STOP,
    `should_stop`) and a trainer that dies are as in run_trial; out of memory splits the group in two."""
    if len(run_ids) == 1:
        return {run_ids[0]: run_trial(run_ids[0], opts, should_stop, poll_seconds, statuses, on_claimed)}
    engine = store.connect(opts.db_url)
    if STOP.is_set():
        return {rid: store.get_run(engine, rid).status for rid in run_ids}
    claimant = store.new_claimant()
    claimed = [rid for rid in run_ids if store.claim_run(engine, rid, claimant, statuses)]
    results = {rid: store.get_run(engine, rid).status for rid in run_ids if rid not in claimed}
    if claimed and on_claimed is not None:
        on_claimed()
    trials = {}
    for rid in claimed:
        try:
            trials[rid] = TrialConfig.model_validate(store.get_run(engine, rid).config)
        except (AblateError, ValueError) as exc:  # e.g. a plugin this worker lacks: failed, before any training
            store.update_run(engine, rid, claimant=claimant, status="failed", error=store.redact(str(exc)),
                             finished_at=store.utcnow())
            results[rid] = "failed"
    ids = list(trials)
    if not ids:
        return results
    first = trials[ids[0]]
    command = group_command(ids, opts) if len(ids) > 1 else None
    try:  # as run_trial: anything between the claims and the trainer's start gives the runs back
        log_path, env = trainer_setup(engine, ids[0], claimant, opts)
        for rid in ids[1:]:  # each run's own log says where its group's is
            with open(log_path.with_name(f"run-{rid}.log"), "a") as log:
                log.write(f"trained in a fused group with runs {ids}: the group's log is {log_path}\n")
        with open(log_path, "ab") as log:
            proc = start_trainer(command or trainer_command(first, ids[0], opts), env, log, log_path, opts.artifacts,
                                 opts.warm, families=(first.architecture,))
    except BaseException as exc:
        for rid in ids:
            release(engine, rid, claimant, exc)
        raise
    for rid in ids:
        store.update_run(engine, rid, claimant=claimant, pid=proc.pid)
    code = wait_for(proc, should_stop, poll_seconds)
    if code == SPLIT_EXIT and len(ids) > 1 and not STOP.is_set():
        half, again = len(ids) // 2, (*statuses, "preempted")  # each member checkpointed and ended `preempted`
        for part in (ids[:half], ids[half:]):
            results.update(run_group(part, opts, should_stop, poll_seconds, again))
        return results
    for rid in ids:
        results[rid] = classify(engine, rid, code, log_path, claimant)
    return {rid: results[rid] for rid in run_ids}
