"""An adaptive sweep end to end on CPU with real training on the embedded TinyStories sample: a claim that is
obviously true (d_model 64 below d_model 8) stops at `min` seeds; one with no real difference (lr 1% apart) runs on
to futility or `max`. The same decisions on SQLite and PostgreSQL, and again after the race was killed mid-round
and run again (no seed trained twice, each decision recorded once).

The clean race is trained once for the module (each test reads it; a race is 16 runs): PostgreSQL replays its
runs, as `next_round` replays every race from the DB, and the killed race is compared with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from ablate import store
from tests.helpers import cli_env, copy_results
from tests.waiting import Deadline, patience

SPEC = {
    "name": "race",
    "dataset": {"source": "ablate:tinystories-sample", "eval": {"holdout": 24}, "packing": "pad"},
    "tokenizer": {"vocab_size": 512},
    "budget": {"steps": 30, "hardware": "cpu"},
    "eval": {"at": [0.5]},
    "defaults": {"architecture": "mixer", "layers": 1, "context": 64, "batch_size": 8, "lr": 3e-3, "precision": "fp32"},
    "grid": [{"d_model": [8, 64]}, {"d_model": 16, "lr": [3e-3, 3.03e-3]}],
    "adaptive": {"seeds": {"min": 2, "max": 6}},
    "report": {"min_steps": 10, "orderings": [
        {"claim": "wider is better", "better": {"d_model": 64}, "worse": {"d_model": 8}},
        {"claim": "a 1% larger lr changes nothing", "better": {"lr": 3e-3}, "worse": {"lr": 3.03e-3}}]},
}


def write_spec(tmp_path: Path) -> Path:
    path = tmp_path / "race.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    return path


def sweep_run(spec: Path, url: str, art: Path, api: str | None = None, **popen) -> subprocess.Popen:
    """`ablate sweep run`, on the Prefect API `api` (the test process's), else on a local server of its own."""
    env = cli_env(HF_HUB_OFFLINE="1", **({"PREFECT_API_URL": api} if api else {}))
    return subprocess.Popen([sys.executable, "-m", "ablate.cli", "sweep", "run", str(spec), "--db", url, "--artifacts",
                             str(art), "--threads", "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **popen)


def finished(proc: subprocess.Popen) -> str:
    out = proc.communicate(timeout=patience(600))[0]
    assert proc.returncode == 0, out[-4000:]
    return out


def race_of(url: str, sweep: str = "race") -> tuple[list[tuple], dict[tuple, list[int]]]:
    """The sweep's (every decision as (round, claim, n better, n worse, decision), {(d_model, lr): seeds run});
    no run twice."""
    engine = store.connect(url)
    with engine.connect() as conn:
        sweep_id = conn.execute(sa.select(store.Sweep.id).where(store.Sweep.name == sweep)).scalar_one()
        decisions = conn.execute(sa.select(store.RaceDecision.round, store.RaceDecision.claim,
                                           store.RaceDecision.n_better, store.RaceDecision.n_worse,
                                           store.RaceDecision.decision)
                                 .where(store.RaceDecision.sweep_id == sweep_id)
                                 .order_by(store.RaceDecision.round, store.RaceDecision.claim)).all()
        runs = conn.execute(sa.select(store.Run.d_model, store.Run.lr, store.Run.seed, store.Run.status,
                                      store.Run.attempts, store.Run.fingerprint)
                            .where(store.Run.sweep_id == sweep_id)).all()
    assert len({r.fingerprint for r in runs}) == len(runs)
    assert all(r.status == "completed" for r in runs), runs
    seeds: dict[tuple, list[int]] = {}
    for r in runs:
        seeds.setdefault((r.d_model, round(r.lr, 6)), []).append(r.seed)
    return [tuple(d) for d in decisions], {k: sorted(v) for k, v in sorted(seeds.items())}


def check_the_race(decisions: list[tuple], seeds: dict[tuple, list[int]]) -> None:
    wide = [d for d in decisions if d[1].startswith("wider is better")]
    assert wide == [(0, "wider is better: 64 < 8", 2, 2, "holds")], decisions  # decided at min, never looked at again
    assert seeds[(8, 0.003)] == seeds[(64, 0.003)] == [0, 1]  # its cells got no more seeds
    lr = [d for d in decisions if d[1].startswith("a 1% larger lr")]
    assert lr[-1][4].startswith("not significant"), decisions  # futility or max, and said which
    assert [d[4] for d in lr[:-1]] == ["continue"] * (len(lr) - 1)
    n = lr[-1][2]
    assert n > 2 and seeds[(16, 0.003)] == seeds[(16, 0.00303)] == list(range(n))  # ran on, each seed once


@dataclass
class Race:
    spec: Path
    url: str
    art: Path
    decisions: list[tuple]
    seeds: dict[tuple, list[int]]


@pytest.fixture(scope="module")
def clean_race(tmp_path_factory, prefect_server) -> Race:
    """The race trained once, from a clean SQLite DB, for every test here that reads it."""
    tmp = tmp_path_factory.mktemp("race")
    spec, art, url = write_spec(tmp), tmp / "art", f"sqlite:///{tmp / 'clean.db'}"
    finished(sweep_run(spec, url, art, prefect_server))
    return Race(spec, url, art, *race_of(url))


@pytest.mark.slow
def test_a_race_decides_the_obvious_claim_at_min_seeds_and_runs_the_null_one_on(clean_race, tmp_path, prefect_api):
    decisions, seeds, url = clean_race.decisions, clean_race.seeds, clean_race.url
    check_the_race(decisions, seeds)
    print(f"race: {decisions[-1]} after {sum(map(len, seeds.values()))} runs")
    again = finished(sweep_run(clean_race.spec, url, clean_race.art, prefect_api))  # the race is over: trains nothing
    assert race_of(url) == (decisions, seeds), again[-3000:]
    report = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "ablate.cli", "report", "race", "--db", url, "--out", str(report)],
                          env=cli_env(), capture_output=True, text=True, timeout=patience(300))
    assert done.returncode == 0, done.stderr[-3000:]
    md = (report / "report.md").read_text()
    assert "**The race** (adaptive seeds)" in md and "| wider is better: 64 < 8 | 1 | 2/2 |" in md, md
    assert "of the 24 runs" in md and "fixed seeds a cell" in md and "Lan-DeMets" in md


@pytest.mark.slow
def test_the_same_runs_on_postgresql_make_the_same_race(clean_race, postgres_url, prefect_api):
    """The clean race's runs and curves copied into PostgreSQL without its decisions: `sweep run` there replays the
    race from the DB round by round, decides the same, and trains nothing."""
    copy_results(clean_race.url, postgres_url, skip=("race_decisions", "study_cache"))
    trained = metric_ids(postgres_url)
    finished(sweep_run(clean_race.spec, postgres_url, clean_race.art, prefect_api))
    assert race_of(postgres_url) == (clean_race.decisions, clean_race.seeds)
    assert metric_ids(postgres_url) == trained  # no point logged again: nothing trained


def metric_ids(url: str) -> int:
    with store.connect(url).connect() as conn:
        return conn.execute(sa.select(sa.func.count(), sa.func.max(store.Metric.id)).select_from(store.Metric)).one()


@pytest.mark.slow
def test_a_race_killed_mid_round_resumes_to_the_same_decisions(clean_race, tmp_path):
    spec, art = write_spec(tmp_path), tmp_path / "art"
    url = f"sqlite:///{tmp_path / 'killed.db'}"
    proc = sweep_run(spec, url, art, start_new_session=True)
    deadline = Deadline(480)
    while True:  # a second-round seed training: the first round decided, the race mid-way
        deadline.check("no second-round run started")
        time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        if Path(url.removeprefix("sqlite:///")).exists():
            with store.connect(url).connect() as conn:
                if conn.execute(sa.select(store.Run.id).where(store.Run.seed >= 2, store.Run.status == "running")).first():
                    break
    os.killpg(proc.pid, signal.SIGKILL)  # the runner, its Prefect server and the trainer, at once
    proc.communicate()
    finished(sweep_run(spec, url, art))
    decisions, seeds = race_of(url)
    check_the_race(decisions, seeds)
    assert (decisions, seeds) == (clean_race.decisions, clean_race.seeds)  # the clean race's, killed or not
