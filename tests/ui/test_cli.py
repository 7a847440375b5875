"""`ablate ui` as a user starts it: a real server in its own process, the token required beyond 127.0.0.1 and
never printed, and clear refusals (no token, a missing database, a taken port)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.helpers import cli_env
from tests.ui.browser import free_port

pytestmark = pytest.mark.slow
SECRET = "s3cret-t0ken-xyz"


def _ablate(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ablate.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=cli_env(ABLATE_UI_TOKEN=SECRET, **kw))


def _get(url: str, token: str | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def test_ablate_ui_serves_with_a_token_it_never_prints(ui_db):
    port = free_port()
    proc = _ablate("ui", "--db", ui_db["url"], "--host", "0.0.0.0", "--port", str(port))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                status, _ = _get(f"http://127.0.0.1:{port}/api/sweeps")
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.2)
        assert status == 401
        status, body = _get(f"http://127.0.0.1:{port}/api/sweeps", token=SECRET)
        assert status == 200 and "widths" in {s["name"] for s in body["sweeps"]}
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert f"http://0.0.0.0:{port}/" in out and "?token=<your token>" in out
    assert SECRET not in out + err and "Traceback" not in err


@pytest.mark.parametrize("args, message", [
    (("--host", "0.0.0.0"), "--token or ABLATE_UI_TOKEN"),
    (("--db", "sqlite:///{tmp}/none.db"), "no results database at"),
])
def test_ablate_ui_refuses_clearly(tmp_path, args, message):
    args = tuple(a.format(tmp=tmp_path) for a in args)
    env = cli_env()
    env.pop("ABLATE_UI_TOKEN", None)
    done = subprocess.run([sys.executable, "-m", "ablate.cli", "ui", "--port", str(free_port()), *args],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "none.db").exists()


def test_ablate_ui_on_a_taken_port_says_so(ui_db):
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "ablate.cli", "ui", "--db", ui_db["url"], "--port", str(port)],
                              capture_output=True, text=True, env=cli_env(), timeout=60)
    assert done.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in done.stderr and "--port" in done.stderr
