"""An adaptive sweep's rounds on simulated results (no training: each run's loss is written as if trained): the
first round decides the obvious claim, the next rounds add seeds only to the undecided claim's cells, a replay adds
and records nothing, two runners at a round boundary add each seed once, a compute cap ends the race, and the
report's and the dashboard's claims read the race's verdicts."""

from __future__ import annotations

import random

import pytest
import sqlalchemy as sa
import yaml

from ablate import runner, store
from ablate.runner.race import next_round
from tests.helpers import at_once

SPEC = {
    "name": "race",
    "dataset": {"source": "ablate:tinystories-sample"},
    "budget": {"steps": 100, "hardware": "cpu"},
    "defaults": {"architecture": "mixer", "layers": 1, "context": 64, "batch_size": 8, "lr": 3e-3},
    "grid": [{"d_model": [8, 64]}, {"d_model": 16, "lr": [3e-3, 3.03e-3]}],
    "adaptive": {"seeds": {"min": 2, "max": 6}},
    "report": {"orderings": [
        {"claim": "wider is better", "better": {"d_model": 64}, "worse": {"d_model": 8}},
        {"claim": "lr 1% apart", "better": {"lr": 3e-3}, "worse": {"lr": 3.03e-3}}]},
}
MEANS = {8: 6.2, 64: 5.1, 16: 6.1}  # the lr claim has no true difference
# seed spread by d_model: the wider claim obvious at its first look (2 seeds a side) whatever its seeds' spreads
# (where one side's spread dominates, Welch at 2 seeds has 1 degree of freedom and a calibrated level:
# ablate/results/calibration.py), the lr claim's sides 0.02 nats apart seed to seed
NOISE = {8: 0.002, 64: 0.002, 16: 0.02}


def register(tmp_path, url, **adaptive):
    data = {**SPEC, "adaptive": {**SPEC["adaptive"], **adaptive}}
    path = tmp_path / "race.yaml"
    path.write_text(yaml.safe_dump(data))
    return runner.register(path, url)


def train(url, seconds: float = 60.0, means: dict[int, float] = MEANS, noise: dict[int, float] = NOISE):
    """Every pending run 'trains': its loss drawn around its cell's mean (seeded by run, so replays agree)."""
    engine = store.connect(url)
    with engine.begin() as conn:
        for r in conn.execute(sa.select(store.Run.id, store.Run.d_model, store.Run.seed)
                              .where(store.Run.status == "pending")).all():
            loss = means[r.d_model] + random.Random(r.id * 7919).gauss(0, noise.get(r.d_model, 0.02))
            conn.execute(sa.update(store.Run).where(store.Run.id == r.id).values(
                status="completed", final_eval_loss=loss, final_train_loss=loss, steps=100, train_seconds=seconds))


def seeds_of(url) -> dict[int, list[int]]:
    with store.connect(url).connect() as conn:
        rows = conn.execute(sa.select(store.Run.d_model, store.Run.lr, store.Run.seed)).all()
    out: dict = {}
    for r in rows:
        out.setdefault((r.d_model, round(r.lr, 6)), []).append(r.seed)
    return {k: sorted(v) for k, v in sorted(out.items())}


def test_rounds_add_seeds_only_where_a_claim_is_undecided_and_a_replay_changes_nothing(tmp_path, any_url):
    register(tmp_path, any_url)
    train(any_url)
    state = next_round(store.connect(any_url), "race")
    assert state.over is None and len(state.owed) == 2  # seed 2 of each lr cell
    assert any("wider is better: 64 < 8: holds" in line for line in state.said), state.said
    rounds = 1
    while state.over is None:
        train(any_url)
        state = next_round(store.connect(any_url), "race")
        rounds += 1
    seeds = seeds_of(any_url)
    assert seeds[(8, 0.003)] == seeds[(64, 0.003)] == [0, 1]
    n = len(seeds[(16, 0.003)])
    assert n > 2 and seeds[(16, 0.00303)] == list(range(n))
    engine = store.connect(any_url)
    decisions = [(d.round, d.claim, d.decision) for d in store.read_decisions(engine, runner.sweep_id(engine, "race"))]
    assert decisions[-1][2].startswith("not significant"), decisions
    assert len(decisions) == 1 + n - 1  # the obvious claim once, the other once a round
    again = next_round(engine, "race")  # replayed: the same end, nothing added or recorded
    assert again.over == state.over and not again.owed and not again.said
    assert seeds_of(any_url) == seeds
    runner.register(tmp_path / "race.yaml", any_url)  # registering the spec again keeps the race's seeds
    assert seeds_of(any_url) == seeds


def test_two_runners_at_a_round_boundary_add_each_seed_once(tmp_path, postgres_url):
    register(tmp_path, postgres_url)
    train(postgres_url)
    results, errors = at_once(lambda i: next_round(store.connect(postgres_url), "race"), 2)
    assert not errors, errors
    assert sorted(results[0].owed) == sorted(results[1].owed) and len(results[0].owed) == 2
    assert seeds_of(postgres_url)[(16, 0.003)] == [0, 1, 2]
    engine = store.connect(postgres_url)
    assert len(store.read_decisions(engine, runner.sweep_id(engine, "race"))) == 2  # each decision once


def test_a_compute_cap_ends_the_race_and_says_so(tmp_path, sqlite_url):
    register(tmp_path, sqlite_url, max_gpu_hours=0.1)
    train(sqlite_url, seconds=3600.0)  # 8 runs of an hour each: past the cap after the first round
    state = next_round(store.connect(sqlite_url), "race")
    assert state.over is not None and "max_gpu_hours 0.1 spent" in state.over and not state.owed


def test_the_reports_and_the_dashboards_claims_read_the_race(tmp_path, sqlite_url):
    from ablate.report import build_report
    from ablate.results.study import study as _study

    register(tmp_path, sqlite_url)
    train(sqlite_url)
    next_round(store.connect(sqlite_url), "race")
    train(sqlite_url)
    next_round(store.connect(sqlite_url), "race")  # round 2 looked at: the lr claim still racing
    study = _study(store.reader(sqlite_url), "race")
    verdicts = [row[7] for row in study["claims"]["rows"]]
    assert verdicts[0] == "holds" and verdicts[1].startswith(("racing (after round 2, n=3)", "not significant")), verdicts
    assert "the verdicts of this adaptive sweep are its race's" in study["claims"]["method"]
    rows = study["race"]["rows"]  # each claim's rounds: n a side, |z| against its boundary, the decision
    assert [(row[0][:4], row[1], row[2], row[5]) for row in rows][:2] == [("lr 1", "1", "2/2", "continue"),
                                                                         ("wide", "1", "2/2", "holds")], rows
    assert rows[2][1:3] == ["2", "3/3"] and " : " in rows[2][3], rows
    assert "Lan-DeMets" in study["race"]["method"] and "fixed seeds a cell" in study["race"]["spent"]
    assert ("; 1 of 2 claims decided, at 2 seeds a side on average where 6 fixed seeds test them with at least the "
            "race's power") in study["race"]["spent"], study["race"]["spent"]
    assert "CPU-hours" in study["race"]["spent"] and "GPU" not in study["race"]["spent"]  # hardware: cpu
    report = build_report("race", sqlite_url, out=tmp_path / "rep", formats=("md",))
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "**The race** (adaptive seeds)" in md and "| wider is better: 64 < 8 | 1 | 2/2 |" in md, md
    assert report is not None


def test_a_race_that_decided_no_claim_says_it_saved_nothing():
    """Runs short of report.min_steps (or claims that race to max) decide nothing: the footer says so instead of a
    saving against max fixed seeds."""
    from ablate.report.race import spent_line

    def decided(claim: str, round_: int, n: int, decision: str) -> store.RaceDecision:
        return store.RaceDecision(claim=claim, round=round_, n_better=n, n_worse=n, level=0.05, decision=decision)

    stuck = [decided("a", 0, 0, "continue"), decided("a", 1, 0, "untested"), decided("b", 0, 2, "continue"),
             decided("b", 1, 3, "not significant (stopped for futility at n=3)")]
    said = spent_line([], 10, stuck)
    assert "no claim decided, so nothing was saved: 10 fixed seeds a cell would test every claim" in said, said
    mixed = stuck + [decided("c", 0, 2, "holds"), decided("d", 2, 4, "holds: equal within ±0.01 nats"),
                     decided("e", 3, 5, "undecided: neither equal within ±0.01 nats nor different")]
    assert "; 2 of 5 claims decided, at 3 seeds a side on average where 10" in spent_line([], 10, mixed)


@pytest.mark.parametrize("bad", ["min", "alpha"])
def test_a_bad_block_registers_nothing(tmp_path, sqlite_url, bad):
    from ablate.config.errors import SpecError

    block = {"seeds": {"min": 5, "max": 3}} if bad == "min" else {"seeds": {"min": 2, "max": 4}, "alpha": 0.7}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**SPEC, "adaptive": block}))
    with pytest.raises(SpecError):
        runner.register(path, sqlite_url)
    with store.connect(sqlite_url).connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(store.Sweep)).scalar_one() == 0


def test_best_of_k_eliminates_the_worse_cells_and_races_the_tied_ones_to_max(tmp_path, sqlite_url):
    data = {**SPEC, "grid": [{"d_model": [8, 16, 32, 64]}], "adaptive": {"mode": "best", "seeds": {"min": 2, "max": 5}}}
    del data["report"]  # which cell is lowest needs no orderings
    path = tmp_path / "best.yaml"
    path.write_text(yaml.safe_dump(data))
    runner.register(path, sqlite_url)
    means = {8: 6.2, 16: 5.6, 32: 5.0, 64: 5.0}
    state = None
    while state is None or state.over is None:
        train(sqlite_url, means=means, noise={})  # every cell 0.02 nats seed to seed
        state = next_round(store.connect(sqlite_url), "race")
    seeds = {d: len(s) for (d, _), s in seeds_of(sqlite_url).items()}
    assert seeds[8] == 2 and seeds[16] < 5 and seeds[32] == seeds[64] == 5, seeds  # the worse two stop early
    engine = store.connect(sqlite_url)
    final = {d.claim: d.decision for d in store.read_decisions(engine, runner.sweep_id(engine, "race"))}
    assert final["d_model=8"] == "worse than the best (eliminated at n=2)", final
    assert final["d_model=16"] == f"worse than the best (eliminated at n={seeds[16]})", final
    assert sorted([final["d_model=32"], final["d_model=64"]]) == [
        "among the best (max seeds reached, n=5)", "the best (lowest mean, n=5)"], final
    assert state.over == "max seeds (5) reached"


def test_best_of_k_needs_two_cells(tmp_path, sqlite_url):
    from ablate.config.errors import SpecError

    data = {**SPEC, "grid": [{"d_model": 8}], "adaptive": {"mode": "best"}}
    del data["report"]
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="adaptive.mode: best races the sweep's cells against each other"):
        runner.register(path, sqlite_url)


def test_a_cancel_ends_the_race_and_a_cell_that_gives_no_number_stops_taking_seeds(tmp_path, sqlite_url):
    register(tmp_path, sqlite_url, futility=False)  # the lr claim races on to max
    engine = store.connect(sqlite_url)
    train(sqlite_url)
    with engine.begin() as conn:  # every run of the d_model 8 cell ran out of memory
        conn.execute(sa.update(store.Run).where(store.Run.d_model == 8).values(status="oom", final_eval_loss=None))
    state = next_round(engine, "race")
    assert len(state.owed) == 4  # seed 2 of the lr cells and of both sides of the untested claim
    with engine.begin() as conn:
        conn.execute(sa.update(store.Run).where(store.Run.id.in_(state.owed), store.Run.d_model == 8)
                     .values(status="oom"))
    train(sqlite_url)
    state = next_round(engine, "race")
    sid = runner.sweep_id(engine, "race")
    last = {d.claim: d.decision for d in store.read_decisions(engine, sid)}
    assert last["wider is better: 64 < 8"] == "untested", last  # no number again: it takes no more seeds
    assert sorted(seeds_of(sqlite_url)[(8, 0.003)]) == [0, 1, 2] and len(state.owed) == 2
    with engine.begin() as conn:  # the user cancels the round's runs
        conn.execute(sa.update(store.Run).where(store.Run.id.in_(state.owed)).values(status="cancelled"))
    before = seeds_of(sqlite_url)
    state = next_round(engine, "race")
    assert state.over is not None and "were cancelled, so the race adds no seeds" in state.over, state
    assert "--retry-failed" in state.over and not state.owed and seeds_of(sqlite_url) == before


def test_with_a_sesoi_the_flat_claim_races_to_equivalent_and_the_report_says_so(tmp_path, sqlite_url):
    """The lr claim has no true difference (seed spread 0.02 nats): with `report.sesoi: 0.1` it ends equivalent,
    recorded as the race's decision and read by the report, where without one it races to max (the test above)."""
    from ablate.results.study import study as _study

    data = {**SPEC, "report": {**SPEC["report"], "sesoi": 0.1}}
    path = tmp_path / "race.yaml"
    path.write_text(yaml.safe_dump(data))
    runner.register(path, sqlite_url)
    state = None
    while state is None or state.over is None:
        train(sqlite_url)
        state = next_round(store.connect(sqlite_url), "race")
    assert state.over == "every claim is decided", state
    engine = store.connect(sqlite_url)
    final = {d.claim.split(":")[0]: d.decision for d in store.read_decisions(engine, runner.sweep_id(engine, "race"))
             if d.decision != "continue"}
    assert final == {"wider is better": "holds", "lr 1% apart [d_model=16]": "equivalent within ±0.1 nats"}, final
    assert len(seeds_of(sqlite_url)[(16, 0.003)]) < 6  # decided before max
    verdicts = [row[7] for row in _study(store.reader(sqlite_url), "race")["claims"]["rows"]]
    assert verdicts[0] == "holds" and verdicts[1].startswith("equivalent within ±0.1 nats"), verdicts
