"""Faithful to the studies, round 3 (issue 26): what the studies scored, how long their schedules ran, and
overrides that produce a sweep that runs.

Each test fails on the tree before it: an end-of-text target per document, schedules that always end at the
budget, a local source override that keeps a split the source does not have, no gpus/hardware overrides.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from ablate import runner, store
from ablate.objectives import base as objectives
from ablate.data import prepare
from ablate.config.errors import SpecError
from ablate.config import TrialConfig, describe_recipe, load_spec, load_trials, parse_spec
from ablate.train import TrainerSettings, train

REPO = Path(__file__).resolve().parents[2]
SWEEPS = REPO / "sweeps"
STUDY_SWEEPS = sorted(p for p in SWEEPS.glob("*.yaml") if load_spec(p).recipe == "studies")


def trial(**over) -> TrialConfig:
    base = dict(architecture="mixer", d_model=32, layers=2, context=64, lr=1e-3, batch_size=4, precision="fp32",
                dataset={"source": "ablate:tinystories-sample", "eval": {"holdout": 16}}, tokenizer={"vocab_size": 384},
                budget={"steps": 6}, eval={"at": [0.5]})
    base.update(over)
    return TrialConfig(**base)


# ---------------------------------------------------------------- 1. the targets scored


def authors_labels(rows: np.ndarray, lengths: np.ndarray, eos: int) -> torch.Tensor:
    """What the authors' pipeline scores for the same documents: tokens without special tokens, truncated and
    padded to the context with pad = eos, and transformers' DataCollatorForLanguageModeling (pad -> -100)."""
    from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models as tok_models

    inputs = []
    for row, n in zip(rows, lengths, strict=True):
        text = [int(t) for t in row[:n] if int(t) != eos]  # the document's own tokens (ours append eos to them)
        inputs.append(text[: len(row)] + [eos] * (len(row) - len(text[: len(row)])))
    raw = Tokenizer(tok_models.WordLevel({"<unk>": 0, "</s>": eos}, unk_token="<unk>"))
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", eos_token="</s>", pad_token="</s>")
    return DataCollatorForLanguageModeling(tok, mlm=False)([{"input_ids": ids} for ids in inputs])["labels"]


@pytest.mark.parametrize("context", [64, 512])
def test_the_studies_recipe_scores_the_targets_the_authors_collator_scored(tmp_path, context):
    t = trial(context=context)
    scored = prepare(t.dataset, t.tokenizer, context, tmp_path / "art", progress=False)
    unscored = prepare(t.dataset, t.tokenizer, context, tmp_path / "art", progress=False, eos_is_target=False)
    idx = np.arange(len(scored.train))
    ids, ours = unscored.train.batch(idx)
    ids_before, before = scored.train.batch(idx)
    assert torch.equal(ids, ids_before)  # the end-of-text token stays in the input
    theirs = authors_labels(unscored.train.data[idx], unscored.train.lengths[idx], scored.eos_id)
    assert torch.equal(ours[:, 1:] != -100, theirs[:, 1:] != -100)  # the same next-token targets, one by one
    lengths = torch.from_numpy(unscored.train.lengths[idx].astype(np.int64))
    whole = int((ids[torch.arange(len(idx)), lengths - 1] == scored.eos_id).sum())  # end-of-text within the context
    assert whole == (0 if context == 64 else len(idx) - int((lengths == context).sum()))  # 64: every story is cut
    assert objectives.count_next_tokens(before) - objectives.count_next_tokens(ours) == whole


def test_an_unscored_separator_stays_input_between_concatenated_documents(tmp_path):
    t = trial(dataset={"source": "ablate:tinystories-sample", "eval": {"holdout": 16}, "packing": "concat"})
    p = prepare(t.dataset, t.tokenizer, t.context, tmp_path / "art", progress=False, eos_is_target=False)
    ids, labels = p.train.batch(np.arange(len(p.train)))
    separators = ids == p.eos_id
    assert separators.sum() > 10 and bool((labels[separators] == -100).all())
    assert bool((labels[~separators] == ids[~separators]).all())


def test_labelled_rows_keep_their_class_where_the_end_of_text_stands(tmp_path):
    sample = REPO / "tests" / "data" / "imdb-sample.jsonl"
    t = trial(architecture="metaformer", heads=2, objective="classification", objective_options={"classes": 2},
              dataset={"source": str(sample), "label_field": "label", "eval": {"holdout": 5}}, tokenizer={"vocab_size": 320})
    p = prepare(t.dataset, t.tokenizer, t.context, tmp_path / "art", progress=False, eos_is_target=False)
    _, labels = p.train.batch(np.arange(len(p.train)))
    assert (labels != -100).sum(1).tolist() == [1] * len(p.train)


def test_the_recipe_says_what_it_scores_and_the_run_records_it():
    studies = parse_spec({"name": "s", "recipe": "studies", "dataset": {"source": "ablate:tinystories-sample"},
                          "budget": {"steps": 2}, "defaults": {"architecture": "mixer", "d_model": 8, "layers": 1,
                                                               "context": 8, "lr": 1e-3, "batch_size": 1}})
    from ablate.config import expand_grid

    (t,) = expand_grid(studies)
    assert t.eos_is_target is False and t.model_dump(mode="json")["eos_is_target"] is False
    assert "end-of-text not scored" in describe_recipe(t) and "end-of-text scored" in describe_recipe(trial())


def test_a_run_trains_and_evaluates_without_end_of_text_targets(tmp_path):
    out = train(trial(eos_is_target=False, context=512), TrainerSettings(artifacts=tmp_path / "art", progress=False))
    kept = train(trial(context=512), TrainerSettings(artifacts=tmp_path / "art", progress=False))
    assert out["status"] == kept["status"] == "completed"
    assert out["tokens"] < kept["tokens"]  # the end-of-story targets are not counted, nor trained on


# ---------------------------------------------------------------- 2. the schedule's horizon


def test_a_run_ends_at_its_horizon_when_that_comes_before_its_budget(tmp_path):
    out = train(trial(budget={"steps": 40}, horizon={"steps": 9}, warmup=0.0),
                TrainerSettings(artifacts=tmp_path / "art", progress=False))
    assert out["status"] == "completed" and out["steps"] == 9
    assert out["notes"]["ended_at_horizon"]["step"] == 9
    longer = train(trial(budget={"steps": 7}, horizon={"steps": 50}), TrainerSettings(artifacts=tmp_path / "b", progress=False))
    assert longer["steps"] == 7 and "ended_at_horizon" not in longer["notes"]  # the budget came first


@pytest.mark.parametrize("path", STUDY_SWEEPS, ids=lambda p: p.name)
def test_every_study_sweep_plans_the_horizon_its_authors_planned_and_cites_it(path):
    text = path.read_text()
    header = text[: text.index("\nname:")]
    _, trials = load_trials(path)
    assert "horizon" in header.lower(), "the header says which schedule length the authors' runs planned"
    if any(t.horizon is not None for t in trials):
        assert "@" in header and ":" in header, "a horizon cites the authors' script (path@commit:line)"
    if any(t.horizon is None for t in trials) and any(t.budget.kind != "steps" for t in trials):
        assert "none" in header.lower(), "rows left ending at the budget say that no plan was found, and why"


def test_study_horizons_follow_the_authors_scripts():
    widths = load_trials(SWEEPS / "tinystories-widths.yaml")[1]
    by = {(t.architecture, t.d_model, t.effective_options()["expand"] if t.architecture == "mixer" else 0, t.layers):
          t.horizon for t in widths}
    assert {h.epochs for (arch, *_), h in by.items() if arch == "llama"} == {3}
    assert by[("mixer", 512, 1, 8)].epochs == 5 and by[("mixer", 1024, 1, 4)].epochs == 5
    assert by[("mixer", 256, 1, 8)] is None and by[("mixer", 256, 2, 8)] is None  # ran past 5.6 epochs
    fineweb = load_trials(SWEEPS / "fineweb-heads.yaml")[1]
    assert {t.horizon.steps for t in fineweb} == {200_000}


def test_plan_prints_each_trials_horizon(capsys):
    from ablate.cli import main

    assert main(["plan", str(SWEEPS / "tinystories-parallel-convs.yaml")]) == 0
    out = capsys.readouterr().out
    assert "horizon" in out and "5 epochs" in out and "3 epochs" in out


# ---------------------------------------------------------------- 6. overrides that reach the cluster


def test_a_local_source_override_holds_documents_out_instead_of_a_split_it_lacks():
    spec, trials = load_trials(SWEEPS / "tinystories-widths.yaml", overrides={"source": "ablate:tinystories"})
    assert spec.dataset.eval.split is None and spec.dataset.eval.holdout == 1000
    assert any("held out instead" in note for note in spec.overrides)
    assert spec.name == "tinystories-widths-data-ablate-tinystories"
    spec, _ = load_trials(SWEEPS / "tinystories-widths.yaml", overrides={"source": "ablate:tinystories", "holdout": 300})
    assert spec.dataset.eval.holdout == 300 and spec.name.endswith("holdout-300")
    hub = load_trials(SWEEPS / "tinystories-widths.yaml", overrides={"source": "someone/stories"})[0]
    assert hub.dataset.eval.split == "validation"  # a hub dataset keeps its split
    from ablate.config.overrides import apply_overrides

    plain = {"name": "x", "dataset": {"source": "someone/stories"}, "budget": {"steps": 1},
             "defaults": {"architecture": "mixer", "d_model": 8, "layers": 1, "context": 8, "lr": 1e-3, "batch_size": 1}}
    for source in ("other/stories", "ablate:tinystories"):  # no eval in the file: the default holdout stays
        assert parse_spec(apply_overrides(plain, {"source": source})).dataset.eval.holdout == 50
    assert plain["dataset"] == {"source": "someone/stories"}  # the file's contents are not changed


def test_plan_refuses_a_split_that_a_local_source_cannot_have(tmp_path):
    corpus = tmp_path / "stories.txt"
    corpus.write_text("one story\n<|endoftext|>\nanother story\n")
    data = {"name": "local", "dataset": {"source": str(corpus), "eval": {"split": "validation"}}, "budget": {"steps": 1},
            "defaults": {"architecture": "mixer", "d_model": 8, "layers": 1, "context": 8, "lr": 1e-3, "batch_size": 1}}
    with pytest.raises(SpecError, match=r"dataset\.eval\.split: .*local source.*holdout"):
        parse_spec(data, base_dir=tmp_path)
    saved = tmp_path / "saved"  # a save_to_disk DatasetDict has named splits: allowed
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a b"]}),
                          "validation": datasets.Dataset.from_dict({"text": ["c"]})}).save_to_disk(str(saved))
    assert parse_spec({**data, "dataset": {"source": str(saved), "eval": {"split": "validation"}}}, base_dir=tmp_path)


def test_the_readme_cluster_example_with_a_local_source_prepares_and_registers(sqlite_url, tmp_path):
    """`--param source=ablate:tinystories` on a study sweep: the flow's own registration, data prepared first."""
    spec, sweep_id, ids = runner.register(SWEEPS / "tinystories-widths.yaml", sqlite_url,
                                          overrides={"source": "ablate:tinystories", "vocab_size": 512},
                                          artifacts=tmp_path / "art")
    assert len(ids) == 12 and spec.dataset.eval.holdout == 1000
    stored = store.get_run(store.connect(sqlite_url), ids[0]).config
    assert stored["dataset"]["eval"]["holdout"] == 1000 and stored["dataset"]["eval"]["split"] is None
    assert stored["dataset"]["source"] == "ablate:tinystories"


def test_a_gpus_override_keeps_the_studys_global_batch():
    before = load_trials(SWEEPS / "v100-mixers.yaml")[1]
    spec, after = load_trials(SWEEPS / "v100-mixers.yaml", overrides={"gpus": 1, "hardware": "h100"})
    assert spec.budget.gpus == 1 and spec.budget.hardware == "h100" and spec.name == "v100-mixers-hw-h100-gpus-1"
    assert [t.batch_size * t.grad_accum * t.budget.gpus for t in after] == [t.batch_size * 4 for t in before]
    assert {t.batch_size for t in after} == {t.batch_size for t in before}
    assert any("not the study's 4x v100" in note for note in spec.overrides)
    data = yaml.safe_load((SWEEPS / "v100-mixers.yaml").read_text())
    data["grid"][0]["grad_accum"] = [2, 3]
    from ablate.config.overrides import apply_overrides
    from ablate.config import expand_grid

    scaled = expand_grid(parse_spec(apply_overrides(data, {"gpus": 2})))
    assert sorted({t.grad_accum for t in scaled}) == [2, 4, 6]  # the block's own values, and the default, doubled
    with pytest.raises(SpecError, match="gpus"):
        apply_overrides(data, {"gpus": 0})


def test_a_gpus_override_on_a_malformed_file_names_the_files_fields_instead_of_a_traceback():
    from ablate.config.overrides import apply_overrides

    data = {"name": "x", "dataset": {"source": "ablate:tinystories"}, "budget": {"steps": 5, "gpus": "four"},
            "defaults": [1, 2], "grid": [{"architecture": "mixer", "d_model": 8, "layers": 1, "context": 8,
                                          "lr": 1e-3, "batch_size": 1}]}
    with pytest.raises(SpecError) as bad:
        parse_spec(apply_overrides(data, {"gpus": 1}))
    assert "budget.gpus" in str(bad.value) and "defaults" in str(bad.value)
    data["budget"]["gpus"] = 4  # gpus that divide: the scaling meets defaults that are not a mapping
    with pytest.raises(SpecError, match="defaults: must be a mapping"):
        parse_spec(apply_overrides(data, {"gpus": 1}))


def test_overrides_are_printed_by_plan_and_stored_with_the_sweep(sqlite_url, capsys):
    from ablate.cli import main

    assert main(["plan", str(SWEEPS / "v100-mixers.yaml"), "--gpus", "1", "--hardware", "h100"]) == 0
    out = capsys.readouterr().out
    assert "override: hardware: 1x h100" in out and "32x4" in out
    spec, sweep_id, _ = runner.register(SWEEPS / "v100-mixers.yaml", sqlite_url, overrides={"gpus": 1})
    with store.connect(sqlite_url).connect() as conn:
        import sqlalchemy as sa

        stored = conn.execute(sa.select(store.Sweep.spec).where(store.Sweep.id == sweep_id)).scalar()
    assert any("grad_accum x4" in note for note in stored["overrides"])
    assert load_spec(SWEEPS / "v100-mixers.yaml").fingerprint() != spec.fingerprint()


def test_the_report_says_when_runs_were_not_on_the_studys_hardware(sqlite_url, tmp_path):
    from ablate.report import build_report

    data = yaml.safe_load((REPO / "sweeps" / "smoke.yaml").read_text())
    data.update(budget={"steps": 3, "hardware": "cpu", "gpus": 2},
                dataset={"source": "ablate:tinystories-sample", "eval": {"holdout": 16}}, tokenizer={"vocab_size": 300})
    data["defaults"]["context"] = 32
    data["grid"] = [{"architecture": "mixer", "d_model": 16}]
    path = tmp_path / "two-gpus.yaml"
    path.write_text(yaml.safe_dump(data))
    spec, _, (rid,) = runner.register(path, sqlite_url, overrides={"gpus": 1})
    report = build_report(spec.name, sqlite_url, out=tmp_path / "report", formats=("md",))
    text = (tmp_path / "report" / "report.md").read_text()
    assert "Override: hardware: 1x cpu per trial, not the study's 2x cpu" in text
    assert report.sweep == spec.name and rid


# ---------------------------------------------------------------- the Train row: HF's last logged loss


def test_the_train_loss_over_the_last_steps_reads_the_intervals_that_end_there():
    from ablate.train.points import final_train_loss

    intervals = [(0.25, 40.0, 10, 100), (0.5, 30.0, 10, 200), (0.75, 20.0, 10, 300), (1.0, 12.0, 10, 400)]
    assert final_train_loss(intervals, steps=150) == pytest.approx((20.0 + 12.0) / 20)  # ends at 300 and 400
    assert final_train_loss(intervals, steps=1) == pytest.approx(1.2)  # at least the last interval
    assert final_train_loss(intervals) == pytest.approx(1.2)  # the last 10% of the budget
    assert final_train_loss([iv[:3] for iv in intervals], steps=150) == pytest.approx(1.2)  # an old checkpoint's


def test_the_studies_recipe_reads_the_train_loss_over_the_last_500_steps(tmp_path):
    studies = parse_spec({"name": "s", "recipe": "studies", "dataset": {"source": "ablate:tinystories-sample"},
                          "budget": {"steps": 2}, "defaults": {"architecture": "mixer", "d_model": 8, "layers": 1,
                                                               "context": 8, "lr": 1e-3, "batch_size": 1}})
    from ablate.config import expand_grid

    (t,) = expand_grid(studies)
    assert t.train_loss_steps == 500 and "train loss over the last 500 steps" in describe_recipe(t)
    assert trial().train_loss_steps is None  # the project's recipe: the last 10% of the budget, as before
    settings = TrainerSettings(artifacts=tmp_path / "art", progress=False, log_points=10)
    whole = train(trial(budget={"steps": 30}, train_loss_steps=1000), settings)  # every interval: the early ones too
    tail = train(trial(budget={"steps": 30}), settings)  # the last 10%: one interval, after the loss fell
    assert whole["final_train_loss"] > tail["final_train_loss"] + 0.05, (whole, tail)
