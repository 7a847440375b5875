"""The `ablate` command. User errors print one clear message and exit 2, without a traceback.

Built on click: the issue proposed typer as the library "which Prefect already installs", but Prefect 3 now builds
its own command line on cyclopts and brings click, not typer; click is the one that is really there. One module
per command group: plan; sweep (register, run, status, cancel; its tables in status); search; report (report,
generate, retrieval); db (db, sql, models); cluster (worker, deploy); check (the model contract). common holds what
they share: --db, the spec overrides, the launch flags, the output helpers; api is the Python door
(`ablate.sweep(SPEC)`: plan, run, status, report by the same code). Shell completion comes with click:
`eval "$(_ABLATE_COMPLETE=bash_source ablate)"` (zsh_source, fish_source).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click
from rich.markup import escape

from ablate.cli import bundle, check, cluster, db, export, plan, report, search, sweep, ui
from ablate.cli.common import (DB, STATUS_ROWS, Ordered, console, db_option, err_console, human_count, human_seconds,
                               print_rows)
from ablate.cli.plan import KNOWN_VOCABS, trial_param_counts, objective_label
from ablate.cli.status import print_status_csv, runs_table, shown_runs
from ablate.config.errors import AblateError

__all__ = ["KNOWN_VOCABS", "STATUS_ROWS", "trial_param_counts", "cli", "console", "err_console", "human_count",
           "human_seconds", "main", "objective_label", "parse", "print_rows", "print_status_csv", "runs_table",
           "shown_runs"]


class Ablate(Ordered):
    """The root group: a user's mistake, or the environment's (a read-only or full database or disk), ends the
    command with one message and exit 2, without a traceback; Ctrl-C ends it with 130."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx) or 0
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise  # the command line itself: main says what is wrong with it
        except AblateError as exc:
            return _fail(str(exc))
        except KeyboardInterrupt:
            err_console.print("interrupted")
            return 130
        except Exception as exc:  # the environment, not ablate: a read-only or full database or disk
            hint = _environment_hint(exc, ctx.meta.get(DB))
            if hint is None:
                raise
            return _fail(hint)


def _fail(message: str) -> int:
    from ablate.store import redact

    err_console.print("[bold red]error:[/] " + escape(redact(message)), soft_wrap=True)
    return 2


def _environment_hint(exc: Exception, url: str | None) -> str | None:
    """What to do about a database or disk error (read-only, full), or None for any other exception.
    SQLAlchemy is consulted only if the command loaded it: `plan` stays light."""
    sa_exc = sys.modules.get("sqlalchemy.exc")
    if not isinstance(exc, OSError) and not (sa_exc is not None and isinstance(exc, sa_exc.DBAPIError)):
        return None
    from ablate.store import explain

    return explain(exc, url)


def _print_version(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    """`ablate --version`: the installed package's version, looked up only when asked (startup stays light)."""
    if not value or ctx.resilient_parsing:
        return
    from importlib import metadata

    try:
        version = metadata.version("ablate")
    except metadata.PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
        from ablate import __version__ as version
    click.echo(f"ablate {version}")
    ctx.exit(0)


@click.group(cls=Ablate, help=__doc__.split("\n", 1)[0], subcommand_metavar="COMMAND [ARGS]...",
             context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="print ablate's version and exit")
@db_option(expose=False)
def cli() -> None:
    pass


for _command in (plan.plan, cluster.worker, db.sql, db.db_command, sweep.sweep_group, search.search_group,
                 report.report, report.generate, report.retrieval, ui.ui, export.export, cluster.deploy,
                 db.models_command, check.check_command, bundle.bundle):
    cli.add_command(_command)


def main(argv: Sequence[str] | None = None) -> int:
    """`ablate ARGV`; its exit code, returned (0, 1: failed trials, 2: a user error or a command line that does not
    parse, 130: interrupted)."""
    if argv is None:  # the `ablate` program (not a caller in Python): `kill -USR1 PID` prints every thread's stack
        import faulthandler
        import signal

        faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        return cli.main(args=None if argv is None else list(argv), prog_name="ablate", standalone_mode=False)
    except click.ClickException as exc:  # a usage error: its message and usage on stderr, exit 2
        exc.show()
        return exc.exit_code
    except click.Abort:  # Ctrl-C while the command line was read
        err_console.print("interrupted")
        return 130


def parse(argv: Sequence[str]) -> click.Context:
    """The context `ablate ARGV` would run its command in, parsed and checked but not run (a click.UsageError
    where it does not parse)."""
    ctx = cli.make_context("ablate", list(argv))
    while isinstance(ctx.command, click.Group):
        rest = [*getattr(ctx, "_protected_args", ()), *ctx.args]  # click 8 keeps the command's name apart
        name, command, rest = ctx.command.resolve_command(ctx, rest)
        ctx = command.make_context(name, rest, parent=ctx)
    return ctx
