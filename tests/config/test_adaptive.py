"""The `adaptive:` block: the form users write works as written, and each mistake gets one message naming the field
and the fix, before anything is registered."""

from __future__ import annotations

import copy

import pytest

from ablate.config import expand_grid, parse_spec
from ablate.config.errors import SpecError
from ablate.config.grid import count_cells, count_trials

BASE = {
    "name": "race",
    "dataset": {"source": "ablate:tinystories-sample"},
    "budget": {"steps": 10},
    "defaults": {"architecture": "mixer", "layers": 1, "context": 64, "lr": 1e-3, "batch_size": 4},
    "grid": [{"d_model": [8, 32]}],
    "adaptive": {"seeds": {"min": 2, "max": 10}},
    "report": {"orderings": [{"claim": "wider is better", "better": {"d_model": 32}, "worse": {"d_model": 8}}],
               "min_steps": 5},  # under the 10 steps its runs train: the race can test its claims
}


def spec_with(**changes) -> dict:
    data = copy.deepcopy(BASE)
    data.update(changes)
    return data


def problems(data: dict, max_trials: int = 10_000) -> str:
    with pytest.raises(SpecError) as caught:
        expand_grid(parse_spec(data), max_trials=max_trials)
    return str(caught.value)


def test_the_block_as_written_runs_min_seeds_of_every_cell_first():
    spec = parse_spec(spec_with())
    assert spec.adaptive.seeds.min == 2 and spec.adaptive.futility and spec.adaptive.alpha == 0.05
    trials = expand_grid(spec)
    assert sorted((t.d_model, t.seed) for t in trials) == [(8, 0), (8, 1), (32, 0), (32, 1)]
    assert count_trials(spec) == 4 and count_cells(spec) == 2
    assert parse_spec(spec_with(adaptive={"seeds": {"min": 2, "max": 4}, "futility": False})).adaptive.futility is False


def test_a_sweep_without_the_block_keeps_its_fingerprint_and_one_with_it_has_another():
    plain = spec_with()
    del plain["adaptive"]
    assert "adaptive" not in str(parse_spec(plain).fingerprint())
    assert parse_spec(plain).fingerprint() != parse_spec(spec_with()).fingerprint()


@pytest.mark.parametrize("change, said", [
    (dict(adaptive={"seeds": {"min": 5, "max": 3}}), "adaptive.seeds: min 5 is above max 3; give min <= max"),
    (dict(adaptive={"seeds": {"min": 2, "max": 10}, "alpha": 0.5}), "adaptive.alpha: alpha 0.5 must lie in (0, 0.5)"),
    (dict(adaptive={"seeds": {"min": 2, "max": 10}, "alpha": 0}), "alpha 0 must lie in (0, 0.5)"),
    (dict(report={}), "adaptive: races the claims of report.orderings, and this sweep has none"),
    (dict(grid=[{"d_model": [8, 32], "seeds": 3}]), "grid[0].seeds: an adaptive sweep sets the seeds itself"),
    (dict(defaults={**BASE["defaults"], "seed": 4}), "defaults.seed: an adaptive sweep sets the seeds itself"),
    (dict(adaptive={"seeds": {"min": 1, "max": 10}}), "adaptive.seeds.min"),
])
def test_each_mistake_is_named_with_its_fix(change, said):
    assert said in problems(spec_with(**change))


def test_max_past_the_trial_limit_is_refused_before_anything_runs():
    said = problems(spec_with(adaptive={"seeds": {"min": 2, "max": 40}}), max_trials=50)
    assert "adaptive.seeds.max: 2 cells at up to 40 seeds each is 80 trials, over the limit of 50" in said
    assert "--max-trials 80" in said


def test_a_race_whose_runs_stop_short_of_min_steps_is_refused():
    """Runs of 30 steps under min_steps 50: every look would be n = 0 and the race would add a round of seeds for
    nothing (its footer then claimed a saving); refused before anything is registered."""
    said = problems(spec_with(budget={"steps": 30}, report={**BASE["report"], "min_steps": 50}))
    assert "adaptive: every trial trains budget.steps=30 steps or fewer, under report.min_steps=50" in said
    assert "raise budget.steps to 50 or more, or lower report.min_steps" in said
    expand_grid(parse_spec(spec_with(budget={"steps": 30}, report={**BASE["report"], "min_steps": 30})))
