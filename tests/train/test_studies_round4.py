"""Faithful to the studies, round 4, the smaller items (issue 47, item 7): the warm-up ramp ends on the axis of an
epochs or tokens horizon, a classifier's plan counts the parameters that train, and the sweeps' settings follow
the authors' scripts (one-step completion's learning rates, multi-token's rows per GPU, the IMDb head's 5 outputs).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ablate.config import TrialConfig, load_spec
from ablate.config.grid import expand_grid
from ablate.objectives import base as objectives
from ablate.train import budget as bud

REPO = Path(__file__).resolve().parents[2]


def trial(**over) -> TrialConfig:
    base = dict(architecture="mixer", d_model=32, layers=2, context=48, lr=1.0, batch_size=4, schedule="linear",
                dataset={"source": "ablate:tinystories-sample", "eval": {"holdout": 16}}, budget={"wall_clock": "6h"})
    return TrialConfig(**{**base, **over})


@pytest.mark.parametrize("horizon", [{"epochs": 2}, {"tokens": "250k"}])
def test_a_step_warm_up_hands_over_at_the_peak_over_an_epochs_or_tokens_horizon(horizon):
    """8 rows and 1,000 tokens a step over 1,000 rows: both horizons are 250 steps. HF's linear schedule with 100
    warm-up steps: step / 100, then (250 - step) / 150. The decay used to start at the horizon's origin, so at step
    100 the rate was already 0.6 of the peak here (a fraction of a percent in the studies' runs)."""
    at = bud.schedule(trial(warmup_steps=100, horizon=horizon))

    def hf(step: int) -> float:
        return step / 100 if step < 100 else max(0.0, (250 - step) / 150)

    for step in (1, 50, 99, 100, 101, 175, 249, 250, 300):
        assert at(0.5, step, 1000 * step, 8 * step, 1000) == pytest.approx(hf(step), abs=1e-9), step


def test_a_step_warm_up_over_a_step_horizon_is_unchanged():
    at = bud.schedule(trial(warmup_steps=100, horizon={"steps": 250}))
    assert [at(0.5, s, 0, 0, None) for s in (100, 175)] == pytest.approx([1.0, 0.5])


@pytest.mark.parametrize("tied", [False, True])
def test_a_classifiers_plan_counts_the_parameters_that_train_not_its_frozen_lm_head(tied):
    from ablate.cli import trial_param_counts

    t = trial(architecture="metaformer", heads=2, objective="classification", options={"tie_weights": tied},
              objective_options={"classes": 5}, tokenizer={"vocab_size": 384},
              dataset={"source": "ablate:tinystories-sample", "label_field": "label", "eval": {"holdout": 16}})
    model = objectives.model_for(t, 384)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    assert frozen == (0 if tied else 384 * 32)
    assert trial_param_counts(t)[0] == trained


def test_the_sweeps_follow_the_authors_scripts():
    one_step = {t.architecture: t for t in expand_grid(load_spec(REPO / "sweeps" / "one-step-completion.yaml"))}
    assert (one_step["llama"].lr, one_step["mixer"].lr) == (1e-4, 2e-4)  # llamacompletion_/mixercompletion_trainer
    assert all((t.layers, t.objective_settings().mask_layer) == (16, 8) for t in one_step.values())  # 8 + 8 blocks
    multi = expand_grid(load_spec(REPO / "sweeps" / "multi-token.yaml"))
    assert {t.batch_size for t in multi} == {16}  # per_device_train_batch_size=16 in both mtp scripts
    imdb = expand_grid(load_spec(REPO / "sweeps" / "metaformer-imdb.yaml"))
    assert {t.objective_settings().classes for t in imdb} == {5}  # output_vocabolary: int = 5
