"""The studies' FineWeb rows (masked-mixers-2.md; blbadger/maskedmixers at 2270414): one document per row at
context >= 512, each document cut into its own rows below (`packing: chunk`, `documents` for the rule), and the
first 50k documents held out (`take` / `skip`), not the last."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ablate.config import DatasetRef, TokenizerRef
from ablate.data import prepare, train_eval_documents

SAMPLE = "ablate:tinystories-sample"
TOKENIZER = TokenizerRef(vocab_size=400)


def test_a_chunked_row_never_crosses_a_document_and_the_remainder_is_dropped(tmp_path):
    dataset = DatasetRef(source=SAMPLE, packing="chunk", eval={"holdout": 20})
    p = prepare(dataset, TOKENIZER, 16, tmp_path, progress=False)
    train, _ = train_eval_documents(dataset, cache=tmp_path)
    docs = p.tokenizer(list(train["text"]), add_special_tokens=False)["input_ids"]
    expected = [d[i * 16:(i + 1) * 16] for d in docs for i in range(len(d) // 16)]  # each document's own rows
    ids, labels = p.train.batch(np.arange(len(p.train)))
    assert ids.tolist() == expected  # in order, whole rows only: no row holds two documents' tokens
    assert (labels != -100).all() and not (ids == p.eos_id).any()  # full rows, no end-of-text, as theirs
    assert sum(len(d) % 16 for d in docs) > 0  # remainders existed, and were dropped
    meta = json.loads((p.cache_dir / "meta.json").read_text())
    assert meta["packing"] == "chunk" and meta["splits"]["train"]["rows"] == len(expected)


@pytest.mark.parametrize(("context", "packing"), [(512, "pad"), (128, "chunk")])
def test_documents_is_the_studies_rule_pad_from_512_and_chunks_below(tmp_path, context, packing):
    p = prepare(DatasetRef(source=SAMPLE, packing="documents", eval={"holdout": 20}), TOKENIZER, context, tmp_path,
                progress=False)
    assert json.loads((p.cache_dir / "meta.json").read_text())["packing"] == packing


def test_holdout_from_start_holds_out_the_first_documents(tmp_path):
    end = train_eval_documents(DatasetRef(source=SAMPLE, eval={"holdout": 30}), cache=tmp_path)
    start = train_eval_documents(DatasetRef(source=SAMPLE, eval={"holdout": 30, "holdout_from": "start"}),
                                 cache=tmp_path)
    every = list(end[0]["text"]) + list(end[1]["text"])
    assert list(start[1]["text"]) == every[:30] and list(start[0]["text"]) == every[30:]  # take(30) / skip(30)
    assert list(end[1]["text"]) == every[-30:]
    assert "holdout_from" not in DatasetRef(source=SAMPLE).model_dump()["eval"]  # unset: every identity as before


def test_a_packing_that_gives_no_rows_says_so_and_leaves_no_cache(tmp_path):
    from ablate.config.errors import AblateError

    dataset = DatasetRef(source=SAMPLE, packing="chunk", eval={"holdout": 20})
    with pytest.raises(AblateError, match="dataset.packing: chunk at context 4096 gives no train rows.*smaller context"):
        prepare(dataset, TOKENIZER, 4096, tmp_path, progress=False)
    assert not any(p.is_dir() for p in (tmp_path / "tokens").iterdir())  # no cache, no half-built folder


def test_chunked_rows_count_no_end_of_text_in_their_bytes_per_token(tmp_path):
    dataset = DatasetRef(source=SAMPLE, packing="chunk", eval={"holdout": 20})
    scored = prepare(dataset, TOKENIZER, 16, tmp_path, progress=False)
    unscored = prepare(dataset, TOKENIZER, 16, tmp_path, progress=False, eos_is_target=False)
    assert scored.eval_bytes_per_token == unscored.eval_bytes_per_token  # no end-of-text in a chunked row to score
