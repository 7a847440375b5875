"""`ablate sweep run`'s local Prefect API server, started for real: it answers at the URL it returns (the flow runs
with PREFECT_API_URL set to it), it ends with the process that started it, whether that exits or is killed -9,
and a configured PREFECT_API_URL starts nothing."""

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

pytestmark = pytest.mark.slow

STARTER = """
import sys, time
from ablate.runner import localserver
print(localserver.start(), flush=True)
if sys.argv[1] == "stay":
    time.sleep(600)
"""


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return {**env, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


def _servers_of(pid: int) -> list[int]:
    """The uvicorn processes serving Prefect's API whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
        if ppid == pid and "prefect.server.api.server:create_app" in cmdline:
            found.append(int(entry.name))
    return found


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


@pytest.mark.parametrize("end", ["kill -9", "exit"])
def test_the_local_server_answers_and_ends_with_its_parent(tmp_path, end):
    mode = "stay" if end == "kill -9" else "exit"
    starter = subprocess.Popen([sys.executable, "-c", STARTER, mode], env=_env(tmp_path), stdout=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        url = starter.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/api"), url
        if end == "kill -9":
            (server,) = _servers_of(starter.pid)
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


def test_a_configured_prefect_api_url_starts_nothing(tmp_path):
    env = {**_env(tmp_path), "PREFECT_API_URL": "http://127.0.0.1:9/api"}
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", STARTER, "exit"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "None", out.stderr
    assert time.monotonic() - started < patience(60)
