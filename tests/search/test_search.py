"""Optuna searches for real: a tiny Llama search on the embedded sample, pruning, resume, concurrent workers, crashes."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from ablate import runner, search, store
from ablate.config.errors import AblateError, SpecError
from ablate.config import parse_spec
from tests.waiting import patience, wait_until

REPO = Path(__file__).resolve().parents[2]

TINY = {
    "name": "tiny-search",
    "dataset": {"source": "ablate:tinystories-sample", "eval": {"holdout": 16}},
    "tokenizer": {"vocab_size": 384},
    "budget": {"steps": 20, "hardware": "cpu"},
    "eval": {"at": [0.25, 0.5, 0.75]},
    "defaults": {"architecture": "llama", "d_model": 32, "layers": 1, "heads": 2, "context": 64, "batch_size": 8,
                 "lr": 1.0e-3, "precision": "fp32"},
    "search": {
        "parameters": {
            "heads": {"type": "categorical", "choices": [1, 2, 4]},
            "lr": {"type": "float", "low": 1.0e-4, "high": 3.0e-2, "log": True},
        },
        "sampler": "tpe",
        "pruner": "median",
        "n_trials": 3,
    },
}


def tiny(**changes) -> dict:
    data = yaml.safe_load(yaml.safe_dump(TINY))
    for key, value in changes.items():
        if key in ("n_trials", "sampler", "pruner", "parameters", "base"):
            data["search"][key] = value
        else:
            data[key] = value
    return data


def write_spec(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def study_of(url: str, name: str = "tiny-search") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=search.open_storage(url))


def runs_of(url: str, name: str = "tiny-search") -> list[store.Run]:
    return runner.sweep_runs(store.connect(url), name)


# ---------------------------------------------------------------- sampling and checks (fast)


def test_sampled_trial_is_defaults_plus_base_plus_params_and_respects_when():
    data = tiny(parameters={
        "architecture": {"type": "categorical", "choices": ["llama", "mixer"]},
        "heads": {"type": "categorical", "choices": [2, 4], "when": {"architecture": "llama"}},
        "options.expand": {"type": "int", "low": 1, "high": 2, "when": {"architecture": "mixer"}},
        "lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
    }, base={"layers": 2, "heads": None})
    spec = parse_spec(data)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(12):
        trial = study.ask()
        config = search.suggest_trial(trial, spec)
        study.tell(trial, 1.0)
        assert config.layers == 2 and config.d_model == 32 and config.budget.steps == 20
        assert config.lr == trial.params["lr"]
        if config.architecture == "llama":
            assert config.heads in (2, 4) and "options.expand" not in trial.params
        else:
            assert config.heads is None and "heads" not in trial.params
            assert config.options == {"expand": trial.params["options.expand"]}
        seen.add(config.architecture)
    assert seen == {"llama", "mixer"}


def test_search_block_problems_are_named_with_their_key_paths():
    bad = tiny(sampler="grid", base={"dataset": "x", "layer": 2}, parameters={
        "heads": {"type": "categorical", "choices": [1, 2], "when": {"lrr": 1}},
        "lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
    })
    with pytest.raises(SpecError) as err:
        search.check_search(parse_spec(bad), "s.yaml")
    text = str(err.value)
    for part in ("search.base.dataset", "search.base: unknown trial field 'layer'", "did you mean 'layers'",
                 "search.parameters.heads.when: 'lrr'", "search.parameters.lr: the grid sampler needs choices"):
        assert part in text, part
    with pytest.raises(AblateError, match="no `search:` block"):
        search.check_search(parse_spec({k: v for k, v in TINY.items() if k != "search"}))


def test_grid_sampler_enumerates_choices_and_steps_and_caps_n_trials():
    spec = parse_spec(tiny(sampler="grid", n_trials=50, parameters={
        "heads": {"type": "categorical", "choices": [1, 2, 4]},
        "layers": {"type": "int", "low": 1, "high": 2, "step": 1},
    }))
    assert search.grid_space(spec.search) == {"heads": [1, 2, 4], "layers": [1, 2]}
    assert search.planned_trials(spec.search) == 6
    assert isinstance(search.make_sampler(spec.search, 0), optuna.samplers.GridSampler)


@pytest.mark.parametrize(("sampler", "pruner", "sampler_cls", "pruner_cls"), [
    ("tpe", "median", optuna.samplers.TPESampler, optuna.pruners.MedianPruner),
    ("random", "hyperband", optuna.samplers.RandomSampler, optuna.pruners.HyperbandPruner),
    ("cmaes", "none", optuna.samplers.CmaEsSampler, optuna.pruners.NopPruner),
])
def test_samplers_and_pruners_by_name(sampler, pruner, sampler_cls, pruner_cls):
    spec = parse_spec(tiny(sampler=sampler, pruner=pruner))
    search.check_search(spec)
    assert isinstance(search.make_sampler(spec.search, 0), sampler_cls)
    assert isinstance(search.make_pruner(spec.search, 3), pruner_cls)
    # the sampler really samples valid trials (CMA-ES needs the cmaes package: a dependency)
    study = optuna.create_study(sampler=search.make_sampler(spec.search, 0))
    for i in range(4):
        trial = study.ask()
        config = search.suggest_trial(trial, spec)
        assert spec.search.parameters["lr"].low <= config.lr <= spec.search.parameters["lr"].high
        study.tell(trial, float(i))


def test_a_failed_trial_counts_unless_it_was_requeued():
    study = optuna.create_study()
    for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL):
        study.add_trial(optuna.trial.create_trial(state=state, value=1.0 if state == TrialState.COMPLETE else None))
    assert search.trials_counted(study.get_trials()) == 3
    search.requeue(study, study.trials[2])
    retry = study.trials[3]
    assert retry.state == TrialState.WAITING and retry.system_attrs["retry_history"] == [2]
    assert search.trials_counted(study.get_trials()) == 2  # the FAIL is replaced by its (queued) retry


def test_a_dead_workers_trial_is_failed_requeued_and_its_finished_run_told(sqlite_url, tmp_path, artifacts):
    """The worker died after its trainer finished: the retry maps to the same run row and is told from it."""
    spec = parse_spec(tiny(n_trials=1))
    storage = search.open_storage(sqlite_url, create=True, heartbeat_seconds=1, grace_seconds=1)
    search.create_study(spec, sqlite_url, storage=storage)
    study = search.load_study(spec, storage, seed=0)
    engine = store.connect(sqlite_url)
    trial = search.claim(study, storage, engine, n_trials=1)  # the worker that will die
    config = search.suggest_trial(trial, spec)
    _, (run_id,) = store.register_sweep(engine, spec, [config])
    store.update_run(engine, run_id, study_name=spec.name, study_trial=trial.number, status="completed",
                  final_eval_loss=4.25)  # its trainer finished on its own
    time.sleep(2.5)  # past the grace period (SQLite's clock has 1 s resolution)
    outcomes = search.run_search(spec, sqlite_url, runner.LaunchOptions(artifacts=artifacts), n_trials=1,
                                 heartbeat_seconds=1, grace_seconds=1)
    assert [(o.number, o.state, o.run_id, o.value) for o in outcomes] == [(1, "COMPLETE", run_id, 4.25)]
    dead, retry = study_of(sqlite_url).trials
    assert dead.state == TrialState.FAIL and retry.params == dead.params
    assert retry.system_attrs["retry_history"] == [0]
    (run,) = runs_of(sqlite_url)
    assert (run.id, run.study_trial, run.attempts) == (run_id, 1, 0)  # told from the row, never trained again


def _a_worker_trains(spec, sqlite_url, storage, heartbeat_at):
    """Another worker's trial, RUNNING in the study, its run `running` on another host, beaten at `heartbeat_at`."""
    study = search.load_study(spec, storage, seed=0)
    engine = store.connect(sqlite_url)
    trial = search.claim(study, storage, engine, n_trials=1)
    _, (run_id,) = store.register_sweep(engine, spec, [search.suggest_trial(trial, spec)])
    trial.set_user_attr("run_id", run_id)
    store.update_run(engine, run_id, study_name=spec.name, study_trial=trial.number, status="running",
                     claimed_by="elsewhere:4242:cafe", host="elsewhere", heartbeat_at=heartbeat_at)
    return study, trial, run_id


def test_a_dead_workers_trial_is_taken_over_when_its_trainer_heartbeat_is_stale(sqlite_url, artifacts):
    """Its worker died mid-trial: the survivor, finding n_trials counted, does not end the search with that trial
    RUNNING; the run's stale heartbeat (the sweeps' rule, long before Optuna's grace period) hands it over."""
    spec = parse_spec(tiny(n_trials=1))
    storage = search.open_storage(sqlite_url, create=True)
    search.create_study(spec, sqlite_url, storage=storage)
    stale = store.utcnow() - dt.timedelta(seconds=store.stale_seconds() + 60)
    study, trial, run_id = _a_worker_trains(spec, sqlite_url, storage, stale)
    outcomes = search.run_search(spec, sqlite_url, runner.LaunchOptions(artifacts=artifacts), n_trials=1)
    assert [(o.number, o.state, o.run_id) for o in outcomes] == [(1, "COMPLETE", run_id)]
    dead, retry = study_of(sqlite_url).trials
    assert dead.state == TrialState.FAIL and retry.params == dead.params and retry.state == TrialState.COMPLETE
    (run,) = runs_of(sqlite_url)
    assert run.status == "completed" and run.attempts == 1  # trained once, here


def test_a_search_ends_only_when_a_live_workers_last_trial_has_finished(sqlite_url, artifacts):
    spec = parse_spec(tiny(n_trials=1))
    storage = search.open_storage(sqlite_url, create=True)
    search.create_study(spec, sqlite_url, storage=storage)
    study, trial, run_id = _a_worker_trains(spec, sqlite_url, storage, store.utcnow())
    engine = store.connect(sqlite_url)
    told = threading.Event()

    def the_other_worker() -> None:  # beats its run, then finishes and tells its trial
        for _ in range(4):
            store.update_run(engine, run_id, heartbeat_at=store.utcnow())
            time.sleep(1)
        store.update_run(engine, run_id, status="completed", final_eval_loss=4.5, finished_at=store.utcnow())
        study.tell(trial, 4.5)
        told.set()

    other = threading.Thread(target=the_other_worker)
    other.start()
    outcomes = search.run_search(spec, sqlite_url, runner.LaunchOptions(artifacts=artifacts), n_trials=1)
    finished = told.is_set()
    other.join()
    assert outcomes == [] and finished  # it waited for the trial, trained nothing itself
    assert [t.state for t in study_of(sqlite_url).trials] == [TrialState.COMPLETE]


def test_a_trial_whose_config_is_already_training_follows_that_run(sqlite_url, artifacts):
    """Two trials with one config (a categorical space, parallel workers) share one run; no second trainer starts."""
    spec = parse_spec(tiny(n_trials=1, sampler="random", parameters={"heads": {"type": "categorical", "choices": [2]}}))
    search.create_study(spec, sqlite_url)
    engine = store.connect(sqlite_url)
    config = search.suggest_trial(optuna.create_study().ask(), spec)
    _, (run_id,) = store.register_sweep(engine, spec, [config])
    trainer = subprocess.Popen(["sleep", "60"])  # stands in for the trainer another worker started
    store.claim_run(engine, run_id, "test")
    store.update_run(engine, run_id, pid=trainer.pid)

    def finish() -> None:  # ... which finishes a moment later
        time.sleep(1.5)
        store.update_run(engine, run_id, status="completed", final_eval_loss=3.5)
        trainer.kill()
        trainer.wait()

    threading.Thread(target=finish).start()
    outcomes = search.run_search(spec, sqlite_url, runner.LaunchOptions(artifacts=artifacts), poll_seconds=0.2)
    assert [(o.number, o.state, o.run_id, o.value) for o in outcomes] == [(0, "COMPLETE", run_id, 3.5)]
    run = store.get_run(engine, run_id)
    assert (run.attempts, run.study_trial) == (1, 0)


def test_search_report_writes_best_trial_importances_and_plots(sqlite_url, tmp_path):
    from ablate.cli import main

    spec = parse_spec(tiny())
    study = search.create_study(spec, sqlite_url)
    dists = {"heads": optuna.distributions.CategoricalDistribution([1, 2, 4]),
             "lr": optuna.distributions.FloatDistribution(1e-4, 3e-2, log=True)}
    for i, (heads, lr, loss) in enumerate([(1, 1e-3, 4.1), (2, 3e-3, 3.6), (4, 1e-2, 3.9), (2, 2e-4, 5.2)]):
        state = TrialState.PRUNED if loss > 5 else TrialState.COMPLETE
        study.add_trial(optuna.trial.create_trial(
            state=state, params={"heads": heads, "lr": lr}, distributions=dists,
            value=None if state == TrialState.PRUNED else loss, user_attrs={"run_id": i + 1},
            intermediate_values={1: loss + 1, 2: loss + 0.5}))
    out = tmp_path / "report"
    assert main(["search", "report", "tiny-search", "--db", sqlite_url, "--out", str(out)]) == 0
    for name in ("summary.md", "trials.csv", "optimization_history.png", "slice.png", "intermediate_values.png"):
        assert (out / name).stat().st_size > 0, name
    rep = search.build_search_report("tiny-search", sqlite_url, out)
    assert rep.best == {"number": 1, "value": 3.6, "params": {"heads": 2, "lr": 3e-3}, "run_id": 2}
    assert rep.counts == {"COMPLETE": 3, "PRUNED": 1}
    if rep.importances:  # when Optuna's default evaluator can rank them from 3 trials
        assert set(rep.importances) == {"heads", "lr"} and (out / "param_importances.png").exists()
    assert "Best: trial 1 (run 2)" in (out / "summary.md").read_text()
    with pytest.raises(AblateError, match="no search study named 'tiny-serch'.*did you mean 'tiny-search'"):
        search.build_search_report("tiny-serch", sqlite_url, out)


# ---------------------------------------------------------------- real searches


JOIN = """
SELECT r.id, r.status, r.final_eval_loss, t.number, t.state, v.value
FROM runs r
JOIN studies s ON s.study_name = r.study_name
JOIN trials t ON t.study_id = s.study_id AND t.number = r.study_trial
LEFT JOIN trial_values v ON v.trial_id = t.trial_id
WHERE r.study_name = 'tiny-search' ORDER BY t.number
"""


@pytest.mark.slow
def test_search_flow_prunes_and_a_stopped_study_finishes_only_what_is_left(prefect_api, sqlite_url, tmp_path,
                                                                           artifacts):
    from ablate.results import read_only_query
    from flows.search import search as search_flow

    # seed 4: trials 0 and 1 draw good learning rates (the median pruner's startup trials), 2 and 5 tiny ones.
    # 300 steps: a trial must still be training when the pruner reads its first eval (20 steps finished in
    # less than one poll on an idle machine, and nothing was pruned)
    budget = {"steps": 300, "hardware": "cpu"}
    spec = write_spec(tmp_path, tiny(n_trials=3, budget=budget))
    kwargs = {"spec": str(spec), "db_url": sqlite_url, "artifacts": str(artifacts), "seed": 4, "poll_seconds": 0.2}
    first = search_flow(**kwargs)
    assert sorted(first) == [0, 1, 2]
    before = {r.id: (r.study_trial, r.attempts, r.started_at, r.status) for r in runs_of(sqlite_url)}
    assert len(before) == 3

    # the study was stopped after 3 trials; asked for 6, it runs trials 3, 4, 5 and leaves 0, 1, 2 alone
    spec.write_text(yaml.safe_dump(tiny(n_trials=6, budget=budget)))
    second = search_flow(**kwargs)
    assert sorted(second) == [3, 4, 5]
    runs = runs_of(sqlite_url)
    assert len(runs) == 6 and len({r.fingerprint for r in runs}) == 6
    assert {r.id: (r.study_trial, r.attempts, r.started_at, r.status) for r in runs if r.id in before} == before
    assert sorted(r.study_trial for r in runs) == list(range(6))

    study = study_of(sqlite_url)
    states = [t.state for t in study.trials]
    assert len(states) == 6 and TrialState.RUNNING not in states and TrialState.WAITING not in states
    assert states.count(TrialState.PRUNED) >= 1 and states.count(TrialState.COMPLETE) >= 2
    pruned = [t for t in study.trials if t.state == TrialState.PRUNED]
    assert all(t.intermediate_values and max(t.intermediate_values) <= 3 for t in pruned)

    columns, rows = read_only_query(JOIN, sqlite_url)
    assert len(rows) == 6
    for row in map(dict, (zip(columns, r) for r in rows)):
        expected = {"completed": "COMPLETE", "pruned": "PRUNED"}.get(row["status"], "FAIL")
        assert row["state"] == expected, row
        if row["state"] == "COMPLETE":
            assert row["value"] == pytest.approx(row["final_eval_loss"])
        if row["state"] == "PRUNED":
            assert row["final_eval_loss"] is None  # stopped before its final eval
    assert {r.status for r in runs} <= {"completed", "pruned"}


@pytest.mark.slow
def test_search_deployment_is_registered_for_specs_with_a_search_block(prefect_api, tmp_path):
    from prefect.client.orchestration import get_client

    from flows.deploy import deploy_all

    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    write_spec(sweeps, tiny())
    names = deploy_all(sweeps, db_url="sqlite:///x.db", source=REPO)
    assert names == ["trial/cpu", "sweep/tiny-search", "search/tiny-search"]
    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name("search/tiny-search")
    assert dep.work_pool_name == "cpu" and dep.parameters["spec"].endswith("tiny-search.yaml")


@pytest.mark.slow
def test_two_workers_on_one_study_make_exactly_n_trials(db_url, tmp_path, artifacts):
    """One worker in this process, one `ablate search run` process, on SQLite and on PostgreSQL."""
    spec = write_spec(tmp_path, tiny(n_trials=3))
    search.create_study(parse_spec(yaml.safe_load(spec.read_text())), db_url, spec_path=str(spec))  # once, first
    other = subprocess.Popen([sys.executable, "-m", "ablate.cli", "search", "run", str(spec), "--db", db_url,
                              "--artifacts", str(artifacts)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:  # both with the default seed: trial n samples with seed + n, whichever worker asks for it
        # this worker starts once the other has asked for its first trial: that one starts in a fresh process
        # (seconds of imports), and on a busy machine this one could otherwise run all three before it asks
        wait_until(lambda: other.poll() is not None or study_of(db_url).trials, 120, "the other worker's first trial")
        here = search.run_search(spec, db_url, runner.LaunchOptions(artifacts=artifacts), poll_seconds=0.2)
        out, _ = other.communicate(timeout=patience(300))
    finally:
        other.kill()
    assert other.returncode == 0, out
    there = [line for line in out.splitlines() if line.startswith("trial ")]
    assert here and there, out  # both workers ran trials
    assert len(here) + len(there) == 3
    study = study_of(db_url)
    assert [t.number for t in study.trials] == [0, 1, 2]
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in study.trials)
    runs = runs_of(db_url)
    assert sorted(r.study_trial for r in runs) == [0, 1, 2] and len({r.fingerprint for r in runs}) == 3
    assert not list(tmp_path.rglob("*.lock"))  # the SQLite study lock left no file beside the results DB


def test_the_study_lock_excludes_other_processes_and_leaves_no_file(tmp_path):
    """Four processes take the lock 25 times each and append to a file while holding it: no two inside at once
    (each append reads the count it increments), and nothing is left beside the DB."""
    path = tmp_path / "r.db.search-s.lock"
    code = ("import sys\nfrom pathlib import Path\nfrom ablate.search.claims import vanishing_lock\n"
            "count = Path(sys.argv[2])\n"
            "for _ in range(25):\n"
            "    with vanishing_lock(Path(sys.argv[1]), timeout=60):\n"
            "        n = int(count.read_text() or 0)\n"
            "        count.write_text(str(n + 1))\n")
    count = tmp_path / "count"
    count.write_text("0")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), str(count)]) for _ in range(4)]
    assert [p.wait(timeout=patience(120)) for p in procs] == [0] * 4
    assert count.read_text() == "100" and not path.exists()


@pytest.mark.slow
def test_a_trial_whose_trainer_fails_is_fail_and_the_study_goes_on(sqlite_url, tmp_path, artifacts):
    from ablate.train.state import TrainerSettings, run_dir

    spec = parse_spec(tiny(n_trials=2, parameters={"lr": {"type": "float", "low": 1.0e-4, "high": 3.0e-2, "log": True}}))
    study = search.create_study(spec, sqlite_url)
    # the first trial's run finds an unreadable checkpoint in its run directory: its trainer fails at start-up
    doomed = search.suggest_trial(optuna.trial.FixedTrial({"lr": 1e-3}), spec)
    run_id = search.register_trial(store.connect(sqlite_url), spec, doomed, None)
    settings = TrainerSettings(artifacts=artifacts, run_id=run_id, db_url=sqlite_url)
    checkpoint = run_dir(settings, doomed) / "checkpoint.pt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"not a checkpoint")
    study.enqueue_trial({"lr": 1e-3})
    study.enqueue_trial({"lr": 3e-3})
    outcomes = search.run_search(spec, sqlite_url, runner.LaunchOptions(artifacts=artifacts), poll_seconds=0.2)
    assert (outcomes[0].number, outcomes[0].state, outcomes[0].run_status) == (0, "FAIL", "failed")
    assert outcomes[1].number == 1 and outcomes[1].state in ("COMPLETE", "PRUNED")
    crashed = study_of(sqlite_url).trials[0]
    assert crashed.state == TrialState.FAIL and "checkpoint" in crashed.user_attrs["error"].lower()
    assert {r.study_trial: r.status for r in runs_of(sqlite_url)}[0] == "failed"


def test_search_run_takes_overrides_as_plan_and_sweep_run_do(sqlite_url, tmp_path, artifacts, capsys):
    """`ablate search run SPEC KEY=VALUE` was refused though any field can be overridden: the search runs the
    changed spec under the changed name, and records the file it came from."""
    import sqlalchemy as sa

    from ablate.cli import main

    path = write_spec(tmp_path, tiny(n_trials=1))
    assert main(["search", "run", str(path), "budget.steps=4", "--n-trials", "1", "--artifacts", str(artifacts),
                 "--db", sqlite_url]) == 0
    assert "search tiny-search-budget-steps-4: 1 trials" in capsys.readouterr().out
    (run,) = runs_of(sqlite_url, "tiny-search-budget-steps-4")
    assert run.steps == 4
    with store.connect(sqlite_url).connect() as conn:
        sweep = conn.execute(sa.select(store.Sweep.name, store.Sweep.spec_path)).one()
    assert tuple(sweep) == ("tiny-search-budget-steps-4", str(path))
