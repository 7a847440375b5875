"""Corpora as documents: the embedded ones (shipped in ablate/corpora), local text / jsonl / parquet / arrow files
or a `save_to_disk` folder, and HF hub datasets, each as a `datasets.Dataset` with a `text` column (and `label`
for a labelled corpus), split into train and eval documents. Torch-free."""

from __future__ import annotations

import contextlib
import glob as globlib
import os
from dataclasses import dataclass
from pathlib import Path

from ablate.config.errors import AblateError, did_you_mean
from ablate.config.sources import is_local_source, special_files
from ablate.config import DatasetRef


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
SUFFIX_FORMAT = {".txt": "text", ".text": "text", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet",
                 ".arrow": "arrow"}


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
    packed = Path(__file__).parent.parent / "corpora" / corpus.file
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


MIN_TRAIN_SHARE = 0.5  # a held-out tail may take at most half of a corpus's documents


def train_eval_documents(ref: DatasetRef, cache: Path | None = None):
    """(train, eval) documents: `limit` first, then the eval split or N held-out documents, the last (or, with
    `holdout_from: start`, the first) ones, whole and in order."""
    train = load_documents(ref, cache=cache)
    if ref.limit is not None:
        train = train.select(range(min(ref.limit, len(train))))
    if ref.eval.split is not None:
        evaluation = load_documents(ref, split=ref.eval.split, cache=cache)
    else:
        n = ref.eval.holdout or 0
        if n >= len(train):
            raise AblateError(f"dataset.eval.holdout: {n} documents held out of only {len(train)}; hold out fewer")
        if len(train) - n < MIN_TRAIN_SHARE * len(train):  # e.g. a study's holdout kept for a small --source file
            raise AblateError(f"dataset.eval.holdout: {n} of {len(train)} documents held out leaves {len(train) - n} "
                              f"({(len(train) - n) / len(train):.0%}) to train on, under {MIN_TRAIN_SHARE:.0%}: hold "
                              f"out fewer (at most {int(len(train) * (1 - MIN_TRAIN_SHARE))}: --holdout N, --param "
                              "holdout=N, or dataset.eval.holdout in the spec)")
        if ref.eval.holdout_from == "start":
            evaluation, train = train.select(range(n)), train.select(range(n, len(train)))
        else:
            evaluation, train = train.select(range(len(train) - n, len(train))), train.select(range(len(train) - n))
    if ref.eval.limit is not None:
        evaluation = evaluation.select(range(min(ref.eval.limit, len(evaluation))))
    return train, evaluation
