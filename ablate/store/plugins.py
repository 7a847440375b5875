"""Plugin rows in the results DB: a file plugin's source by the identity of its code (`plugin_sources`), and what
readers know of a plugin without running it (`plugin_facts`).

The store runs no plugin and decides nothing about one: registration writes the records its caller found
(`PluginRecords`, from ablate/plugins/stored.py), and the plugin side looks rows up here, in any database this
process has opened.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from ablate.config.registry import Source
from ablate.store.migrate import opened_engines
from ablate.store.schema import PluginFacts, PluginSource


@dataclass(frozen=True)
class PluginRecords:
    """What a sweep's registration stores of the plugins its trials run."""

    sources: tuple[Source, ...] = ()  # the file plugins' code, each once (installed packages are not stored)
    facts: Mapping[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # by (name, identity)


def save(session: Any, records: PluginRecords) -> None:
    """Store the sources and facts not stored yet, inside the registration's transaction (before any run names
    them: a worker may claim one at once). Both are keyed by the code's identity, so a row is never updated."""
    if records.sources:
        have = set(session.scalars(sa.select(PluginSource.identity).where(
            PluginSource.identity.in_([s.identity for s in records.sources]))))
        for source in records.sources:
            if source.identity not in have:
                have.add(source.identity)
                session.add(PluginSource(identity=source.identity, path=source.where, text=source.text))
    for (name, identity), data in records.facts.items():
        if session.get(PluginFacts, (name, identity)) is None:
            session.add(PluginFacts(name=name, identity=identity, facts=data))


def stored_source(identity: str) -> tuple[tuple[str, str] | None, list[str]]:
    """((path, text) of the source stored under `identity`, or None), and the databases that could not be read
    (e.g. one gone away: said by the caller, not taken for a missing row)."""
    unread = []
    for engine in opened_engines():
        try:
            with engine.connect() as conn:
                row = conn.execute(sa.select(PluginSource.path, PluginSource.text)
                                   .where(PluginSource.identity == identity)).first()
        except sa.exc.SQLAlchemyError as exc:
            unread.append(f"{engine.url.render_as_string(hide_password=True)} ({type(exc.orig or exc).__name__})")
            continue
        if row is not None:
            return (row.path, row.text), unread
    return None, unread


def stored_facts(name: str, identity: str) -> dict[str, Any]:
    """The facts recorded for plugin `name` at `identity`; {} where no opened database has them."""
    for engine in opened_engines():
        try:
            with engine.connect() as conn:
                facts = conn.scalar(sa.select(PluginFacts.facts).where(PluginFacts.name == name,
                                                                       PluginFacts.identity == identity))
        except sa.exc.SQLAlchemyError:  # an older DB without the table, or one gone away: no facts from it
            continue
        if isinstance(facts, dict):
            return facts
    return {}
