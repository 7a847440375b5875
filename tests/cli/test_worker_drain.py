"""A drained host stops for sure: `ablate worker`'s Prefect workers that go on after SIGTERM (as one did while it
submitted a flow run, polling and failing trials until it was killed) are killed, with everything under them, once
DRAIN_GRACE has passed."""

from __future__ import annotations

import subprocess
import sys
import time

from ablate.cli import cluster

STUBBORN = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)']); print(child.pid, flush=True); "
            "time.sleep(600)")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_drained_hosts_worker_that_ignores_sigterm_is_killed_with_its_children(monkeypatch):
    monkeypatch.setattr(cluster, "DRAIN_GRACE", 1.0)
    worker = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    child = int(worker.stdout.readline())
    start = time.monotonic()
    ended, drained = cluster._wait_for_any([worker], lambda: True)
    assert ended is None and drained
    assert worker.poll() is not None and time.monotonic() - start < 30
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the worker's child (its process worker) outlived the drain"
