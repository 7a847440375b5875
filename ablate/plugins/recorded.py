"""What readers know of a plugin without running it: the facts recorded when its sweep was registered.

A results DB is handed to colleagues and served by `ablate ui`; whoever can edit the file can change a stored
plugin source. So reading a stored trial (report, ui, export, sql, status, `ablate.results`) never executes plugin
code: a plugin this process has not loaded stands in as a *recorded* entry, built from the facts registration
wrote beside the source (`plugin_facts`: its description, its options' defaults, whether it is causal in train
mode, and for an objective what the report reads of it). A recorded family cannot build a model: sampling from a
plugin run needs the plugin given explicitly (`ablate generate --plugin PATH`, or `--run-stored-plugin`;
stored.load_for). Only the trainer runs a stored source, and only after checking its text against its identity
(ablate/plugins/stored.py).

Facts are keyed by (name, identity): the same code registers the same facts, so a row is never updated.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pydantic
from pydantic_core import to_jsonable_python

from ablate.config import registry
from ablate.config.errors import AblateError
from ablate.config.registry import Family, ObjectiveEntry, Source, code_parts

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig

RECORDED = "recorded"  # Source.kind of a stand-in: the plugin's facts, none of its code
_OBJECTIVE_FLAGS = ("unmasked", "token_targets", "next_token", "architectures")


def is_recorded(entry: Any) -> bool:
    return entry is not None and entry.source.kind == RECORDED


def unloaded(trial: TrialConfig) -> list[tuple[str, str]]:
    """The plugins of a stored `trial` whose code this process does not hold (recorded stand-ins)."""
    return [(name, identity) for name, identity in code_parts(trial.code or "")
            if is_recorded(registry.registered(name))]


# ---------------------------------------------------------------- at registration: the facts


def facts_of(trials: list[Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """The facts of each plugin `trials` run, by (name, identity), from the loaded plugin (it ran here anyway)."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for trial in trials:
        for name, identity in code_parts(trial.code or ""):
            entry = registry.registered(name)
            if (name, identity) in found or entry is None or entry.source.identity != identity:
                continue
            facts = {"description": entry.description, "path": entry.source.where}
            if isinstance(entry, Family):
                module = entry.options_module()
                facts.update(kind="architecture", options=_defaults(module.Options),
                             train_mode_causal=getattr(module, "TRAIN_MODE_CAUSAL", True) is not False,
                             train_mode_note=str(getattr(module, "TRAIN_MODE_NOTE", "")))
            else:
                facts.update(kind="objective", options=_defaults(entry.options_model),
                             **{flag: to_jsonable_python(getattr(entry, flag)) for flag in _OBJECTIVE_FLAGS})
            found[name, identity] = facts
    return found


def _defaults(options: Any) -> dict[str, Any]:
    """An Options model's default values (JSON), the fields a trial need not give."""
    fields = getattr(options, "model_fields", {})
    return {key: to_jsonable_python(field.get_default(call_default_factory=True))
            for key, field in fields.items() if not field.is_required()}


# ---------------------------------------------------------------- reading: stand-ins


def stand_in(code: str) -> None:
    """Register a recorded stand-in for each plugin of a stored trial's `code` that this process has not loaded
    (from the facts in any results DB it has opened; a DB registered before facts were kept gives none: its options
    then read as stored, without defaults)."""
    from ablate.store.plugins import stored_facts  # a reading command that met an unloaded plugin: it has a DB open

    for name, identity in code_parts(code):
        if registry.registered(name) is not None:
            continue
        facts = stored_facts(name, identity)
        source = Source(RECORDED, str(facts.get("path", "?")), identity)
        description = str(facts.get("description", f"plugin {identity}, recorded"))
        options = SimpleNamespace(Options=_options_model(name, facts.get("options") or {}))
        if facts.get("kind") == "objective":
            flags = {flag.upper(): facts[flag] for flag in _OBJECTIVE_FLAGS if facts.get(flag) is not None}
            if "ARCHITECTURES" in flags:
                flags["ARCHITECTURES"] = tuple(flags["ARCHITECTURES"])
            registry.add_objective(ObjectiveEntry(name, _refusing(name, identity), SimpleNamespace(
                **vars(options), **flags), description, source))
        else:  # an architecture, or a name whose facts were not kept: a trial's architecture is the usual case
            if facts.get("train_mode_causal") is False:  # what the report says under its tables
                options.TRAIN_MODE_CAUSAL, options.TRAIN_MODE_NOTE = False, facts.get("train_mode_note", "")
            registry.add_family(Family(name, _refusing(name, identity), options, description, source))


def _options_model(name: str, defaults: dict[str, Any]) -> Any:
    """Options that take any keys (they were validated when the sweep was registered) and fill in the defaults."""
    fields = {key: (Any, value) for key, value in defaults.items() if key.isidentifier() and not key.startswith("_")}
    config = pydantic.ConfigDict(extra="allow", protected_namespaces=())
    try:
        with warnings.catch_warnings():  # a field named like a BaseModel attribute: the plugin's own Options had it
            warnings.simplefilter("ignore")
            return pydantic.create_model(f"Recorded_{abs(hash(name))}", __config__=config, **fields)
    except (TypeError, ValueError, NameError):  # a name pydantic keeps for itself: the options as stored, no defaults
        return pydantic.create_model(f"Recorded_{abs(hash(name))}", __config__=config)


def _refusing(name: str, identity: str) -> SimpleNamespace:
    """A model module whose every use says that this process holds the plugin's facts, not its code."""
    def refuse(*_: Any, **__: Any) -> Any:
        raise AblateError(not_loaded(name, identity))

    return SimpleNamespace(build=refuse, loss=refuse, count=refuse)


def not_loaded(name: str, identity: str, what: str = "this") -> str:
    return (f"{what} needs the code of plugin {name!r} ({identity}), and reading commands never run code from the "
            "results DB: `ablate generate` takes the plugin file with --plugin PATH (checked against that identity), "
            "or --run-stored-plugin to run the source the DB holds (only for a DB you trust)")
