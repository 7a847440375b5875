"""What the commands share: the consoles, `--db`, the spec overrides, the launch flags, and output helpers."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click
from rich.console import Console
from rich.table import Table

console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, highlight=False)

STATUS_ROWS = 200  # past this many runs (or trials), a table shows the unfinished and latest ones and counts the rest
ARTIFACTS_HELP = ("the artifacts folder the runs were trained with; checkpoints are only loaded from inside it "
                  "(default: $ABLATE_ARTIFACTS or results/artifacts)")
DB_HELP = "results database URL or SQLite path (default: $ABLATE_DB_URL or results/ablate.db)"
DB = "ablate.db"  # where --db goes in the context's meta, shared by a command and the groups above it


class Ordered(click.Group):
    """A group that lists its commands in the order they were added (click sorts them by name)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)


def about(summary: str, *arguments: str) -> dict[str, str]:
    """A command's help: `summary`, whole in its group's list of commands, then what its arguments are."""
    return {"short_help": summary, "help": "\n\n".join([summary, *arguments])}


# ---------------------------------------------------------------- --db, anywhere on the command line


def require_prefect(command: str) -> None:
    """Prefect is the `prefect` extra: a node that only trains (an offline bundle without it) says so here, before
    anything is registered or started."""
    import importlib.util

    if importlib.util.find_spec("prefect") is None:
        from ablate.config.errors import AblateError

        raise AblateError(f"`{command}` runs on Prefect, which is not installed here: pip install 'ablate[prefect]' "
                          "(offline: build the bundle with `ablate bundle --with prefect`)")


def _remember_db(ctx: click.Context, _: click.Parameter, value: str | None) -> str | None:
    """--db may come before or after the command (`ablate --db X sql ...`, `ablate sql ... --db X`); the last wins."""
    if value is not None:
        ctx.meta[DB] = value
    return ctx.meta.get(DB)


def db_option(expose: bool = True) -> Callable:
    """--db on a command (its function gets `db`: this one or one given before the command), or on a group."""
    return click.option("--db", default=None, expose_value=expose, callback=_remember_db, help=DB_HELP)


# ---------------------------------------------------------------- spec overrides and launch flags


OVERRIDES = ("budget", "source", "holdout", "vocab_size", "gpus", "hardware", "name")
OVERRIDES_NOTE = "The overrides (--budget ... --hardware, KEY=VALUE) name the sweep after them, unless --name."
ASSIGNMENTS_HELP = ("KEY=VALUE: set any field of the file, a dotted path and a YAML value, e.g. defaults.lr=1e-3 "
                    "'grid.0.d_model=[64,128]' (applied before the flags)")


def _check_assignments(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    """Each KEY=VALUE read now, so a mistyped one is a usage error before anything loads (see config.dotted)."""
    from ablate.config.dotted import parse_assignment
    from ablate.config.errors import SpecError

    for text in value:
        try:
            parse_assignment(text)
        except SpecError as exc:
            raise click.BadParameter(exc.problems[0], ctx=ctx, param=param) from None
    return value


def assignments_argument() -> Callable:
    """The dotted overrides after SPEC: `ablate plan SPEC defaults.lr=1e-3 grid.0.d_model=[64,128]`."""
    return click.argument("assignments", nargs=-1, metavar="[KEY=VALUE]...", callback=_check_assignments)


def override_options(merge: bool = True) -> Callable:
    """--budget, --source, --holdout, --vocab-size, --gpus, --hardware, --name (and --merge): see `overrides_of`."""
    options = [
        click.option("--budget", default=None, help="budget per trial: 10m (wall clock), steps=200, tokens=50M"),
        click.option("--source", default=None, help="dataset.source: a local path or hub id (a local one, where the "
                     "spec evaluates on a named split, holds out the last 1000 documents instead)"),
        click.option("--holdout", type=int, default=None,
                     help="evaluate on the last N documents of the training data"),
        click.option("--vocab-size", type=int, default=None, help="train a BPE tokenizer of this size"),
        click.option("--gpus", type=int, default=None, help="GPUs per trial (torchrun when > 1); the global batch is "
                     "kept by scaling grad_accum"),
        click.option("--hardware", default=None, help="hardware profile / work pool (rtx3060, v100, a100, h100, ...)"),
        click.option("--name", default=None, help="the sweep's name in the results DB"),
    ]
    if merge:
        options.append(click.option("--merge", is_flag=True,
                                    help="add the trials to a same-named sweep that holds results of other trials"))
    return _stack(options)


def overrides_of(params: dict[str, Any]) -> dict[str, Any]:
    """The spec overrides given on the command line, out of a command's parameters (see
    config.overrides.apply_overrides); the KEY=VALUE arguments are its `set`."""
    return {**{key: params.pop(key) for key in OVERRIDES}, "set": list(params.pop("assignments", ())) or None}


def launch_flags(threads_help: str) -> Callable:
    """--artifacts, --checkpoint-every, --memory-cap-mb, --threads: how this machine runs the trainers."""
    return _stack([
        click.option("--artifacts", default="results/artifacts",
                     help="token caches, tokenizers, checkpoints, logs"),
        click.option("--checkpoint-every", type=float, default=None,
                     help="seconds between checkpoints (default: a tenth of the budget, 30 s to 10 min)"),
        click.option("--memory-cap-mb", type=float, default=None, help="treat peak memory above this as OOM"),
        click.option("--threads", type=int, default=None, help=threads_help),
    ])


def launch_of(params: dict[str, Any], db_url: str | None) -> Any:
    """The launch flags, taken out of a command's parameters, as one LaunchOptions (a bad value names its flag)."""
    from ablate.config.launch import FLOW_FIELDS, flag, launch_options

    given = {k: params.pop(k) for k in FLOW_FIELDS if k != "db_url"}
    return launch_options(dict(db_url=db_url, **given), flag)


def _stack(decorators: list[Callable]) -> Callable:
    """Options in the order given (click lists an option applied last first)."""
    def apply(fn: Callable) -> Callable:
        for decorate in reversed(decorators):
            fn = decorate(fn)
        return fn

    return apply


class Greedy(click.Command):
    """A command whose `greedy` options take every value up to the next option, as argparse's nargs="+" did:
    `--compare a b` is read as `--compare a --compare b`."""

    greedy: tuple[str, ...] = ()

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, spread(args, self.greedy))


def greedy(*flags: str) -> type[Greedy]:
    return type("Greedy", (Greedy,), {"greedy": flags})


def spread(args: Sequence[str], flags: Sequence[str]) -> list[str]:
    """`args` with each value after a greedy flag given its own flag; a greedy flag with no value goes last, where
    click says that it needs one."""
    out: list[str] = []
    flag, bare = None, []  # the greedy flag being read, and those that got no value
    for i, arg in enumerate(args):
        if arg == "--":
            return out + bare + list(args[i:])
        if arg.startswith("-") and not _number(arg):
            flag = arg if arg in flags else None
            if flag is None:
                out.append(arg)
            else:
                bare.append(flag)
        elif flag is not None:
            out += [flag, arg]
            if flag in bare:
                bare.remove(flag)
        else:
            out.append(arg)
    return out + bare


def _number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


# ---------------------------------------------------------------- output


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
