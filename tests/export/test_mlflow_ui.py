"""The way to look at an MLflow export that `ablate export --to mlflow` prints (`mlflow ui --backend-store-uri ...`),
run for real: the UI's page and its assets are served, and the server's REST API (the calls the UI's experiment page
makes) returns the sweep's experiment and every run. `mlflow-skinny` alone has no server (no flask, no UI build):
the `mlflow` extra installs the full package."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from ablate.cli.export import VIEW
from ablate.export.mlflow import STATUS
from tests.export.test_export import _uri, db_curves
from tests.flows.test_deploy import free_port
from tests.ui.conftest import build
from tests.waiting import patience, wait_until

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def _get(url: str) -> tuple[int, str, bytes]:
    with urllib.request.urlopen(url, timeout=patience(30)) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read()


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=patience(30)) as r:
        return json.load(r)


def test_the_printed_mlflow_ui_command_serves_the_exported_sweep(tmp_path, capsys):
    pytest.importorskip("mlflow")
    from ablate.cli import main

    db = build(f"sqlite:///{tmp_path / 'r.db'}", tmp_path)
    uri = _uri("mlflow", tmp_path)
    assert main(["export", "widths", "--to", "mlflow", "--uri", uri, "--db", db["url"]]) == 0
    hint = [line.removeprefix("view: ") for line in capsys.readouterr().out.splitlines() if line.startswith("view: ")]
    assert hint == [VIEW["mlflow"].format(uri=uri)]
    port = free_port()
    cmd = [*shlex.split(hint[0]), "--host", "127.0.0.1", "--port", str(port)]
    cmd[0] = str(BIN / cmd[0])  # the venv's `mlflow`, as on a PATH that has it
    # no telemetry; no job runner (GenAI jobs, not needed to view runs; each start leaves a folder in /dev/shm)
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true",
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "mlflow-ui.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def up() -> bool:
            if proc.poll() is not None:
                return True  # it ended: said below
            try:
                return _get(f"{base}/health")[0] == 200
            except OSError:
                return False

        try:
            wait_until(up, 90, f"`{shlex.join(cmd)}` did not answer on {base}", every=0.5)
        except AssertionError as e:
            raise AssertionError(f"{e}; its output:\n{log_path.read_text()[-3000:]}") from None
        assert proc.poll() is None, f"`{shlex.join(cmd)}` exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}"

        # the page: MLflow's single-page app, and the script it loads (the UI build that mlflow-skinny lacks)
        status, kind, page = _get(f"{base}/")
        assert status == 200 and kind.startswith("text/html") and b'<div id="root"' in page, page[:500]
        script = re.search(rb'src="\.?/?(static-files/static/js/main\.[0-9a-f]+\.js)"', page)
        assert script, page[:1000]
        status, kind, code = _get(f"{base}/{script[1].decode()}")
        assert status == 200 and "javascript" in kind and len(code) > 100_000

        # what the experiment page asks the server for (the UI calls /ajax-api/2.0/...)
        listed = _post(f"{base}/ajax-api/2.0/mlflow/experiments/search", {"max_results": 100})["experiments"]
        assert "widths" in [e["name"] for e in listed]
        exp = json.loads(_get(f"{base}/ajax-api/2.0/mlflow/experiments/get-by-name?experiment_name=widths")[2])
        exp = exp["experiment"]
        assert exp["name"] == "widths" and {"key": "ablate.sweep", "value": "widths"} in exp["tags"]
        runs = _post(f"{base}/ajax-api/2.0/mlflow/runs/search",
                     {"experiment_ids": [exp["experiment_id"]], "max_results": 1000})["runs"]
        want = db_curves(db["url"])
        held = {}
        for run in runs:
            tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
            held[tags["ablate.fingerprint"]] = (run, {m["key"]: m["value"] for m in run["data"]["metrics"]})
        assert len(runs) == len(want) == 8 and set(held) == set(want)
        for fp, w in want.items():
            run, metrics = held[fp]
            row = w["row"]
            assert run["info"]["status"] == STATUS[row.status], fp
            assert metrics["eval_loss"] == pytest.approx(w["curves"]["eval"][-1][1], rel=1e-6)  # the latest point
            if row.final_eval_loss is not None:
                assert metrics["final_eval_loss"] == pytest.approx(row.final_eval_loss, rel=1e-6)
        assert sum(r["info"]["status"] == "FINISHED" for r in runs) == 7  # one run is still training
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and its workers
            proc.wait(timeout=patience(20))
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
