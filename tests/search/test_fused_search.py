"""A search's parallel trials fused (ablate/search/gate.py): two workers' trials that differ only in lr train as one
group, each trial told its own run's loss, equal to the same trial trained alone; a member its pruner stops leaves
the group alone while the other trains on."""

from __future__ import annotations

import threading

import pytest
from optuna.trial import TrialState

from ablate import runner, search, store
from ablate.config import TrialConfig
from ablate.search import gate
from ablate.search.gate import Gate
from ablate.train import TrainerSettings, train
from tests.search.test_search import runs_of, study_of, tiny, write_spec
from tests.train.test_fused import make_trial, register
from tests.waiting import patience


def test_two_workers_trials_of_one_shape_train_fused_and_each_equals_its_solo_run(sqlite_url, tmp_path, artifacts,
                                                                                monkeypatch):
    """`fuse: shapes`, 2 workers, 4 trials over lr: two groups of two, one trainer each; every trial COMPLETE with
    its own run's final eval loss, and a member's loss equals its trial trained alone (1e-5, fp32 on CPU)."""
    monkeypatch.setattr(gate, "GATHER_SECONDS", patience(30))  # both workers reach the gate, however busy the machine
    data = tiny(n_trials=4, sampler="random", pruner="none",
                parameters={"lr": {"type": "float", "low": 1.0e-4, "high": 3.0e-2, "log": True}})
    spec = write_spec(tmp_path, {**data, "fuse": "shapes"})
    outcomes = search.run_search(spec, sqlite_url, runner.LaunchOptions(artifacts=artifacts, threads=1), workers=2,
                                 poll_seconds=0.2)
    assert sorted(o.number for o in outcomes) == [0, 1, 2, 3]
    study = study_of(sqlite_url)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 4
    runs = runs_of(sqlite_url)
    assert len({r.lr for r in runs}) == 4
    groups = sorted(tuple(r.notes["fused"]["runs"]) for r in runs)
    assert [len(g) for g in groups] == [2] * 4 and len(set(groups)) == 2, groups  # two groups of two
    by_run = {r.id: r for r in runs}
    for t in study.trials:
        assert t.value == by_run[t.user_attrs["run_id"]].final_eval_loss
    member = runs[0]  # the same trial, trained alone
    solo_url = f"sqlite:///{tmp_path / 'solo.db'}"
    trial = TrialConfig.model_validate(member.config)
    [rid] = register(solo_url, [trial])
    train(trial, TrainerSettings(artifacts=artifacts, db_url=solo_url, run_id=rid, progress=False, threads=1))
    alone = store.get_run(store.connect(solo_url), rid).final_eval_loss
    assert abs(alone - member.final_eval_loss) / alone < 1e-5, (alone, member.final_eval_loss)


class PruneAt:
    """Stands in for a trial's EvalFollower: the pruner's word is 'stop' once the run has logged `step` (None:
    never). The gate's part is under test here, not Optuna's pruners (tests/search/test_search.py has those)."""

    def __init__(self, url: str, run_id: int, step: int | None):
        self.url, self.run_id, self.step, self.pruned = url, run_id, step, False

    def should_stop(self) -> bool:
        row = store.get_run(store.connect(self.url), self.run_id)
        if self.step is not None and (row.last_step or 0) >= self.step:
            self.pruned = True
        return self.pruned


@pytest.mark.slow
def test_a_pruned_member_leaves_its_group_alone_and_its_worker_goes_on_at_once(tmp_path, monkeypatch):
    """Two runs at the gate train as one group; the first's pruner stops it at step 20: its row is `pruned` and its
    worker has its answer while the other still trains, which finishes its whole budget. ~15 CPU-s."""
    monkeypatch.setenv("ABLATE_HEARTBEAT_SECONDS", "0.5")  # the trainer drops the pruned member at its next beat
    url = f"sqlite:///{tmp_path / 'gate.db'}"
    ids = register(url, [make_trial(seed, budget={"steps": 2000}) for seed in (0, 1)])
    engine = store.connect(url)
    at = Gate(2, "seeds", engine, gather_seconds=patience(30))
    opts = runner.LaunchOptions(db_url=url, artifacts=tmp_path / "art", threads=1)
    answers: dict[int, tuple[str, str]] = {}

    def worker(rid: int, step: int | None) -> None:
        status = at.train(rid, PruneAt(url, rid, step), opts, poll_seconds=0.2)
        answers[rid] = (status, store.get_run(engine, ids[1]).status)  # and what the other member was doing then

    threads = [threading.Thread(target=worker, args=(rid, step)) for rid, step in zip(ids, (20, None))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(patience(300))
    assert answers[ids[0]] == ("pruned", "running"), answers  # answered while the group trained on
    assert answers[ids[1]][0] == "completed", answers
    pruned, finished = (store.get_run(engine, rid) for rid in ids)
    assert pruned.status == "pruned" and pruned.claimed_by is None and 20 <= pruned.last_step < 2000
    assert finished.steps == 2000 and finished.notes["fused"]["members"] == 2
