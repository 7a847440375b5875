"""`ablate export`: a sweep's runs into MLflow, TensorBoard or W&B (offline)."""

from __future__ import annotations

import click

from ablate.cli.common import about, console, db_option, err_console

# mlflow ui --workers 1: its default 4 server workers were killed on a busy machine, and one serves a reader
VIEW = {"mlflow": "mlflow ui --workers 1 --backend-store-uri {uri}", "tensorboard": "tensorboard --logdir {logdir}",
        "wandb": "wandb sync {dir}/offline-run-*   (uploads them; they are offline until then)"}


@click.command(**about("a sweep's runs into MLflow, TensorBoard or W&B, keyed by fingerprint (again: only what is new)",
                       "SWEEP: the sweep's name"))
@click.argument("sweep")
@click.option("--to", "to", type=click.Choice(("mlflow", "tensorboard", "wandb")), required=True)
@click.option("--uri", default=None, help="MLflow tracking URI (default sqlite:///results/mlflow.db), TensorBoard "
              "logdir (default results/tensorboard) or W&B folder (default results/wandb)")
@click.option("--follow", type=float, default=None, metavar="SECONDS",
              help="then keep the tracker up to date while the sweep trains: every SECONDS, send the runs that moved, "
                   "until every run has finished (Ctrl-C stops it; nothing is lost, the next export goes on)")
@db_option()
def export(sweep: str, to: str, uri: str | None, follow: float | None, db: str | None) -> int:
    from ablate.export import TARGETS, export_sweep

    uri = uri or TARGETS[to][3]
    step = {"next": 0.0}

    def progress(done: int, total: int) -> None:
        if done == total or done / max(total, 1) >= step["next"]:
            err_console.print(f"exported {done:,}/{total:,} runs", highlight=False)
            step["next"] += 0.1

    if follow is not None and follow <= 0:
        from ablate.config.errors import AblateError

        raise AblateError(f"--follow {follow:g}: give the seconds between rounds, e.g. --follow 30")
    out = export_sweep(sweep, to, uri, db, progress, follow=follow,
                       say=lambda line: err_console.print(line, highlight=False))
    console.print(f"{sweep}: {out.runs:,} runs in {to} ({out.points:,} new points in {out.updated:,} runs; "
                  "every run is keyed by its fingerprint: exporting again adds only what is new)", highlight=False)
    console.print("view: " + VIEW[to].format(uri=uri, **out.where), highlight=False)
    return 0
