"""The architecture registry: one table, name -> family, that every layer reads.

A family is two modules, named here by import path so that reading a spec never imports torch:
    options_module  torch-free: Options (frozen pydantic, extra keys forbidden), param_count(trial, vocab_size),
                    inter_token_params(trial), mixing_flops_per_token(trial): what validation and planning need
    model_module    imports torch, re-exports those, and adds build(trial, vocab_size) -> nn.Module mapping
                    input_ids (B, T) -> logits (B, T, V)

The built-in zoo registers itself when `ablate.models` is imported (one `register_architecture` line per family
there); the first lookup imports it, so `config` names it here by path and never imports it at module level.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ablate.config.errors import AblateError, did_you_mean, one_of

BUILTINS = "ablate.models"  # the package whose import registers the built-in families


@dataclass(frozen=True)
class Family:
    name: str
    model_module: str
    options_module: str
    description: str


_FAMILIES: dict[str, Family] = {}
_builtins_loaded = False


def register_architecture(name: str, model_module: str, options_module: str, description: str) -> None:
    """Add a family to the table (a second registration of one name must name the same modules)."""
    family = Family(name, model_module, options_module, description)
    known = _FAMILIES.get(name)
    if known is not None and known != family:
        raise AblateError(f"architecture {name!r} is registered twice: by {known.model_module} and by "
                          f"{model_module}; give one of them another name")
    _FAMILIES[name] = family


def families() -> dict[str, Family]:
    """Every registered family by name, in registration order (the built-ins first)."""
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        importlib.import_module(BUILTINS)
    return _FAMILIES


def unknown_architecture(name: Any) -> str:
    """The message for a name that no family has, with the nearest names."""
    known = families()
    return f"unknown architecture {name!r}{did_you_mean(str(name), known)}; known: {one_of(known)}"


def check_architecture(name: str) -> Family:
    family = families().get(name) if isinstance(name, str) else None
    if family is None:
        raise AblateError(unknown_architecture(name))
    return family


def options_module(name: str) -> ModuleType:
    """The family's torch-free module: Options, param_count, inter_token_params, mixing_flops_per_token."""
    return importlib.import_module(check_architecture(name).options_module)


def options_model(name: str) -> Any:
    """The family's Options class."""
    return options_module(name).Options


def model_module(name: str) -> ModuleType:
    """The family's model module (imports it, and torch): for building."""
    return importlib.import_module(check_architecture(name).model_module)
