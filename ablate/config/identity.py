"""The identity of a plugin's code, which its registrations record (`Source`) and its trials carry (`code`,
runs.code_version): an installed distribution's name and version, a module's files hashed, or one file's text
hashed (`file_identity`; that text is what the results DB stores for workers).

`LOADING` is the plugin file being executed (ablate/plugins/load.py sets it): what registrations made while it runs
record as their source. Torch-free, and of ablate it reads only the registry's `Source`.
"""

from __future__ import annotations

import contextvars
import hashlib
import sys
from pathlib import Path
from types import ModuleType

from ablate.config.registry import Source

# the plugin file being executed: what its registrations record as their source (config/registration.py reads it)
LOADING: contextvars.ContextVar[Source | None] = contextvars.ContextVar("ablate_plugin_loading", default=None)


def file_identity(text: str) -> str:
    return "file:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def module_source(module: ModuleType | None) -> Source:
    """A module's source: the installed distribution it belongs to (name==version), else the hash of its
    top-level package's files ('module:...'), or of its one file ('file:...', stored for workers)."""
    if module is None:
        return Source("module", "<unknown>", None)
    top = module.__name__.split(".")[0]
    dist = _distribution(top)
    if dist is not None:
        return Source("package", dist[0], f"package:{dist[0]}=={dist[1]}")
    root = sys.modules.get(top, module)
    path = Path(getattr(root, "__file__", "") or "")
    if path.name == "__init__.py":
        digest = hashlib.sha256()
        for file in sorted(path.parent.rglob("*.py")):
            digest.update(file.relative_to(path.parent).as_posix().encode() + b"\0" + file.read_bytes())
        return Source("module", top, f"module:{top}:{digest.hexdigest()[:16]}")
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        return Source("module", top, file_identity(text), text)
    return Source("module", top, None)


_PROVIDERS: dict[tuple[str, ...], dict[str, list[str]]] = {}  # top-level module -> distributions, per sys.path


def _distribution(top: str) -> tuple[str, str] | None:
    """(name, version) of the installed distribution that provides top-level module `top`; None for a module
    that is only on the path (a checkout), or ablate's own."""
    from importlib.metadata import packages_distributions, version

    providers = _PROVIDERS.get(tuple(sys.path))
    if providers is None:  # ~0.1 CPU-s to read every installed distribution's file list: once per sys.path
        providers = _PROVIDERS[tuple(sys.path)] = packages_distributions()
    names = [n for n in providers.get(top, []) if n != "ablate"]
    if not names or top in ("ablate", "tests"):
        return None
    try:
        return names[0], version(names[0])
    except Exception:  # noqa: BLE001 - a broken distribution's metadata: no version to name
        return None
