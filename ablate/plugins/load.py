"""Loading plugins: a file (a sweep's `plugins: [./my_mixer.py]`, relative to the sweep file), an importable
module (`mypkg.models`), or an installed package's entry point (group `ablate.plugins`, read on the registry's
first lookup). What each one registers records the identity of its code (config/identity.py).

A file is executed as a module named after its content hash, so that a re-read of the same file is free and an
edited file registers its new code in place of the old. Whatever goes wrong names the plugin and the fix.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablate.config import registry
from ablate.config.errors import AblateError
from ablate.config.identity import LOADING, file_identity, module_source
from ablate.config.registry import Source

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig

GROUP = "ablate.plugins"  # the entry-point group installed packages name their plugin module in

# plugin files executed in this process, by (path, identity): a sweep read twice runs its plugin once
_FILES: dict[tuple[str, str], Source] = {}
BROKEN: dict[str, str] = {}  # entry points that could not load: name -> why (`ablate models` shows them)


@dataclass(frozen=True)
class Loaded:
    ref: str  # as the sweep wrote it
    source: Source
    names: tuple[str, ...]  # the architectures and objectives it registered


def looks_like_file(ref: str) -> bool:
    return ref.endswith(".py") or "/" in ref or "\\" in ref or ref.startswith(("~", "."))


def load_plugin(ref: str, base_dir: Path | None = None, where: str | None = None) -> Loaded:
    """Load one plugin reference: a file path (relative to `base_dir`, else the working directory) or a module.
    `where`: the path to record for a file materialised from the results DB (the one it was registered from)."""
    if not isinstance(ref, str) or not ref.strip():
        raise AblateError(f"plugin {ref!r}: give a path to a .py file (./my_mixer.py) or a module name (mypkg.models)")
    before = _names()
    source = _load_file(ref, base_dir, where) if looks_like_file(ref) else _load_module(ref)
    return Loaded(ref, source, tuple(n for n in _names() if n not in before or _owner(n) == source))


def load_plugins(refs: list[Any], base_dir: Path | None = None) -> list[Loaded]:
    """A sweep's `plugins:`, in order; problems are raised as one AblateError per plugin, naming it by index."""
    loaded = []
    for index, ref in enumerate(refs):
        try:
            loaded.append(load_plugin(ref, base_dir))
        except AblateError as exc:
            raise AblateError(f"plugins[{index}]: {exc}") from None
    return loaded


def _load_file(ref: str, base_dir: Path | None, where: str | None) -> Source:
    path = Path(ref).expanduser()
    if not path.is_absolute():
        path = (base_dir or Path.cwd()) / path
    path = path.resolve()
    if not path.is_file():
        raise AblateError(f"plugin {ref}: no file {path}; paths are read relative to the sweep file's folder "
                          "(or the working directory on the command line)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise AblateError(f"plugin {ref}: {path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
                          f"{exc.start}); save it as UTF-8, as Python source is") from None
    except OSError as exc:
        raise AblateError(f"plugin {ref}: cannot read {path} ({exc.strerror or exc})") from None
    source = Source("file", where or str(path), file_identity(text), text)
    if (source.where, source.identity) in _FILES:
        return _FILES[source.where, source.identity]
    module_name = f"ablate_plugin_{re.sub(r'[^0-9a-zA-Z_]', '_', path.stem)}_{source.identity[5:13]}"
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(module_name, path))
    sys.modules[module_name] = module  # its classes and functions pickle by this name (DDP's spawned processes)
    # the text that was hashed is the code that runs (an edit between reading and running cannot slip in)
    _execute(ref, source, lambda: exec(compile(text, str(path), "exec"), module.__dict__), module_name)
    _FILES[source.where, source.identity] = source
    return source


def _load_module(ref: str) -> Source:
    token = LOADING.set(None)
    try:
        module = _execute(ref, None, lambda: importlib.import_module(ref), None)
    finally:
        LOADING.reset(token)
    return module_source(module)


def _execute(ref: str, source: Source | None, run: Any, module_name: str | None) -> Any:
    """Run a plugin's code with `source` as what its registrations record; a failure undoes them and says why."""
    saved = registry.snapshot()
    token = LOADING.set(source) if source is not None else None
    try:
        return run()
    except AblateError as exc:
        _undo(saved, module_name)
        raise AblateError(f"plugin {ref}: {exc}") from None
    except BaseException as exc:
        _undo(saved, module_name)
        if isinstance(exc, KeyboardInterrupt):
            raise
        fix = (f"fix the plugin (run it with `python {ref}` to see the whole traceback)"
               if source is not None and source.kind == "file" else
               f"is it installed, and does `python -c 'import {ref}'` work?")
        raise AblateError(f"plugin {ref} failed to import: {_last_line(exc)}; {fix}") from None
    finally:
        if token is not None:
            LOADING.reset(token)


def _undo(saved: Any, module_name: str | None) -> None:
    registry.restore(saved)
    if module_name is not None:
        sys.modules.pop(module_name, None)


def _last_line(exc: BaseException) -> str:
    """The traceback's last frame in the plugin and the exception, in one line."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "importlib" not in f.filename]
    at = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{at}"


def _names() -> list[str]:
    return [*registry.families(), *registry.objectives()]


def _owner(name: str) -> Source | None:
    entry = registry.registered(name)
    return entry.source if entry is not None else None


# ---------------------------------------------------------------- installed packages


def load_entry_points() -> None:
    """Every installed package's plugin module (entry-point group `ablate.plugins`). One that fails to load is
    a warning, and stays listed in BROKEN; it breaks nothing else."""
    from importlib.metadata import entry_points

    for point in entry_points(group=GROUP):
        dist = point.dist  # what its registrations record: the installed distribution and its version
        source = Source("package", dist.name, f"package:{dist.name}=={dist.version}") if dist is not None else None
        try:
            _execute(point.value, source, point.load, None)
        except AblateError as exc:
            BROKEN[point.name] = str(exc)
            warnings.warn(f"entry point {point.name!r} ({point.value}, group {GROUP}) of an installed package "
                          f"was skipped: {exc}", stacklevel=2)


# ---------------------------------------------------------------- counting


def meta_count(family: Any, trial: TrialConfig, vocab_size: int) -> int:
    """Parameters of a family without a closed form, counted by building it on the meta device: shapes only, no
    memory (imports torch). A builder that computes on its tensors is built for real, once."""
    import torch

    build = family.model_module().build
    try:
        with torch.device("meta"):
            model = build(trial, vocab_size)
    except Exception:  # noqa: BLE001 - e.g. .item() on a meta tensor
        model = build(trial, vocab_size)
    return sum(p.numel() for p in model.parameters())
