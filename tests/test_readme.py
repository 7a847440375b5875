"""The README's two commands are what CI runs, and the sweep files it names exist."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    block = re.search(r"## The two commands\s+```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1)
    return [line.strip() for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_ci_runs_the_readme_main_job_and_test_command():
    install_and_main, tests = readme_commands()
    ci = (REPO / ".ci" / "run").read_text()
    main_job = install_and_main.split("pip install -e . && ")[1]
    assert main_job in ci, f"{main_job!r} is not in .ci/run"
    assert tests in ci.splitlines(), f"{tests!r} is not a line of .ci/run"
    assert "pip install -q torch==2.13.0" in ci and "torch==2.13.0" in install_and_main


def test_files_the_readme_names_exist():
    text = (REPO / "README.md").read_text()
    for path in set(re.findall(r"sweeps/[a-z0-9-]+\.yaml", text)):
        assert (REPO / path).exists(), path
