"""Corpora, tokenizers and the token cache on the local corpora (the hub cannot be reached here)."""

from __future__ import annotations

import json
import multiprocessing as mp
import shutil
from pathlib import Path

import numpy as np
import pytest

from ablate.data import get_tokenizer, load_documents, prepare, train_eval_documents
from ablate.config.errors import AblateError
from ablate.config import DatasetRef, TokenizerRef

from conftest import TEST_DATA

PTB = TEST_DATA / "ptb" / "valid.txt"


def ref(source, **kw) -> DatasetRef:
    return DatasetRef(source=str(source), **kw)


def test_text_with_separators_gives_one_document_per_story(tinystories):
    docs = load_documents(ref(tinystories))
    assert len(docs) == 221
    assert docs[0]["text"].startswith("Once upon a time, in a big forest, there lived a rhinoceros named Roxy.")
    assert "\n" in docs[0]["text"]  # a story keeps its own line breaks
    assert all("<|endoftext|>" not in d for d in docs["text"])


def test_embedded_sample_is_the_same_corpus(tinystories):
    assert load_documents(ref("ablate:tinystories-sample"))["text"] == load_documents(ref(tinystories))["text"]


def test_lines_format_gives_one_document_per_line(tmp_path):
    path = tmp_path / "ptb.txt"
    shutil.copy(PTB, path)
    docs = load_documents(ref(path))
    lines = [line.strip() for line in PTB.read_text().splitlines() if line.strip()]
    assert docs["text"] == lines


def test_jsonl_parquet_and_save_to_disk_load_the_text_field(tmp_path, tinystories):
    import datasets

    texts = load_documents(ref(tinystories))["text"][:30]
    rows = [{"story": t, "n": i} for i, t in enumerate(texts)]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert load_documents(ref(tmp_path / "d.jsonl", text_field="story"))["text"] == texts
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "d.parquet"))
    assert load_documents(ref(tmp_path / "d.parquet", text_field="story"))["text"] == texts
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:20]), "validation": datasets.Dataset.from_list(rows[20:])}
                         ).save_to_disk(str(tmp_path / "saved"))
    r = ref(tmp_path / "saved", text_field="story", eval={"split": "validation"})
    train, evaluation = train_eval_documents(r)
    assert train["text"] == texts[:20] and evaluation["text"] == texts[20:]


def test_limit_and_holdout(tinystories):
    train, evaluation = train_eval_documents(ref(tinystories, limit=100, eval={"holdout": 10}))
    all_docs = load_documents(ref(tinystories))["text"]
    assert train["text"] == all_docs[:90] and evaluation["text"] == all_docs[90:100]


def test_a_holdout_that_leaves_under_half_the_documents_to_train_on_is_refused_with_the_numbers(tinystories):
    """A study's holdout kept for a small `--source` file (200 of 221 held out) would train on 21 documents."""
    with pytest.raises(AblateError, match=r"dataset.eval.holdout: 51 of 100 documents held out leaves 49 \(49%\) to "
                                          r"train on, under 50%: hold out fewer \(at most 50"):
        train_eval_documents(ref(tinystories, limit=100, eval={"holdout": 51}))
    train, evaluation = train_eval_documents(ref(tinystories, limit=100, eval={"holdout": 50}))
    assert len(train) == len(evaluation) == 50


def test_missing_path_names_the_field_the_path_and_a_near_match(tmp_path, tinystories):
    with pytest.raises(AblateError) as info:
        load_documents(ref(tmp_path / "tinystorie.txt"))
    msg = str(info.value)
    assert "dataset.source" in msg and "tinystorie.txt" in msg and "did you mean 'tinystories.txt'" in msg


def test_missing_text_field_is_named(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"body": "a"}\n')
    with pytest.raises(AblateError, match="dataset.text_field: no column 'text'.*body"):
        load_documents(ref(tmp_path / "d.jsonl"))


def test_hub_id_offline_says_what_to_do():
    with pytest.raises(AblateError) as info:
        load_documents(ref("roneneldan/TinyStories"))
    msg = str(info.value)
    assert "roneneldan/TinyStories" in msg and "local path" in msg and "online" in msg


def test_bpe_is_trained_to_the_vocab_size_once_and_cached(tmp_path, tinystories):
    d, t = ref(tinystories), TokenizerRef(vocab_size=500)
    tok = get_tokenizer(t, d, tmp_path)
    assert len(tok) == 500 and tok.eos_token == "</s>" and tok.pad_token == tok.eos_token
    files = list((tmp_path / "tokenizers").glob("*/tokenizer.json"))
    assert len(files) == 1
    mtime = files[0].stat().st_mtime_ns
    again = get_tokenizer(t, d, tmp_path)
    assert files[0].stat().st_mtime_ns == mtime and again.get_vocab() == tok.get_vocab()
    text = "Once upon a time,\nthere was a dog."
    assert tok.decode(tok(text)["input_ids"]) == text  # byte-level: newlines survive


def test_vocab_larger_than_the_corpus_supports_is_refused(tmp_path):
    (tmp_path / "tiny.txt").write_text("a b c\nabc abc\nbca\n")
    with pytest.raises(AblateError, match="tokenizer.vocab_size: the corpus supports only"):
        get_tokenizer(TokenizerRef(vocab_size=5000), ref(tmp_path / "tiny.txt", eval={"holdout": 1}), tmp_path)


def test_pad_packing_rows_lengths_and_labels(tmp_path, tinystories):
    p = prepare(ref(tinystories, eval={"holdout": 20}), TokenizerRef(vocab_size=400), 64, tmp_path, progress=False)
    assert len(p.train) == 201 and len(p.eval) == 20 and p.train.data.dtype == np.uint16
    ids, labels = p.train.batch(np.arange(len(p.train)))
    lengths = np.asarray(p.train.lengths)
    assert ids.shape == (201, 64)
    for i in range(len(p.train)):
        n = int(lengths[i])
        assert (labels[i, n:] == -100).all() and (labels[i, :n] == ids[i, :n]).all()
        if n < 64:  # a document that fits ends with eos
            assert ids[i, n - 1] == p.eos_id and (ids[i, n:] == p.pad_id).all()
    assert p.train.n_tokens == int(lengths.sum())


def test_concat_packing_fills_rows_with_eos_between_documents(tmp_path, tinystories):
    p = prepare(ref(tinystories, packing="concat"), TokenizerRef(vocab_size=400), 32, tmp_path, progress=False)
    ids, labels = p.train.batch(np.arange(len(p.train)))
    assert (labels != -100).all()
    eos_count = int((ids == p.eos_id).sum())
    assert 150 < eos_count <= 171  # ~one eos per training document, last partial row dropped
    assert p.train.n_tokens == len(p.train) * 32


def test_order_is_a_pure_function_of_epoch_and_seed(tmp_path, tinystories):
    p = prepare(ref(tinystories), TokenizerRef(vocab_size=400), 32, tmp_path, progress=False)
    a, b = p.train.order(0, 7), p.train.order(0, 7)
    assert (a == b).all() and sorted(a) == list(range(len(p.train)))
    assert not (p.train.order(1, 7) == a).all() and not (p.train.order(0, 8) == a).all()


def _prepare_in_process(args) -> list:
    source, root = args
    p = prepare(DatasetRef(source=source), TokenizerRef(vocab_size=400), 48, Path(root), progress=False)
    ids, _ = p.train.batch(np.arange(len(p.train)))
    return [str(p.cache_dir), int(ids.sum()), len(p.train)]


def test_concurrent_processes_share_one_cache(tmp_path, tinystories):
    with mp.get_context("spawn").Pool(3) as pool:
        results = pool.map(_prepare_in_process, [(str(tinystories), str(tmp_path))] * 3)
    assert results[0] == results[1] == results[2]
    assert len(list((tmp_path / "tokens").iterdir())) == 2  # the cache folder and its lock file, no leftovers


def test_embedded_tinystories_is_whole_stories_unpacked_once_and_checked(tmp_path):
    from ablate.data import EMBEDDED, embedded_text

    docs = list(load_documents(ref("ablate:tinystories"), cache=tmp_path)["text"])
    raw = [d.strip() for d in embedded_text("ablate:tinystories").split("<|endoftext|>")]
    assert docs == [d for d in raw[1:-1] if d]  # the byte-cut first and last stories are dropped
    assert len(docs) > 6000 and docs[0].startswith("Once upon a time, in a warm and sunny place")
    assert not raw[-1].endswith((".", "!", "?", '"')) and docs[-1].endswith((".", "!", "?", '"'))
    unpacked = next((tmp_path / "corpora").iterdir())
    assert unpacked.stat().st_size == 5 * 2**20
    unpacked.write_bytes(b"damaged")  # a damaged cache is noticed by its sha256 and unpacked again
    assert list(load_documents(ref("ablate:tinystories"), cache=tmp_path)["text"]) == docs
    assert unpacked.stat().st_size == 5 * 2**20 and EMBEDDED["tinystories"].sha256


def test_embedded_tinystories_splits_train_and_eval_by_story_deterministically(tmp_path):
    r = ref("ablate:tinystories", eval={"holdout": 200})
    train, held = train_eval_documents(r, cache=tmp_path)
    again_train, again_held = train_eval_documents(r, cache=tmp_path)
    assert train["text"] == again_train["text"] and held["text"] == again_held["text"]
    assert len(held) == 200 and not set(held["text"]) & set(train["text"])
    everything = load_documents(ref("ablate:tinystories"), cache=tmp_path)["text"]
    assert list(train["text"]) + list(held["text"]) == list(everything)  # whole stories, in order: the last 200 are held out


def test_embedded_corpus_reads_from_memory_when_its_cache_cannot_be_written(tmp_path):
    blocked = tmp_path / "art"
    blocked.write_text("a file where the artifacts folder should be")  # mkdir under it fails
    docs = load_documents(ref("ablate:tinystories"), cache=blocked)
    assert len(docs) > 6000 and not list(tmp_path.glob("**/*.tmp"))
