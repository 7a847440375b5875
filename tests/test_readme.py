"""The README's two commands are what CI runs; the README and the docs pages it links name files that exist."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    block = re.search(r"## The two commands\s+```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1)
    return [line.strip() for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]


# .ci/run's stages of README command 2: every test in exactly one (a cluster test is in the last, slow or not)
STAGES = {"fast": "not slow and not cluster", "slow": "slow and not cluster", "cluster": "cluster"}


def test_ci_runs_the_readme_main_job_and_test_command():
    install_and_main, tests = readme_commands()
    ci = (REPO / ".ci" / "run").read_text()
    main_job = install_and_main.split('pip install -e ".[prefect]" && ')[1]
    assert main_job in ci, f"{main_job!r} is not in .ci/run"
    install, pytest_command = tests.split(" && ")
    assert install == 'pip install -e ".[test]"' and "-n 2 --dist loadgroup" in pytest_command
    for name, selection in STAGES.items():  # the README's command, in stages, each with its slowest tests
        line = f'stage {name} {pytest_command} --durations=25 -m "{selection}"'
        assert line in ci.splitlines(), f"{line!r} is not a line of .ci/run"
    torch_line = re.search(r"pip install (torch==\S+ --extra-index-url \S+)", install_and_main).group(1)
    assert f"pip install -q {torch_line}" in ci  # the CPU build, as the README installs it
    assert 'pip install -q -e ".[prefect]"' in ci  # the orchestrator is an extra: command 1 needs it


DOCS = sorted((REPO / "docs").glob("*.md"))


def test_files_the_readme_and_docs_name_exist():
    for page in [REPO / "README.md", *DOCS]:
        for path in set(re.findall(r"sweeps/[a-z0-9-]+\.yaml", page.read_text())):
            assert (REPO / path).exists(), f"{page.name}: {path}"


def test_every_docs_page_is_one_click_from_the_readme_and_every_link_resolves():
    readme = (REPO / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/[a-z0-9-]+\.md)\)", readme))
    assert {f"docs/{page.name}" for page in DOCS} <= linked, "a docs page the README does not link"
    for page in [REPO / "README.md", *DOCS]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith("http"):
                assert (page.parent / target).exists(), f"{page.name} links {target}, which does not exist"


def test_the_readme_explains_in_under_250_lines():
    assert len((REPO / "README.md").read_text().splitlines()) < 250


def test_nothing_reads_outside_the_repository():
    """`../shared` exists only on the developers' machines: no code, test or benchmark may name it."""
    quote = "[\"'/]"
    pattern = re.compile(quote + "sha" + "red" + quote + "|" + r"parent\.parent" + r"\.parent")  # not matching itself
    offenders = []
    for folder in ("ablate", "tests", "bench", "flows"):
        for path in (REPO / folder).rglob("*.py"):
            if pattern.search(path.read_text()):
                offenders.append(str(path.relative_to(REPO)))
    assert offenders == []
