"""The suite's own machinery on xdist workers (tests/suite.py), run for real in a small inner suite on 2 workers: the
tests of a module with a module-wide fixture run on one worker and make it once, the slow tests start first, each
worker has its own Prefect home. It fails where xdist's --dist loadgroup stops grouping (pytest 9.2 with xdist 3.8:
pytest-dev/pytest-xdist#1386), which would otherwise only show as every shared cluster started twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.waiting import patience

REPO = Path(__file__).resolve().parent.parent

CONFTEST = """
import json, os, time
import pytest
from tests.suite import pytest_collection_modifyitems  # noqa: F401

def record(what):
    with open(os.environ["RECORD"], "a") as f:
        f.write(json.dumps({"what": what, "worker": os.environ.get("PYTEST_XDIST_WORKER"), "t": time.time(),
                            "home": os.environ["PREFECT_HOME"]}) + "\\n")
"""

SHARED = """
import pytest
from conftest import record

@pytest.fixture(scope="module")
def made():
    record("made {name}")
    return True

@pytest.mark.parametrize("i", range(4))
def test_shares(made, i):
    record("ran {name}")
"""

LONE = """
import time
import pytest
from conftest import record

@pytest.mark.parametrize("i", range(6))
def test_quick(i):
    time.sleep(0.05)
    record("quick")

@pytest.mark.slow
def test_long():
    record("slow")
"""


def test_shared_module_fixtures_are_made_once_on_one_worker_and_slow_tests_start_first(tmp_path):
    suite = tmp_path / "inner"
    suite.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    for name in ("a", "b"):
        (suite / f"test_shared_{name}.py").write_text(SHARED.replace("{name}", name))
    (suite / "test_lone.py").write_text(LONE)
    record = tmp_path / "record.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_HOME", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")}
    env.update(PYTHONPATH=str(REPO), RECORD=str(record))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                           "loadgroup", "-o", "markers=slow", str(suite)], cwd=suite, env=env, capture_output=True,
                          text=True, timeout=patience(120))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    for name in ("a", "b"):
        assert [r["what"] for r in rows].count(f"made {name}") == 1  # the module's fixture, once
        assert len({r["worker"] for r in rows if r["what"].endswith(f" {name}")}) == 1  # its tests on that worker
    workers = {r["worker"] for r in rows}
    assert workers == {"gw0", "gw1"}
    homes = {r["worker"]: r["home"] for r in rows}
    assert len(set(homes.values())) == 2 and all(f"ablate-prefect-{w}-" in h for w, h in homes.items())
    lone = sorted((r for r in rows if r["what"] in ("quick", "slow")), key=lambda r: r["t"])
    slow_worker = next(r["worker"] for r in lone if r["what"] == "slow")
    assert next(r for r in lone if r["worker"] == slow_worker)["what"] == "slow"  # the first lone test it ran
