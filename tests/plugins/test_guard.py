"""The registration guard is `ablate check`'s fast part, bounded: train-mode causality, finite logits and trainable
parameters are asked as check asks them; the plugin's code runs in a child process that a hung forward cannot
hang and an exiting plugin cannot turn into a pass; `ablate plan` says in one line what `sweep run` will refuse."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import sqlalchemy as sa

from ablate import store
from ablate.config.errors import AblateError
from ablate.plugins import guard
from tests.helpers import cli_env
from tests.plugins.test_plugins import sweep_file
from tests.waiting import patience

HEAD = '''
import os
import torch
from pydantic import BaseModel

import ablate


class Options(BaseModel):
    width: int = 1


class Model(torch.nn.Module):
    def __init__(self, trial, vocab_size):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, trial.d_model)
        self.head = torch.nn.Linear(trial.d_model, vocab_size)

    def forward(self, input_ids):
        x = self.embed(input_ids)
{body}
        return self.head(x)


@ablate.architecture("guarded", options=Options{declared})
def build(trial, vocab_size):
{build}
'''

PLUGINS = {
    "train-mode-leak": dict(body="        if self.training:\n            x = x + x.flip(1)  # sees the future in train mode only"),
    "nan-logits": dict(body="        x = x * float('nan')"),
    "no-parameters": dict(build="    model = Model(trial, vocab_size)\n    for p in model.parameters():\n"
                                "        p.requires_grad_(False)\n    return model"),
    "never-returns": dict(body="        while True:\n            pass"),
    "build-raises": dict(build="    raise RuntimeError('no weights for this width')"),
    "routes-by-design": dict(body="        if self.training:\n            x = x + x.flip(1)",
                             declared=", train_mode_causal=False, train_mode_note='routes by design'"),
}


def plugin(folder, kind: str, prefix: str = ""):
    parts = {"body": "", "build": "    return Model(trial, vocab_size)", "declared": "", **PLUGINS[kind]}
    (folder / "guarded.py").write_text(prefix + HEAD.format(**parts))
    return sweep_file(folder, ["./guarded.py"], architectures=("guarded",))


def ablate(folder, *args: str, db: str | None = None) -> subprocess.CompletedProcess:
    env = cli_env(HF_HUB_OFFLINE="1", **({"ABLATE_DB_URL": db} if db else {}))
    return subprocess.run([sys.executable, "-m", "ablate.cli", *args], cwd=folder, text=True, capture_output=True,
                          env=env, timeout=300)


def nothing_registered(url: str) -> bool:
    with store.connect(url).connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(store.Sweep)).scalar() == 0


@pytest.mark.parametrize("kind,said", [("train-mode-leak", "causal (train): logits at position"),
                                       ("nan-logits", "hold NaN or inf"),
                                       ("no-parameters", "no trainable parameters")])
def test_the_guard_refuses_what_check_fails_before_anything_is_registered(tmp_path, sqlite_url, kind, said):
    from ablate import runner

    with pytest.raises(AblateError) as caught:
        runner.register(plugin(tmp_path, kind), sqlite_url)
    message = str(caught.value)
    assert message.startswith("refused before anything was registered: the plugin's model breaks the contract")
    assert "architecture 'guarded'" in message and said in message, message
    assert nothing_registered(sqlite_url)


def test_a_family_that_routes_by_design_declares_it_and_is_registered(tmp_path, sqlite_url):
    from ablate import runner
    from ablate.plugins.check import check_trial, small_trial

    runner.register(plugin(tmp_path, "routes-by-design"), sqlite_url)
    findings = {f.name: f for f in check_trial(small_trial("guarded"), fast=True)}
    assert findings["causal (train)"].ok is None and findings["causal (train)"].detail == "routes by design"

    # a reader that never ran the plugin knows it from the facts registration recorded, and its report says so
    from ablate.config import registry
    from ablate.plugins import load
    from ablate.report.notes import run_notes
    from ablate.results.views import load_views

    del registry.FAMILIES.entries["guarded"]
    load._FILES.clear()
    _, views = load_views(store.connect(sqlite_url), "plug")
    assert registry.families()["guarded"].source.kind == "recorded"
    assert "guarded: its train loss is not causal (routes by design); its test loss is." in run_notes(views)


def test_a_forward_that_never_returns_is_refused_within_the_limit(tmp_path, sqlite_url, monkeypatch):
    from ablate import runner

    monkeypatch.setattr(guard, "GUARD_SECONDS", 8.0)  # longer than the child takes to reach the forward, idle
    t0 = time.monotonic()
    with pytest.raises(AblateError, match=r"the contract's fast check of guarded did not finish in 8 s: does the "
                                          r"model's forward \(or its build\) return\?"):
        runner.register(plugin(tmp_path, "never-returns"), sqlite_url)
    assert time.monotonic() - t0 < patience(60) and nothing_registered(sqlite_url)


def test_check_runs_the_plugin_in_a_child_it_cannot_end_with_exit_0(tmp_path):
    plugin(tmp_path, "nan-logits", prefix="import os\nos._exit(0)\n")
    done = ablate(tmp_path, "check", "guarded", "--plugin", "./guarded.py")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "ended without a result (exit code 0): the plugin exited or crashed the process" in done.stderr


@pytest.mark.parametrize("kind,said", [("train-mode-leak", "causal (train)"),
                                       ("build-raises", "build raised RuntimeError: no weights for this width")])
def test_plan_says_in_one_line_what_sweep_run_will_refuse(tmp_path, kind, said):
    done = ablate(tmp_path, "plan", str(plugin(tmp_path, kind)))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "`ablate sweep run` (and register) will refuse this sweep" in lines[0], lines
    assert said in lines[0]


@pytest.mark.slow
def test_check_of_a_forward_that_never_returns_ends_at_its_limit(tmp_path, monkeypatch, capsys):
    from ablate.cli import main

    plugin(tmp_path, "never-returns")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(guard, "CHECK_SECONDS", 8.0)  # longer than the child takes to reach the forward, idle
    assert main(["check", "guarded", "--plugin", "./guarded.py"]) == 2
    assert "the contract check of guarded did not finish in 8 s" in capsys.readouterr().err


def test_a_module_plugin_is_checked_in_the_child_as_the_sweep_imported_it(tmp_path, sqlite_url, monkeypatch):
    """plugins: [a package] (importable here through sys.path): the child imports it the same way, and its leak is
    found there."""
    from ablate import runner

    package = tmp_path / "leakypkg"
    package.mkdir()
    (package / "__init__.py").write_text("from . import model  # registers on import\n")
    (package / "model.py").write_text(HEAD.format(**{"build": "    return Model(trial, vocab_size)", "declared": "",
                                                      **PLUGINS["train-mode-leak"]}))
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = sweep_file(tmp_path, ["leakypkg"], architectures=("guarded",))
    with pytest.raises(AblateError, match="architecture 'guarded' .*causal \\(train\\)"):
        runner.register(spec, sqlite_url)
