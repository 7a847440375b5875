"""The registries: architectures and objectives by name, the one table of each that every layer reads.

A family is two references, each an import path (read lazily, so that reading a spec never imports torch) or
an object a plugin handed over:
    options   torch-free: Options (frozen pydantic, extra keys forbidden), and where it has them,
              param_count(trial, vocab_size), inter_token_params(trial), mixing_flops_per_token(trial): what
              validation and planning need (Family gives the defaults of those it lacks)
    model     imports torch, re-exports those, and adds build(trial, vocab_size) -> nn.Module mapping
              input_ids (B, T) -> logits (B, T, V)

An objective is two references too, a torch-free options one (what validation, planning and reports read) and a
torch one (model, loss, counts); `ablate/objectives/__init__.py` says what each exposes. ObjectiveEntry reads
its options, with the defaults an objective that declares nothing gets.

Every entry records its Source: built-in, or the plugin file, module or installed package it came from, with
the identity of that code (`Source.identity`), which a trial of it carries as `code` (its fingerprint, and
runs.code_version). Registrations go through `ablate.architecture` / `ablate.objective` (config/registration.py);
the built-ins register themselves when `ablate.models` and `ablate.objectives` are imported, and installed
packages through the entry-point group `ablate.plugins`; the first lookup does both, so `config` names them
here by path and never imports them at module level.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ablate.config.errors import AblateError, did_you_mean, one_of

BUILTINS = "ablate.models"  # the package whose import registers the built-in families
OBJECTIVE_BUILTINS = "ablate.objectives"  # and the one that registers the built-in objectives
PLUGINS = "ablate.plugins"  # loading plugins (entry points, a stored source): named by path, as the built-ins are
Entry = TypeVar("Entry")  # a Family or an ObjectiveEntry: what a Table holds (each has .name and .source)


@dataclass(frozen=True)
class Source:
    """Where an entry's code comes from. identity: None for the built-ins (ablate's own version stands for them);
    'file:<sha256[:16]>' of a plugin file (whose `text` is stored with a sweep, for workers that never saw it),
    'module:TOP:<sha256[:16]>' of an importable package's files, 'package:NAME==VERSION' of an installed one."""

    kind: str  # builtin | file | module | package | recorded (a stand-in: facts read from a results DB, no code)
    where: str  # 'ablate', the file's path, the module's or the distribution's name
    identity: str | None = None
    text: str | None = None

    def describe(self) -> str:
        if self.kind == "builtin":
            return "built-in"
        if self.kind == "package" and self.identity:
            return f"package {self.identity.removeprefix('package:')}"
        return f"{self.kind} {self.where}" + (f" ({self.identity.split(':', 1)[1]})" if self.identity else "")

    def same_plugin(self, other: Source) -> bool:
        """Whether `other` is this plugin again (perhaps edited since): the same kind and place."""
        return (self.kind, self.where) == (other.kind, other.where)


BUILTIN = Source("builtin", "ablate")


def resolve(ref: Any) -> Any:
    """An import path's module (imported on first use), or the object a plugin registered."""
    return importlib.import_module(ref) if isinstance(ref, str) else ref


def _stands_in(entry: Any) -> bool:
    """Whether `entry` is a recorded stand-in (a plugin's facts, read from a results DB; none of its code), which
    the plugin's own code replaces when it is loaded (ablate/plugins/recorded.py)."""
    return entry.source.kind == "recorded"


class Table(Generic[Entry]):
    """One registry (families, or objectives): entries by name, in registration order. The same plugin may
    register a name again (a re-read or edited file replaces its entry, as the plugin's own code replaces a
    recorded stand-in); another source may not, nor a name that differs from a registered one only by case."""

    def __init__(self, kind: str) -> None:
        self.kind = kind  # "architecture" or "objective": how messages name an entry
        self.entries: dict[str, Entry] = {}

    def add(self, entry: Entry) -> None:
        twins = [known for known in self.entries if known != entry.name and known.lower() == str(entry.name).lower()]
        if twins:  # `LLaMA` beside `llama` reads as the same name in a report, a path or a shell
            raise AblateError(f"{self.kind} {entry.name!r} differs from the registered {twins[0]!r} only by case "
                              f"({self.entries[twins[0]].source.describe()}); give it a name of its own")
        known = self.entries.get(entry.name)
        if known is not None and known != entry and not known.source.same_plugin(entry.source) and not _stands_in(known):
            raise AblateError(f"{self.kind} {entry.name!r} is already registered ({known.source.describe()}); the "
                              f"{entry.source.describe()} registers it again: give one of them another name")
        self.entries[entry.name] = entry

    def all(self) -> dict[str, Entry]:
        """Every entry by name (the built-ins first, then installed plugins: the first lookup loads them)."""
        _load_builtins()
        return self.entries

    def unknown(self, name: Any) -> str:
        """The message for a name that no entry has, with the nearest names."""
        known = self.all()
        return f"unknown {self.kind} {name!r}{did_you_mean(str(name), known)}; known: {one_of(known)}"

    def get(self, name: Any) -> Entry:
        entry = self.all().get(name) if isinstance(name, str) else None
        if entry is None:
            raise AblateError(self.unknown(name))
        return entry


@dataclass(frozen=True)
class Family:
    """A registered family. Its counts are its options module's functions, with the defaults a plugin that gives
    none gets: parameters counted on the meta device, inter-token parameters unknown, no mixing FLOPs."""

    name: str
    model_ref: Any  # the model module's import path, or a plugin's namespace with build
    options_ref: Any  # the torch-free options module's path, or a plugin's namespace with Options and the counts
    description: str
    source: Source = BUILTIN

    def options_module(self) -> Any:
        return resolve(self.options_ref)

    def model_module(self) -> Any:
        return resolve(self.model_ref)

    @property
    def closed_form(self) -> bool:
        """Whether param_count is a formula (else counting builds the model on the meta device)."""
        return hasattr(self.options_module(), "param_count")

    # trial: a TrialConfig, typed Any: config.trial imports this module (a circle, tests/test_layout.py)
    def param_count(self, trial: Any, vocab_size: int) -> int:
        count = getattr(self.options_module(), "param_count", None)
        if count is not None:
            return count(trial, vocab_size)
        return importlib.import_module(f"{PLUGINS}.load").meta_count(self, trial, vocab_size)  # imports torch

    # trial: a TrialConfig, typed Any: config.trial imports this module (a circle, tests/test_layout.py)
    def inter_token_params(self, trial: Any) -> int | None:
        """The parameters that mix tokens (recorded per run); None: the family does not say."""
        count = getattr(self.options_module(), "inter_token_params", None)
        return None if count is None else count(trial)

    # trial: a TrialConfig, typed Any: config.trial imports this module (a circle, tests/test_layout.py)
    def mixing_flops_per_token(self, trial: Any) -> float:
        """Token-mixing FLOPs per token that are not parameter multiplies (attention's scores); default none."""
        flops = getattr(self.options_module(), "mixing_flops_per_token", None)
        return 0.0 if flops is None else flops(trial)


FAMILIES: Table[Family] = Table("architecture")
_loaded = False


def add_family(family: Family) -> None:
    """Add a family to the table (Table.add: the same plugin may register a name again, another may not)."""
    FAMILIES.add(family)


def register_architecture(name: str, model_module: str, options_module: str, description: str) -> None:
    """Add a family by its modules' import paths (what `ablate.architecture` does for a lazy registration)."""
    add_family(Family(name, model_module, options_module, description))


def families() -> dict[str, Family]:
    """Every registered family by name, in registration order (the built-ins first, then installed plugins)."""
    return FAMILIES.all()


def _load_builtins() -> None:
    """On the first lookup: the built-in families and objectives, then the installed plugins' entry points."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    importlib.import_module(BUILTINS)
    importlib.import_module(OBJECTIVE_BUILTINS)
    importlib.import_module(f"{PLUGINS}.load").load_entry_points()


def unknown_architecture(name: Any) -> str:
    """The message for a name that no family has, with the nearest names."""
    return FAMILIES.unknown(name)


def check_architecture(name: str) -> Family:
    return FAMILIES.get(name)


def options_module(name: str) -> Any:
    """The family's torch-free module: Options, param_count, inter_token_params, mixing_flops_per_token."""
    return check_architecture(name).options_module()


def options_model(name: str) -> Any:
    """The family's Options class."""
    return options_module(name).Options


def model_module(name: str) -> Any:
    """The family's model module (imports it, and torch): for building."""
    return check_architecture(name).model_module()


# ---------------------------------------------------------------- objectives


@dataclass(frozen=True)
class ObjectiveEntry:
    """A registered objective; what its options module declares, or the default where it declares nothing."""

    name: str
    module: Any  # the torch module's import path, or a plugin's namespace with build, loss and count
    options_module: Any  # the torch-free module's path, or a plugin's namespace with Options and the declarations
    description: str
    source: Source = BUILTIN

    def options(self) -> Any:
        """The torch-free module (imported on first use)."""
        return resolve(self.options_module)

    def load(self) -> Any:
        """The torch module (imports it, and torch): build, loss, count, and its optional hooks."""
        return resolve(self.module)

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

    # trial: a TrialConfig, typed Any: config.trial imports this module (a circle, tests/test_layout.py)
    def check_trial(self, trial: Any) -> None:
        """Its checks of a whole trial (ValueError), past what Options validates; default none."""
        check = getattr(self.options(), "check_trial", None)
        if check is not None:
            check(trial)

    # trial: a TrialConfig, typed Any: config.trial imports this module (a circle, tests/test_layout.py)
    def passes(self, trial: Any) -> tuple[float, float]:
        """(forward passes over all parameters, stacks of token mixing) per token, relative to one causal pass."""
        passes = getattr(self.options(), "passes", None)
        return (1.0, 1.0) if passes is None else passes(trial)

    # trial: a TrialConfig, typed Any: config.trial imports this module (a circle, tests/test_layout.py)
    def param_counts(self, trial: Any, total: int, inter: int, vocab: int, family: Any) -> tuple[int, int]:
        """(total, inter-token) parameters of its model, from one model's of the family (`family`: its options
        module); default unchanged."""
        counts = getattr(self.options(), "param_counts", None)
        return (total, inter) if counts is None else counts(trial, total, inter, vocab, family)


OBJECTIVES: Table[ObjectiveEntry] = Table("objective")


def add_objective(entry: ObjectiveEntry) -> None:
    """Add an objective to the table (Table.add, as add_family)."""
    OBJECTIVES.add(entry)


def register_objective(name: str, module: str, options_module: str, description: str) -> None:
    """Add an objective by its modules' import paths (what `ablate.objective` does for a lazy registration)."""
    add_objective(ObjectiveEntry(name, module, options_module, description))


def objectives() -> dict[str, ObjectiveEntry]:
    """Every registered objective by name, in registration order (the built-ins first, then installed plugins)."""
    return OBJECTIVES.all()


def unknown_objective(name: Any) -> str:
    """The message for a name that no objective has, with the nearest names."""
    return OBJECTIVES.unknown(name)


def objective(name: str) -> ObjectiveEntry:
    return OBJECTIVES.get(name)


def unmasked_objectives() -> tuple[str, ...]:
    """The objectives that may use a family's unmasked option."""
    return tuple(name for name, entry in objectives().items() if entry.unmasked)


# ---------------------------------------------------------------- plugins: lookups by name, undoing a failed one


def registered(name: Any) -> Family | ObjectiveEntry | None:
    """The family, else the objective, registered under `name` (a trial's `code` names its plugins so)."""
    _load_builtins()
    return FAMILIES.entries.get(name) or OBJECTIVES.entries.get(name)


def snapshot() -> tuple[dict[str, Family], dict[str, ObjectiveEntry]]:
    """Both tables as they are (a plugin that fails to load is undone back to this)."""
    return dict(FAMILIES.entries), dict(OBJECTIVES.entries)


def restore(saved: tuple[dict[str, Family], dict[str, ObjectiveEntry]]) -> None:
    for table, entries in zip((FAMILIES.entries, OBJECTIVES.entries), saved):
        table.clear()
        table.update(entries)


# ---------------------------------------------------------------- the identity of a trial's code


def code_of(architecture: Any, objective: Any) -> str | None:
    """`name@identity` of the plugins a trial's family and objective come from ('+' between two), None for
    built-ins: the trial's `code`, part of its fingerprint, so that an edited plugin makes new runs."""
    parts = []
    for entry in (FAMILIES.entries.get(architecture), OBJECTIVES.entries.get(objective)):
        if entry is not None and entry.source.identity is not None and not _stands_in(entry):
            parts.append(f"{entry.name}@{entry.source.identity}")
    return "+".join(parts) or None


def code_parts(code: str) -> list[tuple[str, str]]:
    """(name, identity) of each plugin a trial's `code` names: code_of read back."""
    return [tuple(part.split("@", 1)) for part in code.split("+") if "@" in part]


def with_code(data: dict[str, Any]) -> dict[str, Any]:
    """A trial's fields with its `code`: the registered plugins' for a new trial. A stored trial keeps its own,
    and a plugin it names that this process has not loaded stands in by the facts recorded in the results DB it
    was read from (ablate.plugins.recorded): reading a stored trial never runs plugin code, and reports never
    need the plugin's file. The trainer loads the code itself (ablate.plugins.stored.ensure)."""
    architecture, objective = data.get("architecture"), data.get("objective", "clm")
    families(), objectives()
    if data.get("code") is not None:
        if isinstance(architecture, str) and isinstance(objective, str) and isinstance(data["code"], str) and (
                architecture not in FAMILIES.entries or objective not in OBJECTIVES.entries):
            importlib.import_module(f"{PLUGINS}.recorded").stand_in(data["code"])
        return data
    code = code_of(architecture, objective) if isinstance(architecture, str) and isinstance(objective, str) else None
    return {**data, "code": code} if code else data
