"""`ablate sweep register|run|status|watch|cancel`: a sweep's runs in the results DB, running them here, and
following one that runs on a cluster."""

from __future__ import annotations

import os
from typing import Any

import click

from ablate.cli.common import (ASSIGNMENTS_HELP, OVERRIDES_NOTE, STATUS_ROWS, Ordered, about, assignments_argument,
                               console, db_option, err_console, launch_flags, launch_of, override_options,
                               overrides_of, require_prefect)
from ablate.cli.status import print_status_csv, runs_table, sweep_view, watch
from ablate.config.errors import AblateError

PREFECT_START_TIMEOUT = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
UNFINISHED_EXIT = ("failed", "preempted", "cancelled")  # a sweep run that leaves runs so exits 1
PREFECT_START_SECONDS = 300
FLOW_END_SECONDS = 10.0  # after Ctrl-C, once every trainer has stopped: how long the flow may take to end
# the most run ids handed to the flow as its `registered` parameter: Prefect refuses flow run parameters over
# 512 KiB of JSON (server.api.max_parameter_size)
PASSED_RUNS = 40_000


@click.group(cls=Ordered, name="sweep", **about("register, run and inspect sweeps"),
             subcommand_metavar="ACTION [ARGS]...")
@db_option(expose=False)
def sweep_group() -> None:
    pass


@click.command(**about("validate a sweep file and register its pending runs", ASSIGNMENTS_HELP),
               epilog=OVERRIDES_NOTE)
@click.argument("spec")
@assignments_argument()
@click.option("--max-trials", type=int, default=10_000)
@override_options()
@db_option()
def register(spec: str, max_trials: int, merge: bool, db: str | None, **params: Any) -> int:
    from ablate import runner

    parsed, sweep_id, ids = runner.register(spec, db, max_trials=max_trials, say=console.print,
                                            overrides=overrides_of(params), merge=merge)
    console.print(f"sweep {parsed.name} (id {sweep_id}): {len(ids)} runs registered")
    return 0


@click.command(**about("table of a sweep's runs"))
@click.argument("name")
@click.option("--all", "all_", is_flag=True, help=f"every run (default: at most {STATUS_ROWS}, the rest counted)")
@click.option("--format", "fmt", type=click.Choice(("table", "csv")), default=None,
              help="table or csv (default: a table on a terminal, csv (every run) when piped)")
@db_option()
def status(name: str, all_: bool, fmt: str | None, db: str | None) -> int:
    from ablate import store
    from ablate.results.status import status_rows, status_view

    engine = store.reader(db)  # reading: never creates or migrates a database
    if (fmt or ("table" if console.is_terminal else "csv")) == "csv":
        print_status_csv(status_rows(engine, name))
    elif all_:
        console.print(runs_table(status_rows(engine, name), title=f"sweep {name}", limit=None))
    else:  # the rows it shows and the counts: not every run of a 100,000-run sweep
        rows, counts = status_view(engine, name, STATUS_ROWS)
        console.print(runs_table(rows, title=f"sweep {name}", counts=counts))
        for line in _drained(engine, name):
            console.print(line, highlight=False, markup=False)
    return 0


def _drained(engine: Any, name: str) -> list[str]:
    """A line per drained host of the sweep's pool (flows/health.py), when a Prefect API is set and answers."""
    import os

    if not os.environ.get("PREFECT_API_URL"):
        return []
    try:
        from flows.health import drained_of_sweep
    except ImportError:  # ablate without its flows (a reader's install)
        return []
    return drained_of_sweep(engine, name)


@click.command(**about("cancel waiting runs and stop running ones (checkpointed)"))
@click.argument("name")
@db_option()
def cancel(name: str, db: str | None) -> int:
    from ablate import runner, store

    waiting, stopping, left = runner.cancel(store.connect(db), name)
    console.print(f"sweep {name}: {waiting} waiting runs cancelled, {stopping} running runs cancelled "
                  f"(their trainers checkpoint and stop, on any host)")
    if left:
        err_console.print(f"{left} trainer(s) still running after 60 s (a checkpoint in progress, or a host that "
                          f"cannot reach the database); `ablate sweep status {name}` shows them")
        return 1
    return 0


@click.command(name="watch", **about("follow a sweep to its end: exit 0 completed, 1 failed, 3 cancelled"))
@click.argument("name")
@click.option("--poll", type=click.FloatRange(min=0.5), default=5.0, show_default=True, help="seconds between looks")
@click.option("--start-timeout", type=click.FloatRange(min=0), default=600.0, show_default=True,
              help="seconds to wait for the sweep to be registered (its flow run not started yet)")
@db_option()
def watch_cmd(name: str, poll: float, start_timeout: float, db: str | None) -> int:
    """Follow sweep NAME (its runs in the results DB, its sweep flow runs on the Prefect server at PREFECT_API_URL)
    until it ends, through Prefect API outages; a line whenever its counts change. Exit 0: completed; 1: failed
    (the failed runs' first errors said) or runs left owed; 3: cancelled."""
    import time as clock

    require_prefect("ablate sweep watch")
    from prefect.settings import get_current_settings

    from flows.watch import watch_sweep

    def say(line: str) -> None:
        console.print(f"{clock.strftime('%H:%M:%S')} {line}", highlight=False, soft_wrap=True)

    return watch_sweep(name, db, say, poll_seconds=poll, start_seconds=start_timeout,
                       use_api=bool(get_current_settings().api.url))


@click.command(**about("run every unfinished trial of a sweep here (local Prefect)", ASSIGNMENTS_HELP),
               epilog=OVERRIDES_NOTE)
@click.argument("spec")
@assignments_argument()
@click.option("--max-trials", type=int, default=10_000)
@click.option("--gpu-slots", type=int, default=None,
              help="trials at once (default: GPUs visible x --trials-per-gpu, 1 on CPU)")
@click.option("--trials-per-gpu", type=click.IntRange(1, 64), default=1, show_default=True,
              help="trainers sharing each GPU, each capped at its share of the GPU's memory (under MPS, of its SMs too)")
@click.option("--retry-failed", is_flag=True, help="also re-run cancelled runs and failed runs past 3 attempts")
@click.option("--fuse", type=click.Choice(("off", "seeds", "shapes", "auto")), default=None,
              help="train runs of one shape in fused groups, one process each (docs/fused.md; default: the spec's "
                   "`fuse:`, else off)")
@launch_flags(threads_help="torch threads per trainer (default: the cores other jobs leave free / trials at once)")
@override_options()
@db_option()
def run(spec: str, max_trials: int, gpu_slots: int | None, trials_per_gpu: int, retry_failed: bool,
        fuse: str | None, merge: bool, db: str | None, **params: Any) -> int:
    """Run the `sweep` flow in-process (Prefect's ephemeral API) with a live table of runs."""
    require_prefect("ablate sweep run")
    _quiet_prefect()
    from ablate import runner, store

    if gpu_slots is None:
        gpu_slots = max(1, runner.visible_gpus() * trials_per_gpu)
    os.environ["ABLATE_TRIALS_PER_GPU"] = str(trials_per_gpu)  # its trainers' share of a GPU (train/device.py)
    overrides = overrides_of(params)
    # the URL goes by environment, not as a flow parameter (Prefect stores those in plain text)
    opts = launch_of(params, db_url=None)
    # errors before any Prefect start-up: the spec, then its data (built once here, before any trial starts)
    parsed, sweep_id, ids = runner.register(spec, db, max_trials=max_trials, say=err_console.print,
                                            overrides=overrides, merge=merge, artifacts=opts.artifacts)
    engine = store.connect(db)
    os.environ["ABLATE_DB_URL"] = store.resolve_url(db)  # for the flow and its trainers, which get db_url=None
    # measured now, before the local Prefect server starts (it would count as another job)
    gpus = parsed.budget.gpus
    opts = opts.but(threads=opts.threads or runner.default_threads(max(1, gpu_slots // gpus), gpus))
    console.print(f"sweep {parsed.name}: {len(ids)} trials, {parsed.budget.describe()} each, {opts.threads} thread(s) "
                  f"per trainer; results in {store.describe_url(str(engine.url))}")
    flow_params = dict(spec=str(spec), **opts.flow_fields(), gpu_slots=gpu_slots, retry_failed=retry_failed, fuse=fuse)
    if len(ids) <= PASSED_RUNS:  # the flow runs what was just registered
        flow_params["registered"] = runner.Registration.of(parsed, sweep_id, ids)
    else:  # the flow registers the spec again, as it would on a cluster
        flow_params.update(merge=merge, **{k: v for k, v in overrides.items() if v is not None})
    return _run_flow(flow_params, engine, parsed.name, resume=_resume_command(spec, overrides, db),
                     at_once=max(1, gpu_slots // gpus))


for _command in (register, run, status, watch_cmd, cancel):
    sweep_group.add_command(_command)


def _resume_command(spec: str, overrides: dict[str, Any], db: str | None) -> str:
    """The command that runs the same sweep again: its overrides name it, so they are part of it."""
    import shlex

    from ablate import store

    flags = [f"--{k.replace('_', '-')} {shlex.quote(str(v))}" for k, v in overrides.items()
             if k != "set" and v not in (None, "")]
    sets = [shlex.quote(text) for text in overrides.get("set") or ()]
    return " ".join(["ablate sweep run", shlex.quote(str(spec)), *sets, *flags]
                    + ([f"--db {store.redact(db)}"] if db else []))


def _quiet_prefect() -> None:
    # the live table is the display (failed trials and their reasons are in it: no Prefect tracebacks over it)
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "CRITICAL")
    # nor its internal services' (an `EventsWorker` error at exit, after Ctrl-C, read like a crash)
    os.environ.setdefault("PREFECT_INTERNAL_LOGGING_LEVEL", "CRITICAL")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no telemetry calls from a lab machine
    os.environ.setdefault("DO_NOT_TRACK", "1")  # nor from the client, whose first-run notice would print over the table
    # the local API is a subprocess that must start within this; Prefect's 20 s expired on a loaded host
    os.environ.setdefault(PREFECT_START_TIMEOUT, str(PREFECT_START_SECONDS))


def _run_flow(flow_params: dict[str, Any], engine: Any, name: str, resume: str, at_once: int = 1) -> int:
    """The sweep flow in a thread, the live table here; Ctrl-C or SIGTERM stop it cleanly (exit 130)."""
    import signal
    import threading

    from ablate import runner
    from ablate.results.status import status_counts
    from ablate.runner import localserver
    from flows.sweep import sweep  # Prefect is imported here, in the main thread, as before the flow's thread

    # started here, while this is the only thread, so that it can be a fork of this process (which has imported
    # Prefect); ended with this process, even a killed one (no orphaned server)
    server = localserver.launch()
    done = threading.Event()
    result: dict[str, Any] = {}
    worker = threading.Thread(target=_flow_thread, args=(sweep, server, flow_params, result, done), daemon=True)
    worker.start()
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops the sweep as cleanly as Ctrl-C
    render = sweep_view(engine, name, at_once)
    try:
        watch(render, done, engine, name, at_once)
    except KeyboardInterrupt:
        runner.STOP.set()  # run_trial SIGTERMs its trainer (checkpoint, `preempted`); no new trial starts
        _wait_for_trainers(done, engine, name)
        console.print(render())
        err_console.print(f"sweep {name} stopped; resume it with: {resume}")
        return 130
    worker.join()
    if "error" in result:
        raise _prefect_start_failure(result["error"]) or result["error"]
    counts = status_counts(engine, name)
    console.print(f"sweep {name}: " + ", ".join(f"{n} {status}" for status, n in counts.items()))
    unfinished = {status: counts[status] for status in UNFINISHED_EXIT if counts.get(status)}
    if unfinished:  # `sweep run && ablate report` must not go on as if every run it owed had finished
        err_console.print(f"sweep {name} did not finish: " + ", ".join(f"{n} {s}" for s, n in unfinished.items())
                          + " (`ablate sweep status` says why; --retry-failed runs them again); exit 1", highlight=False)
        return 1
    return 0


def _wait_for_trainers(done: Any, engine: Any, name: str) -> None:
    """After Ctrl-C: until the flow ends (its trainers checkpointed and stopped) or their grace runs out, saying
    which runs it waits for, and again whenever that changes (a busy machine takes minutes to checkpoint)."""
    import time

    import sqlalchemy as sa

    from ablate import runner, store

    deadline = time.monotonic() + runner.STOP_GRACE_SECONDS
    said = None
    while True:
        with engine.connect() as conn:
            running = conn.execute(sa.select(store.Run.id).where(store.Run.sweep_id == runner.sweep_id(engine, name),
                                                                 store.Run.status == "running")).scalars().all()
        if running != said:
            left = max(0, round(deadline - time.monotonic()))
            err_console.print(f"stopping: waiting for {len(running)} trainer(s) to checkpoint and stop (runs "
                              f"{', '.join(map(str, running))}; at most {left} s more; Ctrl-C again abandons them)"
                              if running else f"stopping: no trainer is running; ending the sweep's flow (at most "
                              f"{FLOW_END_SECONDS:g} s)", highlight=False)
            said = running
        if not running:  # every run is recorded: the flow's own end (its states in Prefect) is not worth minutes
            deadline = min(deadline, time.monotonic() + FLOW_END_SECONDS)
        if done.wait(0.5 if running else 0.1) or time.monotonic() > deadline:
            if not done.is_set() and not running:
                err_console.print(f"stopping: the sweep's flow did not end within {FLOW_END_SECONDS:g} s; leaving it "
                                  "(its runs are all recorded in the DB)", highlight=False)
            return


def _flow_thread(sweep: Any, server: Any, flow_params: dict[str, Any], result: dict[str, Any], done: Any) -> None:
    """Wait for the local Prefect API (`server`; None: PREFECT_API_URL's) and run the sweep flow; an error other
    than failed trials goes to `result`."""
    try:
        from flows.sweep import TrialsFailed

        from contextlib import nullcontext

        from prefect.settings import PREFECT_API_URL, temporary_settings

        url = server.ready() if server is not None else None
        with temporary_settings(updates={PREFECT_API_URL: url}) if url else nullcontext():
            state = sweep(**flow_params, return_state=True)
        if state.is_failed():  # failed trials are counted from the DB; anything else is an error
            outcome = state.result(raise_on_failure=False)
            if isinstance(outcome, BaseException) and not isinstance(outcome, TrialsFailed):
                raise outcome
    except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
        result["error"] = exc
    finally:
        done.set()


def _prefect_start_failure(exc: BaseException) -> AblateError | None:
    """A clear error for Prefect's local API that did not start in time (else None: not that failure)."""
    if "ephemeral Prefect API server" not in str(exc):
        return None
    return AblateError(
        f"Prefect's local API server did not start within {os.environ.get(PREFECT_START_TIMEOUT)} s (a busy host, or "
        f"a broken Prefect install: {str(exc).splitlines()[0][:200]}). The sweep's runs are registered and nothing "
        f"was trained; run the same command again with {PREFECT_START_TIMEOUT}=600, or start a server once "
        "(`prefect server start`) and set PREFECT_API_URL=http://127.0.0.1:4200/api")


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt
