"""The results database's tables (SQLAlchemy ORM) and the run statuses they hold.

Alembic owns the schema (`migrations/`); a test checks these models against the migrations' result.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

RUN_STATUSES = ("pending", "running", "completed", "oom", "diverged", "failed", "preempted", "cancelled", "pruned")
FINISHED = ("completed", "oom", "diverged", "pruned")  # results: a re-run of the sweep skips these (pruned: by a search)
OWED_UNSTARTED = ("pending", "failed", "cancelled", "preempted")  # owed work that holds no result


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: sa.JSON}


class Sweep(Base):
    __tablename__ = "sweeps"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200), unique=True)
    description: Mapped[str] = mapped_column(sa.Text, default="")
    spec: Mapped[dict[str, Any]] = mapped_column(sa.JSON)  # the validated spec, as JSON
    spec_fingerprint: Mapped[str] = mapped_column(sa.String(32))
    spec_path: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class Run(Base):
    """One trial of a sweep. The sweep axes are real columns so SQL can group and filter on them."""

    __tablename__ = "runs"
    __table_args__ = (sa.UniqueConstraint("sweep_id", "fingerprint", name="uq_runs_sweep_fingerprint"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    sweep_id: Mapped[int] = mapped_column(sa.ForeignKey("sweeps.id", ondelete="CASCADE"))  # uq_runs_sweep_fingerprint
    fingerprint: Mapped[str] = mapped_column(sa.String(32))
    trial_index: Mapped[int] = mapped_column(default=0)
    status: Mapped[str] = mapped_column(sa.String(16), default="pending", index=True)
    # axes
    architecture: Mapped[str] = mapped_column(sa.String(64), index=True)
    objective: Mapped[str] = mapped_column(sa.String(32))
    d_model: Mapped[int]
    layers: Mapped[int]
    heads: Mapped[int | None]
    context: Mapped[int]
    lr: Mapped[float]
    batch_size: Mapped[int]
    seed: Mapped[int]
    options: Mapped[dict[str, Any]] = mapped_column(sa.JSON, default=dict)
    config: Mapped[dict[str, Any]] = mapped_column(sa.JSON)  # the full frozen trial config
    # where and how
    hardware: Mapped[str] = mapped_column(sa.String(64))
    gpus: Mapped[int] = mapped_column(default=1)
    budget_kind: Mapped[str] = mapped_column(sa.String(16))
    budget_amount: Mapped[float]  # seconds, tokens, steps or FLOPs
    host: Mapped[str | None] = mapped_column(sa.String(200))
    device_name: Mapped[str | None] = mapped_column(sa.String(200))
    attempts: Mapped[int] = mapped_column(default=0)
    pid: Mapped[int | None]  # the trainer process while running (cancel signals it)
    claimed_by: Mapped[str | None] = mapped_column(sa.String(200))  # host:pid:nonce of the process that trains it
    heartbeat_at: Mapped[dt.datetime | None]  # the claimant's last sign of life (UTC); stale: the run is owed again
    threads: Mapped[int | None]  # torch intra-op threads of the trainer (CPU share of this trial)
    precision: Mapped[str | None] = mapped_column(sa.String(8))  # what ran: bf16, fp16 (with a scaler) or fp32
    # timings (seconds); train_seconds is the budget clock
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    started_at: Mapped[dt.datetime | None]
    finished_at: Mapped[dt.datetime | None]
    train_seconds: Mapped[float | None]
    startup_seconds: Mapped[float | None]
    compile_seconds: Mapped[float | None]
    eval_seconds: Mapped[float | None]
    checkpoint_seconds: Mapped[float | None]
    data_wait_fraction: Mapped[float | None]
    # outcome
    steps: Mapped[int | None]
    tokens: Mapped[int | None] = mapped_column(sa.BigInteger)
    samples: Mapped[int | None] = mapped_column(sa.BigInteger)
    tokens_per_second: Mapped[float | None]
    flops_per_token: Mapped[float | None]
    mfu: Mapped[float | None]
    final_train_loss: Mapped[float | None]
    final_eval_loss: Mapped[float | None]
    final_eval_accuracy: Mapped[float | None]  # classification runs: the fraction of eval rows classified right
    # the latest logged points, kept by write_metrics so status tables never aggregate the metrics table
    last_step: Mapped[int | None]
    last_elapsed_seconds: Mapped[float | None]
    last_train_loss: Mapped[float | None]
    last_eval_loss: Mapped[float | None]
    epochs: Mapped[float | None]  # passes over the training rows (> 1: the run saw its data more than once)
    peak_memory_mb: Mapped[float | None]
    params: Mapped[int | None] = mapped_column(sa.BigInteger)
    inter_token_params: Mapped[int | None] = mapped_column(sa.BigInteger)
    error: Mapped[str | None] = mapped_column(sa.Text)
    notes: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)  # e.g. on_oom shrink events
    checkpoint_path: Mapped[str | None] = mapped_column(sa.Text)
    # reproducibility
    code_version: Mapped[str | None] = mapped_column(sa.String(64))  # ablate's, then its plugins' (run_code)
    library_versions: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
    # search linkage (Optuna study name and trial number)
    study_name: Mapped[str | None] = mapped_column(sa.String(200), index=True)
    study_trial: Mapped[int | None]


class Metric(Base):
    """One logged point of a run's curve. (run, split, step) is unique: a resumed run never duplicates a point."""

    __tablename__ = "metrics"
    __table_args__ = (
        sa.UniqueConstraint("run_id", "split", "step", name="uq_metrics_run_split_step"),  # also serves run_id alone
        sa.Index("ix_metrics_eval", "run_id", "step", sqlite_where=sa.text("split = 'eval'"),
                 postgresql_where=sa.text("split = 'eval'")),  # eval curves without scanning train points
        sa.Index("ix_metrics_eval_point", "eval_point", sqlite_where=sa.text("split = 'eval'"),
                 postgresql_where=sa.text("split = 'eval'")),  # "the loss at 50%" of every run (eval_curve)
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int]
    split: Mapped[str] = mapped_column(sa.String(16))  # train | eval
    elapsed_seconds: Mapped[float]  # budget clock at this point
    tokens: Mapped[int] = mapped_column(sa.BigInteger)
    loss: Mapped[float]
    lr: Mapped[float | None]
    eval_point: Mapped[float | None]  # eval rows: the eval.at budget fraction this eval is for (1.0: the final eval)


class PluginSource(Base):
    """A file plugin's source by the identity of its code ('file:<sha256[:16]>'): a trial's `code` names it, and a
    worker that never saw the file materialises it from here (ablate/plugins/stored.py)."""

    __tablename__ = "plugin_sources"
    identity: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    path: Mapped[str] = mapped_column(sa.Text)  # where it was registered from
    text: Mapped[str] = mapped_column(sa.Text)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class PluginFacts(Base):
    """What readers know of a plugin without running its code, recorded when its sweep was registered: its
    description, options' defaults and (objectives) what reports read of it (ablate/plugins/recorded.py)."""

    __tablename__ = "plugin_facts"
    name: Mapped[str] = mapped_column(sa.String(200), primary_key=True)
    identity: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    facts: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class RaceDecision(Base):
    """What one round of an adaptive sweep's race decided for one claim cell (ablate/results/race.py): derived from
    the runs, so a race replayed after a restart writes the same rows, each once."""

    __tablename__ = "race_decisions"
    sweep_id: Mapped[int] = mapped_column(sa.ForeignKey("sweeps.id"), primary_key=True)
    round: Mapped[int] = mapped_column(primary_key=True)
    claim_key: Mapped[str] = mapped_column(sa.String(64), primary_key=True)  # hash of the claim cell's description
    claim: Mapped[str] = mapped_column(sa.Text)  # the claim cell: its ordering, where, and the two sides
    n_better: Mapped[int]
    n_worse: Mapped[int]
    statistic: Mapped[float | None]  # the look's z (Welch's t as the z of the same two-sided p, calibrated)
    boundary: Mapped[float | None]  # the group-sequential boundary it was compared with
    level: Mapped[float]  # the claim's share of alpha at that round (Holm)
    decision: Mapped[str] = mapped_column(sa.String(200))  # continue, or the verdict in the report's words
    decided_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class StudyCache(Base):
    """A sweep's study (the dashboard's tables, claims and race: ablate/results/study.py) as it stood at `key`,
    computed by `code`: kept by a big sweep's runner as it trains and at its end, so a dashboard, which only
    reads, shows it at once. Derived data: a different key or code computes it again."""

    __tablename__ = "study_cache"
    sweep_id: Mapped[int] = mapped_column(sa.ForeignKey("sweeps.id"), primary_key=True)
    key: Mapped[str] = mapped_column(sa.Text)  # the sweep's finished runs, spec and race decisions, as one text
    code: Mapped[str] = mapped_column(sa.String(64))  # the code_version that computed it
    payload: Mapped[str] = mapped_column(sa.Text)  # the study as JSON
    computed_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class Meta(Base):
    """Facts about the database itself: `db_id`, the identity that keys its runs' artifacts."""

    __tablename__ = "ablate_meta"
    key: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    value: Mapped[str] = mapped_column(sa.Text)
