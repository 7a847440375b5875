"""The fixed-budget trainer: real training on the TinyStories sample, resume, DDP, outcomes."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
import torch

from ablate import store
from ablate.train.budget import lr_at
from ablate.config.errors import AblateError
from ablate.config import TrialConfig
from ablate.train import TrainerSettings, train
from ablate.train.trainer import Outcome
from tests.waiting import Deadline, patience

REPO = Path(__file__).resolve().parents[2]


def make_trial(**over) -> TrialConfig:
    base = dict(
        architecture="mixer", d_model=32, layers=2, context=64, lr=3e-3, batch_size=8, precision="fp32",
        dataset={"source": "ablate:tinystories-sample", "eval": {"holdout": 16}},
        tokenizer={"vocab_size": 384}, budget={"steps": 30}, eval={"at": [0.5]}, warmup=0.1,
    )
    base.update(over)
    return TrialConfig(**base)


def registered(url: str, trial: TrialConfig) -> int:
    """A run row for `trial` in a one-trial sweep (what the runner hands the trainer)."""
    from ablate.config import parse_spec

    engine = store.connect(url)
    spec = parse_spec({"name": f"t{abs(hash(trial.fingerprint())) % 10_000}", "dataset": trial.dataset.model_dump(),
                       "budget": trial.budget.model_dump(exclude_none=True),
                       "grid": [{"architecture": trial.architecture, "d_model": trial.d_model}],
                       "defaults": {"layers": 1, "context": 8, "lr": 1e-3, "batch_size": 1}})
    _, ids = store.register_sweep(engine, spec, [trial])
    return ids[0]


def metric_rows(url: str, run_id: int, split: str | None = None) -> list:
    engine = store.connect(url)
    q = sa.select(store.Metric).where(store.Metric.run_id == run_id).order_by(store.Metric.split, store.Metric.step)
    if split:
        q = q.where(store.Metric.split == split)
    with engine.connect() as conn:
        return conn.execute(q).all()


def unigram_entropy(tmp_path: Path, trial: TrialConfig) -> float:
    from ablate.data import prepare

    prepared = prepare(trial.dataset, trial.tokenizer, trial.context, tmp_path / "art", progress=False)
    ids, labels = prepared.train.batch(np.arange(len(prepared.train)))
    tokens = labels[labels != -100].numpy()
    p = np.bincount(tokens) / len(tokens)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def test_lr_schedule_finishes_at_the_budget():
    assert lr_at(0.0, 1.0, "linear", 0.1) == 0.0
    assert lr_at(0.1, 1.0, "linear", 0.1) == pytest.approx(1.0)
    assert lr_at(1.0, 1.0, "linear", 0.1) == pytest.approx(0.0)
    assert lr_at(1.0, 1.0, "cosine", 0.1) == pytest.approx(0.0, abs=1e-12)
    assert lr_at(0.5, 1.0, "wsd", 0.1) == 1.0 and lr_at(0.9, 1.0, "wsd", 0.1) == pytest.approx(0.5)


def test_step_budget_trains_records_and_lowers_the_loss(tmp_path, db_url):
    sqlite_url = db_url  # both backends: the trainer records into SQLite and into the real PostgreSQL
    trial = make_trial()
    run_id = registered(sqlite_url, trial)
    out = train(trial, TrainerSettings(artifacts=tmp_path / "art", db_url=sqlite_url, run_id=run_id, progress=False,
                                       log_points=10))
    assert out["status"] == "completed" and out["steps"] == 30
    run = store.get_run(store.connect(sqlite_url), run_id)
    assert run.status == "completed" and run.final_eval_loss == pytest.approx(out["final_eval_loss"])
    assert run.params > 0 and run.tokens == out["tokens"] > 0 and run.flops_per_token > 0
    train_rows = metric_rows(sqlite_url, run_id, "train")
    eval_rows = metric_rows(sqlite_url, run_id, "eval")
    assert [r.step for r in train_rows] == [3, 6, 9, 12, 15, 18, 21, 24, 27, 30]
    assert len(eval_rows) == 2  # one at half the budget, one final
    assert train_rows[-1].loss < train_rows[0].loss - 0.5
    assert math.log(384) > out["final_eval_loss"]
    # beside MFU (which counts real tokens), the share of trained positions that were real, not padding
    assert out["notes"]["real_token_share"] == round(out["tokens"] / (out["samples"] * trial.context), 4) <= 1
    # the outcome is one Outcome: exactly its declared fields, each a column of the run row it was written to
    assert set(out) == set(Outcome.__annotations__) <= set(store.Run.__table__.columns.keys())


@pytest.mark.slow
@pytest.mark.parametrize("arch,extra", [("mixer", {}), ("llama", {"heads": 4})])
def test_twenty_second_wall_clock_run_learns_and_uses_its_budget(tmp_path, sqlite_url, arch, extra):
    # evals early and late: an idle machine makes ~1900 steps (~45 epochs of the 200-story sample, so the
    # final eval is overfit), a loaded one ~250; the best eval shows learning either way
    trial = make_trial(architecture=arch, budget={"wall_clock": "20s"}, d_model=64, context=128,
                       eval={"at": [0.05, 0.1, 0.25, 0.5]}, **extra)
    run_id = registered(sqlite_url, trial)
    out = train(trial, TrainerSettings(artifacts=tmp_path / "art", db_url=sqlite_url, run_id=run_id, progress=False))
    entropy = unigram_entropy(tmp_path, trial)
    assert out["status"] == "completed"
    evals = [r.loss for r in metric_rows(sqlite_url, run_id, "eval")]
    assert len(evals) == 5 and evals[-1] == pytest.approx(out["final_eval_loss"])
    assert min(evals) < math.log(384) - 1.0, (evals, out["steps"])  # far below a uniform guess
    assert out["final_train_loss"] < entropy - 0.5, out  # fits the training text beyond unigram statistics
    if out["steps"] >= 150:  # enough steps to generalise beyond unigram statistics too
        assert min(evals) < entropy - 0.5, (evals, entropy, out["steps"])
    assert abs(out["train_seconds"] - 20.0) / 20.0 < 0.05  # the clock stops at the first step past the budget


def test_bad_dataset_path_fails_before_training(tmp_path, sqlite_url):
    trial = make_trial(dataset={"source": str(tmp_path / "nope.txt")})
    run_id = registered(sqlite_url, trial)
    with pytest.raises(AblateError, match="nope.txt"):
        train(trial, TrainerSettings(artifacts=tmp_path / "art", db_url=sqlite_url, run_id=run_id, progress=False))
    assert metric_rows(sqlite_url, run_id) == []


def test_vocab_larger_than_the_corpus_supports_fails_before_training(tmp_path):
    trial = make_trial(tokenizer={"vocab_size": 60000})
    with pytest.raises(AblateError, match="vocab_size"):
        train(trial, TrainerSettings(artifacts=tmp_path / "art", progress=False))


def test_dead_database_fails_before_training(tmp_path):
    with pytest.raises(AblateError, match="cannot reach the results database"):
        train(make_trial(), TrainerSettings(artifacts=tmp_path / "art", db_url="postgresql+psycopg://postgres@127.0.0.1:1/x",
                                            run_id=1, progress=False))


def test_nan_loss_is_recorded_as_diverged(tmp_path):
    out = train(make_trial(lr=1.0, options={"norm": False, "activation": "none"}, budget={"steps": 40}, warmup=0.0),
                TrainerSettings(artifacts=tmp_path / "art", progress=False, log_points=40))
    assert out["status"] == "diverged", out
    assert "train loss became" in out["error"] and out["final_eval_loss"] is None


def test_memory_cap_is_recorded_as_oom(tmp_path):
    out = train(make_trial(), TrainerSettings(artifacts=tmp_path / "art", progress=False, memory_cap_mb=10))
    assert out["status"] == "oom" and out["peak_memory_mb"] > 10 and "out of memory" in out["error"]


def test_memory_probe_records_peak_memory(tmp_path):
    out = train(make_trial(mode="memory_probe", budget={"steps": 1}), TrainerSettings(artifacts=tmp_path / "art", progress=False))
    assert out["status"] == "completed" and out["peak_memory_mb"] > 0


def _train_cmd(url: str, run_id: int, art: Path, every: float) -> list[str]:
    return [sys.executable, "-m", "ablate.train", "--run-id", str(run_id), "--db", url, "--artifacts", str(art),
            "--checkpoint-every", str(every), "--quiet", "--threads", "1"]  # one thread: no collapse on a busy host


@pytest.mark.slow
def test_a_run_killed_midway_resumes_the_same_trajectory_without_duplicate_metrics(tmp_path):
    # long enough that the kill lands mid-run: idle, it lands near step 600 (a checkpoint 1 s in, 3 points, 0.5 s);
    # each step more is trained twice (the reference and the resume)
    steps = 1500
    trial = make_trial(budget={"steps": steps}, eval={"at": [0.25, 0.5, 0.75]})
    # reference: uninterrupted
    url_a = f"sqlite:///{tmp_path / 'a.db'}"
    run_a = registered(url_a, trial)
    subprocess.run(_train_cmd(url_a, run_a, tmp_path / "art-a", 1e9), check=True, timeout=patience(300))
    # interrupted: SIGKILL once a checkpoint exists and some metrics are past it, then restart
    url_b = f"sqlite:///{tmp_path / 'b.db'}"
    run_b = registered(url_b, trial)
    proc = subprocess.Popen(_train_cmd(url_b, run_b, tmp_path / "art-b", 1.0))
    ckpt = None
    deadline = Deadline(240)
    while not deadline.passed():
        ckpt = next(iter((tmp_path / "art-b").glob("runs/*/*/checkpoint.pt")), None)
        if ckpt is not None and len(metric_rows(url_b, run_b, "train")) >= 3:
            break
        time.sleep(0.2)
    assert ckpt is not None, "no checkpoint was written"
    time.sleep(0.5)
    assert proc.poll() is None, "the trainer finished before it could be killed: raise `steps`"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert store.get_run(store.connect(url_b), run_b).status == "running"  # never finished; its claimant is dead
    first = torch.load(ckpt, weights_only=True)["progress"]["meters"]
    subprocess.run(_train_cmd(url_b, run_b, tmp_path / "art-b", 1.0), check=True, timeout=patience(300))
    a, b = metric_rows(url_a, run_a), metric_rows(url_b, run_b)
    assert [(r.split, r.step) for r in a] == [(r.split, r.step) for r in b]
    for ra, rb in zip(a, b):
        assert rb.loss == pytest.approx(ra.loss, rel=2e-3, abs=2e-3), (ra.split, ra.step, ra.loss, rb.loss)
    final_a = store.get_run(store.connect(url_a), run_a)
    final_b = store.get_run(store.connect(url_b), run_b)
    assert final_b.status == "completed" and final_b.steps == final_a.steps == steps
    assert final_b.startup_seconds >= 0  # this attempt's own start-up, not minus the first attempt's warm-up
    # the resumed attempt warmed up too (its first steps' compile and allocation are start-up, not training time)
    assert final_b.notes["meters"]["warmup"] > first["warmup"] > 0, (first, final_b.notes["meters"])
    assert final_b.last_step == final_a.last_step and final_b.last_train_loss == pytest.approx(final_a.last_train_loss,
                                                                                              rel=2e-3)


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["clm", "bidirectional", "autoencoder", "multi_token", "one_step",
                                       "classification"])
def test_two_process_ddp_matches_one_process_at_the_same_global_batch(tmp_path, objective):
    # every objective's forward goes through the DDP wrapper (a call past it would miss DDP's gradient hooks, or
    # fail outright: DistributedDataParallel has none of the model's own attributes)
    steps = 40 if objective == "clm" else 20
    labelled = {} if objective != "classification" else {  # 15 real IMDb reviews (tests/data)
        "dataset": {"source": str(REPO / "tests" / "data" / "imdb-sample.jsonl"), "label_field": "label",
                    "eval": {"holdout": 5}}, "tokenizer": {"vocab_size": 320}, "context": 96}
    one = make_trial(batch_size=8, budget={"steps": steps}, objective=objective, **labelled)
    two = make_trial(batch_size=4, budget={"steps": steps, "gpus": 2}, objective=objective, **labelled)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    r1, r2 = registered(url, one), registered(url, two)
    subprocess.run(_train_cmd(url, r1, tmp_path / "art", 1e9), check=True, timeout=patience(300))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           *_train_cmd(url, r2, tmp_path / "art", 1e9)[1:]]
    subprocess.run(cmd, check=True, timeout=patience(300), env={**os.environ, "OMP_NUM_THREADS": "1"})
    engine = store.connect(url)
    a, b = store.get_run(engine, r1), store.get_run(engine, r2)
    assert b.status == "completed" and b.samples == a.samples == steps * 8
    assert b.final_eval_loss == pytest.approx(a.final_eval_loss, abs=0.05)
    steps_b = [(r.split, r.step) for r in metric_rows(url, r2)]
    assert len(steps_b) == len(set(steps_b)) == len(metric_rows(url, r1))  # rank 0 alone writes, once


def test_fp16_with_a_grad_scaler_trains(tmp_path):
    out = train(make_trial(precision="fp16", budget={"steps": 12}), TrainerSettings(artifacts=tmp_path / "art", progress=False))
    assert out["status"] == "completed" and math.isfinite(out["final_eval_loss"])


def test_on_oom_shrink_halves_the_micro_batch_keeping_the_effective_batch(tmp_path):
    out = train(make_trial(on_oom="shrink", batch_size=8), TrainerSettings(artifacts=tmp_path / "art", progress=False,
                                                                           memory_cap_mb=10))
    shrinks = out["notes"]["oom_shrink"]
    assert [(s["micro_batch"], s["grad_accum"]) for s in shrinks] == [(4, 2), (2, 4), (1, 8)]
    assert out["status"] == "oom"  # a CPU cap below the process size cannot be met by any micro-batch


def test_an_eval_after_a_shrink_takes_the_shrunk_micro_batch_and_the_same_rows(tmp_path):
    """Found reading the GPU path: evaluate took trial.batch_size rows at a time, so a run that on_oom: shrink had
    halved went out of memory again at its first eval. It takes the run's micro-batch now, over the same rows (the
    eval's loss is the same to rounding), and eval.batches still counts batches of batch_size."""
    from ablate.data import prepare
    from ablate.objectives import base as objectives
    from ablate.train.evaluate import evaluate
    from ablate.train.state import Dist

    trial = make_trial(batch_size=8)
    prepared = prepare(trial.dataset, trial.tokenizer, trial.context, tmp_path / "art", progress=False)
    torch.manual_seed(0)
    objective = objectives.Objective(trial, objectives.model_for(trial, prepared.vocab_size))
    sizes: list[int] = []
    objective.register_forward_pre_hook(lambda module, args: sizes.append(args[0].shape[0]))
    cpu = torch.device("cpu")
    whole, _ = evaluate(objective, prepared.eval, trial, cpu, Dist(), None, "fp32")
    assert max(sizes) == 8
    sizes.clear()
    shrunk, _ = evaluate(objective, prepared.eval, trial, cpu, Dist(), None, "fp32", micro_batch=2)
    assert max(sizes) == 2 and sum(sizes) == len(prepared.eval) and shrunk == pytest.approx(whole, rel=1e-6)
    sizes.clear()
    evaluate(objective, prepared.eval, trial, cpu, Dist(), 1, "fp32", micro_batch=2)
    assert sizes == [2, 2, 2, 2]  # eval.batches 1: one batch of 8 rows, taken 2 at a time


def test_gradient_accumulation_matches_the_full_batch(tmp_path):
    full = train(make_trial(batch_size=8, budget={"steps": 10}),
                 TrainerSettings(artifacts=tmp_path / "a", progress=False))
    accum = train(make_trial(batch_size=4, grad_accum=2, budget={"steps": 10}),
                  TrainerSettings(artifacts=tmp_path / "b", progress=False))
    assert accum["samples"] == full["samples"] == 80
    assert accum["final_eval_loss"] == pytest.approx(full["final_eval_loss"], abs=1e-3)


def test_the_run_records_its_threads_epochs_and_an_absolute_checkpoint_path(sqlite_url, tmp_path, monkeypatch):
    from ablate.data import prepare

    trial = make_trial(budget={"steps": 8})
    run_id = registered(sqlite_url, trial)
    monkeypatch.chdir(tmp_path)  # artifacts given relative, as the CLI's default is
    before = torch_threads()
    try:
        out = train(trial, TrainerSettings(artifacts=Path("art"), db_url=sqlite_url, run_id=run_id, progress=False,
                                           threads=1))
    finally:
        import torch

        torch.set_num_threads(before)
    run = store.get_run(store.connect(sqlite_url), run_id)
    rows = len(prepare(trial.dataset, trial.tokenizer, trial.context, tmp_path / "art", progress=False).train)
    assert run.threads == 1
    assert run.epochs == pytest.approx(out["samples"] / rows) and out["samples"] == 8 * trial.batch_size
    assert Path(run.checkpoint_path).is_absolute() and Path(run.checkpoint_path).exists()


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def test_the_runner_gives_each_trainer_its_share_of_the_free_cores(monkeypatch):
    from ablate import runner
    from ablate.runner import host

    monkeypatch.setattr(host, "host_cores", lambda: 16)
    monkeypatch.setattr(host, "busy_cores", lambda: 0)  # an idle host
    assert runner.default_threads(1) == 16 and runner.default_threads(2) == 8
    assert runner.default_threads(4, processes_per_trial=4) == 1
    monkeypatch.setattr(host, "busy_cores", lambda: 6)  # other jobs keep 6 cores busy
    assert runner.default_threads(1) == 10 and runner.default_threads(3) == 3
    monkeypatch.setattr(host, "busy_cores", lambda: 15)  # overloaded: one thread, never none
    assert runner.default_threads(1) == 1


def test_busy_cores_sees_a_job_that_keeps_a_core_busy():
    from ablate import runner

    if runner.host_cores() < 2:
        pytest.skip("needs two cores")
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        assert runner.busy_cores() >= 1
    finally:
        spinner.kill()
        spinner.wait()
    command = runner.trainer_command(make_trial(), 7, runner.LaunchOptions(threads=3))
    assert json.loads(command[command.index("--launch") + 1])["threads"] == 3
    command = runner.trainer_command(make_trial(), 7, runner.LaunchOptions())
    assert json.loads(command[command.index("--launch") + 1])["threads"] is None
