"""Runs read at an equal budget: the interpolation against hand-computed values, FLOPs from tokens, the refusal
past a run's last point, and the budget's spelling."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from ablate.config import SweepSpec
from ablate.config.units import At, parse_at
from ablate.results.equal import BEFORE_FIRST, NO_FLOPS, NOT_REACHED, loss_at, read_at, x_of
from ablate.results.orderings import check_claims
from ablate.results.views import RunView

# rows (elapsed_seconds, tokens, step, loss), as run_points gives them
EVAL = np.array([[10.0, 1000, 10, 4.0], [20.0, 2000, 20, 3.0], [40.0, 4000, 40, 2.5]])


def test_loss_at_an_equal_budget_interpolates_between_the_two_points_around_it():
    # by hand: tokens 2,500 lies a quarter of the way from 2,000 (3.0) to 4,000 (2.5): 3.0 - 0.25 * 0.5 = 2.875
    assert loss_at(EVAL, x_of("tokens", EVAL, None), 2500) == pytest.approx(2.875)
    # seconds 15: halfway from 10 s (4.0) to 20 s (3.0)
    assert loss_at(EVAL, x_of("seconds", EVAL, None), 15) == pytest.approx(3.5)
    assert loss_at(EVAL, x_of("steps", EVAL, None), 40) == pytest.approx(2.5)  # the last point itself
    # FLOPs are tokens x the run's training FLOPs per token: 6e6 FLOPs per token, 1.5e10 FLOPs = 2,500 tokens
    assert loss_at(EVAL, x_of("flops", EVAL, 6e6), 1.5e10) == pytest.approx(2.875)
    assert x_of("flops", EVAL, None) is None  # a run with no FLOPs per token cannot be read in FLOPs


def test_a_budget_past_the_last_point_is_refused_and_one_before_the_first_has_no_number():
    assert loss_at(EVAL, x_of("tokens", EVAL, None), 4001) is None
    assert np.isnan(loss_at(EVAL, x_of("tokens", EVAL, None), 999))


def _view(run_id: int, arch: str, seed: int, status: str = "completed", fpt: float = 6e6) -> RunView:
    row = SimpleNamespace(id=run_id, status=status, final_eval_loss=9.9, final_train_loss=9.9, steps=400,
                          flops_per_token=fpt)
    return RunView(row=row, axes={"architecture": arch, "d_model": 64, "seed": seed}, reference=None)


def test_read_at_gives_each_run_its_own_interpolated_loss_and_a_status_for_the_others():
    views = [_view(1, "mixer", 0), _view(2, "llama", 0), _view(3, "llama", 1, status="failed")]
    curves = {(1, "eval"): EVAL, (1, "train"): EVAL, (2, "eval"): EVAL[:2], (3, "eval"): EVAL}
    read = read_at(views, At("tokens", 3000), curves)
    assert read[0].row.final_eval_loss == pytest.approx(2.75) and read[0].row.status == "completed"
    assert read[0].row.steps == 400 and read[0].row.id == 1  # every other field is the run's own
    assert read[1].row.status == NOT_REACHED and read[1].row.final_eval_loss is None
    assert read[2].row.status == "failed"
    early = read_at(views[:1], At("tokens", 500), curves)[0]
    assert early.row.status == BEFORE_FIRST and early.row.final_eval_loss is None
    unknown = read_at([_view(4, "mixer", 0, fpt=None)], At("flops", 1e10), {(4, "eval"): EVAL})[0]
    assert unknown.row.status == NO_FLOPS  # not "not reached": it cannot be read in FLOPs at all
    assert views[0].row.final_eval_loss == 9.9  # the stored row is untouched


def test_orderings_at_an_equal_budget_compare_the_interpolated_losses():
    spec = SweepSpec.model_validate({
        "name": "s", "dataset": {"source": "ablate:tinystories"}, "budget": {"wall_clock": "60s", "hardware": "cpu"},
        "report": {"orderings": [{"claim": "mixer wins", "better": {"architecture": "mixer"},
                                  "worse": {"architecture": "llama"}}], "min_steps": 0}})
    views = [_view(i, "mixer" if i < 3 else "llama", i % 3) for i in range(6)]
    # the mixer is faster per token early, Llama catches up late: at 1,500 tokens the mixer leads by 0.5 nats
    curves = {}
    for v in views:
        fast = v.axes["architecture"] == "mixer"
        jitter = 0.01 * v.axes["seed"]
        curves[(v.row.id, "eval")] = np.array([[10, 1000, 10, (3.5 if fast else 4.0) + jitter],
                                               [20, 2000, 20, (3.0 if fast else 3.5) + jitter],
                                               [40, 4000, 40, (2.8 if fast else 2.5) + jitter]])
    early = check_claims(spec, read_at(views, At("tokens", 1500), curves)).cells[0]
    late = check_claims(spec, read_at(views, At("tokens", 4000), curves)).cells[0]
    assert early.comparison.effect == pytest.approx(0.5) and early.verdict == "holds"
    assert late.comparison.effect == pytest.approx(-0.3) and late.verdict == "reversed"


@pytest.mark.parametrize("text, expected", [("tokens=50M", At("tokens", 5e7)), ("flops=1e15", At("flops", 1e15)),
                                            ("seconds=10m", At("seconds", 600.0)), ({"steps": 500}, At("steps", 500))])
def test_the_budget_is_spelled_as_the_budget_block_spells_it(text, expected):
    assert parse_at(text) == expected


@pytest.mark.parametrize("text, message", [("tokens", "KIND=AMOUNT"), ("token=5M", "must be one of"),
                                           ("tokens=-5", "must be positive"), ("tokens=5x", "not a count"),
                                           ({"tokens": 1, "steps": 2}, "exactly one")])
def test_a_malformed_budget_says_how_to_write_it(text, message):
    with pytest.raises(ValueError, match=message):
        parse_at(text)


def test_the_spec_checks_report_at_and_keeps_reading_settings_out_of_its_fingerprint():
    base = {"name": "s", "dataset": {"source": "ablate:tinystories"}, "budget": {"steps": 10, "hardware": "cpu"}}
    plain = SweepSpec.model_validate(base)
    read = SweepSpec.model_validate({**base, "report": {"at": {"flops": "1e15"}, "group": ["architecture"],
                                                        "min_steps": 5}})
    assert read.fingerprint() == plain.fingerprint()  # how runs are read is not which runs exist
    with pytest.raises(ValueError, match=r"report\.at"):
        SweepSpec.model_validate({**base, "report": {"at": {"flop": 1}}})


@pytest.mark.parametrize("budget", ["tokens=300", "tokens=10", "tokens=1M", "steps=8", "steps=16", "seconds=5s",
                                    "flops=1e9"])
def test_the_points_around_a_budget_read_as_every_point_does(tmp_path, db_url, budget):
    """The database picks each run's points on either side of the budget (points_around); read at it, they give
    the losses, statuses and steps that all of the run's points give, on both backends."""
    from ablate import store
    from ablate.results.points import points_around, run_points
    from ablate.results.views import load_views
    from tests.report.test_report_scale import fake_sweep, grid

    url, _ = fake_sweep(tmp_path, "near", grid([32, 64], [1e-3], 2), points=20, url=db_url)
    engine = store.reader(url)
    _, views = load_views(engine, "near")
    ids = [v.row.id for v in views]
    at = parse_at(budget)
    every, near = read_at(views, at, run_points(engine, ids)), read_at(views, at, points_around(engine, ids, at.kind,
                                                                                                 at.amount))
    assert [(v.row.status, v.row.final_train_loss, v.row.final_eval_loss, v.row.steps_read) for v in near] == \
           [(v.row.status, v.row.final_train_loss, v.row.final_eval_loss, v.row.steps_read) for v in every]
    assert sum(len(p) for p in points_around(engine, ids, at.kind, at.amount).values()) <= 3 * 2 * len(ids)
    if budget == "tokens=300":  # between two eval points of every run: an interpolated number, not a refusal
        assert all(v.row.final_eval_loss is not None and v.row.final_train_loss is not None for v in near)
