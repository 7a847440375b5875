"""The Python door (ablate/cli/api.py): a sweep planned, run, read and reported from Python by the CLI's own code."""

from __future__ import annotations

import pytest

import ablate
from ablate.config.errors import SpecError
from tests.helpers import grid_spec


def test_a_sweep_from_python_plans_and_refuses_a_bad_override_naming_it(tmp_path):
    s = ablate.sweep(grid_spec(tmp_path, "py", d_models=(32, 48)), overrides=["defaults.lr=1e-3"])
    assert s.name == "py-defaults-lr-0-001" and [t.d_model for t in s.plan()] == [32, 48]
    assert all(t.lr == 1e-3 for t in s.plan())
    with pytest.raises(SpecError, match="lrr"):
        ablate.sweep(s.spec, overrides=["defaults.lrr=1"]).plan()


@pytest.mark.slow
def test_a_sweep_from_python_runs_reads_and_reports(tmp_path):
    """A real `ablate sweep run` (its local Prefect server and two 10-step trainers, about half a minute): the same
    runs the CLI would make, read back as status rows, and the report built from them."""
    db = f"sqlite:///{tmp_path / 'r.db'}"
    s = ablate.sweep(grid_spec(tmp_path, "py", d_models=(32, 48), steps=10), db=db)
    assert s.run("--artifacts", str(tmp_path / "art")) == 0
    rows = s.status()
    assert [(r["d_model"], r["status"], r["steps"]) for r in rows] == [(32, "completed", 10), (48, "completed", 10)]
    report = s.report(out=tmp_path / "rep", formats=("md",))
    assert (tmp_path / "rep" / "report.md").exists() and report.tables
