"""The node check's CUDA tests, processes (`python -m pytest -m gpu tests/gpu`): `torchrun --nproc_per_node 1` over
NCCL (gloo on CPU), the warm trainer forked with CUDA only in the child, and how `--device cuda` and
ABLATE_WARM_TRAINER are read. See tests/gpu/common.py for the device and the CPU rule."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from ablate import runner, store
from ablate.runner import warm
from ablate.train import TrainerSettings, train
from ablate.train.state import Dist
from tests.gpu.common import REPO, device_name, settings, tiny
from tests.train.test_train import metric_rows, registered
from tests.waiting import patience

pytestmark = pytest.mark.gpu


# ---------------------------------------------------------------- 8: torchrun


def test_torchrun_with_one_process_trains_a_registered_run(device, tmp_path):
    """A `budget.gpus: 1` trial forced through `torchrun --standalone --nproc_per_node=1` (the launch torchrun
    trials get; trainer_command uses it only for gpus > 1) with the database in ABLATE_DB_URL: the trainer claims
    its run, starts a process group of one (NCCL on a GPU, gloo on CPU), wraps the model in DDP, trains on the
    device (cuda:LOCAL_RANK on a GPU host) and records the run once, the same trajectory a plain process trains:
    the multi-GPU path, on one GPU."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    trial = tiny(budget={"steps": 20, "gpus": 1})
    rid = registered(url, trial)
    opts = runner.LaunchOptions(db_url=url, artifacts=tmp_path / "art", threads=1)
    plain = runner.trainer_command(trial, rid, opts)
    assert plain[1:3] == ["-m", "ablate.train"] and "--db" not in plain  # gpus: 1 starts one plain process
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", *plain[1:]]
    env = {**os.environ, "ABLATE_DB_URL": url, "OMP_NUM_THREADS": "1"}
    env.pop("ABLATE_CLAIMANT", None)
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=patience(300), check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    run = store.get_run(store.connect(url), rid)
    assert run.status == "completed" and run.steps == 20, (run.status, run.error)
    assert run.device_name == device_name(device) and run.precision == "fp32"
    assert run.notes["distributed"] == {"world": 1, "backend": "nccl" if device.type == "cuda" else "gloo"}, run.notes
    points = [(m.split, m.step) for m in metric_rows(url, rid)]
    assert points and len(points) == len(set(points))  # one rank, each point written once
    reference = train(trial, settings(device, tmp_path / "ref"))
    assert run.final_eval_loss == pytest.approx(reference["final_eval_loss"], abs=1e-2), (run.final_eval_loss,
                                                                                          reference)


# ---------------------------------------------------------------- 9: the warm (forked) trainer


def test_the_warm_trainer_forks_a_trainer_that_initialises_cuda_itself(device, tmp_path, monkeypatch, capsys,
                                                                        record_property):
    """With ABLATE_WARM_TRAINER=always (GPU hosts too), `runner.run_trial` forks the trainer from the warm helper,
    the helper never touched CUDA (its ready message: CUDA not initialised, a fork of it is not poisoned) and
    forks from a single thread, and the forked trainer initialises the device itself, trains on it and completes.
    Prints the trainer's start-up cold and warm (not asserted: the node check's log says whether warm is worth
    enabling on GPU hosts)."""
    monkeypatch.setenv("ABLATE_WARM_TRAINER", "always")
    monkeypatch.setattr(warm, "_FAILED", False)
    if warm._HELPER is not None:  # a fresh helper: its start and its ready message are this test's
        warm._HELPER.close()
        warm._HELPER = None
    assert warm.enabled()
    url = f"sqlite:///{tmp_path / 'r.db'}"
    art = tmp_path / "art"
    (art / "logs").mkdir(parents=True)
    opts = runner.LaunchOptions(db_url=url, artifacts=art, threads=1)
    t0 = time.perf_counter()
    helper = warm.helper(art / "logs" / "warm-trainer.log")
    helper_ready = time.perf_counter() - t0
    assert helper is not None, capsys.readouterr().err
    try:
        ready = helper.ready
        assert ready["cuda_initialized"] is False and ready["cuda_fork_safe"] is True, ready
        assert ready["threads"] == 1, ready  # forked from a single thread

        spawned: list[tuple[list[str], warm.Child]] = []
        real_spawn = warm.WarmTrainer.spawn

        def spawn(self, argv, env, log, families=()):
            child = real_spawn(self, argv, env, log, families)
            spawned.append((argv, child))
            return child

        monkeypatch.setattr(warm.WarmTrainer, "spawn", spawn)
        trials = {"warm": tiny(budget={"steps": 20}, seed=0), "cold": tiny(budget={"steps": 20}, seed=1)}
        runner.prepare_data(list(trials.values()), art, progress=False)  # built once, before: neither trainer builds it
        runs = {}
        for how in ("warm", "cold"):
            if how == "cold":
                monkeypatch.setenv("ABLATE_WARM_TRAINER", "0")
            rid = registered(url, trials[how])
            t0 = time.perf_counter()
            status = runner.run_trial(rid, opts, poll_seconds=0.1)
            wall = time.perf_counter() - t0
            run = store.get_run(store.connect(url), rid)
            assert status == "completed" == run.status, (how, status, run.error)
            runs[how] = (rid, run, wall)

        rid, run, _ = runs["warm"]
        assert len(spawned) == 1, spawned  # the warm trial, and only it, was forked from the helper
        argv, child = spawned[0]
        assert argv[argv.index("--run-id") + 1] == str(rid) and child.returncode == 0
        assert child.cpu_seconds is not None  # reaped by the helper: it was the helper's child
        for how in ("warm", "cold"):
            run = runs[how][1]
            assert run.device_name == device_name(device) and run.precision == "fp32" and run.steps == 20, how
        # start-up: the trainer's own (data, model, optimizer), its process's CPU before the first step (imports
        # included when cold), and the wall time of run_trial beyond training, eval and checkpoints
        lines = [(f"warm trainer on {device_name(device)} (torch {torch.__version__}): helper ready in "
                  f"{helper_ready:.1f} s, ready message {ready}")]
        record_property("helper_ready_s", round(helper_ready, 2))
        for how in ("cold", "warm"):
            _, run, wall = runs[how]
            overhead = wall - (run.train_seconds or 0) - (run.eval_seconds or 0) - (run.checkpoint_seconds or 0)
            record_property(f"{how}_startup_s", round(run.startup_seconds, 3))
            record_property(f"{how}_cpu_before_first_step_s", run.notes["process_cpu"]["before_training"])
            record_property(f"{how}_run_trial_s", round(wall, 2))
            record_property(f"{how}_not_training_s", round(overhead, 2))
            lines.append(f"  {how}: trainer start-up {run.startup_seconds:.2f} s, process CPU before the first step "
                         f"{run.notes['process_cpu']['before_training']:.2f} s, run_trial {wall:.2f} s of which "
                         f"{overhead:.2f} s not training, eval or checkpoints")
        with capsys.disabled():
            print("\n" + "\n".join(lines))
    finally:
        helper.close()
        warm._HELPER = None


def test_always_is_the_only_setting_that_forks_where_a_gpu_is_visible(monkeypatch):
    """ABLATE_WARM_TRAINER: unset or 1, the helper only where no GPU is visible; `always`, GPU hosts too; 0, never."""
    monkeypatch.setattr(warm, "_FAILED", False)
    monkeypatch.setattr(warm, "_GPUS", 1)  # as if nvidia-smi had listed a GPU
    for value, expected in ((None, False), ("1", False), ("always", True), (" Always ", True), ("0", False)):
        if value is None:
            monkeypatch.delenv("ABLATE_WARM_TRAINER", raising=False)
        else:
            monkeypatch.setenv("ABLATE_WARM_TRAINER", value)
        assert warm.enabled() is expected, value
    monkeypatch.setattr(warm, "_GPUS", 0)
    for value, expected in ((None, True), ("1", True), ("always", True), ("0", False)):
        if value is None:
            monkeypatch.delenv("ABLATE_WARM_TRAINER", raising=False)
        else:
            monkeypatch.setenv("ABLATE_WARM_TRAINER", value)
        assert warm.enabled() is expected, value


def test_cuda_without_an_index_is_this_ranks_gpu():
    """`--device cuda` (TrainerSettings.device "cuda", no index) becomes cuda:LOCAL_RANK: torch.cuda.set_device and
    DDP's device_ids take an index, and torch.device("cuda") has none. Runs on CPU too (no CUDA call is made)."""
    from ablate.train.device import pick_device

    assert pick_device(TrainerSettings(device="cuda"), Dist()) == torch.device("cuda", 0)
    assert pick_device(TrainerSettings(device="cuda"), Dist(rank=1, world=2, local_rank=1)) == torch.device("cuda", 1)
    assert pick_device(TrainerSettings(device="cuda:0"), Dist(local_rank=1)) == torch.device("cuda", 0)  # as given
    assert pick_device(TrainerSettings(device="cpu"), Dist()) == torch.device("cpu")
