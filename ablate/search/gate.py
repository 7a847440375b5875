"""A search's parallel trials fused: the workers of one `run_search` (threads) meet here before training, and the
runs that fuse (ablate/config/fusion.py, the spec's `fuse:`) train as one group in one trainer process, led by one of
their workers' threads (runner.run_group). Each worker still samples, follows and tells its own trial.

A member that its pruner stops leaves the group alone: its claim is taken back and its row set `pruned` (its
trainer drops the member at its next heartbeat, as a fused member that lost its claim does) and its worker goes on
to its next trial at once. A worker told to stop (Ctrl-C) stops the whole group: every member checkpoints and is
re-queued, as a solo trial is. A worker that arrives alone waits GATHER_SECONDS for the others, then trains what
has gathered.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import sqlalchemy as sa

from ablate import runner, store

GATHER_SECONDS = 5.0  # how long a worker about to train waits for the others to reach the gate


class Ticket:
    """One worker's run at the gate: its eval follower, and once the group has trained, its status (or error)."""

    def __init__(self, run_id: int, follower: Any, opts: runner.LaunchOptions):
        self.run_id, self.follower, self.opts = run_id, follower, opts
        self.members: list[Ticket] | None = None  # the group this run trains in, its leader first
        self.status: str | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()


class Gate:
    """Where `workers` search workers gather their runs into fused groups under `mode`."""

    def __init__(self, workers: int, mode: str, engine: sa.Engine, gpus_per_trial: int = 1,
                 gather_seconds: float | None = None):
        self.active, self.mode, self.engine = workers, mode, engine
        self.gather_seconds = GATHER_SECONDS if gather_seconds is None else gather_seconds
        self.waiting: dict[int, Ticket] = {}
        self.cond = threading.Condition()
        # a group (or a one-GPU trial without GPUs of its own) trains on the GPU with the fewest trainers: the workers
        # may outnumber the GPUs, and a group's members' own GPUs would idle while it trains
        self.gpus = runner.visible_gpus() if gpus_per_trial == 1 else 0
        self.load = [0] * self.gpus

    def leave(self) -> None:
        """A worker is done (no trial left for it): the others no longer wait for it."""
        with self.cond:
            self.active -= 1
            self.cond.notify_all()

    def train(self, run_id: int, follower: Any, opts: runner.LaunchOptions, poll_seconds: float) -> str:
        """Train the run, fused with the others' that have gathered and fuse with it; its status (`pruned` when
        its pruner stopped it)."""
        ticket = Ticket(run_id, follower, opts)
        with self.cond:
            self.waiting[run_id] = ticket
            self.cond.notify_all()
            deadline = time.monotonic() + self.gather_seconds
            while ticket.members is None and len(self.waiting) < self.active:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            if ticket.members is None:  # this worker forms the groups of everything gathered
                self._form(self.waiting)
                self.waiting = {}
                self.cond.notify_all()
        if ticket.members[0] is ticket:  # in a thread of its own: a pruned member's worker goes on at once, leader too
            threading.Thread(target=self._lead, args=(ticket.members, poll_seconds), name=f"group-{run_id}").start()
        ticket.done.wait()
        if ticket.error is not None:
            raise ticket.error
        return ticket.status

    def _form(self, gathered: dict[int, Ticket]) -> None:
        for ids in runner.plan_groups(self.engine, list(gathered), self.mode, self.gpus):
            members = [gathered[rid] for rid in ids]
            for t in members:
                t.members = members

    def _lead(self, members: list[Ticket], poll_seconds: float) -> None:
        """Train the group (one run: as a solo trial), then hand every member its status (or the error)."""
        lead = members[0]
        gpu = self._place(lead.opts if len(members) == 1 else None)
        opts = lead.opts if gpu is None else lead.opts.but(gpu_ids=(gpu,))
        try:
            if len(members) == 1:
                statuses = {lead.run_id: runner.run_trial(lead.run_id, opts, should_stop=lead.follower.should_stop,
                                                          poll_seconds=poll_seconds, statuses=store.OWED_UNSTARTED)}
            else:
                statuses = runner.run_group([t.run_id for t in members], opts, poll_seconds=poll_seconds,
                                            should_stop=lambda: self._should_stop(members),
                                            statuses=store.OWED_UNSTARTED)
        except BaseException as exc:  # noqa: BLE001 - raised in every member's worker that has no answer yet
            for t in members:
                if not t.done.is_set():
                    t.error = exc
                    t.done.set()
            return
        finally:
            if gpu is not None:
                with self.cond:
                    self.load[gpu] -= 1
        for t in members:
            if not t.done.is_set():
                t.status = statuses[t.run_id]
                t.done.set()

    def _place(self, solo: runner.LaunchOptions | None) -> int | None:
        """The GPU a group (`solo`: a trial's own options) trains on, counted as busy; None: its own, or no GPU."""
        if not self.gpus or (solo is not None and solo.gpu_ids is not None):
            return None
        with self.cond:
            gpu = min(range(self.gpus), key=lambda g: (self.load[g], g))
            self.load[gpu] += 1
        return gpu

    def _should_stop(self, members: list[Ticket]) -> bool:
        """Asked while the group trains: each member's follower reports its evals and asks its pruner; a pruned member
        leaves the group and its worker goes on; True (stop the group) when a worker is told to stop, or none is left."""
        for t in members:
            if t.done.is_set():
                continue
            if t.follower.should_stop():
                if not t.follower.pruned:
                    return True  # the worker is stopping: every member checkpoints and is re-queued
                if prune(self.engine, t.run_id):
                    t.status = "pruned"
                    t.done.set()
        return all(t.done.is_set() for t in members)


def prune(engine: sa.Engine, run_id: int) -> bool:
    """A member of a training group pruned: its row `pruned` and its claim taken back (its trainer drops it at the
    next heartbeat); False when it has already ended."""
    with engine.begin() as conn:
        return conn.execute(sa.update(store.Run).where(store.Run.id == run_id, store.Run.status == "running").values(
            status="pruned", claimed_by=None, pid=None, finished_at=store.utcnow())).rowcount == 1
