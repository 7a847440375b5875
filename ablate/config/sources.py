"""What a dataset source names: a hub id, local files or folders, or a corpus embedded in the package.
Torch-free: reading a spec, planning and overriding one decide it from the text alone (and the filesystem)."""

from __future__ import annotations

import os
from pathlib import Path

# Suffixes of data files: a source ending in one of these is a local path, never a hub id.
DATA_SUFFIXES = (".txt", ".text", ".jsonl", ".json", ".parquet", ".arrow", ".csv", ".tsv", ".xz", ".gz", ".zst", ".bz2")


def is_local_source(source: str) -> bool:
    """Whether a dataset source names local files or an embedded corpus (else: a hub id)."""
    return source.startswith(("/", ".", "~", "ablate:")) or os.path.exists(source) or any(c in source for c in "*?[")


def looks_like_path(source: str) -> bool:
    """Whether a source can only mean a local path (a hub id is `name` or `org/name`, with no data-file suffix)."""
    return (source.startswith((".", "/", "~")) or source.count("/") > 1 or "\\" in source
            or any(c in source for c in "*?[") or source.lower().endswith(DATA_SUFFIXES))


def has_splits(source: str) -> bool:
    """Whether a local source is a `save_to_disk` DatasetDict folder (the one local kind with named splits)."""
    return (Path(source).expanduser() / "dataset_dict.json").exists()


def special_files(paths: list) -> list[str]:
    """Those of `paths` that exist but are neither a regular file nor a folder (/dev/zero, a FIFO, a socket):
    reading one as a corpus never ends, or blocks."""
    return [str(p) for p in paths if os.path.exists(p) and not (os.path.isfile(p) or os.path.isdir(p))]
