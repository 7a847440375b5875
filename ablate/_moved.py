"""Old import paths of modules that moved, kept for one release so that users' notebooks keep working."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any


def alias(old: str, *new: str) -> Callable[[str], Any]:
    """A module `__getattr__` for `old` that finds each name in the modules `new` (private names too), and
    warns once, at import, that `old` is deprecated."""
    parts = [path.split(".") for path in new]
    home = ".".join(p for p, *others in zip(*parts) if all(o == p for o in others))  # their common package
    warnings.warn(f"{old} moved to {home}: import from there; the old path is removed after one release",
                  DeprecationWarning, stacklevel=3)

    def __getattr__(name: str) -> Any:
        for path in new:
            module = importlib.import_module(path)
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(f"module {old!r} has no attribute {name!r} (it moved to {', '.join(new)})")

    return __getattr__
