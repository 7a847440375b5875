"""`ablate ui`: a read-only web dashboard over a results DB (SQLite or Postgres), live while sweeps train.

The pages (app.py) read through `store.reader` and the read side (results/live.py for rows and curves, the report's
own tables and orderings for the study), and keep what they read per change token (cache.py); the table's filter,
sort and pages are table.py. The charts are uPlot,
vendored under static/ with its licence: nothing is fetched from a CDN, so the dashboard works on an offline cluster.
"""

from __future__ import annotations

import socket
from pathlib import Path

from ablate.config.errors import AblateError

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def check_bind(host: str, port: int, token: str | None) -> None:
    """Refuse a bind beyond this machine without a token, and a port that is taken, before anything starts."""
    if host not in LOCAL_HOSTS and not token:
        raise AblateError(f"--host {host} serves the dashboard beyond this machine: give it a token with --token or "
                          "ABLATE_UI_TOKEN (anyone who can reach the port could read every run otherwise)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise AblateError(f"cannot listen on {host}:{port} ({exc.strerror}): choose another with --port, or "
                              "stop what holds it") from None


def serve(url: str | None = None, host: str = "127.0.0.1", port: int = 8765, token: str | None = None,
          artifacts: Path | None = None, announce: bool = True) -> None:
    """Serve the dashboard until Ctrl-C. The token is never printed: the announcement says one is required."""
    import uvicorn

    from ablate import store
    from ablate.ui.app import make_app

    check_bind(host, port, token)
    engine = store.reader(url)
    label = store.describe_url(store.resolve_url(url))
    app = make_app(engine, artifacts, token, label)
    if announce:
        shown = f"[{host}]" if ":" in host else host
        print(f"ablate ui: http://{shown}:{port}/ over {label} (read-only)"
              + ("; open it once with ?token=<your token>" if token else "") + "; Ctrl-C stops it", flush=True)
    # no access log: a first visit's URL carries the token
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
