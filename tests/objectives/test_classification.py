"""Text classification (the MetaFormer study's IMDb task) on 15 real labelled IMDb reviews (tests/data)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from ablate import store
from ablate.objectives import base as objectives
from ablate.config.errors import AblateError, SpecError
from ablate.config import TrialConfig, load_trials, parse_spec

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "tests" / "data" / "imdb-sample.jsonl"
LABELS = [json.loads(line)["label"] for line in SAMPLE.read_text().splitlines()]


def trial(**over) -> TrialConfig:
    base = dict(architecture="metaformer", d_model=32, layers=1, heads=2, context=96, lr=3e-3, batch_size=5,
                precision="fp32", objective="classification", objective_options={"classes": 2},
                dataset={"source": str(SAMPLE), "label_field": "label", "eval": {"holdout": 5}},
                tokenizer={"vocab_size": 320}, budget={"steps": 6}, eval={"at": [0.5]}, warmup=0.0)
    base.update(over)
    return TrialConfig(**base)


def prepared(tmp_path: Path, t: TrialConfig):
    from ablate.data import prepare

    return prepare(t.dataset, t.tokenizer, t.context, tmp_path / "art", progress=False)


def test_labelled_rows_carry_each_reviews_class_at_its_last_token(tmp_path):
    p = prepared(tmp_path, trial())
    assert (len(p.train), len(p.eval)) == (10, 5) and p.train.n_classes == 2
    ids, labels = p.train.batch(np.arange(10))
    marked = labels != objectives.IGNORE_INDEX
    assert marked.sum(1).tolist() == [1] * 10  # one target per review
    lengths, classes = objectives.module("classification").rows_of(labels)
    assert classes.tolist() == LABELS[:10]
    assert lengths.tolist() == p.train.lengths[:10].tolist()  # reviews longer than the context are cut at it
    _, eval_labels = p.eval.batch(np.arange(5))
    assert objectives.module("classification").rows_of(eval_labels)[1].tolist() == LABELS[10:]


def test_the_loss_is_cross_entropy_of_the_pooled_class_scores_and_counts_what_it_got_right(tmp_path):
    t = trial()
    p = prepared(tmp_path, t)
    torch.manual_seed(0)
    model = objectives.model_for(t, p.vocab_size).eval()
    objective = objectives.Objective(t, model)
    ids, labels = p.train.batch(np.arange(10))
    total, count, aux, correct = objective(ids, labels)
    lengths = torch.from_numpy(p.train.lengths[:10].astype(np.int64))
    hidden = model.model.hidden_states(ids)
    mean = torch.stack([hidden[i, : lengths[i]].mean(0) for i in range(10)])  # the study's averaged projection
    scores = model.head(mean)
    truth = torch.tensor(LABELS[:10])
    assert float(total) == pytest.approx(float(torch.nn.functional.cross_entropy(scores, truth, reduction="sum")), rel=1e-5)
    assert int(count) == 10 and float(aux) == 0.0
    assert int(correct) == int((scores.argmax(-1) == truth).sum())
    assert objectives.token_counter(t)(labels) == int(lengths.sum())  # tokens read, not targets
    last = objectives.Objective(trial(objective_options={"classes": 2, "pooling": "last"}), model)
    model.pooling = "last"
    s_last, *_ = last(ids, labels)
    assert float(s_last) == pytest.approx(float(torch.nn.functional.cross_entropy(
        model.head(hidden[torch.arange(10), lengths - 1]), truth, reduction="sum")), rel=1e-5)


def test_training_records_test_accuracy_and_fits_the_training_labels(tmp_path, sqlite_url):
    from ablate.report import build_report
    from ablate import runner
    import yaml

    spec = tmp_path / "imdb.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "imdb-tiny", "dataset": {"source": str(SAMPLE), "label_field": "label", "eval": {"holdout": 5}},
        "tokenizer": {"vocab_size": 320}, "budget": {"steps": 40}, "eval": {"at": [0.5]},
        "defaults": {"architecture": "metaformer", "d_model": 32, "layers": 1, "heads": 2, "context": 96,
                     "lr": 1e-2, "batch_size": 5, "precision": "fp32", "warmup": 0.0, "objective": "classification"},
        "grid": [{"options": {"token_mixer": ["attention", "pool"]}}]}))
    _, _, ids = runner.register(spec, sqlite_url)
    from ablate.train import TrainerSettings, train

    engine = store.connect(sqlite_url)
    for run_id in ids:
        t = TrialConfig.model_validate(store.get_run(engine, run_id).config)
        out = train(t, TrainerSettings(artifacts=tmp_path / "art", db_url=sqlite_url, run_id=run_id, progress=False))
        run = store.get_run(engine, run_id)
        assert out["status"] == "completed" and math.isfinite(run.final_eval_loss)
        assert run.final_eval_accuracy in {0.0, 0.2, 0.4, 0.6, 0.8, 1.0}  # 5 held-out reviews
        # it learns the labels it is given: the trained model classifies its 10 training reviews right
        from ablate.train.generate import load_checkpoint_model

        model = load_checkpoint_model(Path(run.checkpoint_path), t, 320).eval()
        p = prepared(tmp_path, t)
        with torch.no_grad():
            _, _, _, correct = objectives.Objective(t, model)(*p.train.batch(np.arange(10)))
        assert int(correct) == 10
    text = (build_report("imdb-tiny", sqlite_url, tmp_path / "rep", formats=("md",)).out / "report.md").read_text()
    assert "| Test accuracy |" in text


def test_classification_needs_a_label_column_and_one_document_per_row(tmp_path):
    with pytest.raises(ValueError, match="needs labelled documents: set dataset.label_field"):
        trial(dataset={"source": str(SAMPLE), "eval": {"holdout": 5}})
    with pytest.raises(ValueError, match="label_field needs packing: pad"):
        trial(dataset={"source": str(SAMPLE), "label_field": "label", "packing": "concat", "eval": {"holdout": 5}})
    with pytest.raises(AblateError, match="dataset.label_field: no column 'stars'.*columns: text, label"):
        prepared(tmp_path, trial(dataset={"source": str(SAMPLE), "label_field": "stars", "eval": {"holdout": 5}}))


def test_more_labels_than_classes_is_refused_before_training(tmp_path):
    from ablate.train import TrainerSettings, train

    text = tmp_path / "three.jsonl"
    text.write_text("".join(json.dumps({"text": f"review number {i} of many", "label": i % 3}) + "\n" for i in range(12)))
    t = trial(dataset={"source": str(text), "label_field": "label", "eval": {"holdout": 3}}, tokenizer={"vocab_size": 270})
    with pytest.raises(AblateError, match="objective_options.classes=2, but dataset.label_field 'label' has labels up to 2"):
        train(t, TrainerSettings(artifacts=tmp_path / "art", progress=False))


def test_the_imdb_sweep_plans_the_studys_unmasked_token_mixers_with_one_block():
    spec, trials = load_trials(REPO / "sweeps" / "metaformer-imdb.yaml")
    assert spec.dataset.label_field == "label" and spec.dataset.eval.split == "test"
    assert sorted(t.effective_options()["token_mixer"] for t in trials) == ["attention", "metric", "none", "pool",
                                                                           "quadratic"]
    assert all(t.layers == 1 and t.objective == "classification" and t.objective_settings().pooling == "mean"
               for t in trials)
    # the study code's classifier (nlp-metaformer @33c02a7): unmasked, width 300, 6 heads, context 300, gpt2 BPE,
    # Adam lr 1e-4 at a constant rate in fp32, 40 epochs of 781 batches of 32
    for t in trials:
        opts = t.effective_options()
        assert not opts["causal"] and opts["pool_features"] and opts["ffn_mult"] == 2 and not opts["bias"]
        assert (t.d_model, t.heads, t.context, t.batch_size, t.lr) == (300, 6, 300, 32, 1e-4)
        assert t.tokenizer.name == "gpt2" and t.schedule == "constant" and t.warmup == 0 and t.precision == "fp32"
        assert tuple(t.betas) == (0.9, 0.999) and t.budget.steps == 40 * 781
        assert not t.objective_settings().bias


def test_an_unlabelled_corpus_keeps_its_identity():
    data = {"name": "x", "dataset": {"source": "ablate:tinystories-sample"}, "budget": {"steps": 1},
            "defaults": {"architecture": "mixer", "d_model": 8, "layers": 1, "context": 8, "lr": 1e-3, "batch_size": 1}}
    dumped = parse_spec(data).model_dump(mode="json")
    assert "label_field" not in dumped["dataset"] and "trained_on" not in dumped["tokenizer"]
    with pytest.raises(SpecError):
        parse_spec({**data, "dataset": {"source": "ablate:tinystories-sample", "label_field": "y", "packing": "concat"}})


# ---------------------------------------------------------------- the study's unmasked classifier (issue 26)

UNMASKED = {"causal": False}


def test_unmasked_token_mixers_are_for_classification_only():
    with pytest.raises(ValueError, match=r"options.causal: False cannot be evaluated causally.*later tokens.*classification"):
        trial(objective="clm", objective_options={}, dataset={"source": "ablate:tinystories-sample"},
              options=UNMASKED)
    assert not trial(options=UNMASKED).effective_options()["causal"]


@pytest.mark.parametrize("mixer", ["attention", "metric", "quadratic", "pool"])
def test_an_unmasked_mixer_lets_every_position_read_the_whole_review(mixer):
    from ablate import models

    torch.manual_seed(0)
    causal = models.build(trial(options={"token_mixer": mixer}), 64).eval()
    unmasked = models.build(trial(options={"token_mixer": mixer, **UNMASKED}), 64).eval()
    ids = torch.randint(0, 64, (2, 12))
    later = ids.clone()
    later[:, 1] = (later[:, 1] + 1) % 64  # a later token (within the pool's window of 3)
    with torch.no_grad():
        first = lambda m, x: m.hidden_states(x)[:, 0]  # noqa: E731 - the first position's state
        assert torch.allclose(first(causal, ids), first(causal, later))  # causal: position 0 reads only itself
        assert not torch.allclose(first(unmasked, ids), first(unmasked, later), atol=1e-6)


@pytest.mark.parametrize("features", [False, True])
def test_the_unmasked_pool_is_a_centred_window_mean_minus_the_token(features):
    from ablate.models.metaformer import CentredPool

    x = torch.randn(2, 7, 5)
    out = CentredPool(3, features)(x)
    expected = torch.empty_like(x)
    for t in range(7):
        for d in range(5):
            rows = slice(max(t - 1, 0), t + 2)  # padding is not counted: the window shrinks at the edges
            cols = slice(max(d - 1, 0), d + 2) if features else slice(d, d + 1)
            expected[:, t, d] = x[:, rows, cols].mean(dim=(1, 2)) - x[:, t, d]
    torch.testing.assert_close(out, expected)


def test_no_mixer_sublayer_and_no_biases_are_the_study_codes_block():
    from ablate import models

    model = models.build(trial(options={"token_mixer": "none", "bias": False, "ffn_mult": 2, **UNMASKED}), 64)
    block = model.blocks[0]
    assert block.mixer is None and block.norm1 is None  # x + MLP(LN(x)): the study code's IDENTITY
    assert all(m.bias is None for m in block.mlp if isinstance(m, torch.nn.Linear))
    assert block.mlp[0].out_features == 64
    head = objectives.model_for(trial(options=UNMASKED, objective_options={"classes": 2, "bias": False}), 64).head
    assert head.bias is None


def test_an_unmasked_classifier_trains_and_records_its_accuracy(tmp_path):
    from ablate.train import TrainerSettings, train

    out = train(trial(options={"token_mixer": "pool", "pool_features": True, **UNMASKED}, budget={"steps": 4}),
                TrainerSettings(artifacts=tmp_path / "art", progress=False))
    assert out["status"] == "completed" and math.isfinite(out["final_eval_loss"])
