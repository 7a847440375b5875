"""Cluster mode for real: a local Prefect server, process workers, deployments, `prefect deployment run`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from ablate import store
from tests.waiting import patience, wait_until

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, timeout: float = 120) -> None:
    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    wait_until(healthy, timeout, f"Prefect server at {url} did not become healthy", every=0.5)


@pytest.mark.slow
def test_prefect_deployment_run_sweep_smoke_with_a_local_server_and_workers(tmp_path):
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_API_URL": api,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "WARNING",
           "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}"}
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    spec = yaml.safe_load((REPO / "sweeps" / "smoke.yaml").read_text())
    spec["budget"] = {"steps": 10, "hardware": "cpu"}
    spec["dataset"], spec["tokenizer"] = {"source": "ablate:tinystories-sample", "eval": {"holdout": 24}, "packing": "pad"}, {"vocab_size": 512}  # the small sample: fast
    spec["grid"] = [{"architecture": "mixer", "d_model": [32, 48]}]
    (sweeps / "smoke.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    url = f"sqlite:///{tmp_path / 'results.db'}"
    procs = []
    logs = []

    def start(*cmd: str) -> subprocess.Popen:
        log = open(tmp_path / f"{len(procs)}.log", "w")  # noqa: SIM115 - open as long as the process; closed at teardown
        logs.append(log)
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        procs.append(proc)
        return proc

    try:
        start(str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port))
        wait_healthy(api)
        deployed = subprocess.run([str(BIN / "ablate"), "deploy", "--sweeps", str(sweeps), "--db", url,
                                   "--artifacts", str(tmp_path / "art"), "--slots", "cpu=1", "--pool", "h100"],
                                  env=env, cwd=REPO, capture_output=True, text=True, timeout=patience(180))
        assert deployed.returncode == 0, deployed.stderr[-3000:]
        assert "sweep/smoke" in deployed.stdout and "trial/cpu" in deployed.stdout
        assert "trial/h100" in deployed.stdout  # --pool: a pool no sweep file names, for hardware overrides
        # one line per deployment, not Prefect's table and notices for each
        lines = deployed.stdout.strip().splitlines()
        made = [line for line in lines if line.startswith("deployed ")]
        assert lines[0].startswith("automation 'ablate: crash flow runs whose machine died'"), deployed.stdout
        assert lines[1:] == [*made, f"registered {len(made)} deployments", "start workers with: prefect worker start "
                             "--pool sweeps  and  ablate worker --pool HARDWARE"], deployed.stdout
        assert "Successfully created" not in deployed.stdout + deployed.stderr
        start(str(BIN / "prefect"), "worker", "start", "--pool", "sweeps")
        start(str(BIN / "prefect"), "worker", "start", "--pool", "cpu")
        result = subprocess.run([str(BIN / "prefect"), "deployment", "run", "sweep/smoke", "--watch",
                                 "--watch-timeout", "400"], env=env, cwd=REPO, capture_output=True, text=True,
                                timeout=patience(450))
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
        engine = store.connect(url)
        with engine.connect() as conn:
            statuses = conn.execute(sa.select(store.Run.status)).scalars().all()
            metrics = conn.execute(sa.select(sa.func.count()).select_from(store.Metric)).scalar()
        assert statuses == ["completed", "completed"] and metrics > 4
    finally:
        for proc in reversed(procs):
            try:
                os.killpg(proc.pid, 15)
            except ProcessLookupError:
                pass
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
        for log in logs:
            log.close()


def test_deploy_outside_the_checkout_refuses_saying_where_it_looked(tmp_path, monkeypatch, capsys):
    """`--sweeps` is read from the working directory: run elsewhere, `ablate deploy` registered 0 deployments
    (not even trial/cpu) and exited 0. Now it refuses before touching the Prefect API, naming the folder."""
    from ablate.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # nothing answers: it must not be asked
    assert main(["deploy"]) != 0
    err = capsys.readouterr().err
    assert f"--sweeps sweeps: no folder {tmp_path / 'sweeps'}" in " ".join(err.split()), err
    assert "Run `ablate deploy` in the checkout" in " ".join(err.split()), err
    (tmp_path / "sweeps").mkdir()
    assert main(["deploy"]) != 0
    assert f"no sweep files (*.yaml) in {tmp_path / 'sweeps'}" in " ".join(capsys.readouterr().err.split())
