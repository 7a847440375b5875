"""What a finished sweep yields: `ablate report` (tables and loss curves), `ablate generate` (a trained run completes
a prompt) and `ablate retrieval` (the sweep's retrieval stage)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from ablate.cli.common import ARTIFACTS_HELP, about, console, db_option, err_console, greedy


@click.command(cls=greedy("--compare"), **about("the studies' tables and loss curves for a sweep",
                                                 "SWEEP: sweep name (as in the spec's `name`)"))
@click.argument("sweep")
@click.option("--out", default=None, help="output folder (default results/reports/SWEEP)")
@click.option("--format", "formats", default="md,html,png,svg,csv",
              help="comma-separated: md, html, png, svg, csv; and points: every run's every point (curves-*.csv)")
@click.option("--compare", multiple=True, metavar="SWEEP ...",
              help="other sweeps to put beside this one in a single table")
@click.option("--artifacts", default=None, help=ARTIFACTS_HELP)
@click.option("--at", "at", default=None, metavar="KIND=AMOUNT",
              help="read every run at an equal budget on its own curve: flops=1e15, tokens=50M, seconds=10m, steps=500")
@click.option("--group", default=None, metavar="AXIS,...",
              help="one table and figure by these axes (e.g. architecture,d_model), every other axis averaged")
@db_option()
def report(sweep: str, out: str | None, formats: str, compare: tuple[str, ...], artifacts: str | None,
           at: str | None, group: str | None, db: str | None) -> int:
    from ablate.config.errors import AblateError
    from ablate.report import build_comparison, build_report
    from ablate.report.render import KNOWN_FORMATS

    kinds = tuple(f.strip() for f in formats.split(",") if f.strip())
    unknown = [k for k in kinds if k not in KNOWN_FORMATS]
    if unknown or not kinds:
        raise AblateError(f"--format: {', '.join(map(repr, unknown)) or 'nothing named'} is not a format; choose from "
                          f"{', '.join(KNOWN_FORMATS)} (e.g. --format md,html,png,svg,csv,points)")
    folder = Path(out) if out else None
    axes = tuple(a.strip() for a in group.split(",") if a.strip()) if group is not None else None
    if group is not None and not axes:
        raise AblateError("--group: name at least one axis, e.g. --group architecture,d_model")
    if compare:
        if at or axes:
            raise AblateError("--at and --group read one sweep; --compare puts sweeps side by side as they ended")
        built = build_comparison([sweep, *compare], db, folder, formats=kinds, artifacts=artifacts)
    else:
        built = build_report(sweep, db, folder, formats=kinds, artifacts=artifacts, at=at, group=axes,
                             progress=lambda line: err_console.print(line, highlight=False))
    if built.answer:  # the answer first, in words; the tables and the tests' numbers after it
        console.print("[bold]The answer.[/]")
        for line in built.answer:
            console.print(f"- {escape(line)}")
        console.print()
    for table in built.tables:
        console.print(escape(table.markdown()))
        console.print()
    method = [f"Method: {built.method}."] if built.method else []
    for line in built.orderings + method + ([built.floor] if built.floor else []) + built.scaling:
        console.print(escape(line))
        console.print()
    console.print(f"report written to {built.out}/ (" + ", ".join(p.name for p in built.files) + ")")
    return 0


@click.command(**about("complete a prompt with a trained run", "RUN: run id (see `ablate sweep status`)"))
@click.argument("run", type=int)
@click.option("--prompt", required=True)
@click.option("--max-new", type=int, default=64)
@click.option("--top-k", type=int, default=0, help="0: greedy")
@click.option("--temperature", type=float, default=1.0)
@click.option("--seed", type=int, default=0)
@click.option("--artifacts", default=None, help=ARTIFACTS_HELP)
@click.option("--plugin", default=None, metavar="PATH",
              help="a plugin run's plugin file (checked against the code the run was trained with)")
@click.option("--run-stored-plugin", is_flag=True,
              help="run the plugin source the results DB holds (checked against its identity): only a DB you trust")
@db_option()
def generate(run: int, prompt: str, max_new: int, top_k: int, temperature: float, seed: int, artifacts: str | None,
             plugin: str | None, run_stored_plugin: bool, db: str | None) -> int:
    from ablate.train.generate import complete, load_run_model

    trial, model, tokenizer = load_run_model(run, db, artifacts, plugin, run_stored_plugin)
    text = complete(model, tokenizer, prompt, trial.context, max_new, top_k, temperature, seed)
    console.print(f"[bold]{escape(prompt)}[/]" + escape(text))
    return 0


@click.command(cls=greedy("--candidates"), **about(
    "a sweep's retrieval stage: embed pairs with each completed run, train retrieval models",
    "SWEEP: sweep name (its spec has a `retrieval:` block)"))
@click.argument("sweep")
@click.option("--candidates", type=int, multiple=True, metavar="N ...", help="override the spec's candidate counts")
@click.option("--steps", type=int, default=None, help="override the spec's retrieval training steps")
@click.option("--out", default=None, help="output folder (default results/reports/SWEEP)")
@click.option("--quiet", is_flag=True, help="no progress output")
@click.option("--artifacts", default=None, help=ARTIFACTS_HELP)
@db_option()
def retrieval(sweep: str, candidates: tuple[int, ...], steps: int | None, out: str | None, quiet: bool,
              artifacts: str | None, db: str | None) -> int:
    from ablate.retrieval import run_stage

    table, files = run_stage(sweep, db, Path(out) if out else None, steps=steps, candidates=list(candidates) or None,
                             progress=not quiet, artifacts=artifacts)
    console.print(files[0].read_text())
    console.print(f"{len(table)} cells recorded (metrics splits 'retrieval' and 'retrieval_best', step = c; each c's "
                  "evaluations as 'retrieval_c<c>'); written to "
                  + ", ".join(str(f) for f in files))
    return 0
