"""The house's rules, checked on the code itself: no import circles, no import running back up from the lower
floors, the torch-free layers stay torch-free, `config` stands on nothing of ablate, the old top-level paths are
gone, a module reads in one sitting."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules of the house that `path` imports, at any depth of its code (a function's lazy import counts:
    a circle through one is still a circle a reader has to hold in mind)."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _graph() -> dict[str, set[str]]:
    files = [p for folder in ("ablate", "flows") for p in (ROOT / folder).rglob("*.py")
             if "migrations" not in p.parts]
    names = {_module_name(p): p for p in files}
    known = set(names)
    return {name: _imports(path, name, known) for name, path in names.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), ignoring a package's import of its own
    submodules (its face re-exporting them)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def edges(v: str) -> set[str]:
        return {w for w in graph.get(v, ()) if w in graph and not w.startswith(v + ".") and not v.startswith(w + ".")}

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    assert _circles(_graph()) == []


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_config_imports_nothing_of_ablate_outside_config():
    graph = _graph()
    outside = {m: sorted(d for d in deps if not d.startswith("ablate.config"))
               for m, deps in graph.items() if m.startswith("ablate.config")}
    assert {m: d for m, d in outside.items() if d} == {}


# what each lower floor may import (ablate/README.md's picture); "ablate" is the package face (its version, the
# registration in config/, and on first use of `ablate.sweep` the Python door, cli/api.py, beside the command line)
BELOW = {"ablate": {"config", "cli"}, "store": {"ablate", "config"}, "data": {"config"}, "models": {"config"},
         "objectives": {"config", "models"}, "plugins": {"config", "models", "objectives", "store"}}


def test_no_import_runs_back_up_from_the_lower_floors():
    """Registration sits with the registry in config/ (the zoo, the objectives and every plugin register through
    config/registration.py), and the store receives plugin sources from its caller: no lower floor imports one
    above it, so nothing below plugins/ can run plugin code."""
    graph = _graph()

    def folder(module: str) -> str:
        return module.split(".")[1] if module.startswith("ablate.") else module

    above = {}
    for module, deps in graph.items():
        if folder(module) in BELOW:
            wrong = sorted(d for d in deps if folder(d) not in BELOW[folder(module)] | {folder(module)})
            if wrong:
                above[module] = wrong
    assert above == {}


def test_the_read_side_asks_nothing_of_the_runner():
    """results/ reads the DB itself (a sweep by name is store.sweep_named): it never imports runner/, which runs
    trials, so a machine that only reads results never loads what starts processes."""
    used = {m: sorted(d for d in deps if d.startswith("ablate.runner"))
            for m, deps in _graph().items() if m.startswith("ablate.results")}
    assert {m: d for m, d in used.items() if d} == {}


@pytest.mark.parametrize("layer", ["ablate.config", "ablate.store", "ablate.runner", "ablate.results",
                                   "ablate.data.tokencache",  # checks a built token cache, under a lazy face
                                   "ablate.train.budget"])  # the budget clock: planning and the search loop read it
def test_torch_free_layers_never_import_torch(layer):
    """Imported in a fresh interpreter with every module of the folder, and a spec read and expanded."""
    folder = ROOT / Path(*layer.split("."))
    modules = [layer] + ([_module_name(p) for p in folder.rglob("*.py") if "migrations" not in p.parts]
                         if folder.is_dir() else [])
    code = ("import importlib, sys\n"
            f"for m in {sorted(set(modules))!r}: importlib.import_module(m)\n"
            "from ablate.config import load_trials\n"
            f"load_trials({str(ROOT / 'sweeps' / 'smoke.yaml')!r})\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_old_top_level_paths_are_gone():
    """The modules that moved into folders kept their old paths for a while; version 0.1.0 was never released
    with them, so they are gone, and ablate/ holds only its package face at the top."""
    assert sorted(p.name for p in (ROOT / "ablate").glob("*.py")) == ["__init__.py"]


def test_a_module_reads_in_one_sitting_and_a_function_top_to_bottom():
    """No module of ablate/, flows/ or bench/ over 400 lines, no function over 80 (a migration is a record of the
    schema as it was, not read as code: it is left out). At 120 columns in the house's dense call layout: this is
    also why `ruff format` is not run (pyproject.toml)."""
    modules, functions = {}, {}
    for root in ("ablate", "flows", "bench"):
        for path in (ROOT / root).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            text = path.read_text()
            name = str(path.relative_to(ROOT))
            if len(text.splitlines()) > 400:
                modules[name] = len(text.splitlines())
            for node in ast.walk(ast.parse(text, name)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 80:
                    functions[f"{name}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert (modules, functions) == ({}, {})
