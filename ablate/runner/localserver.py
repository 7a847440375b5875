"""The local Prefect API server of `ablate sweep run`, tied to the life of the process that started it.

Prefect starts its temporary server as a child process and stops it at exit; a SIGKILL (an OOM killer, a
closed terminal's `kill -9`, a cluster's job limit) skips that and leaves a ~200 MB server behind, for every
kill. Here the server is started before the flow (which runs with PREFECT_API_URL set to it), and a small watcher
process ends it as soon as its parent is gone, however that happened.

On Linux, from a process with one thread, the server is a fork of the command: the child starts with the Prefect
client modules the command has already imported and imports only the server's own on top (the server process of
a 2-trial sweep: 4.8-5.1 CPU-s as a fresh interpreter, 3.5-3.9 as a fork). It serves a socket the command bound
before the fork, so its URL is known at once and no other process can take its port. Elsewhere (another OS, other
threads running, ABLATE_FORK_SERVER=0) it is the command Prefect's own temporary server runs, in a fresh interpreter.
"""

from __future__ import annotations

import atexit
import gc
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

APP = "prefect.server.api.server:create_app"
# what Prefect's own temporary server sets for its process: no UI, and a server that runs no background services
SERVER_ENV = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}

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


class Server:
    """A local API server being started: `url` is where it will answer, `ready()` waits until it does. It is
    watched from the moment it exists (a kill during its start-up leaves none either) and stopped at this
    process's exit."""

    def __init__(self) -> None:
        timeout = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS") or 90)
        self.deadline = time.monotonic() + timeout
        self.forked = _may_fork()
        self._launch()

    def _launch(self) -> None:
        if self.forked:
            try:
                self.process, port = _fork_server()
            except OSError:  # no fork today (out of memory, a process limit): a fresh interpreter may still start
                self.forked = False
        if not self.forked:
            self.process, port = _spawn_server()
        watch(self.process.pid)
        atexit.register(_stop, self.process)
        self.port = port
        self.url = f"http://127.0.0.1:{port}/api"

    def stop(self) -> None:
        """Stop it now, as this process's exit would (SIGTERM, then SIGKILL)."""
        _stop(self.process)

    def ready(self) -> str:
        """Its URL, once it answers; a RuntimeError (Prefect's own words) when it dies or the time runs out."""
        while True:
            while self.process.poll() is None and time.monotonic() < self.deadline:
                if _answers(self.url + "/health"):
                    return self.url
                time.sleep(0.1)
            # 3: uvicorn did not start; a spawned server whose port another process took since it was picked is
            # started again on another (a forked one serves a socket bound before the fork)
            if self.forked or self.process.poll() != 3 or not _taken(self.port):
                _stop(self.process)
                code = self.process.returncode
                said = "" if code is None else f" Ephemeral server process exited with code {code}."
                raise RuntimeError(f"Timed out while attempting to connect to ephemeral Prefect API server.{said}")
            self._launch()


def launch() -> Server | None:
    """Start Prefect's temporary local API server, unless PREFECT_API_URL names a server (None: the configured one
    is used). Call it from the main thread before any other starts, so that it can fork."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return None
    return Server()


def _may_fork() -> bool:
    """Fork only on Linux, from a process with a single thread (a fork copies one thread: any lock another held
    stays held in the child), unless ABLATE_FORK_SERVER=0."""
    from ablate.config.settings import environment
    from ablate.runner.warm import threads_now

    return environment().fork_server and sys.platform == "linux" and threads_now()["threads"] == 1


def _fork_server() -> tuple[Forked, int]:
    """The server as a fork of this process, serving a socket bound here."""
    from ablate.runner.warm import exit_with  # before the fork: the child must not fail before it can only exit

    with socket.socket() as sock:  # closed here once the child has it (or the fork failed)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            exit_with(lambda: _serve(sock))
        return Forked(pid), sock.getsockname()[1]


def _serve(sock: socket.socket) -> int:
    """In the forked child: its own session (a terminal's Ctrl-C is the command's to handle), Prefect's settings
    for a temporary server, uvicorn on `sock` until it is stopped; its exit code."""
    gc.freeze()  # what the command had is never garbage here: the collector need not walk it (nor copy its pages)
    os.setsid()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.update(SERVER_ENV)
    import prefect.context

    prefect.context.GLOBAL_SETTINGS_CONTEXT = prefect.context.root_settings_context()  # the env just set
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(APP, factory=True, log_level="error", lifespan="on"))
    server.run(sockets=[sock])
    return 0 if server.started else 3


def _spawn_server() -> tuple[subprocess.Popen, int]:
    """The command Prefect's own temporary server runs (uvicorn over `create_app`, without the UI), in a fresh
    interpreter, started here without importing the server's module (the child imports it)."""
    import prefect
    from prefect.settings import get_current_settings

    env = {**os.environ, **SERVER_ENV, **get_current_settings().to_environment_variables(exclude_unset=True)}
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent), "--factory", APP,
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "error", "--lifespan", "on"],
        env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    return process, port


class Forked:
    """A forked server: the part of `subprocess.Popen` this module uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                done, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else: gone, its code unknown
                done, status = self.pid, 0
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(APP, timeout)
            time.sleep(0.05)
        return self.returncode

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _taken(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _stop(process: Any) -> None:
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
