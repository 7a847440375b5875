"""Runs trials as subprocesses, classifies their outcome into the run row, and picks what a sweep still owes.

Plain functions, usable from the CLI, a notebook or a test; `flows/` wraps them for Prefect.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from ablate import db
from ablate.errors import AblateError
from ablate.spec import TrialConfig, load_trials

MAX_ATTEMPTS = 3  # a failed run is retried by later sweeps until it has had this many attempts
TERMINAL = ("completed", "oom", "diverged", "failed", "preempted", "cancelled")


@dataclass(frozen=True)
class RunOptions:
    """How runs execute on this worker (not part of any trial's identity)."""

    db_url: str | None = None
    artifacts: Path = Path("results/artifacts")
    checkpoint_every: float | None = None  # None: the trainer's default, proportional to the budget
    memory_cap_mb: float | None = None
    gpu_ids: tuple[int, ...] | None = None  # CUDA_VISIBLE_DEVICES for this trial; None: inherit
    quiet: bool = True
    threads: int | None = None  # torch intra-op threads per trainer process; None: every core
    extra_env: dict[str, str] = field(default_factory=dict)
    # fork single-process trainers from this process's warm helper where it applies (warm.enabled); worth it
    # only for a process that runs several trials: its start costs about what one cold trainer's imports do
    warm: bool = True


def host_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. a container's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat (Linux)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def busy_cores(sample_seconds: float = 0.5) -> int:
    """Cores other jobs keep busy right now, at most all but one: measured over a short sample of
    /proc/stat (the 1-minute load average would still count a pip install that just ended)."""
    before = _cpu_times()
    if before is not None:
        time.sleep(sample_seconds)
        after = _cpu_times()
        if after is not None and after[1] > before[1]:
            share = (after[0] - before[0]) / (after[1] - before[1])
            return min(host_cores() - 1, int(share * (os.cpu_count() or 1) + 0.5))
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # neither is available here
        return 0
    return min(host_cores() - 1, int(load + 0.5))


def visible_gpus() -> int:
    """CUDA devices this process may use, without importing torch (the runner stays light): the ids in
    CUDA_VISIBLE_DEVICES when set, else the GPUs `nvidia-smi -L` lists (0 without a driver)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = 0
        for device in visible.split(","):  # CUDA stops at the first invalid id ("-1", "")
            if not device.strip() or device.strip().startswith("-"):
                break
            count += 1
        return count
    import shutil

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in out.splitlines())


def default_threads(concurrent: int, processes_per_trial: int = 1) -> int:
    """Each trainer process's share of the cores left free when `concurrent` trials run at once here.

    torch's default (every core) collapses on a shared host: busy threads wait on each other (measured
    on 2 cores beside a 2-process job: 18 steps in 20 s with 2 threads, 151 with 1, 262 idle with 2).
    Call it before this process starts helpers of its own (the local Prefect server), which would count.
    """
    free = host_cores() - busy_cores()
    return max(1, free // max(1, concurrent * processes_per_trial))


def trainer_command(trial: TrialConfig, run_id: int, opts: RunOptions) -> list[str]:
    """`python -m ablate.train`, or torchrun with one process per GPU when the budget names several.
    The database URL travels in the environment (ABLATE_DB_URL), never in argv where `ps` shows its password."""
    args = ["-m", "ablate.train", "--run-id", str(run_id), "--artifacts", str(opts.artifacts)]
    if opts.checkpoint_every:
        args += ["--checkpoint-every", str(opts.checkpoint_every)]
    if opts.memory_cap_mb:
        args += ["--memory-cap-mb", str(opts.memory_cap_mb)]
    if opts.quiet:
        args.append("--quiet")
    if opts.threads:
        args += ["--threads", str(opts.threads)]
    if trial.budget.gpus > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc_per_node={trial.budget.gpus}", *args]
    return [sys.executable, *args]


pid_alive = db.pid_alive


# Set when the user stops this process (Ctrl-C, SIGTERM): running trainers checkpoint and end `preempted`,
# and no further trial starts. Process-wide, because trials run in threads of Prefect flows.
STOP = threading.Event()
STOP_GRACE_SECONDS = 150.0  # how long a stopped sweep waits for its trainers to checkpoint
CLAIMABLE = ("pending", "failed", "preempted")  # what a runner takes by default (not `cancelled`: the user's word)


def run_trial(run_id: int, opts: RunOptions, should_stop: Callable[[], bool] | None = None,
              poll_seconds: float = 1.0, statuses: tuple[str, ...] = CLAIMABLE) -> str:
    """Claim one run and train it to the end (resuming from its checkpoint if it has one); its final status.

    The claim is atomic: when another process (a second runner, a search worker, another host) holds the
    run or has finished it, nothing starts and the row's current status is returned. `should_stop` is
    polled while the trainer runs (e.g. an Optuna pruner reading the eval metrics); when it, or `STOP`,
    says so, the trainer gets SIGTERM, checkpoints, and the run ends `preempted`.
    """
    engine = db.connect(opts.db_url)
    if STOP.is_set():
        return db.get_run(engine, run_id).status
    claimant = db.new_claimant()
    if not db.claim_run(engine, run_id, claimant, statuses):
        return db.get_run(engine, run_id).status
    trial = TrialConfig.model_validate(db.get_run(engine, run_id).config)
    log_dir = opts.artifacts / "logs" / db.database_id(engine)[:16]  # run ids restart in every database
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"run-{run_id}.log"
    # ABLATE_RUNNER_PID: a trainer whose runner is gone (its flow run cancelled or killed) checkpoints and stops
    env = {**os.environ, **opts.extra_env, "PYTHONUNBUFFERED": "1", "ABLATE_CLAIMANT": claimant,
           "ABLATE_DB_URL": db.resolve_url(opts.db_url), "ABLATE_RUNNER_PID": str(os.getpid())}
    if opts.threads:  # also the OpenMP pool that torch and the tokenizer libraries start
        env["OMP_NUM_THREADS"] = str(opts.threads)
    if opts.gpu_ids is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in opts.gpu_ids)
    with open(log_path, "ab") as log:
        proc = start_trainer(trainer_command(trial, run_id, opts), env, log, log_path, opts.artifacts, opts.warm)
        db.update_run(engine, run_id, claimant=claimant, pid=proc.pid)  # the trainer beats the claim's heartbeat
        try:
            while True:
                try:
                    code = proc.wait(timeout=poll_seconds)
                    break
                except subprocess.TimeoutExpired:
                    if STOP.is_set() or (should_stop is not None and should_stop()):
                        code = _stop(proc)
                        break
        except BaseException:
            _stop(proc)
            raise
    return classify(engine, run_id, code, log_path, claimant)


def start_trainer(command: list[str], env: dict[str, str], log: Any, log_path: Path, artifacts: Path,
                  warm_ok: bool = True) -> Any:
    """The trainer process, in its own process group (cancel and Ctrl-C signal it, and torchrun's ranks).

    A single-process trainer on a host without a visible GPU is forked from this runner's warm helper
    (ablate/warm.py: the imports are done once per runner, not once per trial); otherwise, with `warm_ok`
    false, or if the helper cannot start, a fresh `python -m ablate.train`. Either has `pid`, `poll()` and
    `wait(timeout)`."""
    from ablate import warm

    if warm_ok and command[1:3] == ["-m", "ablate.train"] and warm.enabled():
        helper = warm.helper(artifacts / "logs" / "warm-trainer.log")
        if helper is not None:
            try:
                return helper.spawn(command[3:], env, log_path)
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
    run = db.get_run(engine, run_id)
    if claimant is not None and run.claimed_by != claimant:
        return run.status
    if run.status in TERMINAL and run.status != "running":
        db.update_run(engine, run_id, claimant=claimant, pid=None)
        return run.status
    tail = _tail(log_path) if log_path else ""
    if code < 0 or code in (137, 143):  # killed by a signal: resumable from the last checkpoint
        status, error = "preempted", f"trainer killed by signal {-code if code < 0 else code - 128}"
    else:
        status, error = "failed", f"trainer exited with code {code}:\n{db.redact(tail)}"
    db.update_run(engine, run_id, claimant=claimant, status=status, error=error, pid=None, finished_at=db.utcnow())
    return status


def _tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# ---------------------------------------------------------------- what a sweep owes


def runs_to_do(engine: sa.Engine, sweep_id: int, run_ids: list[int], retry_failed: bool = False) -> list[int]:
    """Runs of this registration that still need work: pending, preempted, running with a stale heartbeat,
    failed (under the attempt cap); cancelled only with `retry_failed`."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(db.Run.id, db.Run.status, db.Run.attempts, db.Run.heartbeat_at, db.Run.claimed_by, db.Run.pid)
            .where(db.Run.id.in_(run_ids))
        ).all()
    by_id = {r.id: r for r in rows}
    todo = []
    for rid in run_ids:
        r = by_id[rid]
        if r.status in db.FINISHED:
            continue
        if db.is_live(r):
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
        return conn.execute(sa.update(db.Run).where(db.Run.id.in_(run_ids), db.Run.status == "cancelled")
                            .values(status="pending")).rowcount


def register(spec_path: str | Path, db_url: str | None = None, max_trials: int = 10_000,
             say: Callable[[str], None] | None = None, overrides: dict[str, Any] | None = None, merge: bool = False,
             artifacts: Path | None = None) -> tuple[Any, int, list[int]]:
    """Validate and register a sweep: (spec, sweep id, run ids in trial order). Invalid specs write nothing;
    with `artifacts`, neither does a sweep whose data cannot be prepared (`prepare_data` runs first).

    `overrides`: see `spec.apply_overrides`. Runs that an edit of the spec removed and that hold no result
    (pending, failed, cancelled, preempted) are dropped, so the sweep owes only its current trials; a spec
    that would leave results of other trials under its name is refused unless `merge` (db.register_sweep).
    """
    spec, trials = load_trials(spec_path, max_trials=max_trials, overrides=overrides)
    for note in spec.overrides if say is not None else ():
        say(f"sweep {spec.name}: {note}")
    engine = db.connect(db_url)
    if artifacts is not None:
        prepare_data(trials, artifacts, say=say)
    sweep_id, ids = db.register_sweep(engine, spec, trials, spec_path=str(spec_path), merge=merge)
    if spec.search is None:
        dropped = db.drop_stale_runs(engine, sweep_id, set(ids))
        if dropped and say is not None:
            say(f"sweep {spec.name}: dropped {dropped} unfinished run(s) whose trial is no longer in {spec_path}")
    return spec, sweep_id, ids


def distinct_data(trials: list[TrialConfig]) -> list[TrialConfig]:
    """One trial per (dataset, tokenizer, context) that the trials train on (memory probes read no data)."""
    seen: dict[str, TrialConfig] = {}
    for t in trials:
        if t.mode != "memory_probe":
            key = json.dumps([t.dataset.model_dump(mode="json"), t.tokenizer.model_dump(mode="json"), t.context],
                             sort_keys=True)
            seen.setdefault(key, t)
    return list(seen.values())


def check_sources(trials: list[TrialConfig]) -> None:
    """Each hub dataset of the trials resolves here (cheap: metadata only); `ablate plan` runs this."""
    hub = {t.dataset.model_dump_json(): t.dataset for t in distinct_data(trials) if t.dataset.from_hub}
    if hub:
        from ablate import data  # torch comes with it: only when there is a hub dataset to check

        for source in hub.values():
            data.check_source(source)


def prepare_data(trials: list[TrialConfig], artifacts: Path, say: Callable[[str], None] | None = None,
                 progress: bool = True) -> None:
    """Build the sweep's token caches (download, tokenizer, packing) once, before any trial is dispatched: a
    dataset that cannot load, a vocabulary the corpus cannot support or a missing file fails here with one
    message, instead of in every trial. Trials then read the caches (on a cluster, from the shared artifacts).
    Caches that are built and intact are checked without importing torch (ablate/tokencache.py)."""
    from ablate import tokencache

    todo = distinct_data(trials)
    for k, t in enumerate(todo, 1):
        built = tokencache.cache_intact(tokencache.cache_folder(artifacts, t.dataset, t.tokenizer, t.context))
        if say is not None:
            say(f"data {k}/{len(todo)}: {t.dataset.source} ({t.tokenizer.name or f'BPE {t.tokenizer.vocab_size}'}, "
                f"context {t.context}){' cached' if built else ''}")
        if built:
            continue
        from ablate import data

        before = _cache_entries(artifacts)
        try:
            data.prepare(t.dataset, t.tokenizer, t.context, artifacts, progress=progress)
        except AblateError:
            _remove_new_entries(artifacts, before)
            raise
        except Exception as exc:  # noqa: BLE001 - a file that does not parse, memory, a full disk: one message
            _remove_new_entries(artifacts, before)
            raise AblateError(f"dataset.source {t.dataset.source}: the token cache could not be built: "
                              f"{_root_cause(exc)}. Nothing was registered or kept (the cache is written to a "
                              "temporary folder first); fix the data and run again") from None


CACHE_FOLDERS = ("tokenizers", "tokens")


def _cache_entries(artifacts: Path) -> set[Path]:
    return {p for name in CACHE_FOLDERS for p in [artifacts / name, *(artifacts / name).glob("*")] if p.exists()}


def _remove_new_entries(artifacts: Path, before: set[Path]) -> None:
    """After a failed build: the lock files and empty folders it made (its data went to temporary folders, already
    removed). Anything with content, or that existed before, stays."""
    for path in sorted(_cache_entries(artifacts) - before, key=lambda p: len(p.parts), reverse=True):
        try:
            if path.is_dir():
                path.rmdir()  # only when empty
            elif path.suffix == ".lock" and path.stat().st_size == 0:
                path.unlink()
        except OSError:
            pass


def _root_cause(exc: BaseException) -> str:
    """The innermost cause's type and first line (datasets wraps a parse error in DatasetGenerationError)."""
    while exc.__cause__ is not None or (exc.__context__ is not None and not exc.__suppress_context__):
        exc = exc.__cause__ or exc.__context__
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


def sweep_id(engine: sa.Engine, name: str) -> int:
    """The id of the sweep named `name`, or an error that lists the known names."""
    with engine.connect() as conn:
        found = conn.execute(sa.select(db.Sweep.id).where(db.Sweep.name == name)).scalar()
        if found is None:
            known = conn.execute(sa.select(db.Sweep.name)).scalars().all()
            from ablate.errors import did_you_mean

            raise AblateError(f"no sweep named {name!r} in the results DB{did_you_mean(name, known)}; "
                              f"known: {', '.join(known) or 'none yet'}")
    return found


def sweep_runs(engine: sa.Engine, name: str) -> list[db.Run]:
    """Every run of the sweep as full rows (config, versions ...), in trial order."""
    sid = sweep_id(engine, name)
    with db.session_factory(engine)() as session:
        return list(session.scalars(sa.select(db.Run).where(db.Run.sweep_id == sid).order_by(db.Run.trial_index)))


# what a status table shows: run-row columns only (the latest points are kept there), never the metrics table
STATUS_COLUMNS = ("id", "trial_index", "architecture", "options", "d_model", "layers", "heads", "lr", "batch_size",
                  "status", "budget_kind", "budget_amount", "train_seconds", "steps", "final_train_loss",
                  "final_eval_loss", "last_step", "last_elapsed_seconds", "last_train_loss", "last_eval_loss",
                  "finished_at", "error", "heartbeat_at", "claimed_by", "pid")


def status_rows(engine: sa.Engine, name: str) -> list[sa.Row]:
    """The sweep's runs for a status table, in trial order: one query over run-row columns."""
    sid = sweep_id(engine, name)
    with engine.connect() as conn:
        return list(conn.execute(sa.select(*(getattr(db.Run, c) for c in STATUS_COLUMNS))
                                 .where(db.Run.sweep_id == sid).order_by(db.Run.trial_index)))


def status_view(engine: sa.Engine, name: str, limit: int) -> tuple[list[sa.Row], dict[str, int]]:
    """What a status table of at most `limit` rows needs, without reading every run of a big sweep: the sweep's
    counts by status, and, in trial order, the first `limit` unfinished runs that are not waiting, the latest
    `limit` finished ones and the next `limit` waiting ones (cli.shown_runs picks from these)."""
    counts = status_counts(engine, name)
    if sum(counts.values()) <= limit:
        return status_rows(engine, name), counts
    sid = sweep_id(engine, name)
    base = sa.select(*(getattr(db.Run, c) for c in STATUS_COLUMNS)).where(db.Run.sweep_id == sid)
    finished = db.Run.status.in_(db.FINISHED)
    parts = (base.where(db.Run.status != "pending", ~finished).order_by(db.Run.trial_index),
             base.where(finished).order_by(db.Run.finished_at.is_(None), db.Run.finished_at.desc(), db.Run.id.desc()),
             base.where(db.Run.status == "pending").order_by(db.Run.trial_index))
    with engine.connect() as conn:
        rows = {r.id: r for part in parts for r in conn.execute(part.limit(limit))}
    return sorted(rows.values(), key=lambda r: r.trial_index), counts


def status_counts(engine: sa.Engine, name: str) -> dict[str, int]:
    """How many of the sweep's runs are in each status."""
    sid = sweep_id(engine, name)
    with engine.connect() as conn:
        return dict(conn.execute(sa.select(db.Run.status, sa.func.count()).where(db.Run.sweep_id == sid)
                                 .group_by(db.Run.status).order_by(db.Run.status)).all())


def cancel(engine: sa.Engine, name: str, wait: float = 60.0) -> tuple[int, int, int]:
    """Cancel a sweep on every host: its waiting and running runs become `cancelled` in one UPDATE. A trainer
    reads its row at each heartbeat (HEARTBEAT_SECONDS), checkpoints and stops, on whatever host it runs;
    trainers on this host also get SIGTERM now. The sweep flow, seeing the rows, cancels its trial flow runs.
    Waits up to `wait` seconds for the trainers to end. Returns (waiting runs cancelled, running runs
    cancelled, trainers still running after the wait)."""
    runs = sweep_runs(engine, name)
    running = [r for r in runs if r.status == "running"]
    with engine.begin() as conn:
        waiting = conn.execute(sa.update(db.Run).where(
            db.Run.id.in_([r.id for r in runs]), db.Run.status.in_(("pending", "preempted", "failed")),
        ).values(status="cancelled")).rowcount
        stopping = conn.execute(sa.update(db.Run).where(
            db.Run.id.in_([r.id for r in running]), db.Run.status == "running").values(status="cancelled")).rowcount
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
        rows = conn.execute(sa.select(db.Run.id, db.Run.host, db.Run.pid, db.Run.heartbeat_at, db.Run.claimed_by)
                            .where(db.Run.id.in_(run_ids))).all()
    return [r.id for r in rows if db.trainer_running(r)]
