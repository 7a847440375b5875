"""`ablate sweep run`'s local Prefect API server, started for real, as a fork of the command or in a fresh interpreter:
it answers at the URL it returns (the flow runs with PREFECT_API_URL set to it), it ends with the process that
started it, whether that exits or is killed -9, and a configured PREFECT_API_URL starts nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.waiting import patience, wait_until

STARTER = """
import sys, time
from ablate.runner import localserver
server = localserver.launch()
print(server.ready() if server else None, server.process.pid if server else None, server and server.forked, flush=True)
if sys.argv[1] == "stay":
    time.sleep(600)
"""


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return {**env, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            # the server's start-up limit (90 s unset), scaled like every wait: a loaded machine is not a failure
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": str(int(patience(90)))}


def _parent_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its new parent) is gone for this purpose
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("end", ["kill -9", "exit"])
@pytest.mark.parametrize("fork", ["1", "0"])
def test_the_local_server_answers_and_ends_with_its_parent(tmp_path, end, fork):
    mode = "stay" if end == "kill -9" else "exit"
    starter = subprocess.Popen([sys.executable, "-c", STARTER, mode], env={**_env(tmp_path), "ABLATE_FORK_SERVER": fork},
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        url, pid, forked = starter.stdout.readline().split()
        server = int(pid)
        assert url.startswith("http://127.0.0.1:") and url.endswith("/api"), url
        assert forked == {"1": "True", "0": "False"}[fork]
        if end == "kill -9":
            assert _parent_of(server) == starter.pid
            # a fork runs the starter's own command line; a fresh interpreter, Prefect's uvicorn command
            assert (_cmdline(server) == _cmdline(starter.pid)) == (fork == "1")
            assert (b"prefect.server.api.server:create_app" in _cmdline(server)) == (fork == "0")
            assert _answers(url)
            os.kill(starter.pid, signal.SIGKILL)
            starter.wait(30)
            wait_until(lambda: not _alive(server), patience(30), "the server outlived its killed parent")
        else:
            assert starter.wait(patience(60)) == 0  # its atexit stopped the server before it exited
        assert not _answers(url)
    finally:
        if starter.poll() is None:
            os.killpg(starter.pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_configured_prefect_api_url_starts_nothing(tmp_path):
    env = {**_env(tmp_path), "PREFECT_API_URL": "http://127.0.0.1:9/api"}
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", STARTER, "exit"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["None", "None", "None"], out.stderr
    assert time.monotonic() - started < patience(60)


@pytest.mark.parametrize("env, threads, forks", [({}, 1, True), ({}, 2, False), ({"ABLATE_FORK_SERVER": "0"}, 1, False)])
def test_the_server_is_forked_only_from_a_single_thread(env, threads, forks):
    # a fork copies only the thread that forks: a lock another thread holds would stay held in the server
    code = ("import threading, time\nfrom ablate.runner import localserver\n"
            f"for _ in range({threads} - 1):\n    threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
            "print(localserver._may_fork())")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == str(forks), out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("fork", ["1", "0"])
def test_a_server_that_cannot_start_is_an_error_said_once(tmp_path, fork):
    # its database cannot be opened: the server's start-up fails; the forked child ends there, never returning into
    # the starter's code (which would then print twice)
    code = ("from ablate.runner import localserver\ntry:\n    localserver.launch().ready()\n"
            "except RuntimeError as exc:\n    print('failed:', exc, flush=True)\n")
    env = {**_env(tmp_path), "ABLATE_FORK_SERVER": fork,
           "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{tmp_path}/no/such/folder/prefect.db"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=patience(120))
    lines = out.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("failed: "), (out.stdout, out.stderr[-2000:])
    assert "Ephemeral server process exited with code" in lines[0]


@pytest.mark.slow
def test_a_fork_that_fails_starts_the_server_in_a_fresh_interpreter(tmp_path):
    # out of memory or at a process limit, os.fork raises: the server is then spawned, and answers all the same
    code = ("import os\ndef refuse():\n    raise BlockingIOError(11, 'Resource temporarily unavailable')\n"
            "os.fork = refuse\n" + STARTER)
    out = subprocess.run([sys.executable, "-c", code, "exit"], env=_env(tmp_path), capture_output=True, text=True,
                         timeout=patience(120))
    url, pid, forked = out.stdout.split()
    assert url.startswith("http://127.0.0.1:") and forked == "False", out.stderr[-2000:]
