"""Corpora, tokenizers and the on-disk token cache.

A corpus comes through HF `datasets` (a hub id, local text / jsonl / parquet / arrow files, or a
`save_to_disk` folder); a Llama-style BPE tokenizer is trained on it (or loaded); documents are
tokenized and packed to the trial's context into memory-mapped uint16/uint32 files, keyed by
corpus x tokenizer x context x packing and shared by every trial and process (file lock, atomic rename).
"""

from __future__ import annotations

import contextlib
import glob as globlib
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

from ablate.config.errors import AblateError, did_you_mean
from ablate.config.sources import is_local_source, special_files
from ablate.config import DatasetRef, TokenizerRef
from ablate.tokencache import cache_folder, cache_intact, file_sha256, tokenizer_fingerprint  # noqa: F401 - data's API


@dataclass(frozen=True)
class Embedded:
    """A corpus shipped inside the package (see ablate/corpora/README.md and NOTICE)."""

    file: str
    sha256: str | None = None  # of the unpacked text: checked whenever a compressed corpus is unpacked or reused
    cut_ends: bool = False  # the file is a byte-cut of a bigger one: its first and last documents are partial


EMBEDDED = {
    "tinystories-sample": Embedded("tinystories-valid-head.txt"),
    "tinystories": Embedded("tinystories-v2-valid-5M.txt.xz", cut_ends=True,
                            sha256="7cc2577b9e1f9ed703b13ca651103bf421c91912fcbcb2d024213858e0981d87"),
}
SEPARATOR = "<|endoftext|>"
SPECIALS = ("<unk>", "<s>", "</s>")  # unk, bos, eos; pad = eos, as in the studies
SUFFIX_FORMAT = {".txt": "text", ".text": "text", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet",
                 ".arrow": "arrow"}


# ---------------------------------------------------------------- corpora


def _embedded(source: str) -> Embedded:
    name = source.removeprefix("ablate:")
    if name not in EMBEDDED:
        raise AblateError(f"dataset.source: no embedded corpus {source!r}{did_you_mean(name, EMBEDDED)}; "
                          f"embedded: {', '.join('ablate:' + k for k in EMBEDDED)}")
    return EMBEDDED[name]


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def embedded_text(source: str, cache: Path | None = None) -> str:
    """The text of an embedded corpus. A compressed one is unpacked once into `cache`/corpora (the
    artifacts folder) and checked by sha256 there; without a cache it is unpacked in memory."""
    corpus = _embedded(source)
    packed = Path(__file__).parent / "corpora" / corpus.file
    if packed.suffix != ".xz":
        return packed.read_text(encoding="utf-8")
    target = cache / "corpora" / f"{packed.stem}.{corpus.sha256[:12]}" if cache is not None and corpus.sha256 else None
    if target is not None and target.exists():
        data = target.read_bytes()
        if _sha256(data) == corpus.sha256:
            return data.decode("utf-8")
    import lzma

    data = lzma.decompress(packed.read_bytes())
    if corpus.sha256 and _sha256(data) != corpus.sha256:
        raise AblateError(f"dataset.source: the embedded corpus {packed} is damaged (sha256 differs from "
                          f"{corpus.sha256[:12]}…); reinstall ablate")
    if target is not None:
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            os.replace(tmp, target)  # a reader never sees a partial file; a damaged one is unpacked again
        except OSError:  # a full or read-only disk: the cache only saves time, so go on from memory
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
    return data.decode("utf-8")


_is_local = is_local_source


def _local_files(source: str) -> list[Path]:
    files = _find_local_files(source)
    special = special_files(files)
    if special:
        raise AblateError(f"dataset.source: {special[0]} is not a regular file (a device, pipe or socket can be read "
                          "without end); point dataset.source at a file or folder of .txt, .jsonl, .parquet or "
                          ".arrow files")
    return files


def _find_local_files(source: str) -> list[Path]:
    path = Path(source).expanduser()
    if any(c in source for c in "*?["):
        files = sorted(Path(p) for p in globlib.glob(str(path)))
        if not files:
            raise AblateError(f"dataset.source: the pattern {source!r} matches no file")
        return files
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.suffix in SUFFIX_FORMAT)
    if path.exists():
        return [path]
    parent = path.parent if path.parent.exists() else None
    hint = did_you_mean(path.name, [p.name for p in parent.iterdir()]) if parent else ""
    where = f"; {parent} has: {', '.join(sorted(p.name for p in parent.iterdir())[:8])}" if parent else \
        f"; the folder {path.parent} does not exist either"
    raise AblateError(f"dataset.source: no such file {path}{hint}{where}. Point dataset.source at a local "
                      "file or folder (relative paths are relative to the sweep file), or at a hub id.")


def _text_documents(text: str, fmt: str) -> list[str]:
    if fmt == "auto":
        fmt = "text" if f"\n{SEPARATOR}\n" in f"\n{text}" else "lines"
    if fmt == "lines":
        return [line.strip() for line in text.splitlines() if line.strip()]
    docs, current = [], []
    for line in text.splitlines():
        if line.strip() == SEPARATOR:
            docs.append("\n".join(current).strip())
            current = []
        else:
            current.append(line)
    docs.append("\n".join(current).strip())
    return [d for d in docs if d]


def _hub_error(ref: DatasetRef, exc: Exception) -> AblateError:
    from huggingface_hub import is_offline_mode

    why = ("HF_HUB_OFFLINE is set and this machine has no cached copy" if is_offline_mode() else
           f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
    return AblateError(
        f"dataset.source: cannot load {ref.source!r} from the HuggingFace hub ({why}). With no network access to the "
        "hub, download it elsewhere (datasets' save_to_disk, or the raw files) and point dataset.source at that local "
        "path; or run online."
    )


def check_source(ref: DatasetRef) -> None:
    """A cheap check that a hub dataset can be loaded here (its metadata, from the hub or the local cache; offline
    without a cached copy fails at once), without downloading it. Local and embedded sources are checked when
    the spec is read."""
    if not ref.from_hub:
        return
    import datasets

    try:
        datasets.load_dataset_builder(ref.source, ref.config)
    except Exception as exc:  # noqa: BLE001 - offline, unknown id, auth: all need the user's action
        raise _hub_error(ref, exc) from None


def _read_text(path: Path) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def load_documents(ref: DatasetRef, split: str | None = None, cache: Path | None = None):
    """The corpus split as a `datasets.Dataset` with one column, `text` (`cache`: where embedded corpora unpack)."""
    import datasets

    split = split or ref.split
    fmt = ref.format
    if fmt == "hub" or (fmt == "auto" and not _is_local(ref.source)):
        try:
            ds = datasets.load_dataset(ref.source, ref.config, split=split)
        except Exception as exc:  # noqa: BLE001 - offline, unknown id, auth: all need the user's action
            raise _hub_error(ref, exc) from None
        return _text_column(ds, ref)
    path = Path(ref.source).expanduser() if not ref.source.startswith("ablate:") else None
    if fmt == "disk" or (path is not None and path.is_dir() and
                         ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists())):
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise AblateError(f"dataset.split: {path} has splits {list(loaded)}, not {split!r}"
                                  f"{did_you_mean(split, list(loaded))}")
            loaded = loaded[split]
        return _text_column(loaded, ref)
    if split != ref.split:
        raise AblateError(f"dataset.eval.split: local files have no split {split!r}; "
                          "use dataset.eval.holdout (a number of documents) instead")
    if ref.source.startswith("ablate:"):
        if ref.label_field is not None:
            raise AblateError(f"dataset.label_field: the embedded corpus {ref.source} has no labels")
        docs = _text_documents(embedded_text(ref.source, cache), "text")
        return datasets.Dataset.from_dict({"text": docs[1:-1] if _embedded(ref.source).cut_ends else docs})
    files = _local_files(ref.source)
    if not files:
        raise AblateError(f"dataset.source: {ref.source} contains no .txt, .jsonl, .parquet or .arrow files")
    kinds = {fmt if fmt != "auto" else SUFFIX_FORMAT.get(f.suffix, "text") for f in files}
    if kinds <= {"text", "lines"}:
        if ref.label_field is not None:
            raise AblateError(f"dataset.label_field: {ref.source} is plain text, which has no label column; give "
                              "jsonl, parquet or arrow files with a text and a label column")
        docs = [d for f in files for d in _text_documents(_read_text(f), fmt if fmt in ("text", "lines") else "auto")]
        ds = datasets.Dataset.from_dict({"text": docs})
    else:
        if len(kinds) > 1:
            raise AblateError(f"dataset.source: mixed file types {sorted(kinds)}; keep one format per dataset")
        builder = {"jsonl": "json", "parquet": "parquet", "arrow": "arrow"}[kinds.pop()]
        ds = datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train")
        ds = _text_column(ds, ref)
    if len(ds) == 0:
        raise AblateError(f"dataset.source: {ref.source} holds no documents")
    return ds


def _text_column(ds, ref: DatasetRef):
    """The `text` column (and, for labelled corpora, the `label` column) of a loaded dataset."""
    if ref.text_field not in ds.column_names:
        raise AblateError(f"dataset.text_field: no column {ref.text_field!r} in {ref.source} "
                          f"(columns: {', '.join(ds.column_names)}){did_you_mean(ref.text_field, ds.column_names)}")
    if ref.label_field is not None and ref.label_field not in ds.column_names:
        raise AblateError(f"dataset.label_field: no column {ref.label_field!r} in {ref.source} "
                          f"(columns: {', '.join(ds.column_names)}){did_you_mean(ref.label_field, ds.column_names)}")
    keep = [ref.text_field] + ([ref.label_field] if ref.label_field is not None else [])
    ds = ds.select_columns(keep)
    if ref.label_field is not None and ref.label_field != "label":
        ds = ds.rename_column(ref.label_field, "label")
    return ds.rename_column(ref.text_field, "text") if ref.text_field != "text" else ds


def train_eval_documents(ref: DatasetRef, cache: Path | None = None):
    """(train, eval) documents: `limit` first, then the eval split or a held-out tail (whole documents, in order)."""
    train = load_documents(ref, cache=cache)
    if ref.limit is not None:
        train = train.select(range(min(ref.limit, len(train))))
    if ref.eval.split is not None:
        evaluation = load_documents(ref, split=ref.eval.split, cache=cache)
    else:
        n = ref.eval.holdout or 0
        if n >= len(train):
            raise AblateError(f"dataset.eval.holdout: {n} documents held out of only {len(train)}; hold out fewer")
        evaluation = train.select(range(len(train) - n, len(train)))
        train = train.select(range(len(train) - n))
    if ref.eval.limit is not None:
        evaluation = evaluation.select(range(min(ref.eval.limit, len(evaluation))))
    return train, evaluation


# ---------------------------------------------------------------- tokenizer


def _wrap(path: Path):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(path), unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="</s>")


def get_tokenizer(ref: TokenizerRef, dataset: DatasetRef, root: Path, progress: bool = True):
    """Load `tokenizer.name`, or train (once, cached by fingerprint) a byte-level BPE of `vocab_size` on the corpus.

    Byte-level BPE keeps newlines and every byte (the studies' retrained Llama tokenizer mapped
    newlines to <unk>); special tokens <unk>, <s>, </s>, with pad = eos.
    """
    if ref.name is not None:
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(ref.name)
        except Exception as exc:  # noqa: BLE001
            raise AblateError(f"tokenizer.name: cannot load {ref.name!r} ({str(exc).splitlines()[0][:200]}). "
                              "Give a local folder with tokenizer files, train one with tokenizer.vocab_size, "
                              "or run online.") from None
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        return tok
    folder = root / "tokenizers" / tokenizer_fingerprint(ref, dataset)
    target = folder / "tokenizer.json"
    if target.exists():
        return _wrap(target)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if not target.exists():
            train_docs, _ = train_eval_documents(ref.trained_on or dataset, cache=root)
            tok = _train_bpe(train_docs, ref, progress)
            tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=folder.name + ".tmp"))
            tok.save(str(tmp / "tokenizer.json"))
            os.replace(tmp, folder) if not folder.exists() else shutil.rmtree(tmp)
    return _wrap(target)


def _train_bpe(docs, ref: TokenizerRef, progress: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    vocab_size = ref.vocab_size or 4096
    n = min(len(docs), ref.train_documents or len(docs))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=progress,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())

    def batches():
        for start in range(0, n, 1000):
            yield docs[start: min(start + 1000, n)]["text"]

    tok.train_from_iterator(batches(), trainer=trainer, length=n)
    reached = tok.get_vocab_size()
    if reached < vocab_size:
        raise AblateError(f"tokenizer.vocab_size: the corpus supports only {reached} tokens "
                          f"({n} documents), fewer than the {vocab_size} asked; lower tokenizer.vocab_size "
                          f"to at most {reached} or use more data (dataset.limit)")
    return tok


# ---------------------------------------------------------------- token cache


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
    return Prepared(vocab_size=meta["vocab_size"], pad_id=meta["pad_id"], eos_id=meta["eos_id"],
                    train=TokenRows(folder, "train", meta, unscored), eval=TokenRows(folder, "eval", meta, unscored),
                    cache_dir=folder,
                    _tokenizer=lambda: get_tokenizer(tokenizer, dataset, root, progress),
                    tokenizer_file=None if tokenizer.name else root / "tokenizers" / tok_fp / "tokenizer.json")


def _build(folder: Path, dataset: DatasetRef, tok: Any, context: int, progress: bool, root: Path) -> None:
    train_docs, eval_docs = train_eval_documents(dataset, cache=root)
    vocab_size = len(tok)
    dtype = np.uint16 if vocab_size <= 65536 else np.uint32
    eos = tok.eos_token_id
    meta: dict[str, Any] = {"context": context, "dtype": np.dtype(dtype).name, "packing": dataset.packing,
                            "vocab_size": vocab_size, "pad_id": tok.pad_token_id, "eos_id": eos, "splits": {}}
    for split, docs in (("train", train_docs), ("eval", eval_docs)):
        workers = min(os.cpu_count() or 1, 8) if len(docs) > 50_000 else None

        def encode(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
            return {"ids": [ids + [eos] for ids in tok(batch["text"], add_special_tokens=False)["input_ids"]]}

        encoded = docs.map(encode, batched=True, batch_size=1000, num_proc=workers, remove_columns=["text"],
                           desc=f"tokenizing {split}")
        meta["splits"][split] = (_pack_pad if dataset.packing == "pad" else _pack_concat)(
            folder, split, encoded, context, dtype, tok.pad_token_id)
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
