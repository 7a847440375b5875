"""Corpora, tokenizers and the on-disk token cache.

A corpus comes through HF `datasets` (a hub id, local text / jsonl / parquet / arrow files, or a
`save_to_disk` folder); a Llama-style BPE tokenizer is trained on it (or loaded); documents are
tokenized and packed to the trial's context into memory-mapped uint16/uint32 files, keyed by
corpus x tokenizer x context x packing and shared by every trial and process (file lock, atomic rename).

    corpus.py      the embedded corpora (EMBEDDED, embedded_text), local files, the hub loader and its errors:
                   check_source, load_documents, train_eval_documents (documents as a `datasets.Dataset`)
    tokenizer.py   get_tokenizer: a named tokenizer, or a BPE (bytelevel, llama, llama3) trained once on the corpus
    cache.py       prepare: tokenize and pack a corpus into the token cache, once; TokenRows: its rows as
                   (ids, labels) batches; Prepared: both splits and the tokenizer. The only file that needs torch
    tokencache.py  where a token cache lives (cache_folder, tokenizer_fingerprint) and whether it is intact
                   (cache_intact), torch-free: a sweep whose caches are all built checks them without torch

The package face is lazy: `data.X` imports the file that holds X on first use, so `from ablate import data`
loads nothing heavy, and `data.check_source` or `ablate.data.tokencache` never bring torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOMES = {  # every name the old ablate/data.py held, private ones too (generate.py reads data._wrap)
    "corpus": ("Embedded", "EMBEDDED", "SEPARATOR", "SUFFIX_FORMAT", "embedded_text", "check_source",
               "load_documents", "train_eval_documents", "_embedded", "_sha256", "_is_local", "_local_files",
               "_find_local_files", "_text_documents", "_hub_error", "_read_text", "_text_column"),
    "tokenizer": ("SPECIALS", "get_tokenizer", "_wrap", "_train_bpe"),
    "cache": ("TokenRows", "Prepared", "prepare", "_build", "_write_labels", "_pack_pad", "_pack_concat"),
    "tokencache": ("tokenizer_fingerprint", "cache_folder", "file_sha256", "cache_intact"),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}

__all__ = ["EMBEDDED", "Embedded", "Prepared", "SEPARATOR", "SPECIALS", "SUFFIX_FORMAT", "TokenRows", "cache_folder",
           "cache_intact", "check_source", "embedded_text", "file_sha256", "get_tokenizer", "load_documents", "prepare",
           "tokenizer_fingerprint", "train_eval_documents"]  # the public names of _HOME

if TYPE_CHECKING:  # for readers and type checkers; at run time the names come through __getattr__
    from ablate.data.cache import Prepared, TokenRows, prepare
    from ablate.data.corpus import (EMBEDDED, SEPARATOR, SUFFIX_FORMAT, Embedded, check_source, embedded_text,
                                    load_documents, train_eval_documents)
    from ablate.data.tokencache import cache_folder, cache_intact, file_sha256, tokenizer_fingerprint
    from ablate.data.tokenizer import SPECIALS, get_tokenizer


def __getattr__(name: str) -> Any:
    """A name of the old `ablate/data.py` (private ones too: `data._wrap`), or a submodule, imported on first use."""
    if name in _HOMES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME, *_HOMES})
