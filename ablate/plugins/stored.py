"""A file plugin's source in the results DB, by the identity of its code, and its materialisation where it runs.

Registering a sweep stores the source of every plugin file its trials name (`records_of`, given to the store). A trainer that never saw the
file writes that exact source into a content-addressed folder and loads it (`materialise`), making sure it builds
with exactly the trial's code (`ensure`): a later edit on the submitting laptop cannot change a running sweep.
Reading a trial runs none of it (a report on another machine reads recorded facts); `ablate generate` loads a
plugin run's code only when told where from (`load_for`).
Installed packages are not stored: a worker must have the same version installed, or the trial fails saying so.

Trust: whoever can write the results DB can run code on the workers, as with any job queue; never on a machine
that only reads it (ablate/plugins/recorded.py). The text is checked against its identity before it runs.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablate.config import registry
from ablate.config.errors import AblateError
from ablate.config.identity import file_identity
from ablate.config.registry import Source, code_parts
from ablate.plugins.recorded import facts_of, is_recorded, not_loaded, unloaded
from ablate.store.plugins import PluginRecords, stored_source

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig


def records_of(trials: list[Any]) -> PluginRecords:
    """What registering `trials` stores of their plugins (store.register_sweep's `plugins=`): the file plugins'
    sources (each once), and every plugin's facts for readers (recorded.facts_of)."""
    found: dict[str, Source] = {}
    for trial in trials:
        for name, identity in code_parts(trial.code or ""):
            entry = registry.registered(name)
            if entry is not None and entry.source.identity == identity and entry.source.text is not None:
                found[identity] = entry.source
    return PluginRecords(tuple(found.values()), facts_of(trials))


def ensure(trial: TrialConfig) -> Any:
    """Load exactly the code `trial` was registered with (before building it): its stored source where this
    process holds another version of a plugin, or only its recorded facts, or nothing. Returns the trial read
    again against that code (its options validated by the plugin's own Options)."""
    if trial.code and registry.code_of(trial.architecture, trial.objective) != trial.code:
        materialise(trial.code, exact=True)
        return type(trial).model_validate(trial.model_dump(mode="json"))
    return trial


def load_for(trial: TrialConfig, what: str, plugin: str | None = None, run_stored: bool = False) -> Any:
    """`trial` read again with its plugins' code loaded, for `what` (a command that builds its model): from the
    file `plugin` (its identity must be the trial's), from the results DB's source when `run_stored`, else refused
    in one line. A trial whose plugins are loaded (or that has none) is returned as it is."""
    missing = unloaded(trial)
    if not missing:
        return trial
    if plugin is not None:
        from ablate.plugins.load import load_plugin

        load_plugin(plugin)
        wrong = [f"{name} is {_loaded_identity(name)}, the run's is {identity}" for name, identity in missing
                 if _loaded_identity(name) != identity]
        if wrong:
            raise AblateError(f"--plugin {plugin} is not the code {what} was trained with: {'; '.join(wrong)}; give "
                              "the file as it was when the sweep was registered")
        return type(trial).model_validate(trial.model_dump(mode="json"))
    if run_stored:
        return ensure(trial)
    name, identity = missing[0]
    raise AblateError(not_loaded(name, identity, what))


def _loaded_identity(name: str) -> str | None:
    entry = registry.registered(name)
    return None if entry is None or is_recorded(entry) else entry.source.identity


def materialise(code: str, exact: bool = False) -> None:
    """Load the plugins a trial's `code` names that are not loaded (or, `exact`, loaded with other code); a stored
    source runs only if its text is the code its identity names."""
    from ablate.plugins.load import load_plugin

    for name, identity in code_parts(code):
        entry = registry.registered(name)
        if entry is not None and not is_recorded(entry) and (not exact or entry.source.identity == identity):
            continue
        kind = identity.split(":", 1)[0]
        if kind == "package":
            raise AblateError(f"{name!r} comes from the installed package {identity.removeprefix('package:')}, "
                              f"which is not installed here{_have(entry)}: install that version on every worker "
                              "(docker-compose: add it to EXTRA_REQUIREMENTS, see docs/plugins.md)")
        if kind == "module":
            top = identity.split(":", 2)[1]
            load_plugin(top)
            entry = registry.registered(name)
            if entry is None or entry.source.identity != identity:
                raise AblateError(f"{name!r} comes from module {top} at {identity}, but this machine's {top} is "
                                  f"other code{_have(entry)}: install the same version on every worker")
            continue
        path, text = _stored(identity, name)
        if file_identity(text) != identity:  # an edited copy of the DB: its text is not the code it names
            raise AblateError(f"{name!r}: the source stored for {identity} in the results DB is other code "
                              f"({file_identity(text)}); refused, nothing of it ran. Register the sweep again from the "
                              "machine that has the plugin file")
        load_plugin(str(write_source(identity, path, text)), where=path)  # its identity is the text's hash: that text


def _have(entry: Any) -> str:
    return f" (this machine has {entry.source.describe()})" if entry is not None else ""


def _stored(identity: str, name: str) -> tuple[str, str]:
    """(path, text) of a stored source, from any results DB this process has opened."""
    found, unread = stored_source(identity)
    if found is not None:
        return found
    if unread:
        raise AblateError(f"{name!r} is a plugin ({identity}) whose source could not be read from the results DB: "
                          f"{', '.join(unread)}; check that the database is reachable, then retry the trial")
    raise AblateError(f"architecture or objective {name!r} is a plugin ({identity}) whose source is not in the "
                      "results DB: register its sweep again from the machine that has the plugin file")


def write_source(identity: str, path: str, text: str) -> Path:
    """The source in a folder named by its identity, in this user's own temporary folder (mode 700: nobody else
    can put code there), written atomically unless the file there already holds it: concurrent trainers share it."""

    folder = Path(tempfile.gettempdir()) / f"ablate-plugins-{os.getuid()}" / identity.replace(":", "-")
    target = folder / Path(path).name
    if not (target.exists() and file_identity(target.read_text(encoding="utf-8")) == identity):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.parent.chmod(0o700)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, target)
    return target
