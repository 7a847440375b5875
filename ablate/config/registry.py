"""The registries: architectures and objectives by name, the one table of each that every layer reads.

A family is two modules, named here by import path so that reading a spec never imports torch:
    options_module  torch-free: Options (frozen pydantic, extra keys forbidden), param_count(trial, vocab_size),
                    inter_token_params(trial), mixing_flops_per_token(trial): what validation and planning need
    model_module    imports torch, re-exports those, and adds build(trial, vocab_size) -> nn.Module mapping
                    input_ids (B, T) -> logits (B, T, V)

An objective is two modules too, a torch-free options module (what validation, planning and reports read) and a
torch module (model, loss, counts); `ablate/objectives/__init__.py` says what each exposes. ObjectiveEntry reads
its options module, with the defaults an objective that declares nothing gets.

The built-ins register themselves when `ablate.models` and `ablate.objectives` are imported (one register line per
family or objective there); the first lookup imports them, so `config` names them here by path and never imports
them at module level.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ablate.config.errors import AblateError, did_you_mean, one_of

BUILTINS = "ablate.models"  # the package whose import registers the built-in families
OBJECTIVE_BUILTINS = "ablate.objectives"  # and the one that registers the built-in objectives


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


# ---------------------------------------------------------------- objectives


@dataclass(frozen=True)
class ObjectiveEntry:
    """A registered objective; what its options module declares, or the default where it declares nothing."""

    name: str
    module: str
    options_module: str
    description: str

    def options(self) -> ModuleType:
        """The torch-free module (imported on first use)."""
        return importlib.import_module(self.options_module)

    def load(self) -> ModuleType:
        """The torch module (imports it, and torch): build, loss, count, and its optional hooks."""
        return importlib.import_module(self.module)

    @property
    def options_model(self) -> Any:
        """The Options class of the trial's objective_options."""
        return self.options().Options

    @property
    def architectures(self) -> tuple[str, ...] | None:
        """The families it is built for; None (the default): every one."""
        return getattr(self.options(), "ARCHITECTURES", None)

    @property
    def unmasked(self) -> bool:
        """Whether it may use a family's unmasked option (it reads whole documents); default no."""
        return getattr(self.options(), "UNMASKED", False)

    @property
    def token_targets(self) -> bool:
        """Whether its targets are tokens, so that eos_is_target means something; default yes."""
        return getattr(self.options(), "TOKEN_TARGETS", True)

    @property
    def next_token(self) -> bool:
        """Whether its model's logits at t predict token t + 1, so a report can sample from it; default no."""
        return getattr(self.options(), "NEXT_TOKEN", False)

    def unsupported(self, architecture: str) -> str | None:
        """Why it cannot be built on `architecture`, or None when it can."""
        allowed = self.architectures
        if allowed is None or architecture in allowed:
            return None
        return (f"objective {self.name!r} is built for architectures {one_of(allowed)}, not {architecture!r}; "
                f"use one of those or objective: clm")

    def check_trial(self, trial: Any) -> None:
        """Its checks of a whole trial (ValueError), past what Options validates; default none."""
        check = getattr(self.options(), "check_trial", None)
        if check is not None:
            check(trial)

    def passes(self, trial: Any) -> tuple[float, float]:
        """(forward passes over all parameters, stacks of token mixing) per token, relative to one causal pass."""
        passes = getattr(self.options(), "passes", None)
        return (1.0, 1.0) if passes is None else passes(trial)

    def param_counts(self, trial: Any, total: int, inter: int, vocab: int, family: ModuleType) -> tuple[int, int]:
        """(total, inter-token) parameters of its model, from one model's of the family (`family`: its options
        module); default unchanged."""
        counts = getattr(self.options(), "param_counts", None)
        return (total, inter) if counts is None else counts(trial, total, inter, vocab, family)


_OBJECTIVES: dict[str, ObjectiveEntry] = {}
_objective_builtins_loaded = False


def register_objective(name: str, module: str, options_module: str, description: str) -> None:
    """Add an objective to the table (a second registration of one name must name the same modules)."""
    entry = ObjectiveEntry(name, module, options_module, description)
    known = _OBJECTIVES.get(name)
    if known is not None and known != entry:
        raise AblateError(f"objective {name!r} is registered twice: by {known.module} and by {module}; "
                          f"give one of them another name")
    _OBJECTIVES[name] = entry


def objectives() -> dict[str, ObjectiveEntry]:
    """Every registered objective by name, in registration order (the built-ins first)."""
    global _objective_builtins_loaded
    if not _objective_builtins_loaded:
        _objective_builtins_loaded = True
        importlib.import_module(OBJECTIVE_BUILTINS)
    return _OBJECTIVES


def unknown_objective(name: Any) -> str:
    """The message for a name that no objective has, with the nearest names."""
    known = objectives()
    return f"unknown objective {name!r}{did_you_mean(str(name), known)}; known: {one_of(known)}"


def objective(name: str) -> ObjectiveEntry:
    entry = objectives().get(name) if isinstance(name, str) else None
    if entry is None:
        raise AblateError(unknown_objective(name))
    return entry


def unmasked_objectives() -> tuple[str, ...]:
    """The objectives that may use a family's unmasked option."""
    return tuple(name for name, entry in objectives().items() if entry.unmasked)
