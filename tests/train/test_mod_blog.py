"""Mixture-of-depths as the blog ran it (issue 47, item 6): dropout 0.2 in both models, and a test loss computed
the blog's way (top-k routing over the sequence, not causal) beside the causal one.

The blog's code: joey00072/ohara at 2f01778, experiments/mixture_of_depth/train_mod.py (AdamW at torch's default
weight decay 0.01, lr 5e-4 cosine to 0 after 1,000 warm-up iterations, batch 32 x 4 micro-batches) and
ohara/models/llama.py (dropout 0.2 on the attention weights, after the attention output projection and after
the SwiGLU), whose validation ran model.eval() through the same top-k routing.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from ablate.config import SweepSpec, TableSpec, TrialConfig, load_spec
from ablate.objectives import base as objectives
from ablate.report.tables import TRAIN_ROUTING_ROW, one_table
from ablate.results.views import RunView
from ablate.train import TrainerSettings, train

REPO = Path(__file__).resolve().parents[2]
SAMPLE = {"source": "ablate:tinystories-sample", "eval": {"holdout": 16}}


def trial(architecture: str, **options) -> TrialConfig:
    return TrialConfig(architecture=architecture, d_model=16, layers=2, heads=2, context=16, lr=1e-3, batch_size=2,
                       precision="fp32", dataset=SAMPLE, tokenizer={"vocab_size": 384}, budget={"steps": 6},
                       options=options)


@pytest.mark.parametrize("architecture", ["llama", "mod"])
def test_dropout_falls_where_the_blogs_did_in_training_only(monkeypatch, architecture):
    calls = []
    real = F.dropout

    def spy(x, p=0.5, training=True, inplace=False):
        calls.append((tuple(x.shape), p, training))
        return real(x, p, training, inplace)

    model = objectives.model_for(trial(architecture, dropout=0.2), 40)
    monkeypatch.setattr(F, "dropout", spy)
    x = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(0))
    model.train()
    with torch.no_grad():
        a, b = model(x), model(x)
    active = [c for c in calls if c[2] and c[1] == 0.2]
    # attention output and MLP output of each of the 2 layers (the routed one on its selected tokens), per forward
    assert len(active) == 2 * 2 * 2, calls
    assert not torch.equal(a, b)  # dropout draws differ
    calls.clear()
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x), model(x)) and not any(c[2] and c[1] > 0 for c in calls)
    plain = objectives.model_for(trial(architecture), 40)
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(plain.eval()(x), model(x))  # eval mode: dropout off, the same model
    if architecture == "llama":  # and on the attention weights, inside SDPA (transformers' attention_dropout)
        assert [layer.self_attn.dropout for layer in (*model.layers, *plain.layers)] == [0.2, 0.2, 0.0, 0.0]


def test_the_train_routing_eval_is_the_training_forward_and_the_trainer_records_it(tmp_path):
    model = objectives.model_for(trial("mod", capacity=0.25), 40)
    x = torch.randint(0, 40, (3, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        trained_way = model.train()(x)
        model.eval()
        causal = model(x)
        with model.routing_as_in_training():
            blog_way = model(x)
        assert torch.equal(model(x), causal)  # the context restores the causal routing
    torch.testing.assert_close(blog_way, trained_way)
    assert not torch.allclose(blog_way, causal)

    out = train(trial("mod", capacity=0.25), TrainerSettings(artifacts=tmp_path / "mod", progress=False))
    routed = out["notes"]["eval_loss_train_routing"]
    assert out["status"] == "completed" and math.isfinite(routed) and routed != out["final_eval_loss"]
    dense = train(trial("llama"), TrainerSettings(artifacts=tmp_path / "llama", progress=False))
    assert "eval_loss_train_routing" not in dense["notes"]


def test_the_report_gives_the_blogs_loss_its_own_row_labelled_not_causal():
    views = []
    for arch, routed in (("llama", None), ("mod", 2.5)):
        for seed, loss in enumerate((3.0, 3.2)):
            row = SimpleNamespace(id=len(views) + 1, status="completed", final_eval_loss=loss, final_train_loss=loss,
                                  steps=200, flops_per_token=1.0, epochs=None, train_seconds=None,
                                  notes=None if routed is None else {"eval_loss_train_routing": routed + seed / 10})
            views.append(RunView(row=row, axes={"architecture": arch, "seed": seed}, reference=None))
    spec = SweepSpec.model_validate({"name": "s", "dataset": SAMPLE, "budget": {"steps": 100, "hardware": "cpu"}})
    table = one_table(spec, TableSpec(columns="architecture"), views)
    rows = dict(table.rows)
    assert [label for label, _ in table.rows][:3] == ["Train", "Test", TRAIN_ROUTING_ROW]
    assert rows[TRAIN_ROUTING_ROW][0] == rows["Test"][0]  # the dense run: one test loss
    assert rows[TRAIN_ROUTING_ROW][1].startswith("2.55") and rows["Test"][1].startswith("3.10")
    assert any(note.startswith(TRAIN_ROUTING_ROW) and "not a causal loss" in note for note in table.notes)


def test_the_sweep_follows_the_blogs_code():
    spec = load_spec(REPO / "sweeps" / "mixture-of-depths.yaml")
    from ablate.config.grid import expand_grid

    for t in expand_grid(spec):
        assert (t.lr, t.weight_decay, t.schedule, t.warmup_steps) == (5e-4, 0.01, "cosine", 1000)
        assert (tuple(t.betas), t.precision) == ((0.9, 0.999), "fp16")
        assert t.horizon.steps == 30_000 and t.batch_size * t.grad_accum == 32 * 4 and t.options["dropout"] == 0.2
