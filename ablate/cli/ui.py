"""`ablate ui`: the read-only web dashboard over the results database."""

from __future__ import annotations

from pathlib import Path

import click

from ablate.cli.common import about, db_option


@click.command(**about("a read-only web dashboard over the results database, live while sweeps train"))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="address to listen on; anything beyond this machine needs --token")
@click.option("--port", type=int, default=8765, show_default=True)
@click.option("--token", default=None, help="a secret every request must carry (open the page once with ?token=...); "
              "prefer $ABLATE_UI_TOKEN: a command line is visible to every user of the machine in `ps`; never printed")
@click.option("--artifacts", default=None, help="the artifacts folder the runs were trained with (their logs); "
              "default: $ABLATE_ARTIFACTS or results/artifacts")
@db_option()
def ui(host: str, port: int, token: str | None, artifacts: str | None, db: str | None) -> int:
    from ablate.config.settings import environment
    from ablate.ui import serve

    token = token or environment().ui_token
    serve(db, host, port, token, Path(artifacts) if artifacts else environment().artifacts)
    return 0
