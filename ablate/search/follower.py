"""Following a trial's run: the eval follower reports the run's intermediate evals to its Optuna trial (step k is
the k-th eval), keeps the trial's heartbeat and asks the pruner; `follow_evals` waits on a run another process trains."""

from __future__ import annotations

import math
import os
import signal
import socket
import threading
import time

import optuna
import sqlalchemy as sa

from ablate.train import budget as bud
from ablate import runner, store


class EvalFollower:
    """Reports a run's new intermediate evals to its Optuna trial, keeps the heartbeat, and asks the pruner."""

    def __init__(self, engine: sa.Engine, run_id: int, storage: optuna.storages.RDBStorage, trial: optuna.Trial,
                 n_evals: int, heartbeat_seconds: float, stop: threading.Event | None):
        self.engine, self.run_id, self.storage, self.trial = engine, run_id, storage, trial
        self.n_evals, self.heartbeat_seconds, self.stop = n_evals, heartbeat_seconds, stop
        self.reported = 0
        self.last_beat = time.monotonic()
        self.pruned = False

    def beat(self) -> None:
        if time.monotonic() - self.last_beat >= self.heartbeat_seconds:
            self.storage.record_heartbeat(self.trial._trial_id)
            self.last_beat = time.monotonic()

    def report_new(self) -> int:
        """Report evals not yet reported; returns how many. The k-th eval of the run is Optuna step k."""
        run = store.get_run(self.engine, self.run_id)
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(store.Metric.step, store.Metric.elapsed_seconds, store.Metric.tokens, store.Metric.loss,
                          store.Metric.eval_point)
                .where(store.Metric.run_id == self.run_id, store.Metric.split == "eval").order_by(store.Metric.step)
            ).all()
        # the final eval (at the whole budget) is the run's result, not an intermediate value; nor is an eval every N
        # steps (eval.every_steps: no eval_point), which no Optuna step stands for
        flops = run.flops_per_token or 0.0
        intermediate = [r for r in rows if r.eval_point is not None and bud.budget_fraction(
            run.budget_kind, run.budget_amount, r.elapsed_seconds, r.step, r.tokens, flops) < 1 - 1e-9][: self.n_evals]
        fresh = intermediate[self.reported:]
        for k, r in enumerate(fresh, start=self.reported + 1):
            if math.isfinite(r.loss):
                self.trial.report(r.loss, step=k)
        self.reported += len(fresh)
        return len(fresh)

    def should_stop(self) -> bool:
        """True when the pruner says so (then `pruned` is set), or when this worker is told to stop."""
        if self.stop is not None and self.stop.is_set():
            return True
        self.beat()
        if self.report_new() and self.trial.should_prune():
            self.pruned = True
            return True
        return False


def follow_evals(engine: sa.Engine, run_id: int, follower: EvalFollower, poll_seconds: float) -> None:
    """Wait for a run another process is training, reporting its evals; a prune stops it if it trains on this host."""
    while store.is_live(run := store.get_run(engine, run_id)):
        if follower.should_stop():
            if follower.pruned and run.host == socket.gethostname() and runner.pid_alive(run.pid):
                os.killpg(run.pid, signal.SIGTERM)  # the trainer checkpoints and records `preempted`
                deadline = time.monotonic() + 120
                while runner.pid_alive(run.pid) and time.monotonic() < deadline:
                    time.sleep(0.2)
                if store.get_run(engine, run_id).status == "preempted":
                    store.update_run(engine, run_id, status="pruned", finished_at=store.utcnow())
            return
        time.sleep(poll_seconds)
