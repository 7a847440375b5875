"""Bits per byte: the token cache counts the eval text's UTF-8 bytes per scored token, the trainer records it, and
every loss table gets a `Test (bits/byte)` row (loss / ln 2 / bytes per token), with a line naming the tokenizers
under a table with published numbers."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from ablate.config import SweepSpec, TableSpec, TokenizerRef
from ablate.data import prepare, train_eval_documents
from ablate.report.tables import one_table
from ablate.results.views import RunView
from ablate.train import train
from tests.gpu.common import settings, tiny

SAMPLE = {"source": "ablate:tinystories-sample", "eval": {"holdout": 16}}


@pytest.mark.parametrize("style", [None, "llama"])
def test_the_cache_counts_the_eval_texts_bytes_per_scored_token(tmp_path, style):
    trial = tiny(tokenizer={"vocab_size": 512, "style": style})
    scored = prepare(trial.dataset, trial.tokenizer, 64, tmp_path, progress=False)
    unscored = prepare(trial.dataset, trial.tokenizer, 64, tmp_path, progress=False, eos_is_target=False)
    _, held = train_eval_documents(trial.dataset, cache=tmp_path)
    texts = list(held["text"])
    tokens = sum(map(len, scored.tokenizer(texts, add_special_tokens=False)["input_ids"]))
    text_bytes = sum(len(t.encode("utf-8")) for t in texts)
    assert unscored.eval_bytes_per_token == pytest.approx(text_bytes / tokens)
    assert scored.eval_bytes_per_token == pytest.approx(text_bytes / (tokens + len(texts)))  # each story's eos too


def test_a_trained_run_records_its_bytes_per_token(tmp_path):
    trial = tiny(budget={"steps": 3})
    out = train(trial, settings(torch.device("cpu"), tmp_path))
    cache = prepare(trial.dataset, trial.tokenizer, trial.context, tmp_path, progress=False)  # the run's, built
    assert out["notes"]["eval_bytes_per_token"] == pytest.approx(cache.eval_bytes_per_token, abs=1e-5)


def _views(per_token: dict[str, float | None]) -> list[RunView]:
    views = []
    for arch, bpt in per_token.items():
        for seed, loss in enumerate((2.0, 2.2)):
            row = SimpleNamespace(id=len(views) + 1, status="completed", final_eval_loss=loss, final_train_loss=loss,
                                  steps=200, flops_per_token=1.0, epochs=None, train_seconds=None,
                                  notes=None if bpt is None else {"eval_bytes_per_token": bpt})
            views.append(RunView(row=row, axes={"architecture": arch, "seed": seed}, reference=None))
    return views


def _spec(**report) -> SweepSpec:
    return SweepSpec.model_validate({"name": "s", "dataset": SAMPLE, "budget": {"steps": 100, "hardware": "cpu"},
                                     "tokenizer": {"vocab_size": 4096, "style": "llama"}, "report": report})


def test_the_table_reads_each_run_in_bits_per_byte_where_its_trainer_counted_them():
    table = one_table(_spec(), TableSpec(columns="architecture"), _views({"llama": 5.0, "mixer": 4.0}))
    rows = dict(table.rows)
    expected = [statistics_mean(2.0, 2.2) / math.log(2) / bpt for bpt in (5.0, 4.0)]  # columns in grid order
    cells = rows["Test (bits/byte)"]
    assert [float(c.split(" ")[0]) for c in cells] == pytest.approx(expected, abs=0.006), cells
    assert "Test (bits/byte)" not in dict(one_table(_spec(), TableSpec(columns="architecture"),
                                                    _views({"llama": None, "mixer": None})).rows)


def test_published_numbers_say_which_tokenizer_made_them():
    spec = _spec(reference_tokenizer="the authors' Llama retrain (4096)")
    views = _views({"llama": 5.0})
    for v in views:
        v.reference = SimpleNamespace(train=1.9, eval=2.0)
    notes = " ".join(one_table(spec, TableSpec(columns="architecture"), views).notes)
    assert "Tokenizers: ours BPE 4096 llama; the published numbers' the authors' Llama retrain (4096)." in notes
    unsaid = " ".join(one_table(_spec(), TableSpec(columns="architecture"), views).notes)
    assert "not recorded in the sweep (report.reference_tokenizer)" in unsaid
    assert _spec().fingerprint() == spec.fingerprint()  # a description, not the sweep's identity
    assert TokenizerRef(vocab_size=8000, style="llama3").describe() == "BPE 8000 llama3"


def statistics_mean(*values: float) -> float:
    return sum(values) / len(values)
