"""A results DB for the dashboard's tests, registered for real (runner.register) with curves written through the
trainer's own writer (store.write_metrics): sweep `widths` (mixer and llama at two widths, two seeds, one run still
training, one failed), and a second sweep whose name, description and error text are hostile HTML."""

from __future__ import annotations

import numpy as np
from pathlib import Path

import pytest
import yaml

from ablate import runner, store

REPO = Path(__file__).resolve().parents[2]
HOSTILE = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'


def spec_file(tmp_path: Path, name: str) -> Path:
    data = yaml.safe_load((REPO / "sweeps" / "smoke.yaml").read_text())
    data.update({"name": name, "budget": {"steps": 400, "hardware": "cpu"},
                 "description": "Synthetic curves for the dashboard tests: mixer vs Llama at two widths, two seeds.",
                 "grid": [{"architecture": "mixer", "d_model": [32, 64], "seeds": 2},
                          {"architecture": "llama", "heads": 4, "d_model": [32, 64], "seeds": 2}]})
    data["report"].pop("prompt", None)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def loss(arch: str, d_model: int, seed: int, step: int) -> float:
    """A falling curve per configuration: wider and llama lower, seeds a little apart."""
    floor = 2.0 - 0.004 * d_model - (0.3 if arch == "llama" else 0.0) + 0.04 * seed
    return floor + 3.0 * np.exp(-np.asarray(step) / 120)


def write_curve(engine, run_id: int, arch: str, d_model: int, seed: int, steps: range) -> None:
    rows = []
    for step in steps:
        for split in ("train", "eval") if step % 40 == 0 else ("train",):
            rows.append({"step": step, "split": split, "elapsed_seconds": step * 0.05, "tokens": step * 1024,
                         "loss": float(loss(arch, d_model, seed, step)) + (0.05 if split == "eval" else 0.0), "lr": 1e-3})
    store.write_metrics(engine, run_id, rows)


def build(url: str, tmp: Path) -> dict:
    """The dashboard's DB at `url`: its URL, the `widths` runs by id, the hostile sweep's name and its failed run."""
    _, _, ids = runner.register(spec_file(tmp, "widths"), url)
    engine = store.connect(url)
    runs = {}
    for rid in ids:
        run = store.get_run(engine, rid)
        runs[rid] = run
        last = 200 if rid == ids[-1] else 400  # the last run is still training
        write_curve(engine, rid, run.architecture, run.d_model, run.seed, range(0, last + 1, 2))
        if rid == ids[-1]:
            store.update_run(engine, rid, status="running")
        else:
            store.update_run(engine, rid, status="completed", steps=400, tokens=400 * 1024, params=1000 * run.d_model,
                             flops_per_token=6000.0 * run.d_model, epochs=0.25,
                             final_train_loss=float(loss(run.architecture, run.d_model, run.seed, 400)),
                             final_eval_loss=float(loss(run.architecture, run.d_model, run.seed, 400)) + 0.05)
    _, _, bad = runner.register(spec_file(tmp, "hostile"), url)
    store.update_run(engine, bad[0], status="failed", error=f"RuntimeError: {HOSTILE}\ntraceback line 2")
    with engine.begin() as conn:
        conn.execute(store.Sweep.__table__.update().where(store.Sweep.name == "hostile")
                     .values(name=f"hostile {HOSTILE}", description=f"about {HOSTILE}"))
    add_search(url)
    return {"url": url, "ids": ids, "runs": runs, "hostile": f"hostile {HOSTILE}", "failed": bad[0]}


def add_search(url: str) -> None:
    """An Optuna study `tiny-search` in the DB (Optuna's own tables): two completed trials and a pruned one (its value: the
    last it reported)."""
    import optuna
    from optuna.trial import TrialState

    from ablate import search
    from ablate.config import parse_spec
    from tests.search.test_search import tiny

    study = search.create_study(parse_spec(tiny()), url)
    dists = {"heads": optuna.distributions.CategoricalDistribution([1, 2, 4]),
             "lr": optuna.distributions.FloatDistribution(1e-4, 3e-2, log=True)}
    for i, (heads, lr, value) in enumerate([(4, 1e-3, 4.1), (2, 3e-3, 3.6)]):
        study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, params={"heads": heads, "lr": lr},
                                                  distributions=dists, value=value, user_attrs={"run_id": i + 1}))
    study.enqueue_trial({"heads": 1, "lr": 1e-2})  # pruned as a search prunes: Optuna keeps its last report as value
    trial = study.ask(fixed_distributions=dists)
    trial.set_user_attr("run_id", 3)
    trial.report(5.2, step=100)
    study.tell(trial, state=TrialState.PRUNED)


@pytest.fixture(scope="module")
def ui_db(tmp_path_factory) -> dict:
    """The dashboard's DB on SQLite, shared by a test module (a test that writes to it writes to its own run)."""
    tmp = tmp_path_factory.mktemp("ui")
    return {**build(f"sqlite:///{tmp / 'r.db'}", tmp), "path": tmp / "r.db"}


@pytest.fixture
def client(ui_db):
    """The dashboard over `ui_db` through FastAPI's test client (a loopback host, no token)."""
    from fastapi.testclient import TestClient

    from ablate.ui.app import make_app

    return TestClient(make_app(store.reader(ui_db["url"])), base_url="http://127.0.0.1")
