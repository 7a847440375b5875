"""The local Prefect API server of `ablate sweep run`, tied to the life of the process that started it.

Prefect starts its temporary server as a child process and stops it at exit; a SIGKILL (an OOM killer, a
closed terminal's `kill -9`, a cluster's job limit) skips that and leaves a ~200 MB server behind, for every
kill. Here the server is started before the flow (Prefect's client then uses this one), and a small watcher
process ends it as soon as its parent is gone, however that happened.
"""

from __future__ import annotations

import os
import subprocess
import sys

# the watcher: polls its parent (it is reparented when the parent dies), then stops the server (SIGTERM, then
# SIGKILL after 5 s); it ends by itself when the server is gone
WATCH = """
import os, signal, sys, time
parent, server = int(sys.argv[1]), int(sys.argv[2])

def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True

while os.getppid() == parent:
    if not alive(server):
        sys.exit(0)
    time.sleep(0.5)
try:
    os.kill(server, signal.SIGTERM)
    for _ in range(50):
        if not alive(server):
            sys.exit(0)
        time.sleep(0.1)
    os.kill(server, signal.SIGKILL)
except ProcessLookupError:
    pass
"""


def start() -> int | None:
    """Start Prefect's temporary local server (unless PREFECT_API_URL names a server), each server process with
    its watcher from the moment it exists (a kill during the server's start-up leaves none either); the server's
    pid, or None when there is none of ours."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return None
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # the instance Prefect's own client asks for (keyed by port None)
    launch = getattr(server, "_run_uvicorn_command", None)
    if launch is not None and not server.running:
        def launch_and_watch() -> subprocess.Popen:
            process = launch()
            watch(process.pid)
            return process

        server._run_uvicorn_command = launch_and_watch  # Prefect starts the process; the watcher follows at once
        server.start()
    else:  # a Prefect without that hook: watched once started
        server.start()
        if server.server_process is not None:
            watch(server.server_process.pid)
    return server.server_process.pid if server.server_process is not None else None


def watch(server_pid: int) -> None:
    """A watcher process that stops `server_pid` as soon as this process is gone."""
    subprocess.Popen([sys.executable, "-c", WATCH, str(os.getpid()), str(server_pid)], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
