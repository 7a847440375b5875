"""What a trainer costs besides its steps (issue 27 item 8): imports it does not need, host syncs per step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from ablate import store
from ablate.train import TrainerSettings, make_optimizer, plain_step, train
from tests.train.test_train import make_trial, metric_rows, registered
from tests.waiting import patience

ABLATE = Path(__file__).resolve().parents[2] / "ablate"
READS = {"item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy"}


@pytest.mark.parametrize("family", ["mixer", "llama"])
def test_a_trainer_that_compiles_nothing_never_imports_dynamo(tmp_path, family):
    # torch.optim's wrappers import torch._dynamo (~0.7 CPU-s of a cold start) at the first zero_grad/step, and
    # transformers' Llama imports it too (2.8 CPU-s before a cold Llama trainer's first step): the family is ours
    # (transformers itself may load here, for the tokenizer this first trial trains; none of its models)
    trial = make_trial(budget={"steps": 3}, architecture=family, **({"heads": 4} if family == "llama" else {}))
    config = trial.model_dump(mode="json")
    script = ("import json, sys; from ablate import train; "
              f"code = train.main(['--config', {json.dumps(json.dumps(config))}, '--artifacts', {str(tmp_path)!r}, "
              "'--quiet', '--threads', '1', '--checkpoint-every', '0']); "  # a checkpoint: state_dict too
              "print(json.dumps({'code': code, 'dynamo': 'torch._dynamo' in sys.modules, "
              "'modeling': any(m.startswith('transformers.models.') for m in sys.modules)}))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=patience(300))
    last = json.loads(out.stdout.strip().splitlines()[-1])
    assert last == {"code": 0, "dynamo": False, "modeling": False}, out.stderr[-2000:]


def test_the_plain_optimizer_step_is_torchs_own_update():
    torch.manual_seed(0)
    trial = make_trial(weight_decay=0.1)
    models = [torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
              for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    optimizers = [make_optimizer(m, trial, torch.device("cpu")) for m in models]
    steps = [optimizers[0].step, plain_step(optimizers[1])]
    for _ in range(5):
        x = torch.randn(32, 8)
        for model, optimizer, step in zip(models, optimizers, steps):
            model(x).pow(2).mean().backward()
            step()
            optimizer.zero_grad(set_to_none=True)
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)
    assert not torch.equal(models[0][0].weight, models[1][0].weight.detach() * 0)  # they moved
    assert optimizers[0].state_dict()["state"].keys() == optimizers[1].state_dict()["state"].keys()


class _HostReads(TorchFunctionMode):
    """Counts values the trainer's own code reads from tensors to the host (on a GPU, each is a sync): the
    float reads made in ablate/ (labels counted on the host, and torch's own internals, are not the loop's)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in READS and args and isinstance(args[0], torch.Tensor) \
                and args[0].is_floating_point() and str(ABLATE) in sys._getframe(1).f_code.co_filename:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _reads(tmp_path: Path, url: str, steps: int, read_every: float) -> tuple[int, int]:
    trial = make_trial(budget={"steps": steps}, seed=steps)
    run_id = registered(url, trial)
    with _HostReads() as reads:
        out = train(trial, TrainerSettings(artifacts=tmp_path / "art", db_url=url, run_id=run_id, progress=False,
                                           threads=1, read_every=read_every))
    assert out["status"] == "completed"
    return reads.count, run_id


def test_losses_logged_every_step_are_read_from_the_device_together(tmp_path, sqlite_url):
    # a budget under log_points (200) steps logs every step; each point used to be read at once (a sync per step)
    short, _ = _reads(tmp_path, sqlite_url, 10, read_every=1e9)
    long, run_id = _reads(tmp_path, sqlite_url, 40, read_every=1e9)
    assert long == short, f"{long - short} more host reads for 30 more steps: the loop reads per step"
    # deferring the reads loses nothing: the same points as reading every one at once
    every_point = make_trial(budget={"steps": 40}, seed=40)
    url2 = f"sqlite:///{tmp_path / 'every.db'}"
    run2 = registered(url2, every_point)
    train(every_point, TrainerSettings(artifacts=tmp_path / "art", db_url=url2, run_id=run2, progress=False, threads=1,
                                       read_every=0.0))
    deferred = [(r.step, r.loss, r.tokens) for r in metric_rows(sqlite_url, run_id, "train")]
    at_once = [(r.step, r.loss, r.tokens) for r in metric_rows(url2, run2, "train")]
    assert [s for s, _, _ in deferred] == list(range(1, 41))
    assert deferred == at_once  # one thread, one seed: the same arithmetic
    assert store.get_run(store.connect(sqlite_url), run_id).final_train_loss == store.get_run(store.connect(url2), run2).final_train_loss


def test_a_run_that_runs_out_of_memory_mid_training_keeps_the_points_not_yet_read(tmp_path, sqlite_url, monkeypatch):
    # OOM is a result (the studies' OOM cells): its curve up to the OOM is recorded, not left unread on the device
    from ablate.train import loop as train_mod  # where the loop looks check_memory up
    from ablate.train.device import SimulatedOOM

    calls = {"n": 0}

    def oom_at_step_15(device, cap_mb):  # 2 warm-up steps, then 15 training steps (before the eval at 50%), then OOM
        calls["n"] += 1
        if calls["n"] > 17:
            raise SimulatedOOM("peak memory past the cap")

    monkeypatch.setattr(train_mod, "check_memory", oom_at_step_15)
    trial = make_trial(budget={"steps": 40})
    run_id = registered(sqlite_url, trial)
    out = train(trial, TrainerSettings(artifacts=tmp_path / "art", db_url=sqlite_url, run_id=run_id, progress=False,
                                       threads=1, read_every=1e9))
    assert out["status"] == "oom" and out["steps"] == 15
    assert [r.step for r in metric_rows(sqlite_url, run_id, "train")] == list(range(1, 16))
