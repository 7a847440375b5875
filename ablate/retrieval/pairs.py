"""The (summary, text) pairs retrieval works on: from a local file or folder, the HuggingFace hub, or stories."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ablate import data as data_mod
from ablate.config.errors import AblateError, did_you_mean

PAIR_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def load_pairs(source: str | Path, summary_column: str = "summary", text_column: str = "text", split: str = "train"):
    """A (summary, text) pairs dataset from a local file or `datasets` folder, or a hub id; columns renamed."""
    import datasets

    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix not in PAIR_FORMATS:
            raise AblateError(f"pairs: {path} is not one of {', '.join(PAIR_FORMATS)}")
        ds = datasets.load_dataset(PAIR_FORMATS[path.suffix], data_files=[str(path)], split="train")
    elif path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            ds = datasets.load_from_disk(str(path))
        else:
            ds = datasets.load_dataset(str(path), split=split)
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise AblateError(f"pairs: {path} has splits {list(ds)}, not {split!r}{did_you_mean(split, list(ds))}")
            ds = ds[split]
    elif str(source).startswith(("/", ".", "~")):
        raise AblateError(f"pairs: no such file or folder {path}")
    else:
        from huggingface_hub import is_offline_mode

        try:
            ds = datasets.load_dataset(str(source), split=split)
        except Exception as exc:  # noqa: BLE001 - offline, unknown id, auth: all need the user's action
            why = "HF_HUB_OFFLINE is set" if is_offline_mode() else f"{type(exc).__name__}: {str(exc)[:200]}"
            raise AblateError(f"pairs: cannot load {source!r} from the HuggingFace hub ({why}); pass a local "
                              "path (.jsonl, .json, .csv, .parquet or a save_to_disk folder) or run online") from None
    for column in (summary_column, text_column):
        if column not in ds.column_names:
            raise AblateError(f"pairs: no column {column!r} in {source} (columns: {', '.join(ds.column_names)})"
                              f"{did_you_mean(column, ds.column_names)}")
    ds = ds.select_columns([summary_column, text_column])
    return ds.rename_columns({c: n for c, n in ((summary_column, "summary"), (text_column, "text")) if c != n})


def pairs_from_stories(path_or_text: str | Path = "ablate:tinystories-sample"):
    """Pairs from TinyStories-format text: summary = a story's first sentence, text = the rest of the story.

    The studies' summaries were written by an LLM, which cannot run here; the first sentence is a
    stand-in that shares names and setting with the text without being a substring of it.
    """
    import datasets

    source = str(path_or_text)
    if source.startswith("ablate:"):
        text = data_mod.embedded_text(source)
    elif isinstance(path_or_text, Path) or ("\n" not in source and Path(source).expanduser().is_file()):
        text = Path(source).expanduser().read_text(encoding="utf-8")
    else:
        text = source
    stories = [s.strip() for s in re.split(rf"^\s*{re.escape(data_mod.SEPARATOR)}\s*$", text, flags=re.MULTILINE)]
    summaries, texts = [], []
    for story in stories:
        parts = re.split(r"(?<=[.!?])[\"”']?\s+", story, maxsplit=1)
        if len(parts) < 2:
            continue
        rest = parts[1].strip()
        summary = story[: len(story) - len(parts[1])].strip()
        if rest and summary not in rest:
            summaries.append(summary)
            texts.append(rest)
    return datasets.Dataset.from_dict({"summary": summaries, "text": texts})


def pair_columns(pairs: Any) -> tuple[list[str], list[str]]:
    return list(pairs["summary"]), list(pairs["text"])
