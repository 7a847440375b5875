"""One Settings reads the ABLATE_* environment: typed, checked, documented, and the only reader."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ablate.config.errors import AblateError
from ablate.config.settings import Settings, describe, environment, variable

REPO = Path(__file__).resolve().parents[2]
INTERNAL = {"ABLATE_CLAIMANT", "ABLATE_RUNNER_PID", "ABLATE_RUN_LOG"}  # messages from a runner to its trainer, not settings


def _environ_reads(path: Path) -> list[str]:
    """`os.environ.get("ABLATE_X")`, `os.environ["ABLATE_X"]` (read, not assigned) and `os.getenv("ABLATE_X")`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        key = None
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = ast.unparse(node.func)
            if name in ("os.environ.get", "os.getenv", "environ.get"):
                key = node.args[0].value
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and isinstance(node.slice, ast.Constant):
            if ast.unparse(node.value) in ("os.environ", "environ"):
                key = node.slice.value
        if isinstance(key, str) and key.startswith("ABLATE_"):
            found.append(f"{path.name}:{node.lineno} {key}")
    return found


def test_nothing_but_settings_reads_an_ablate_variable():
    reads = [hit for folder in ("ablate", "flows") for path in sorted((REPO / folder).rglob("*.py"))
             if path.name != "settings.py" for hit in _environ_reads(path)]
    assert reads == []


def test_the_reader_scan_finds_a_read(tmp_path):
    """The scan above would see a read if one came back (so its empty answer means something)."""
    sample = tmp_path / "sample.py"
    sample.write_text('import os\nA = os.environ.get("ABLATE_X")\nB = os.environ["ABLATE_Y"]\nos.environ["ABLATE_Z"] = "1"\n')
    assert [hit.split()[1] for hit in _environ_reads(sample)] == ["ABLATE_X", "ABLATE_Y"]


def _frozen_at_import(path: Path) -> list[str]:
    """Module-level statements that call environment(): a setting frozen when the module was first imported."""
    tree = ast.parse(path.read_text())
    return [f"{path.name}:{node.lineno}" for node in tree.body if not isinstance(node, (ast.FunctionDef, ast.ClassDef))
            and any(isinstance(n, ast.Call) and ast.unparse(n.func).endswith("environment") for n in ast.walk(node))]


def test_no_module_freezes_a_setting_at_import(tmp_path):
    """A warm helper forks trainers with their own environment, and a test changes it: a value read at import
    would be the first process's. Settings are read where they are used (or as the object using them starts)."""
    frozen = [hit for folder in ("ablate", "flows") for path in sorted((REPO / folder).rglob("*.py"))
              for hit in _frozen_at_import(path)]
    assert frozen == []
    sample = tmp_path / "sample.py"  # the scan sees one when there is one
    sample.write_text("from x import environment\n\ndef f():\n    return environment()\nA = environment().stale_seconds\n")
    assert _frozen_at_import(sample) == ["sample.py:5"]


def test_the_timings_follow_the_environment_after_import(monkeypatch):
    from ablate import store
    from ablate.train.stopping import StopSignal

    monkeypatch.setenv("ABLATE_STALE_SECONDS", "123")
    monkeypatch.setenv("ABLATE_HEARTBEAT_SECONDS", "4.5")
    monkeypatch.setenv("ABLATE_STOP_GRACE_SECONDS", "7")
    assert (store.stale_seconds(), store.heartbeat_seconds(), StopSignal().grace) == (123, 4.5, 7)
    assert (store.utcnow() - store.stale_before()).total_seconds() == pytest.approx(123, abs=5)


def test_defaults_and_typed_values(monkeypatch):
    for name in Settings.model_fields:
        monkeypatch.delenv(variable(name), raising=False)
    assert environment().heartbeat_seconds == 10.0 and environment().db_url is None
    assert environment().artifacts == Path("results/artifacts") and environment().warm_trainer
    monkeypatch.setenv("ABLATE_HEARTBEAT_SECONDS", "2.5")
    monkeypatch.setenv("ABLATE_DB_URL", "")  # empty counts as unset, as `os.environ.get(...) or default` did
    monkeypatch.setenv("ABLATE_WARM_TRAINER", " 0")
    monkeypatch.setenv("ABLATE_RUNNER_PID", "not-a-pid")
    s = environment()
    assert (s.heartbeat_seconds, s.db_url, s.warm_trainer, s.runner_pid) == (2.5, None, False, None)
    monkeypatch.setenv("ABLATE_RUNNER_PID", "4242")
    assert environment().runner_pid == 4242


def test_warm_trainer_is_never_auto_or_always(monkeypatch):
    """ABLATE_WARM_TRAINER: 0 never (False), `always` on GPU hosts too, anything else auto (True: no GPU visible)."""
    for value, expected in (("0", False), (" 0 ", False), ("1", True), ("yes", True), ("always", "always"),
                            (" ALWAYS", "always")):
        monkeypatch.setenv("ABLATE_WARM_TRAINER", value)
        assert environment().warm_trainer == expected, value


def test_parsed_once_per_environment(monkeypatch):
    monkeypatch.setenv("ABLATE_STALE_SECONDS", "30")
    first = environment()
    assert environment() is first  # the same environment is not parsed again
    monkeypatch.setenv("ABLATE_STALE_SECONDS", "31")
    assert environment() is not first and environment().stale_seconds == 31


@pytest.mark.parametrize("name, value, words", [
    ("ABLATE_HEARTBEAT_SECONDS", "soon", "valid number"),
    ("ABLATE_STALE_SECONDS", "-1", "greater than 0"),
    ("ABLATE_GPUS_PER_TRIAL", "two", "valid integer"),
])
def test_a_bad_value_is_refused_naming_the_variable(monkeypatch, name, value, words):
    monkeypatch.setenv(name, value)
    with pytest.raises(AblateError) as err:
        environment()
    assert f"{name}={value!r}" in str(err.value) and words in str(err.value) and "unset it" in str(err.value)


def test_every_setting_is_documented_with_its_default():
    readme = (REPO / "docs" / "environment.md").read_text()
    for name, default, meaning in describe():
        if name not in INTERNAL:
            assert f"| `{name}` | {default or '—'} | {meaning} |" in readme, name
