"""The results database: `ablate sql` (read-only queries), `ablate db upgrade|current`, and `ablate models`
(the architecture registry)."""

from __future__ import annotations

import click
from rich.markup import escape
from rich.table import Table

from ablate.cli.common import about, console, db_option, err_console, print_rows
from ablate.config.errors import AblateError


@click.command(**about("read-only SQL over the results database",
                       'QUERY: e.g. "SELECT architecture, d_model, final_eval_loss FROM runs"'))
@click.argument("query")
@click.option("--format", "fmt", type=click.Choice(("table", "csv", "json")), default=None,
              help="table, csv or json (default: a table on a terminal, csv when piped)")
@click.option("--timeout", type=float, default=None, metavar="SECONDS",
              help="stop the query after this long (default: $ABLATE_SQL_TIMEOUT or 30; 0: no limit)")
@click.option("--max-rows", type=int, default=None, metavar="N",
              help="refuse a result longer than this (default: $ABLATE_SQL_MAX_ROWS or 10,000; 0: no limit)")
@click.option("--max-bytes", type=int, default=None, metavar="N",
              help="refuse a result larger than this many bytes (default: $ABLATE_SQL_MAX_BYTES or 64 MiB; 0: no "
                   "limit)")
@db_option()
def sql(query: str, fmt: str, timeout: float | None, max_rows: int | None, max_bytes: int | None,
        db: str | None) -> int:
    """Piped, it writes csv (as `sweep status` does): a script reads every value whole, not a table cut to fit."""
    from ablate.results import DEFAULT_MAX_BYTES, DEFAULT_MAX_ROWS, DEFAULT_TIMEOUT_SECONDS, read_only_query

    timeout = _sql_limit(timeout, "--timeout", "ABLATE_SQL_TIMEOUT", DEFAULT_TIMEOUT_SECONDS, float)
    max_rows = int(_sql_limit(max_rows, "--max-rows", "ABLATE_SQL_MAX_ROWS", DEFAULT_MAX_ROWS, int))
    max_bytes = int(_sql_limit(max_bytes, "--max-bytes", "ABLATE_SQL_MAX_BYTES", DEFAULT_MAX_BYTES, int))
    columns, rows = read_only_query(query, db, max_rows=max_rows, timeout_seconds=timeout, max_bytes=max_bytes)
    from ablate.store import readlogin

    note = readlogin.advice(db)
    if note:
        err_console.print(f"note: {note}", highlight=False)
    print_rows(columns, rows, fmt or ("table" if console.is_terminal else "csv"))
    return 0


def _sql_limit(value: float | None, flag: str, env: str, default: float, kind: type) -> float:
    """A limit of `ablate sql`: the flag, else the environment variable (read by Settings, checked here so that the
    message names the flag too), else the default; 0 means none."""
    from ablate.config.settings import PREFIX, environment

    where = f"{flag} {value:g}" if value is not None else ""
    if value is None:
        text = (getattr(environment(), env.removeprefix(PREFIX).lower()) or "").strip()
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


@click.command(name="db", **about("results database schema", "upgrade: migrate to the newest schema"))
@click.argument("db_command", type=click.Choice(("upgrade", "current")), metavar="{upgrade,current}")
@db_option()
def db_command(db_command: str, db: str | None) -> int:
    """upgrade: migrate to the newest schema; current: say which schema it has (only reads: never creates it)."""
    from ablate import store

    if db_command == "current":
        engine = store.make_engine(db, read_only=True)
        console.print(f"{store.describe_url(str(engine.url))}: schema {store.current_revision(engine) or 'empty'} "
                      f"(newest {store.head_revision(engine)})")
        return 0
    engine = store.connect(db, upgrade=False)
    before = store.current_revision(engine)
    after = store.upgrade_schema(engine)
    console.print(f"{store.describe_url(str(engine.url))}: schema {before or 'empty'} -> {after}")
    from ablate.store import readlogin

    said = readlogin.ensure_login(engine)
    if said:
        console.print(said, highlight=False)
    return 0


@click.command(name="models", **about("list the architecture registry and each family's options"))
@click.option("--plugin", "plugins", multiple=True, metavar="PATH|MODULE",
              help="load a plugin file or module first (repeatable); installed packages are always listed")
@db_option(expose=False)
def models_command(plugins: tuple[str, ...]) -> int:
    from pathlib import Path

    from ablate import models
    from ablate.plugins.load import load_plugins

    load_plugins(list(plugins), Path.cwd())

    table = Table(title="architectures (use as `architecture:` in a sweep; options under `options:`)",
                  title_justify="left")
    table.add_column("name")
    table.add_column("what")
    table.add_column("options (default)")
    table.add_column("source")
    for name, family in models.families().items():
        cls = models.options_model(name)
        opts = ", ".join(f"{k}={f.default!r}" for k, f in cls.model_fields.items())
        table.add_row(escape(name), escape(family.description), escape(opts), escape(family.source.describe()))
    console.print(table)
    from ablate.plugins.load import BROKEN

    for point, why in BROKEN.items():  # a package whose plugin does not load: said, and nothing else breaks
        err_console.print(f"[yellow]skipped the installed plugin {escape(point)}:[/] {escape(why)}", soft_wrap=True)
    return 0
