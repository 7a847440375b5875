"""The `ablate` command. User errors print one clear message and exit 2, without a traceback."""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ablate.config.errors import AblateError
from ablate.config.settings import environment

console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, highlight=False)

COMMANDS: dict[str, Callable[[argparse.Namespace], int | None]] = {}


def command(name: str) -> Callable:
    def register(fn: Callable[[argparse.Namespace], int | None]) -> Callable:
        COMMANDS[name] = fn
        return fn

    return register


def human_seconds(seconds: float) -> str:
    hours, rest = divmod(int(round(seconds)), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def human_count(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f}{unit}"
    return str(int(n))


# ---------------------------------------------------------------- plan


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The spec overrides given on the command line (--budget, --source, --holdout, --vocab-size, --gpus,
    --hardware, --name)."""
    return {"budget": args.budget, "source": args.source, "holdout": args.holdout, "vocab_size": args.vocab_size,
            "gpus": args.gpus, "hardware": args.hardware, "name": args.name}


def _add_overrides(parser: argparse.ArgumentParser, merge: bool = True) -> None:
    g = parser.add_argument_group("overrides (the sweep is then named after them, unless --name)")
    g.add_argument("--budget", default=None, help="budget per trial: 10m (wall clock), steps=200, tokens=50M")
    g.add_argument("--source", default=None, help="dataset.source: a local path or hub id (a local one, where the "
                   "spec evaluates on a named split, holds out the last 1000 documents instead)")
    g.add_argument("--holdout", type=int, default=None, help="evaluate on the last N documents of the training data")
    g.add_argument("--vocab-size", type=int, default=None, help="train a BPE tokenizer of this size")
    g.add_argument("--gpus", type=int, default=None, help="GPUs per trial (torchrun when > 1); the global batch is "
                   "kept by scaling grad_accum")
    g.add_argument("--hardware", default=None, help="hardware profile / work pool (rtx3060, v100, a100, h100, ...)")
    g.add_argument("--name", default=None, help="the sweep's name in the results DB")
    if merge:
        parser.add_argument("--merge", action="store_true",
                            help="add the trials to a same-named sweep that holds results of other trials")


KNOWN_VOCABS = {"gpt2": 50257, "gpt2-medium": 50257, "gpt-neo-125m": 50257, "llama-7b": 32000}


def _param_counts(trial: Any) -> tuple[int, int]:
    """(total, inter-token) parameters from the family's closed-form formula and the objective's (torch-free)."""
    from ablate import models
    from ablate.config import registry

    fam = models.options_module(trial.architecture)
    # a loaded tokenizer's size is known only once it is loaded (transformers, maybe the hub): the common ones here
    vocab = (KNOWN_VOCABS.get(trial.tokenizer.name.rsplit("/", 1)[-1], 32000) if trial.tokenizer.name
             else trial.tokenizer.vocab_size or 32000)
    total, inter = fam.param_count(trial, vocab), fam.inter_token_params(trial)
    return registry.objective(trial.objective).param_counts(trial, total, inter, vocab, fam)


def objective_label(objective: str, options: dict | None) -> str:
    """`multi_token(n_tokens=3)`: an objective with the options a trial sets."""
    extra = ",".join(f"{k}={v}" for k, v in sorted((options or {}).items()))
    return f"{objective}({extra})" if extra else objective


@command("plan")
def cmd_plan(args: argparse.Namespace) -> int:
    from ablate.config import describe_recipe, load_trials, reference_for

    spec, trials = load_trials(args.spec, max_trials=args.max_trials, overrides=_overrides(args))
    table = Table(title=f"sweep {spec.name}: {spec.description}".rstrip(": "), title_justify="left")
    show_objective = any(t.objective != "clm" for t in trials)
    show_horizon = any(t.horizon is not None for t in trials)  # the schedule's planned length, where a study gave one
    for col in ("#", "fingerprint", "architecture", *(["objective"] if show_objective else []), "options", "d_model", "layers", "heads", "context", "lr",
                "batch", *(["horizon"] if show_horizon else []), "seed", "params", "inter-token", "reference"):
        table.add_column(col, justify="right" if col not in ("fingerprint", "architecture", "options") else "left")
    per_class: dict[str, float] = defaultdict(float)
    listed = len(trials) if args.all else min(len(trials), STATUS_ROWS)  # rendering 10,000 rows takes seconds
    for i, t in enumerate(trials):
        key = f"{t.budget.gpus}x {t.budget.hardware}"
        per_class[key] += t.budget.amount
        if i >= listed:
            continue
        total, inter = _param_counts(t)
        ref = reference_for(spec, t)
        ref_text = "" if ref is None else "/".join(
            "-" if v is None else f"{v:.2f}" if round(v, 2) == v else str(v) for v in (ref.train, ref.eval))
        if ref is not None and ref.memory_mb is not None:
            ref_text = f"{ref.memory_mb} MB"
        opts = ",".join(f"{k}={v}" for k, v in sorted(t.options.items()))
        objective = [objective_label(t.objective, t.objective_options)] if show_objective else []
        table.add_row(str(i), t.fingerprint(), t.architecture, *objective, opts, str(t.d_model), str(t.layers),
                      str(t.heads or "-"), str(t.context), f"{t.lr:g}",
                      f"{t.batch_size}x{t.grad_accum}" if t.grad_accum > 1 else str(t.batch_size),
                      *([t.horizon.describe() if t.horizon else "budget"] if show_horizon else []), str(t.seed),
                      human_count(total), human_count(inter), ref_text)
    if listed < len(trials):
        table.caption, table.caption_justify = f"the first {listed:,} of {len(trials):,} trials; --all lists every one", "left"
    console.print(table)
    if spec.search is not None:  # the table shows the base trial; the search samples the rest
        search = spec.search
        console.print(f"search: {search.n_trials} trials sampled by {search.sampler} (pruner {search.pruner}) from the "
                      "trial above, over " + "; ".join(f"{k} {_search_range(v)}" for k, v in search.parameters.items())
                      + f". Run it with `ablate search run {args.spec}`.")
        for key in per_class:
            per_class[key] = spec.budget.amount * search.n_trials
    else:
        console.print(f"{len(trials)} trials; budget per trial: {spec.budget.describe()}")
    try:  # a hub dataset that cannot load here (offline, unknown id): said now, though this machine may not run it
        if any(t.dataset.from_hub for t in trials):  # (the runner brings SQLAlchemy: only when there is one to check)
            from ablate import runner

            runner.check_sources(trials)
    except AblateError as exc:
        err_console.print(f"[yellow]warning:[/] {escape(str(exc))} `ablate sweep run` and the sweep flow check the data "
                          "before any trial starts, and stop with this message where it cannot load")
    for note in spec.overrides:
        console.print(f"override: {note}", highlight=False)
    if spec.retrieval is not None:
        console.print(f"retrieval stage: {spec.retrieval.describe()}", highlight=False)
    recipes = list(dict.fromkeys(describe_recipe(t) for t in trials))
    for text in recipes[:5]:  # a grid over lr or betas has as many recipes as values; the first few say enough
        console.print(f"recipe {spec.recipe}: {text}", highlight=False)
    if len(recipes) > 5:
        console.print(f"... and {len(recipes) - 5} more recipe variants")
    kind = spec.budget.kind
    for key, amount in per_class.items():
        if kind == "wall_clock":
            console.print(f"total on {key}: {human_seconds(amount)} ({amount / 3600:.1f} h wall clock)")
        else:
            console.print(f"total on {key}: {human_count(amount)} {kind}")
    return 0


def _search_range(param: Any) -> str:
    if param.type == "categorical":
        return "in {" + ", ".join(str(c) for c in param.choices) + "}"
    scale = " (log)" if param.log else ""
    return f"in [{param.low:g}, {param.high:g}]{scale}" + (f" when {param.when}" if param.when else "")


# ---------------------------------------------------------------- sql


@command("sql")
def cmd_sql(args: argparse.Namespace) -> int:
    from ablate.results import DEFAULT_MAX_BYTES, DEFAULT_MAX_ROWS, DEFAULT_TIMEOUT_SECONDS, read_only_query

    timeout = _sql_limit(args.timeout, "--timeout", "ABLATE_SQL_TIMEOUT", DEFAULT_TIMEOUT_SECONDS, float)
    max_rows = int(_sql_limit(args.max_rows, "--max-rows", "ABLATE_SQL_MAX_ROWS", DEFAULT_MAX_ROWS, int))
    max_bytes = int(_sql_limit(args.max_bytes, "--max-bytes", "ABLATE_SQL_MAX_BYTES", DEFAULT_MAX_BYTES, int))
    columns, rows = read_only_query(args.query, args.db, max_rows=max_rows, timeout_seconds=timeout,
                                    max_bytes=max_bytes)
    from ablate.store import readlogin

    note = readlogin.advice(args.db)
    if note:
        err_console.print(f"note: {note}", highlight=False)
    print_rows(columns, rows, args.format)
    return 0


def _sql_limit(value: float | None, flag: str, env: str, default: float, kind: type) -> float:
    """A limit of `ablate sql`: the flag, else the environment variable, else the default; 0 means none."""
    import os

    where = f"{flag} {value:g}" if value is not None else ""
    if value is None:
        text = os.environ.get(env, "").strip()
        if not text:
            return default
        where = f"{env}={text}"
        try:
            value = kind(text)
        except ValueError:
            raise AblateError(f"{where} is not a {'whole ' if kind is int else ''}number; write e.g. {env}={default:g} "
                              "(0: no limit)") from None
    if value < 0:
        raise AblateError(f"{where} is negative; give {flag} or {env} a number >= 0 (0: no limit)")
    return value


def print_rows(columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str) -> None:
    if fmt == "json":
        sys.stdout.write(json.dumps([dict(zip(columns, r)) for r in rows], default=str, indent=1) + "\n")
    elif fmt == "csv":
        import csv

        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)
    else:
        table = Table()
        for c in columns:
            table.add_column(str(c))
        for r in rows:
            table.add_row(*("NULL" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v) for v in r))
        console.print(table)
        console.print(f"{len(rows)} row{'s' if len(rows) != 1 else ''}")


# ---------------------------------------------------------------- db


@command("db")
def cmd_db(args: argparse.Namespace) -> int:
    from ablate import store

    # `current` only reads: it never creates the database
    engine = store.connect(args.db, upgrade=False) if args.db_command == "upgrade" else store.make_engine(args.db, read_only=True)
    before = store.current_revision(engine)
    if args.db_command == "upgrade":
        after = store.upgrade_schema(engine)
        console.print(f"{store.describe_url(str(engine.url))}: schema {before or 'empty'} -> {after}")
        from ablate.store import readlogin

        said = readlogin.ensure_login(engine)
        if said:
            console.print(said, highlight=False)
    else:
        console.print(f"{store.describe_url(str(engine.url))}: schema {before or 'empty'} (newest {store.head_revision(engine)})")
    return 0


def _prefect_command() -> str:
    """`prefect` on PATH, else the one installed beside this Python (a venv used without activating it)."""
    import shutil
    import sys
    from pathlib import Path

    beside = Path(sys.executable).parent / "prefect"
    return shutil.which("prefect") or (str(beside) if beside.exists() else "prefect")


# ---------------------------------------------------------------- models


@command("models")
def cmd_models(args: argparse.Namespace) -> int:
    from ablate import models

    table = Table(title="architectures (use as `architecture:` in a sweep; options under `options:`)", title_justify="left")
    table.add_column("name")
    table.add_column("what")
    table.add_column("options (default)")
    for name, family in models.families().items():
        cls = models.options_model(name)
        opts = ", ".join(f"{k}={f.default!r}" for k, f in cls.model_fields.items())
        table.add_row(name, family.description, opts)
    console.print(table)
    return 0


# ---------------------------------------------------------------- sweep


@command("sweep")
def cmd_sweep(args: argparse.Namespace) -> int:
    from ablate import runner, store

    if args.sweep_command == "register":
        spec, sweep_id, ids = runner.register(args.spec, args.db, max_trials=args.max_trials, say=console.print,
                                              overrides=_overrides(args), merge=args.merge)
        console.print(f"sweep {spec.name} (id {sweep_id}): {len(ids)} runs registered")
        return 0
    if args.sweep_command == "run":
        return _sweep_run(args)
    if args.sweep_command == "status":  # reading: never creates or migrates a database
        engine = store.reader(args.db)
        if (args.format or ("table" if console.is_terminal else "csv")) == "csv":
            print_status_csv(runner.status_rows(engine, args.name))
        elif args.all:
            console.print(runs_table(runner.status_rows(engine, args.name), title=f"sweep {args.name}", limit=None))
        else:  # the rows it shows and the counts: not every run of a 100,000-run sweep
            rows, counts = runner.status_view(engine, args.name, STATUS_ROWS)
            console.print(runs_table(rows, title=f"sweep {args.name}", counts=counts))
        return 0
    if args.sweep_command == "cancel":
        waiting, stopping, left = runner.cancel(store.connect(args.db), args.name)
        console.print(f"sweep {args.name}: {waiting} waiting runs cancelled, {stopping} running runs cancelled "
                      f"(their trainers checkpoint and stop, on any host)")
        if left:
            err_console.print(f"{left} trainer(s) still running after 60 s (a checkpoint in progress, or a host that "
                              f"cannot reach the database); `ablate sweep status {args.name}` shows them")
            return 1
        return 0
    raise AssertionError(args.sweep_command)


STATUS_ROWS = 200  # past this many runs, a status table shows the unfinished and latest ones and counts the rest


def _progress(r: Any) -> str:
    """How far through its budget a run is (wall-clock budgets), from its row."""
    if r.budget_kind != "wall_clock" or not r.budget_amount:
        return "-"
    if r.status == "completed":
        return "100%"
    used = r.train_seconds if r.train_seconds is not None else (r.last_elapsed_seconds or 0.0)
    return f"{min(used / r.budget_amount, 1):.0%}"


def _reason(r: Any) -> str:
    """The first line of a run's error (why it failed, oom'd or was stopped), or why a `running` row is stale."""
    if r.status == "running" and _stale(r):
        beat = f"{(_utcnow() - r.heartbeat_at).total_seconds():.0f} s ago" if r.heartbeat_at else "never"
        return f"stale: its trainer last beat {beat} (machine or process gone); the next runner takes it over"
    if r.status == "cancelled" and _trainer_running(r):
        return (f"cancelling: trainer still running (pid {r.pid} on {(r.claimed_by or '?').partition(':')[0]}); it "
                "checkpoints and stops, or is killed after its grace")
    return (r.error or "").strip().splitlines()[0][:120] if (r.error or "").strip() else ""


def _trainer_running(r: Any) -> bool:
    from ablate import store

    return hasattr(r, "pid") and store.trainer_running(r)


def _stale(r: Any) -> bool:
    from ablate import store

    return hasattr(r, "heartbeat_at") and not store.is_live(r)


def _utcnow() -> Any:
    from ablate import store

    return store.utcnow()


def _status_cells(r: Any) -> dict[str, Any]:
    """One run's status row as plain values (csv) keyed by column."""
    pick = lambda final, last: final if final is not None else last  # noqa: E731
    return {"run": r.id, "architecture": r.architecture,
            "options": ",".join(f"{k}={v}" for k, v in sorted((r.options or {}).items())), "d_model": r.d_model,
            "layers": r.layers, "heads": r.heads, "lr": r.lr, "batch": r.batch_size, "status": r.status,
            "budget": _progress(r), "steps": pick(r.steps, r.last_step),
            "train": pick(r.final_train_loss, r.last_train_loss), "eval": pick(r.final_eval_loss, r.last_eval_loss),
            "reason": _reason(r)}


def shown_runs(rows: Sequence[Any], limit: int = STATUS_ROWS, total: int | None = None) -> list[Any]:
    """At most `limit` rows, in trial order: every unfinished run that is not waiting (running, failed ...),
    then the latest finished, then the next waiting ones (`total`: the sweep's runs, where `rows` holds only
    those candidates, runner.status_view)."""
    if (len(rows) if total is None else total) <= limit:
        return list(rows)
    import datetime as dt

    from ablate import store

    waiting = [r for r in rows if r.status == "pending"]
    done = sorted((r for r in rows if r.status in store.FINISHED), key=lambda r: (r.finished_at is not None, r.finished_at or dt.datetime.min, r.id), reverse=True)
    active = [r for r in rows if r.status != "pending" and r.status not in store.FINISHED]
    keep = {r.id for r in (active + done + waiting)[:limit]}
    return [r for r in rows if r.id in keep]


def runs_table(rows: Sequence[Any], title: str = "", limit: int | None = STATUS_ROWS,
               counts: dict[str, int] | None = None) -> Table:
    """One row per run (at most `limit`, None: all): axes, status, progress through the budget, the latest losses
    and the reason of a failure, from run-row columns only; a caption counts the runs by status (`counts`: the
    sweep's, where `rows` are only the candidates to show)."""
    if counts is None:
        counts = defaultdict(int)
        for r in rows:
            counts[r.status] += 1
    total = sum(counts.values())
    shown = shown_runs(rows, limit, total) if limit else list(rows)
    caption = ", ".join(f"{n:,} {status}" for status, n in sorted(counts.items()))
    if len(shown) < total:
        caption = (f"showing {len(shown):,} of {total:,} runs (unfinished, the latest finished, the next pending); "
                   f"{caption}; --all for every run, --format csv for a file")
    table = Table(title=title, title_justify="left", caption=caption or None, caption_justify="left")
    styles = {"completed": "green", "running": "cyan", "oom": "yellow", "diverged": "yellow",
              "failed": "red", "preempted": "magenta"}
    for col in STATUS_HEADER:
        table.add_column(col, justify="left" if col in ("architecture", "options", "status", "reason") else "right")
    for r in shown:
        c = _status_cells(r)
        style = styles.get(r.status, "")
        table.add_row(str(c["run"]), c["architecture"], escape(c["options"]), str(c["d_model"]), str(c["layers"]),
                      str(c["heads"] or "-"), f"{c['lr']:g}", str(c["batch"]),
                      f"[{style}]{c['status']}[/]" if style else c["status"], c["budget"],
                      "-" if c["steps"] is None else str(c["steps"]),
                      "-" if c["train"] is None else f"{c['train']:.3f}",
                      "-" if c["eval"] is None else f"{c['eval']:.3f}", escape(c["reason"]))
    return table


STATUS_HEADER = ("run", "architecture", "options", "d_model", "layers", "heads", "lr", "batch", "status", "budget",
                 "steps", "train", "eval", "reason")


def print_status_csv(rows: Sequence[Any]) -> None:
    """Every run as csv on stdout (full precision), for scripts and pipes."""
    import csv

    writer = csv.DictWriter(sys.stdout, fieldnames=STATUS_HEADER, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: "" if v is None else v for k, v in _status_cells(r).items()})


def _sweep_run(args: argparse.Namespace) -> int:
    """Run the `sweep` flow in-process (Prefect's ephemeral API) with a live table of runs."""
    import os
    import signal
    import threading
    from pathlib import Path

    # the live table is the display (failed trials and their reasons are in it: no Prefect tracebacks over it)
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "CRITICAL")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no telemetry calls from a lab machine
    os.environ.setdefault("DO_NOT_TRACK", "1")  # nor from the client, whose first-run notice would print over the table
    # the local API is a subprocess that must start within this; Prefect's 20 s expired on a loaded host
    os.environ.setdefault(PREFECT_START_TIMEOUT, str(PREFECT_START_SECONDS))
    from ablate import runner, store

    # errors before any Prefect start-up: the spec, then its data (built once here, before any trial starts)
    overrides = _overrides(args)
    spec, _, ids = runner.register(args.spec, args.db, max_trials=args.max_trials, say=err_console.print,
                                   overrides=overrides, merge=args.merge, artifacts=Path(args.artifacts))
    engine = store.connect(args.db)
    os.environ["ABLATE_DB_URL"] = store.resolve_url(args.db)  # for the flow and its trainers, which get db_url=None
    # measured now, before the local Prefect server starts (it would count as another job)
    threads = args.threads or runner.default_threads(max(1, args.gpu_slots // spec.budget.gpus), spec.budget.gpus)
    console.print(f"sweep {spec.name}: {len(ids)} trials, {spec.budget.describe()} each, {threads} thread(s) per "
                  f"trainer; results in {store.describe_url(str(engine.url))}")
    from flows.sweep import TrialsFailed
    from flows.sweep import sweep as sweep_flow

    done = threading.Event()

    def render() -> Table:
        rows, counts = runner.status_view(engine, spec.name, STATUS_ROWS)
        finished = sum(n for status, n in counts.items() if status in store.FINISHED)
        return runs_table(rows, title=f"sweep {spec.name}: {finished}/{sum(counts.values())} finished", counts=counts)

    result: dict[str, Any] = {}

    def work() -> None:
        try:
            from ablate.runner import localserver

            localserver.start()  # ended with this process, even a killed one (no orphaned server)
            # the URL goes by environment, not as a flow parameter (Prefect stores those in plain text)
            state = sweep_flow(spec=str(args.spec), db_url=None, artifacts=str(args.artifacts),
                               gpu_slots=args.gpu_slots, retry_failed=args.retry_failed,
                               checkpoint_every=args.checkpoint_every, memory_cap_mb=args.memory_cap_mb,
                               threads=threads, merge=args.merge, return_state=True,
                               **{k: v for k, v in overrides.items() if v is not None})
            if state.is_failed():  # failed trials are counted below, from the DB; anything else is an error
                outcome = state.result(raise_on_failure=False)
                if isinstance(outcome, BaseException) and not isinstance(outcome, TrialsFailed):
                    raise outcome
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            result["error"] = exc
        finally:
            done.set()

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops the sweep as cleanly as Ctrl-C
    try:
        _watch(render, done, engine, spec.name)
    except KeyboardInterrupt:
        runner.STOP.set()  # run_trial SIGTERMs its trainer (checkpoint, `preempted`); no new trial starts
        err_console.print("stopping: running trainers checkpoint and stop (Ctrl-C again to abandon them)...")
        done.wait(runner.STOP_GRACE_SECONDS)
        console.print(render())
        err_console.print(f"sweep {spec.name} stopped; resume it with: ablate sweep run {args.spec}"
                          + (f" --db {store.redact(args.db)}" if args.db else ""))
        return 130
    worker.join()
    if "error" in result:
        raise _prefect_start_failure(result["error"]) or result["error"]
    counts = runner.status_counts(engine, spec.name)
    console.print(f"sweep {spec.name}: " + ", ".join(f"{n} {status}" for status, n in counts.items()))
    return 1 if counts.get("failed") or counts.get("preempted") else 0


PREFECT_START_TIMEOUT = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
PREFECT_START_SECONDS = 300


def _prefect_start_failure(exc: BaseException) -> AblateError | None:
    """A clear error for Prefect's local API that did not start in time (else None: not that failure)."""
    if "ephemeral Prefect API server" not in str(exc):
        return None
    import os

    return AblateError(
        f"Prefect's local API server did not start within {os.environ.get(PREFECT_START_TIMEOUT)} s (a busy host, or "
        f"a broken Prefect install: {str(exc).splitlines()[0][:200]}). The sweep's runs are registered and nothing "
        f"was trained; run the same command again with {PREFECT_START_TIMEOUT}=600, or start a server once "
        "(`prefect server start`) and set PREFECT_API_URL=http://127.0.0.1:4200/api")


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def _watch(render: Callable[[], Table], done: Any, engine: Any, name: str) -> None:
    """The live table on a terminal; otherwise a status line whenever it changes, then the table."""
    import time

    from rich.live import Live

    from ablate import runner

    if console.is_terminal:
        with Live(render(), console=console, refresh_per_second=2) as live:
            while not done.wait(1.0):
                live.update(render())
            live.update(render())
        return
    last = ""
    while not done.wait(5.0):
        line = ", ".join(f"{n} {status}" for status, n in runner.status_counts(engine, name).items())
        if line != last:
            console.print(f"[{time.strftime('%H:%M:%S')}] {line}")
            last = line
    console.print(render())


@command("search")
def cmd_search(args: argparse.Namespace) -> int:
    """Optuna searches: `run` asks, trains and tells trials here; `report` writes the study's best trial and plots."""
    from pathlib import Path

    from ablate import search

    if args.search_command == "report":
        rep = search.build_search_report(args.name, args.db, Path(args.out) if args.out else None)
        console.print(f"search {args.name}: " + ", ".join(f"{n} {s.lower()}" for s, n in rep.counts.items()))
        if rep.best:
            console.print(f"best: trial {rep.best['number']} (run {rep.best['run_id']}), final eval loss "
                          f"{rep.best['value']:.4f}, {rep.best['params']}")
        if rep.importances:
            console.print("importances: " + ", ".join(f"{k} {v:.2f}" for k, v in rep.importances.items()))
        console.print(f"report written to {rep.out}/ (" + ", ".join(p.name for p in rep.files) + ")")
        return 0
    from ablate import runner
    from ablate.config import load_spec

    spec = load_spec(args.spec)
    search.check_search(spec, args.spec)
    opts = runner.RunOptions(db_url=args.db, artifacts=Path(args.artifacts), checkpoint_every=args.checkpoint_every,
                             memory_cap_mb=args.memory_cap_mb,
                             threads=args.threads or runner.default_threads(args.workers, spec.budget.gpus))
    total = search.planned_trials(spec.search, args.n_trials)
    console.print(f"search {spec.name}: {total} trials ({spec.search.sampler}, pruner {spec.search.pruner}), "
                  f"{args.workers} worker(s) here, {spec.budget.describe()} each")

    def on_trial(o: search.TrialOutcome) -> None:
        value = "" if o.value is None else f" {o.value:.4f}"
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in o.params.items())
        console.print(f"trial {o.number}: {o.run_status}{value} (run {o.run_id}) {params}")

    import signal

    def stop_on_sigterm(*_: Any) -> None:
        raise KeyboardInterrupt  # like Ctrl-C: trainers checkpoint, their trials are re-queued for the next run

    signal.signal(signal.SIGTERM, stop_on_sigterm)
    outcomes = search.run_search(args.spec, args.db, opts, workers=args.workers, n_trials=args.n_trials,
                                 seed=args.seed, on_trial=on_trial)
    console.print(f"search {spec.name}: {len(outcomes)} trials run here; `ablate search report {spec.name}` for the best")
    return 0


@command("report")
def cmd_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ablate.report import build_report

    from ablate.report import build_comparison

    formats = tuple(f.strip() for f in args.format.split(","))
    out = Path(args.out) if args.out else None
    if args.compare:
        report = build_comparison([args.sweep, *args.compare], args.db, out, formats=formats, artifacts=args.artifacts)
    else:
        report = build_report(args.sweep, args.db, out, formats=formats, artifacts=args.artifacts)
    for table in report.tables:
        console.print(escape(table.markdown()))
        console.print()
    for line in report.orderings:
        console.print(escape(line))
        console.print()
    console.print(f"report written to {report.out}/ (" + ", ".join(p.name for p in report.files) + ")")
    return 0


@command("generate")
def cmd_generate(args: argparse.Namespace) -> int:
    from ablate.train.generate import complete, load_run_model

    trial, model, tokenizer = load_run_model(args.run, args.db, args.artifacts)
    text = complete(model, tokenizer, args.prompt, trial.context, args.max_new, args.top_k, args.temperature, args.seed)
    console.print(f"[bold]{escape(args.prompt)}[/]" + escape(text))
    return 0


@command("retrieval")
def cmd_retrieval(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ablate.retrieval import run_stage

    table, files = run_stage(args.sweep, args.db, Path(args.out) if args.out else None, steps=args.steps,
                             candidates=args.candidates or None, progress=not args.quiet, artifacts=args.artifacts)
    console.print(files[0].read_text())
    console.print(f"{len(table)} cells recorded (metrics split 'retrieval', step = c); written to "
                  + ", ".join(str(f) for f in files))
    return 0


@command("worker")
def cmd_worker(args: argparse.Namespace) -> int:
    """Prefect workers for a work pool on this machine: one per group of --gpus-per-trial GPUs, each running at
    most one trial at a time on its own CUDA_VISIBLE_DEVICES (no two trials share a GPU); on a machine without
    GPUs, one worker running --slots trials at once. Stops them all on Ctrl-C / SIGTERM."""
    import os
    import signal
    import socket
    import subprocess
    import time

    from ablate import runner

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = runner.visible_gpus()
    ids = [d.strip() for d in visible.split(",")][:count] if visible is not None else [str(i) for i in range(count)]
    per = args.gpus_per_trial
    groups: list[list[str] | None] = [ids[i:i + per] for i in range(0, len(ids) - per + 1, per)]
    if ids and not groups:
        raise AblateError(f"--gpus-per-trial {per}: this machine shows only {len(ids)} GPU(s) ({','.join(ids)})")
    limit = 1 if groups else args.slots
    groups = groups or [None]
    host = socket.gethostname()
    procs = []
    for group in groups:
        env = dict(os.environ)
        label = "cpu"
        if group is not None:
            env["CUDA_VISIBLE_DEVICES"] = label = ",".join(group)
        cmd = [_prefect_command(), "worker", "start", "--pool", args.pool, "--type", "process", "--limit", str(limit),
               "--name", f"{host}-{args.pool}-{label.replace(',', '+')}-{os.getpid()}"]
        console.print(f"worker on pool {args.pool}: {'GPUs ' + label if group else 'no GPU'}, at most {limit} trial(s) "
                      f"at once: {' '.join(cmd)}")
        procs.append(subprocess.Popen(cmd, env=env))

    told = {"stop": False}

    def stop(*_: Any) -> None:
        told["stop"] = True
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    try:
        while not told["stop"] and all(p.poll() is None for p in procs):
            time.sleep(1)
    except KeyboardInterrupt:
        told["stop"] = True
    ended = next((p for p in procs if p.poll() is not None), None)
    stop()  # one worker ended (or we were told to stop): end the others, so a restart policy restarts them all
    for p in procs:
        p.wait()
    return 0 if ended is None else abs(ended.returncode or 0)


@command("deploy")
def cmd_deploy(args: argparse.Namespace) -> int:
    """Register Prefect deployments on the server at PREFECT_API_URL."""
    from pathlib import Path

    from flows.deploy import deploy_all

    slots = {}
    for item in args.slots:
        hardware, _, n = item.partition("=")
        if not n.isdigit():
            from ablate.config.errors import AblateError

            raise AblateError(f"--slots {item!r}: write HARDWARE=N, e.g. --slots rtx3060=1 --slots v100=4")
        slots[hardware] = int(n)
    names = deploy_all(Path(args.sweeps), db_url=args.db, artifacts=args.artifacts, slots=slots, pools=args.pool,
                       say=lambda line: console.print(line, highlight=False))
    console.print(f"registered {len(names)} deployments")
    console.print("start workers with: prefect worker start --pool sweeps  and  prefect worker start --pool HARDWARE")
    return 0


# ---------------------------------------------------------------- parser


ARTIFACTS_HELP = ("the artifacts folder the runs were trained with; checkpoints are only loaded from inside it "
                  "(default: $ABLATE_ARTIFACTS or results/artifacts)")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", default=argparse.SUPPRESS,
                        help="results database URL or SQLite path (default: $ABLATE_DB_URL or results/ablate.db)")
    p = argparse.ArgumentParser(prog="ablate", description=__doc__, parents=[common])
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("plan", parents=[common], help="validate a sweep file and list its trials")
    s.add_argument("spec", help="sweep file, e.g. sweeps/tinystories-widths.yaml")
    s.add_argument("--max-trials", type=int, default=10_000, help="refuse grids larger than this (default 10,000)")
    s.add_argument("--all", action="store_true", help="list every trial (default: the first 200, the rest counted)")
    _add_overrides(s, merge=False)

    s = sub.add_parser("worker", parents=[common], help="Prefect workers for a pool here: one trial per GPU")
    s.add_argument("--pool", required=True, help="the work pool: the hardware class of the sweeps (rtx3060, v100, cpu)")
    s.add_argument("--gpus-per-trial", type=int, default=environment().gpus_per_trial,
                   help="GPUs each trial gets (the sweeps' budget.gpus; default $ABLATE_GPUS_PER_TRIAL or 1)")
    s.add_argument("--slots", type=int, default=1, help="without GPUs: trials at once (default 1)")

    s = sub.add_parser("sql", parents=[common], help="read-only SQL over the results database")
    s.add_argument("query", help='e.g. "SELECT architecture, d_model, final_eval_loss FROM runs"')
    s.add_argument("--format", choices=("table", "csv", "json"), default="table")
    s.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="stop the query after this long (default: $ABLATE_SQL_TIMEOUT or 30; 0: no limit)")
    s.add_argument("--max-rows", type=int, default=None, metavar="N",
                   help="refuse a result longer than this (default: $ABLATE_SQL_MAX_ROWS or 10,000; 0: no limit)")
    s.add_argument("--max-bytes", type=int, default=None, metavar="N",
                   help="refuse a result larger than this many bytes (default: $ABLATE_SQL_MAX_BYTES or 64 MiB; 0: no "
                        "limit)")

    s = sub.add_parser("db", parents=[common], help="results database schema")
    s.add_argument("db_command", choices=("upgrade", "current"), help="upgrade: migrate to the newest schema")

    s = sub.add_parser("sweep", parents=[common], help="register, run and inspect sweeps")
    ssub = s.add_subparsers(dest="sweep_command", required=True, metavar="ACTION")
    r = ssub.add_parser("register", parents=[common], help="validate a sweep file and register its pending runs")
    r.add_argument("spec")
    r.add_argument("--max-trials", type=int, default=10_000)
    _add_overrides(r)
    r = ssub.add_parser("run", parents=[common], help="run every unfinished trial of a sweep here (local Prefect)")
    r.add_argument("spec")
    r.add_argument("--max-trials", type=int, default=10_000)
    r.add_argument("--gpu-slots", type=int, default=None, help="trials at once (default: GPUs visible, 1 on CPU)")
    r.add_argument("--retry-failed", action="store_true", help="also re-run cancelled runs and failed runs past 3 attempts")
    r.add_argument("--artifacts", default="results/artifacts", help="token caches, tokenizers, checkpoints, logs")
    r.add_argument("--checkpoint-every", type=float, default=None,
                   help="seconds between checkpoints (default: a tenth of the budget, 30 s to 10 min)")
    r.add_argument("--memory-cap-mb", type=float, default=None, help="treat peak memory above this as OOM")
    r.add_argument("--threads", type=int, default=None,
                   help="torch threads per trainer (default: the cores other jobs leave free / trials at once)")
    _add_overrides(r)
    r = ssub.add_parser("status", parents=[common], help="table of a sweep's runs")
    r.add_argument("name")
    r.add_argument("--all", action="store_true", help=f"every run (default: at most {STATUS_ROWS}, the rest counted)")
    r.add_argument("--format", choices=("table", "csv"), default=None,
                   help="table or csv (default: a table on a terminal, csv (every run) when piped)")
    r = ssub.add_parser("cancel", parents=[common], help="cancel waiting runs and stop running ones (checkpointed)")
    r.add_argument("name")

    s = sub.add_parser("search", parents=[common], help="Optuna searches over a sweep's `search` block")
    ssub = s.add_subparsers(dest="search_command", required=True, metavar="ACTION")
    r = ssub.add_parser("run", parents=[common], help="run (or continue) the search here until the study has n_trials")
    r.add_argument("spec", help="sweep file with a `search:` block, e.g. sweeps/tinystories-heads-lr.yaml")
    r.add_argument("--workers", type=int, default=1, help="trials at once here, each asking the shared study (default 1)")
    r.add_argument("--n-trials", type=int, default=None, help="trials the study should hold (default: the spec's)")
    r.add_argument("--seed", type=int, default=None, help="sampler seed (default: from the spec name)")
    r.add_argument("--threads", type=int, default=None, help="torch threads per trainer (default: free cores / workers)")
    r.add_argument("--artifacts", default="results/artifacts", help="token caches, tokenizers, checkpoints, logs")
    r.add_argument("--checkpoint-every", type=float, default=None,
                   help="seconds between checkpoints (default: a tenth of the budget, 30 s to 10 min)")
    r.add_argument("--memory-cap-mb", type=float, default=None, help="treat peak memory above this as OOM")
    r = ssub.add_parser("report", parents=[common], help="best trial, importances, history and slice plots (PNG)")
    r.add_argument("name", help="study name (the spec's `name`)")
    r.add_argument("--out", default=None, help="output folder (default results/reports/NAME)")

    s = sub.add_parser("report", parents=[common], help="the studies' tables and loss curves for a sweep")
    s.add_argument("sweep", help="sweep name (as in the spec's `name`)")
    s.add_argument("--out", default=None, help="output folder (default results/reports/SWEEP)")
    s.add_argument("--format", default="md,html,png,svg,csv", help="comma-separated: md, html, png, svg, csv")
    s.add_argument("--compare", nargs="+", default=[], metavar="SWEEP",
                   help="other sweeps to put beside this one in a single table")
    s.add_argument("--artifacts", default=None, help=ARTIFACTS_HELP)

    s = sub.add_parser("generate", parents=[common], help="complete a prompt with a trained run")
    s.add_argument("run", type=int, help="run id (see `ablate sweep status`)")
    s.add_argument("--prompt", required=True)
    s.add_argument("--max-new", type=int, default=64)
    s.add_argument("--top-k", type=int, default=0, help="0: greedy")
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--artifacts", default=None, help=ARTIFACTS_HELP)

    s = sub.add_parser("retrieval", parents=[common],
                       help="a sweep's retrieval stage: embed pairs with each completed run, train retrieval models")
    s.add_argument("sweep", help="sweep name (its spec has a `retrieval:` block)")
    s.add_argument("--candidates", type=int, nargs="+", default=[], help="override the spec's candidate counts")
    s.add_argument("--steps", type=int, default=None, help="override the spec's retrieval training steps")
    s.add_argument("--out", default=None, help="output folder (default results/reports/SWEEP)")
    s.add_argument("--quiet", action="store_true", help="no progress output")
    s.add_argument("--artifacts", default=None, help=ARTIFACTS_HELP)

    s = sub.add_parser("deploy", parents=[common], help="register Prefect deployments sweep/<name> and trial/<hardware>")
    s.add_argument("--sweeps", default="sweeps", help="folder of sweep files")
    s.add_argument("--pool", action="append", default=[], metavar="HARDWARE",
                   help="also a work pool and trial deployment for this hardware (for --param hardware=... overrides)")
    s.add_argument("--artifacts", default=None, help="shared artifacts path the workers use")
    s.add_argument("--slots", action="append", default=[], metavar="HARDWARE=N",
                   help="GPU slots (pool concurrency) per hardware class; default 1")

    sub.add_parser("models", parents=[common], help="list the architecture registry and each family's options")
    return p


def _environment_hint(exc: Exception, url: str | None) -> str | None:
    """What to do about a database or disk error (read-only, full), or None for any other exception.
    SQLAlchemy is consulted only if the command loaded it: `plan` stays light."""
    sa_exc = sys.modules.get("sqlalchemy.exc")
    if not isinstance(exc, OSError) and not (sa_exc is not None and isinstance(exc, sa_exc.DBAPIError)):
        return None
    from ablate.store import explain

    return explain(exc, url)


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # the `ablate` program (not a caller in Python): `kill -USR1 PID` prints every thread's stack
        import faulthandler
        import signal

        faulthandler.register(signal.SIGUSR1, all_threads=True)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.db = getattr(args, "db", None)  # --db may come before or after the command
    if getattr(args, "gpu_slots", 0) is None:
        from ablate.runner import visible_gpus

        args.gpu_slots = max(1, visible_gpus())
    try:
        return COMMANDS[args.command](args) or 0
    except AblateError as exc:
        from ablate.store import redact

        err_console.print("[bold red]error:[/] " + escape(redact(str(exc))), soft_wrap=True)
        return 2
    except Exception as exc:  # the environment, not ablate: a read-only or full database or disk
        hint = _environment_hint(exc, args.db)
        if hint is None:
            raise
        from ablate.store import redact

        err_console.print("[bold red]error:[/] " + escape(redact(hint)), soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
