"""The Masked Mixers II corpora: the sweeps' hub refs, exercised on local files with the hub's schemas.

fineweb-edu (sample-10BT) and FineMath-4+ cannot be downloaded here, so local parquet files with the
same columns (built from the TinyStories sample) stand in for them; the sweeps' refs are used as they
are except for `source`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import REPO, SAMPLE

from ablate.data import load_documents, prepare, train_eval_documents
from ablate.config.errors import AblateError
from ablate.config import TokenizerRef, load_spec

STORIES = [s.strip() for s in SAMPLE.read_text().split("<|endoftext|>")
           if s.strip()]

# the columns of the hub datasets (text is the one the sweeps read)
FINEWEB_COLUMNS = {"text": pa.string(), "id": pa.string(), "dump": pa.string(), "url": pa.string(),
                   "file_path": pa.string(), "language": pa.string(), "language_score": pa.float64(),
                   "token_count": pa.int64(), "score": pa.float64(), "int_score": pa.int64()}
FINEMATH_COLUMNS = {"url": pa.string(), "fetch_time": pa.int64(), "content_mime_type": pa.string(),
                    "warc_filename": pa.string(), "warc_record_offset": pa.int32(), "warc_record_length": pa.int32(),
                    "text": pa.string(), "token_count": pa.int32(), "char_count": pa.int32(),
                    "metadata": pa.string(), "score": pa.float64(), "int_score": pa.int64(), "crawl": pa.string(),
                    "snapshot_type": pa.string(), "language": pa.string(), "language_score": pa.float64()}


def write_like(folder: Path, columns: dict[str, pa.DataType]) -> Path:
    """A two-shard parquet folder with the hub dataset's columns, one TinyStories story per row."""
    folder.mkdir()
    for shard, stories in enumerate((STORIES[:120], STORIES[120:])):
        data = {}
        for name, kind in columns.items():
            if name == "text":
                data[name] = stories
            elif pa.types.is_string(kind):
                data[name] = [f"{name}-{shard}-{i}" for i in range(len(stories))]
            elif pa.types.is_floating(kind):
                data[name] = [3.5] * len(stories)
            else:
                data[name] = [len(s) for s in stories]
        pq.write_table(pa.table(data, schema=pa.schema(columns)), folder / f"train-0000{shard}.parquet")
    return folder


@pytest.mark.parametrize("sweep,columns", [("fineweb-context", FINEWEB_COLUMNS), ("finemath-context", FINEMATH_COLUMNS)])
def test_the_sweeps_corpus_refs_pack_local_files_of_the_hub_schema(tmp_path, sweep, columns):
    spec = load_spec(REPO / "sweeps" / f"{sweep}.yaml")
    assert spec.dataset.packing == "documents" and spec.dataset.text_field == "text" and spec.dataset.config
    assert spec.dataset.eval.holdout_from == "start"
    local = spec.dataset.model_copy(update={"source": str(write_like(tmp_path / "corpus", columns)),
                                            "eval": spec.dataset.eval.model_copy(update={"holdout": 20})})
    docs = load_documents(local)
    assert len(docs) == len(STORIES) and docs[0]["text"] == STORIES[0]
    train, held = train_eval_documents(local)
    assert len(held) == 20 and len(train) == len(STORIES) - 20 and held[0]["text"] == STORIES[0]  # the first held
    p = prepare(local, TokenizerRef(vocab_size=400), 32, tmp_path / "art", progress=False)
    ids, labels = p.train.batch(np.arange(len(p.train)))
    assert ids.shape[1] == 32 and (labels != -100).all()  # below 512: each document cut into full rows, no padding
    assert not (ids == p.eos_id).any()  # rows never cross documents: no separator inside a row
    p = prepare(local, TokenizerRef(vocab_size=400), 512, tmp_path / "art", progress=False)
    _, labels = p.train.batch(np.arange(len(p.train)))
    assert len(p.train) == len(train) and (labels == -100).any()  # at 512: one document a row, padded


@pytest.mark.parametrize("sweep", ["fineweb-context", "finemath-context"])
def test_the_sweeps_hub_ids_offline_say_what_to_do(sweep):
    spec = load_spec(REPO / "sweeps" / f"{sweep}.yaml")
    with pytest.raises(AblateError) as info:
        load_documents(spec.dataset)
    assert spec.dataset.source in str(info.value) and "local path" in str(info.value)
