"""Hardening of a trainer: artifacts keyed by database, checkpoints that cannot run code, a new attempt's points,
checkpoints that cannot be written (a full disk).

(A campaign across the house: `pytest -m hardening` runs all of it.)
"""

from __future__ import annotations

import os
import pickle
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ablate import store
from ablate.config.errors import AblateError
from ablate.train import TrainerSettings, train
from tests.train.test_train import make_trial, metric_rows, registered
from tests.waiting import patience

from tests.helpers import cli_env


pytestmark = pytest.mark.hardening


def test_a_fresh_database_never_resumes_another_databases_checkpoint(tmp_path):
    trial = make_trial(budget={"steps": 20})
    art = tmp_path / "art"
    urls = [f"sqlite:///{tmp_path / name}" for name in ("a.db", "b.db")]
    outs = []
    for url in urls:
        run_id = registered(url, trial)
        assert run_id == 1  # the same run id in both databases
        outs.append(train(trial, TrainerSettings(artifacts=art, db_url=url, run_id=run_id, progress=False)))
    paths = [store.get_run(store.connect(url), 1).checkpoint_path for url in urls]
    assert paths[0] != paths[1] and all(Path(p).exists() for p in paths)
    # trained from its first step, not resumed at the other run's end (which would log no step before 20 here); not
    # a comparison of the two runs' train seconds, which a loaded machine's first run can triple
    steps = [[row.step for row in metric_rows(url, 1, "train")] for url in urls]
    assert outs[1]["steps"] == 20 and steps[1] == steps[0] and min(steps[1]) < 20


class _Exploit:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_checkpoints_load_weights_only_and_a_crafted_one_runs_no_code(tmp_path, capsys):
    from ablate.cli import main
    from ablate.train.generate import load_run_model
    from ablate.train.checkpoint import load_checkpoint

    url = f"sqlite:///{tmp_path / 'r.db'}"
    trial = make_trial(budget={"steps": 5})
    run_id = registered(url, trial)
    art = tmp_path / "art"
    train(trial, TrainerSettings(artifacts=art, db_url=url, run_id=run_id, progress=False))
    path = Path(store.get_run(store.connect(url), run_id).checkpoint_path)
    state = torch.load(path, weights_only=True)  # plain tensors and values
    assert set(state) >= {"model", "optimizer", "progress", "rng", "identity"}
    assert load_run_model(run_id, url, art)[0].fingerprint() == trial.fingerprint()
    # a crafted file in place of the checkpoint: refused, and its payload never runs
    marker = tmp_path / "pwned"
    with open(path, "wb") as f:
        pickle.dump({"model": _Exploit(marker)}, f)
    with pytest.raises(AblateError, match="cannot be read safely"):
        load_checkpoint(path)
    assert main(["generate", str(run_id), "--prompt", "Once", "--db", url, "--artifacts", str(art)]) == 2
    assert not marker.exists()
    # a row that names a file outside the artifacts folder is not opened
    store.update_run(store.connect(url), run_id, checkpoint_path=str(tmp_path / "elsewhere" / "checkpoint.pt"))
    with pytest.raises(AblateError, match="outside the artifacts folder"):
        load_run_model(run_id, url, art)


def test_a_new_attempt_from_step_zero_replaces_the_killed_attempts_points(sqlite_url):
    trial = make_trial(budget={"steps": 30})
    run_id = registered(sqlite_url, trial)
    # a first attempt killed before its first checkpoint left points behind
    stale = [dict(step=s, split="train", elapsed_seconds=0.1 * s, tokens=s, loss=123.0, lr=None) for s in range(1, 40)]
    store.write_metrics(store.connect(sqlite_url), run_id, stale)
    train(trial, TrainerSettings(artifacts=Path(sqlite_url.removeprefix("sqlite:///")).parent / "art", db_url=sqlite_url,
                                 run_id=run_id, progress=False, log_points=10))
    rows = metric_rows(sqlite_url, run_id)
    assert rows and all(r.loss != 123.0 for r in rows)
    assert max(r.step for r in rows if r.split == "train") <= 30


def _train_under_a_file_size_limit(tmp_path, budget: dict, *args: str, full_log: bool = False):
    """A real write failure (a file-size limit on the trainer, EFBIG like ENOSPC) for a run's checkpoints;
    `full_log`: its output goes to /dev/full (ENOSPC on every write), as a log on the same full disk would."""
    from ablate.data import prepare

    url = f"sqlite:///{tmp_path / 'r.db'}"
    trial = make_trial(d_model=128, budget=budget)  # a checkpoint of several MB
    run_id = registered(url, trial)
    art = tmp_path / "art"
    prepare(trial.dataset, trial.tokenizer, trial.context, art, progress=False)  # caches written before the limit

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failing write, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    output = {"stdout": open("/dev/full", "w"),  # noqa: SIM115 - the child's stdout; closed with the test
              "stderr": subprocess.STDOUT} if full_log else {"capture_output": True}
    proc = subprocess.run([sys.executable, "-m", "ablate.train", "--run-id", str(run_id), "--artifacts", str(art),
                           "--quiet", "--threads", "1", *args], env=cli_env(ABLATE_DB_URL=url), preexec_fn=limit,
                          text=True, timeout=patience(300), **output)
    return proc, store.get_run(store.connect(url), run_id), art


def test_a_checkpoint_that_cannot_be_written_fails_the_run_cleanly(tmp_path):
    """Mid-run: a message, no partial checkpoint, no run left `running`."""
    proc, run, art = _train_under_a_file_size_limit(tmp_path, {"steps": 100_000}, "--checkpoint-every", "0.5")
    assert proc.returncode == 2, proc.stderr
    assert "cannot write checkpoint" in proc.stderr
    assert run.status == "failed" and "cannot write checkpoint" in run.error and run.steps < 100_000
    assert not list(art.glob("runs/**/*.tmp"))


def test_a_finished_run_whose_final_checkpoint_cannot_be_written_keeps_its_result(tmp_path):
    """Training and the final eval are done and recorded: the run is not failed and trained again for a file."""
    proc, run, art = _train_under_a_file_size_limit(tmp_path, {"steps": 5})
    assert proc.returncode == 0, proc.stderr
    assert "final checkpoint was not written" in proc.stderr and "cannot write checkpoint" in proc.stderr
    assert run.status == "completed" and run.steps == 5 and run.final_eval_loss is not None, (run.status, run.error)
    assert run.notes["final_checkpoint"].startswith("not written: cannot write checkpoint")
    assert not list(art.glob("runs/**/*.tmp"))


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_finished_run_whose_log_is_on_the_full_disk_too_stays_completed(tmp_path):
    """The warning that keeps the result cannot be written either: the run still ends completed, not failed (and
    trained again from step 0 by the next sweep run)."""
    proc, run, _ = _train_under_a_file_size_limit(tmp_path, {"steps": 5}, full_log=True)
    assert proc.returncode == 0
    assert run.status == "completed" and run.error is None and run.final_eval_loss is not None
    assert run.notes["final_checkpoint"].startswith("not written: cannot write checkpoint")


def test_a_stored_error_is_one_line_saying_where_the_whole_traceback_is(tmp_path, sqlite_url):
    from ablate.config.errors import one_line
    from ablate.runner.trials import classify

    try:
        {}["missing"]
    except KeyError as exc:
        said = one_line(exc, "/logs/run-1.log")
    assert "\n" not in said and said.startswith("KeyError: 'missing' (at test_train_hardening.py:")
    assert said.endswith("; the whole traceback is in /logs/run-1.log")
    assert one_line(AblateError("a message\nof two lines"), "x") == "a message\nof two lines"  # ours: as written

    run_id = registered(sqlite_url, make_trial())
    engine = store.connect(sqlite_url)
    store.claim_run(engine, run_id, "me")
    log = tmp_path / "run.log"
    log.write_text("step 1\nTraceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                   "RuntimeError: CUDA error: an illegal memory access was encountered\n\n")
    assert classify(engine, run_id, 1, log, "me") == "failed"
    error = store.get_run(engine, run_id).error
    assert error == (f"trainer exited with code 1: RuntimeError: CUDA error: an illegal memory access was "
                     f"encountered; the whole log is {log}")
