"""Where a (corpus, tokenizer, context, packing) token cache lives and whether it is intact. Torch-free: a sweep
whose caches are all built and intact checks them without importing torch (ablate/data/cache.py builds them)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ablate.config import DatasetRef, TokenizerRef, fingerprint


def tokenizer_fingerprint(ref: TokenizerRef, dataset: DatasetRef) -> str:
    if ref.name is not None:
        return fingerprint({"name": ref.name})
    if ref.trained_on is not None:  # exactly the tokenizer of a sweep on that corpus
        return tokenizer_fingerprint(ref.model_copy(update={"trained_on": None}), ref.trained_on)
    return fingerprint({"tokenizer": ref.model_dump(mode="json"), "dataset": dataset.model_dump(mode="json")})


def cache_folder(root: Path, dataset: DatasetRef, tokenizer: TokenizerRef, context: int) -> Path:
    """The token cache's folder under the artifacts `root`."""
    key = fingerprint({"dataset": dataset.model_dump(mode="json"), "tokenizer": tokenizer_fingerprint(tokenizer, dataset),
                       "context": context, "packing": dataset.packing})
    return Path(root) / "tokens" / key


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def cache_intact(folder: Path) -> bool:
    """Whether a token cache is complete and every file matches the sha256 its build recorded (checked at
    every start: about 1 s per GB of tokens)."""
    try:
        sums = json.loads((folder / "meta.json").read_text()).get("sha256")
        return bool(sums) and all(file_sha256(folder / name) == digest for name, digest in sums.items())
    except (OSError, ValueError, AttributeError):
        return False
