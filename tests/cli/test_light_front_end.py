"""The light front end (DESIGN.md): reading, planning and registering a spec never import torch.

Each check runs in a fresh interpreter, since this test process has imported torch already.
Parameter counts of the torch-free modules are checked against built models in test_models.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.waiting import patience


ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers")
MARK = "heavy modules imported:"


def heavy_imports(code: str, heavy: tuple[str, ...] = HEAVY) -> list[str]:
    """Run `code` in a fresh interpreter at the repository root; the `heavy` modules it imported."""
    probe = f"{code}\nimport sys\nprint({MARK!r}, __import__('json').dumps([m for m in {heavy!r} if m in sys.modules]))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                          timeout=patience(120))
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith(MARK))
    return json.loads(line.removeprefix(MARK))


def test_reading_every_sweep_and_importing_the_front_end_imports_no_torch():
    assert list(ROOT.glob("sweeps/*.yaml"))
    code = """
import glob
from ablate import config, models
for path in sorted(glob.glob("sweeps/*.yaml")):
    config.load_trials(path)
models.list_families()  # every family's options module
import ablate.store, ablate.report, ablate.runner
"""
    assert heavy_imports(code) == []


def test_plan_and_a_sweep_runners_start_import_no_torch():
    plan = "from ablate import cli\nassert cli.main(['plan', 'sweeps/smoke.yaml']) == 0"
    assert heavy_imports(plan, (*HEAVY, "sqlalchemy")) == []  # a local-data spec needs no database code either
    assert heavy_imports("from ablate import cli\nimport flows.sweep\ncli.parse(['sweep', 'run', 'sweeps/smoke.yaml'])") == []
