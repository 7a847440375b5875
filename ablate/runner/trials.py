"""Runs trials as subprocesses, classifies their outcome into the run row, picks what a sweep still owes, and
cancels a sweep's runs and trainers.

Plain functions, usable from the CLI, a notebook or a test; `flows/` wraps them for Prefect.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from ablate import store
from ablate.runner.host import pid_alive, sharing_env, worker_host
from ablate.runner.launch import LaunchOptions, group_command, trainer_command
from ablate.runner.sweep import sweep_runs
from ablate.config import TrialConfig
from ablate.config.errors import AblateError
from ablate.config.settings import environment

MAX_ATTEMPTS = 3  # a failed run is retried by later sweeps until it has had this many attempts
TERMINAL = ("completed", "oom", "diverged", "failed", "preempted", "cancelled")

# Set when the user stops this process (Ctrl-C, SIGTERM): running trainers checkpoint and end `preempted`,
# and no further trial starts. Process-wide, because trials run in threads of Prefect flows.
STOP = threading.Event()
STOP_GRACE_SECONDS = 150.0  # how long a stopped sweep waits for its trainers to checkpoint
CLAIMABLE = ("pending", "failed", "preempted")  # what a runner takes by default (not `cancelled`: the user's word)
SPLIT_EXIT = 4  # a fused group's trainer ran out of memory (ablate.train.fused.SPLIT_EXIT; no torch here)


def run_trial(run_id: int, opts: LaunchOptions, should_stop: Callable[[], bool] | None = None,
              poll_seconds: float = 1.0, statuses: tuple[str, ...] = CLAIMABLE,
              on_claimed: Callable[[], None] | None = None) -> str:
    """Claim one run and train it to the end (resuming from its checkpoint if it has one); its final status.

    The claim is atomic: when another process (a second runner, a search worker, another host) holds the
    run or has finished it, nothing starts and the row's current status is returned. `should_stop` is
    polled while the trainer runs (e.g. an Optuna pruner reading the eval metrics); when it, or `STOP`,
    says so, the trainer gets SIGTERM, checkpoints, and the run ends `preempted`. `on_claimed` is called once this
    call holds the claim (a run left alone never calls it).
    """
    return run_group([run_id], opts, should_stop, poll_seconds, statuses, on_claimed)[run_id]


def run_group(run_ids: list[int], opts: LaunchOptions, should_stop: Callable[[], bool] | None = None,
              poll_seconds: float = 1.0, statuses: tuple[str, ...] = CLAIMABLE,
              on_claimed: Callable[[], None] | None = None) -> dict[int, str]:
    """Claim the runs and train them in one trainer process, as run_trial says of one run; {run id: final status}.
    Several runs train as one fused group (`python -m ablate.train --run-ids ...`, ablate/train/fused.py); runs
    another process holds or has finished are left alone, the group trains the rest, and one run claimed trains
    solo. A group that runs out of memory (SPLIT_EXIT: every member checkpointed) is trained again as two halves."""
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
    try:  # anything between the claim and the trainer's start (a read-only or full artifacts disk) gives the runs back
        log_path, env = trainer_setup(engine, ids[0], claimant, opts)
        for rid in ids[1:]:  # each run's own log says where its group's is
            with open(log_path.with_name(f"run-{rid}.log"), "a") as log:
                log.write(f"trained in a fused group with runs {ids}: the group's log is {log_path}\n")
        command = group_command(ids, opts) if len(ids) > 1 else trainer_command(first, ids[0], opts)
        with open(log_path, "ab") as log:  # the trainer writes through its own copy of the file
            proc = start_trainer(command, env, log, log_path, opts.artifacts, opts.warm, families=(first.architecture,))
    except BaseException as exc:
        for rid in ids:
            release(engine, rid, claimant, exc)
        raise
    for rid in ids:  # the trainer beats the claim's heartbeat
        store.update_run(engine, rid, claimant=claimant, pid=proc.pid)
    code = wait_for(proc, should_stop, poll_seconds)
    if code == SPLIT_EXIT and len(ids) > 1 and not STOP.is_set():
        half, again = len(ids) // 2, (*statuses, "preempted")  # each member checkpointed and ended `preempted`
        for part in (ids[:half], ids[half:]):
            results.update(run_group(part, opts, should_stop, poll_seconds, again))
    else:
        for rid in ids:
            results[rid] = classify(engine, rid, code, log_path, claimant)
    return {rid: results[rid] for rid in run_ids}


def wait_for(proc: Any, should_stop: Callable[[], bool] | None, poll_seconds: float) -> int:
    """The trainer's exit code; SIGTERM (it checkpoints) once `STOP` or `should_stop` says so, or this runner is
    interrupted."""
    try:
        while True:
            try:
                return proc.wait(timeout=poll_seconds)
            except subprocess.TimeoutExpired:
                if STOP.is_set() or (should_stop is not None and should_stop()):
                    return _stop(proc)
    except BaseException:
        _stop(proc)
        raise


def trainer_setup(engine: sa.Engine, run_id: int, claimant: str, opts: LaunchOptions) -> tuple[Path, dict[str, str]]:
    """The claimed run's log file (made here: its folder may fail to be made) and its trainer's environment."""
    log_dir = opts.artifacts / "logs" / store.database_id(engine)[:16]  # run ids restart in every database
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"run-{run_id}.log"
    # ABLATE_RUNNER_PID: a trainer whose runner is gone (its flow run cancelled or killed) checkpoints and stops
    env = {**os.environ, **opts.extra_env, "PYTHONUNBUFFERED": "1", "ABLATE_CLAIMANT": claimant,
           "ABLATE_DB_URL": store.resolve_url(opts.db_url), "ABLATE_RUNNER_PID": str(os.getpid()),
           "ABLATE_RUN_LOG": str(log_path)}  # where a failed trainer says its whole traceback is
    if opts.threads:  # also the OpenMP pool that torch and the tokenizer libraries start
        env["OMP_NUM_THREADS"] = str(opts.threads)
    if opts.gpu_ids is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in opts.gpu_ids)
    env.update(sharing_env(environment().trials_per_gpu))  # several trainers on one GPU: MPS's share of the SMs
    return log_path, env


def release(engine: sa.Engine, run_id: int, claimant: str, exc: BaseException) -> str:
    """Give back a run whose trainer never started (this host failed between the claim and the start): owed again
    at once, `preempted` when it has a checkpoint to resume, else `pending`, with the claim's attempt undone (the
    run was not tried: a host's fault must not spend its MAX_ATTEMPTS; the sweep's re-dispatch limit and the host's
    drain bound the retries); its error says this host and why. The row's new status (unchanged if the claim was
    lost meanwhile)."""
    run = store.get_run(engine, run_id)
    status = "preempted" if run.checkpoint_path else "pending"
    error = store.redact(f"host {worker_host()} could not start its trainer: {type(exc).__name__}: {exc}")
    if store.update_run(engine, run_id, claimant=claimant, status=status, error=error, pid=None, heartbeat_at=None,
                        finished_at=store.utcnow(), attempts=max(0, run.attempts - 1)):
        return status
    return store.get_run(engine, run_id).status


def start_trainer(command: list[str], env: dict[str, str], log: Any, log_path: Path, artifacts: Path,
                  warm_ok: bool = True, families: tuple[str, ...] = ()) -> Any:
    """The trainer process, in its own process group (cancel and Ctrl-C signal it, and torchrun's ranks).

    A single-process trainer on a host without a visible GPU (or on any host with ABLATE_WARM_TRAINER=always) is
    forked from this runner's warm helper (ablate/runner/warm.py: the imports are done once per runner, not once per
    trial; the helper loads the `families`' libraries once, first); otherwise, with `warm_ok` false, or if the helper cannot start, a fresh `python -m ablate.train`. Either
    has `pid`, `poll()` and `wait(timeout)`."""
    from ablate.runner import warm  # on first use: the helper runs that module as __main__, which must not import it first

    if warm_ok and command[1:3] == ["-m", "ablate.train"] and warm.enabled():
        helper = warm.helper(artifacts / "logs" / "warm-trainer.log")
        if helper is not None:
            try:
                return helper.spawn(command[3:], env, log_path, families)
            except RuntimeError as exc:
                print(f"warning: trainer starts cold ({exc})", file=sys.stderr)
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _stop(proc: Any, grace: float = 120.0) -> int:
    """SIGTERM to the trainer's group (it checkpoints and records `preempted`); SIGKILL after `grace` seconds."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        return proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def classify(engine: sa.Engine, run_id: int, code: int, log_path: Path | None = None,
             claimant: str | None = None) -> str:
    """The trainer records its own outcome; a process that died without doing so is preempted (killed) or failed.
    A run that another process has taken over meanwhile is left to it."""
    run = store.get_run(engine, run_id)
    if claimant is not None and run.claimed_by != claimant:
        return run.status
    if run.status in TERMINAL and run.status != "running":
        store.update_run(engine, run_id, claimant=claimant, pid=None)
        return run.status
    tail = _tail(log_path) if log_path else ""
    if code < 0 or code in (137, 143):  # killed by a signal: resumable from the last checkpoint
        status, error = "preempted", f"trainer killed by signal {-code if code < 0 else code - 128}"
    else:
        status, error = "failed", f"trainer exited with code {code}: {store.redact(last_line(tail))}" + (
            f"; the whole log is {log_path}" if log_path else "")
    store.update_run(engine, run_id, claimant=claimant, status=status, error=error, pid=None, finished_at=store.utcnow())
    return status


def last_line(text: str) -> str:
    """A log's last non-empty line (a traceback's exception line), at most 300 characters."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(nothing in its log)"


def _tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# ---------------------------------------------------------------- what a sweep owes


UNSETTLED = ("pending", "preempted", "running")  # row statuses that are not an outcome yet


def owed(run: Any) -> bool:
    """Whether a run still needs a trainer: pending or preempted, or `running` with no live claimant (its
    heartbeat stale, or its processes gone from this host: store.is_live). The one rule by which the sweep flow
    dispatches a run again, its end fails with runs untrained, and `ablate sweep watch` exits."""
    return run.status in ("pending", "preempted") or (run.status == "running" and not store.is_live(run))


def runs_to_do(engine: sa.Engine, sweep_id: int, run_ids: list[int], retry_failed: bool = False) -> list[int]:
    """Runs of this registration that still need work: pending, preempted, running with a stale heartbeat,
    failed (under the attempt cap); cancelled only with `retry_failed`."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(store.Run.id, store.Run.status, store.Run.attempts, store.Run.heartbeat_at, store.Run.claimed_by, store.Run.pid)
            .where(store.Run.id.in_(run_ids))
        ).all()
    by_id = {r.id: r for r in rows}
    todo = []
    for rid in run_ids:
        r = by_id[rid]
        if r.status in store.FINISHED:
            continue
        if store.is_live(r):
            continue  # a live process (here or on another host) has it
        if r.status == "cancelled" and not retry_failed:
            continue
        if r.status == "failed" and r.attempts >= MAX_ATTEMPTS and not retry_failed:
            continue
        todo.append(rid)
    return todo


def uncancel(engine: sa.Engine, run_ids: list[int]) -> int:
    """Cancelled runs among `run_ids` become pending again (a sweep run with --retry-failed); how many."""
    with engine.begin() as conn:
        return conn.execute(sa.update(store.Run).where(store.Run.id.in_(run_ids), store.Run.status == "cancelled")
                            .values(status="pending")).rowcount


# ---------------------------------------------------------------- cancelling a sweep


def cancel(engine: sa.Engine, name: str, wait: float = 60.0) -> tuple[int, int, int]:
    """Cancel a sweep on every host: its waiting and running runs become `cancelled` in one UPDATE. A trainer
    reads its row at each heartbeat (ABLATE_HEARTBEAT_SECONDS), checkpoints and stops, on whatever host it runs;
    trainers on this host also get SIGTERM now. The sweep flow, seeing the rows, cancels its trial flow runs.
    Waits up to `wait` seconds for the trainers to end. Returns (waiting runs cancelled, running runs
    cancelled, trainers still running after the wait)."""
    runs = sweep_runs(engine, name)
    running = [r for r in runs if r.status == "running"]
    with engine.begin() as conn:
        waiting = conn.execute(sa.update(store.Run).where(
            store.Run.id.in_([r.id for r in runs]), store.Run.status.in_(("pending", "preempted", "failed")),
        ).values(status="cancelled")).rowcount
        stopping = conn.execute(sa.update(store.Run).where(
            store.Run.id.in_([r.id for r in running]), store.Run.status == "running").values(status="cancelled")).rowcount
    here = socket.gethostname()
    for run in running:
        if run.host == here and pid_alive(run.pid):
            try:
                os.killpg(run.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + wait
    while True:
        left = _trainers_left(engine, [r.id for r in running])
        if not left or time.monotonic() >= deadline:
            return waiting, stopping, len(left)
        time.sleep(0.5)


def _trainers_left(engine: sa.Engine, run_ids: list[int]) -> list[int]:
    """Runs among `run_ids` whose trainer still runs: a live pid here, or a fresh heartbeat from another host."""
    if not run_ids:
        return []
    with engine.connect() as conn:
        rows = conn.execute(sa.select(store.Run.id, store.Run.host, store.Run.pid, store.Run.heartbeat_at, store.Run.claimed_by)
                            .where(store.Run.id.in_(run_ids))).all()
    return [r.id for r in rows if store.trainer_running(r)]
