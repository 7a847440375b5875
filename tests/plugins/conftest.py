"""Plugins register into the process-wide registry: each test gets the table back as it was."""

from __future__ import annotations

import pytest

from ablate.config import registry
from ablate.plugins import load


@pytest.fixture(autouse=True)
def clean_registry(monkeypatch):
    registry.families()  # the built-ins and installed plugins, loaded before the snapshot
    monkeypatch.setattr(registry.FAMILIES, "entries", dict(registry.FAMILIES.entries))
    monkeypatch.setattr(registry.OBJECTIVES, "entries", dict(registry.OBJECTIVES.entries))
    monkeypatch.setattr(load, "_FILES", dict(load._FILES))
    monkeypatch.setattr(load, "BROKEN", dict(load.BROKEN))
