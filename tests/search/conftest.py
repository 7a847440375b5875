"""The search tests' shared token caches (tests/search/test_search.py, test_fused_search.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    """Tokenizer and token caches shared by the module's tests (run directories stay per test)."""
    root = tmp_path_factory.mktemp("cache")
    (root / "tokenizers").mkdir()
    (root / "tokens").mkdir()
    return root


@pytest.fixture
def artifacts(tmp_path: Path, shared_cache: Path) -> Path:
    art = tmp_path / "art"
    art.mkdir()
    for name in ("tokenizers", "tokens"):
        (art / name).symlink_to(shared_cache / name, target_is_directory=True)
    return art
