"""The token cache: a corpus tokenized and packed to the trial's context into memory-mapped uint16/uint32 files,
keyed by corpus x tokenizer x context x packing and shared by every trial and process (file lock, atomic rename);
`prepare` builds it once, `TokenRows` reads its rows back as (ids, labels) batches."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
from filelock import FileLock

from ablate.config.errors import AblateError
from ablate.config import DatasetRef, TokenizerRef
from ablate.data.corpus import train_eval_documents
from ablate.data.tokencache import cache_folder, cache_intact, file_sha256, tokenizer_fingerprint
from ablate.data.tokenizer import get_tokenizer


class TokenRows:
    """Rows of `context` token ids, memory-mapped; labels are -100 past each row's length (pad packing).

    `unscored_id`: a token that is input but never a target (label -100 wherever it stands): the end-of-text
    token each document gets, when a trial does not score it (`eos_is_target: false`, the studies' recipe: the
    authors' collator masked pad = eos to -100, so their losses have no end-of-story target).
    A labelled corpus (dataset.label_field) gives, instead of token labels, each row's class at the row's last
    real token and -100 everywhere else: the classification objective reads both the class and the length
    from that one tensor."""

    def __init__(self, folder: Path, split: str, meta: dict[str, Any], unscored_id: int | None = None):
        self.unscored_id = unscored_id
        info = meta["splits"][split]
        self.rows, self.context = info["rows"], meta["context"]
        self.n_tokens: int = info["tokens"]
        self.data = np.memmap(folder / f"{split}.bin", dtype=meta["dtype"], mode="r", shape=(self.rows, self.context)) \
            if self.rows else np.zeros((0, self.context), dtype=meta["dtype"])
        self.lengths = np.memmap(folder / f"{split}.len", dtype=np.int32, mode="r", shape=(self.rows,)) \
            if meta["packing"] == "pad" and self.rows else None
        self.classes = np.memmap(folder / f"{split}.cls", dtype=np.int32, mode="r", shape=(self.rows,)) \
            if meta.get("labels") and self.rows else None
        self.n_classes: int = info.get("classes", 0)

    def __len__(self) -> int:
        return self.rows

    def batch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        idx = np.asarray(indices, dtype=np.int64)
        ids = torch.from_numpy(self.data[idx].astype(np.int64))  # (B, context)
        labels = ids.clone()
        if self.lengths is not None:
            lengths = torch.from_numpy(self.lengths[idx].astype(np.int64))  # (B,)
            labels[torch.arange(self.context)[None, :] >= lengths[:, None]] = -100
            if self.classes is not None:  # a labelled row: its class at its last token, nothing else counted
                labels.fill_(-100)
                labels[torch.arange(len(idx)), lengths - 1] = torch.from_numpy(self.classes[idx].astype(np.int64))
                return ids, labels
        if self.unscored_id is not None:
            labels[ids == self.unscored_id] = -100
        return ids, labels

    def order(self, epoch: int, seed: int) -> np.ndarray:
        """A permutation of the rows: a pure function of (epoch, seed)."""
        return np.random.default_rng([seed, epoch]).permutation(self.rows)


@dataclass(frozen=True)
class Prepared:
    """Packed rows of a corpus and the tokenizer that made them (loaded only when asked for)."""

    vocab_size: int
    pad_id: int
    eos_id: int
    train: TokenRows
    eval: TokenRows
    cache_dir: Path
    _tokenizer: Any = field(repr=False)  # () -> tokenizer; a cache hit never imports transformers/datasets
    tokenizer_file: Path | None = None  # the trained tokenizer.json, when ablate trained it
    # UTF-8 bytes of the eval text per scored token (its end-of-text tokens counted where they are targets): a loss
    # per token divided by ln 2 and by this is bits per byte, which compares across tokenizers. None: a cache built
    # before it was counted
    eval_bytes_per_token: float | None = None

    @cached_property
    def tokenizer(self) -> Any:
        return self._tokenizer()

    def save_tokenizer(self, folder: Path) -> None:
        """Keep the tokenizer beside a checkpoint (a trained one is copied as is: no transformers import)."""
        folder.mkdir(parents=True, exist_ok=True)
        if self.tokenizer_file is not None and self.tokenizer_file.exists():
            shutil.copyfile(self.tokenizer_file, folder / "tokenizer.json")
        else:
            self.tokenizer.save_pretrained(str(folder))


def prepare(dataset: DatasetRef, tokenizer: TokenizerRef, context: int, root: Path, progress: bool = True,
            eos_is_target: bool = True) -> Prepared:
    """Tokenizer and packed token rows for (corpus, tokenizer, context, packing), built once and shared.
    `eos_is_target: False`: the end-of-text token stays in the rows as input but is never a target."""
    root = Path(root)
    tok_fp = tokenizer_fingerprint(tokenizer, dataset)
    folder = cache_folder(root, dataset, tokenizer, context)
    key = folder.name
    if not cache_intact(folder):
        import datasets

        (datasets.enable_progress_bars if progress else datasets.disable_progress_bars)()
        tok = get_tokenizer(tokenizer, dataset, root, progress)
        folder.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(folder) + ".lock"):
            if not cache_intact(folder):
                if folder.exists():  # damaged (or from before checksums): rebuilt, never trained on
                    if progress:
                        print(f"token cache {folder} fails its checksum: rebuilding it", file=sys.stderr)
                    shutil.rmtree(folder)
                tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=key + ".tmp"))
                try:
                    _build(tmp, dataset, tok, context, progress, root)
                    os.replace(tmp, folder)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
    meta = json.loads((folder / "meta.json").read_text())
    unscored = None if eos_is_target else meta["eos_id"]
    text = meta["splits"]["eval"]
    scored_eos = text.get("docs", 0) if eos_is_target and meta["packing"] != "chunk" else 0  # chunked rows have none
    per_token = text["text_bytes"] / (text["text_tokens"] + scored_eos) if text.get("text_tokens") else None
    return Prepared(vocab_size=meta["vocab_size"], pad_id=meta["pad_id"], eos_id=meta["eos_id"],
                    train=TokenRows(folder, "train", meta, unscored), eval=TokenRows(folder, "eval", meta, unscored),
                    cache_dir=folder,
                    _tokenizer=lambda: get_tokenizer(tokenizer, dataset, root, progress),
                    tokenizer_file=None if tokenizer.name else root / "tokenizers" / tok_fp / "tokenizer.json",
                    eval_bytes_per_token=per_token)


def _build(folder: Path, dataset: DatasetRef, tok: Any, context: int, progress: bool, root: Path) -> None:
    train_docs, eval_docs = train_eval_documents(dataset, cache=root)
    vocab_size = len(tok)
    dtype = np.uint16 if vocab_size <= 65536 else np.uint32
    eos = tok.eos_token_id
    packing = packing_at(dataset.packing, context)
    meta: dict[str, Any] = {"context": context, "dtype": np.dtype(dtype).name, "packing": packing,
                            "vocab_size": vocab_size, "pad_id": tok.pad_token_id, "eos_id": eos, "splits": {}}
    for split, docs in (("train", train_docs), ("eval", eval_docs)):
        workers = min(os.cpu_count() or 1, 8) if len(docs) > 50_000 else None

        def encode(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
            return {"ids": [ids + [eos] for ids in tok(batch["text"], add_special_tokens=False)["input_ids"]]}

        encoded = docs.map(encode, batched=True, batch_size=1000, num_proc=workers, remove_columns=["text"],
                           desc=f"tokenizing {split}")
        meta["splits"][split] = PACKERS[packing](folder, split, encoded, context, dtype, tok.pad_token_id)
        if not meta["splits"][split]["rows"]:  # nothing to train or evaluate on: said here, before any trial starts
            raise AblateError(f"dataset.packing: {packing} at context {context} gives no {split} rows (the {split} "
                              f"documents hold fewer tokens than one row); use a smaller context, more documents, "
                              "or packing: pad")
        if split == "eval":  # the text behind the eval loss, for bits per byte (Prepared.eval_bytes_per_token)
            meta["splits"][split].update(docs=len(encoded), text_tokens=sum(len(ids) - 1 for ids in encoded["ids"]),
                                         text_bytes=sum(len(t.encode("utf-8")) for t in docs["text"]))
        if dataset.label_field is not None:
            meta["splits"][split]["classes"] = _write_labels(folder, split, encoded["label"], dataset.label_field)
    if dataset.label_field is not None:
        meta["labels"] = True
    meta["sha256"] = {f.name: file_sha256(f) for f in sorted(folder.iterdir())
                      if f.suffix in (".bin", ".len", ".cls")}
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))


def _write_labels(folder: Path, split: str, labels: list[Any], field_name: str) -> int:
    """One class label per row (`{split}.cls`); returns how many classes the split's labels need."""
    bad = next((x for x in labels if isinstance(x, bool) or not isinstance(x, int) or x < 0), None)
    if bad is not None:
        raise AblateError(f"dataset.label_field: {field_name!r} holds {bad!r}; class labels must be integers "
                          "0 .. classes-1 (map text labels to integers first)")
    np.asarray(labels, dtype=np.int32).tofile(folder / f"{split}.cls")
    return int(max(labels, default=-1)) + 1


def _pack_pad(folder: Path, split: str, encoded, context: int, dtype, pad_id: int) -> dict[str, int]:
    """One document per row: tokens + eos, truncated to context, padded with pad_id; lengths kept."""
    rows = len(encoded)
    data = np.memmap(folder / f"{split}.bin", dtype=dtype, mode="w+", shape=(max(rows, 1), context))
    lengths = np.memmap(folder / f"{split}.len", dtype=np.int32, mode="w+", shape=(max(rows, 1),))
    tokens = 0
    for start in range(0, rows, 10_000):
        chunk = encoded[start: start + 10_000]["ids"]
        block = np.full((len(chunk), context), pad_id, dtype=dtype)
        for j, ids in enumerate(chunk):
            n = min(len(ids), context)
            block[j, :n] = ids[:n]
            lengths[start + j] = n
            tokens += n
        data[start: start + len(chunk)] = block
    data.flush()
    lengths.flush()
    return {"rows": rows, "tokens": tokens}


def packing_at(packing: str, context: int) -> str:
    """The packing a cache is built with: `documents` is the studies' FineWeb rule, one document per row, truncated
    and padded, at context >= 512 (blbadger/maskedmixers mixer_lm/llama_trainer_fineweb.py@2270414:84-95), and each
    document cut into its own context-sized rows below (fineweb_packed_tokenizer.py@2270414:14-27)."""
    if packing == "documents":
        return "pad" if context >= 512 else "chunk"
    return packing


def _pack_chunk(folder: Path, split: str, encoded, context: int, dtype, pad_id: int) -> dict[str, int]:
    """Each document's tokens (without its end-of-text: the studies' rows have none) cut into full rows of
    `context`, the remainder dropped: a row never crosses a document, and a document shorter than a row gives none."""
    rows = sum((len(ids) - 1) // context for ids in encoded["ids"])
    data = np.memmap(folder / f"{split}.bin", dtype=dtype, mode="w+", shape=(max(rows, 1), context))
    row = 0
    for start in range(0, len(encoded), 10_000):
        for ids in encoded[start: start + 10_000]["ids"]:
            n = (len(ids) - 1) // context
            if n:
                data[row: row + n] = np.asarray(ids[: n * context], dtype=dtype).reshape(n, context)
                row += n
    data.flush()
    return {"rows": rows, "tokens": rows * context}


def _pack_concat(folder: Path, split: str, encoded, context: int, dtype, pad_id: int) -> dict[str, int]:
    """Documents joined with eos between and cut into full rows; the last partial row is dropped."""
    total = sum(len(ids) for ids in encoded["ids"])
    rows = total // context
    data = np.memmap(folder / f"{split}.bin", dtype=dtype, mode="w+", shape=(max(rows, 1), context))
    flat = data.reshape(-1)
    pos = 0
    limit = rows * context
    for start in range(0, len(encoded), 10_000):
        for ids in encoded[start: start + 10_000]["ids"]:
            take = min(len(ids), limit - pos)
            if take <= 0:
                break
            flat[pos: pos + take] = ids[:take]
            pos += take
    data.flush()
    return {"rows": rows, "tokens": rows * context}


PACKERS = {"pad": _pack_pad, "concat": _pack_concat, "chunk": _pack_chunk}
