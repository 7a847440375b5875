"""The local Prefect API server of `ablate sweep run`, tied to the life of the process that started it.

Prefect starts its temporary server as a child process and stops it at exit; a SIGKILL (an OOM killer, a
closed terminal's `kill -9`, a cluster's job limit) skips that and leaves a ~200 MB server behind, for every
kill. Here the server is started before the flow (which runs with PREFECT_API_URL set to it), and a small watcher
process ends it as soon as its parent is gone, however that happened.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import time
import urllib.request

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


def start() -> str | None:
    """Start Prefect's temporary local API server (unless PREFECT_API_URL names a server) with its watcher from the
    moment it exists (a kill during the server's start-up leaves none either), and wait until it answers; its API
    URL, for the flow's `temporary_settings` (None: the configured server is used).

    It is the command Prefect's own ephemeral server runs (uvicorn over `prefect.server.api.server:create_app`,
    without the UI), started here without importing that module: the import costs this process ~2.3 CPU-s, and
    the server process imports it again anyway."""
    import prefect
    from prefect.settings import PREFECT_API_URL, get_current_settings

    if PREFECT_API_URL.value():
        return None
    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
           **get_current_settings().to_environment_variables(exclude_unset=True)}
    timeout = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS") or 90)
    deadline = time.monotonic() + timeout
    while True:
        port = _free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent), "--factory",
             "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port), "--log-level", "error",
             "--lifespan", "on"], env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        watch(process.pid)
        atexit.register(_stop, process)
        url = f"http://127.0.0.1:{port}/api"
        while process.poll() is None and time.monotonic() < deadline:
            if _answers(url + "/health"):
                return url
            time.sleep(0.1)
        if process.poll() != 3:  # 3: uvicorn could not bind (the port was taken since): another port
            _stop(process)
            said = "" if process.returncode is None else f" Ephemeral server process exited with code {process.returncode}."
            raise RuntimeError(f"Timed out while attempting to connect to ephemeral Prefect API server.{said}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _stop(process: subprocess.Popen) -> None:
    """At this process's exit: SIGTERM, then SIGKILL after 5 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()


def watch(server_pid: int) -> None:
    """A watcher process that stops `server_pid` as soon as this process is gone."""
    subprocess.Popen([sys.executable, "-c", WATCH, str(os.getpid()), str(server_pid)], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
