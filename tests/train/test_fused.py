"""Fused groups (ablate/train/fused.py): each member equals its solo run, curve and final losses, for every built-in
family and objective; a member that diverges or is cancelled leaves the group alone; a model that does not vmap
trains alone, saying why; a killed group resumes every member; out of memory splits a group in two."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
import torch

from ablate import runner, store
from ablate.config import TrialConfig, parse_spec
from ablate.train import TrainerSettings, train
from ablate.train.fused import train_group
from tests.waiting import patience, wait_until

REPO = Path(__file__).resolve().parents[2]
IMDB = REPO / "tests" / "data" / "imdb-sample.jsonl"
REL = 1e-5  # the contract: fp32 on CPU, over 50 steps with evals

CASES = {  # every built-in family on the causal LM objective, and every other objective on a family it runs on
    "mixer": {},
    "llama": {"architecture": "llama", "heads": 4},
    "gpt": {"architecture": "gpt", "heads": 4, "options": {"dropout": 0.0}},
    "hybrid": {"architecture": "hybrid", "heads": 4},
    "metaformer": {"architecture": "metaformer", "heads": 4},
    "mod": {"architecture": "mod", "heads": 4},
    "bidirectional": {"objective": "bidirectional"},
    "multi_token": {"objective": "multi_token"},
    "one_step": {"objective": "one_step", "layers": 2},
    # at lr 3e-3 it memorises the 15 training rows within 20 steps, and its eval loss on 5 rows then swings with
    # rounding (1.3e-5 apart); at 1e-3 it learns, and the contract holds with room (7e-7)
    "classification": {"architecture": "metaformer", "heads": 2, "objective": "classification", "lr": 1e-3,
                       "objective_options": {"classes": 2}, "context": 96, "batch_size": 5,
                       "dataset": {"source": str(IMDB), "label_field": "label", "eval": {"holdout": 5}},
                       "tokenizer": {"vocab_size": 320}},
}


def make_trial(seed: int = 0, **over) -> TrialConfig:
    base = dict(architecture="mixer", d_model=32, layers=1, context=64, lr=3e-3, batch_size=8, precision="fp32",
                dataset={"source": "ablate:tinystories-sample", "eval": {"holdout": 16}}, tokenizer={"vocab_size": 384},
                budget={"steps": 50}, eval={"at": [0.5], "every_steps": 20}, warmup=0.1, seed=seed)
    base.update(over)
    return TrialConfig(**base)


def register(url: str, trials: list[TrialConfig]) -> list[int]:
    """Run rows for `trials` in one sweep (what a runner hands its trainers)."""
    spec = parse_spec({"name": "fused", "dataset": trials[0].dataset.model_dump(),
                       "budget": trials[0].budget.model_dump(exclude_none=True),
                       "grid": [{"architecture": trials[0].architecture, "d_model": trials[0].d_model}],
                       "defaults": {"layers": 1, "context": 8, "lr": 1e-3, "batch_size": 1}})
    return store.register_sweep(store.connect(url), spec, trials)[1]


def settings(tmp_path: Path, url: str, run_id: int, **over) -> TrainerSettings:
    return TrainerSettings(**{"artifacts": tmp_path / "art", "db_url": url, "run_id": run_id, "progress": False,
                              "log_points": 25, "threads": 1, **over})


def curve(url: str, run_id: int) -> list[tuple[str, int, float]]:
    with store.connect(url).connect() as conn:
        rows = conn.execute(sa.select(store.Metric.split, store.Metric.step, store.Metric.loss)
                            .where(store.Metric.run_id == run_id).order_by(store.Metric.split, store.Metric.step)).all()
    return [tuple(r) for r in rows]


def solo_runs(tmp_path: Path, trials: list[TrialConfig], **over) -> tuple[str, list[int]]:
    url = f"sqlite:///{tmp_path / 'solo.db'}"
    ids = register(url, trials)
    for trial, rid in zip(trials, ids):
        train(trial, settings(tmp_path / "solo", url, rid, **over))
    return url, ids


def fused_runs(tmp_path: Path, trials: list[TrialConfig]) -> tuple[str, list[int], list]:
    url = f"sqlite:///{tmp_path / 'fused.db'}"
    ids = register(url, trials)
    outcomes = train_group(trials, [settings(tmp_path / "fused", url, rid) for rid in ids])
    return url, ids, outcomes


def furthest(a: tuple[str, list[int]], b: tuple[str, list[int]]) -> float:
    """The largest relative difference between the two sets of runs' points and final losses (the same points
    required)."""
    worst = 0.0
    for ra, rb in zip(a[1], b[1]):
        ca, cb = curve(a[0], ra), curve(b[0], rb)
        assert [p[:2] for p in ca] == [p[:2] for p in cb], "the runs logged different points"
        worst = max([worst] + [abs(pa[2] - pb[2]) / abs(pa[2]) for pa, pb in zip(ca, cb)])
        row_a, row_b = store.get_run(store.connect(a[0]), ra), store.get_run(store.connect(b[0]), rb)
        assert row_a.status == row_b.status == "completed", (row_a.error, row_b.error)
        assert row_a.steps == row_b.steps and row_a.tokens == row_b.tokens
        for field in ("final_train_loss", "final_eval_loss"):
            worst = max(worst, abs(getattr(row_a, field) - getattr(row_b, field)) / abs(getattr(row_a, field)))
    return worst


@pytest.mark.parametrize("case", list(CASES))
def test_each_member_equals_its_solo_run(tmp_path, case):
    """Two seeds fused against each trained alone: every train and eval point and the final losses within 1e-5
    (rounding: the batched matmuls sum in another order). ~3 CPU-s a case."""
    trials = [make_trial(seed, **CASES[case]) for seed in (0, 1)]
    solo = solo_runs(tmp_path, trials)
    url, ids, outcomes = fused_runs(tmp_path, trials)
    assert [o["status"] for o in outcomes] == ["completed", "completed"]
    assert furthest(solo, (url, ids)) < REL
    notes = store.get_run(store.connect(url), ids[0]).notes
    assert notes["fused"] == {"members": 2, "runs": ids}


def test_the_autoencoder_member_is_as_close_to_its_solo_run_as_the_run_is_to_itself(tmp_path):
    """The autoencoder's training amplifies rounding about threefold a step (its points part from 1e-7 to 1e-4 in
    ten steps): two solo runs that differ only in torch's thread count part as much. A fused member stays within
    that, and within 1e-5 over its first steps, before the parting grows."""
    trials = [make_trial(seed, objective="autoencoder") for seed in (0, 1)]
    solo = solo_runs(tmp_path, trials)
    again = solo_runs(tmp_path / "threads", trials, threads=2)
    fused = fused_runs(tmp_path, trials)[:2]
    noise = furthest(solo, again)
    assert furthest(solo, fused) <= max(REL, 3 * noise), noise
    for ra, rb in zip(solo[1], fused[1]):
        early = [(a, b) for a, b in zip(curve(solo[0], ra), curve(fused[0], rb)) if a[0] == "train" and a[1] <= 10]
        assert early and all(abs(a[2] - b[2]) / a[2] < REL for a, b in early)


def test_members_of_one_shape_keep_their_own_schedule_and_budget(tmp_path):
    """`fuse: shapes`: members with their own lr, weight decay, warm-up and schedule, on a tokens budget that each
    reaches at its own step (its stories pad differently at context 512: 16 to 18 steps here), each equal to its solo
    run; the first to finish leaves the group and the others go on."""
    shape = {"context": 512, "batch_size": 2, "budget": {"tokens": 12_000}, "eval": {"at": [0.5]}}
    trials = [make_trial(0, **shape), make_trial(1, lr=1e-3, weight_decay=0.1, **shape),
              make_trial(2, warmup_steps=5, schedule="cosine", **shape)]
    solo = solo_runs(tmp_path, trials)
    url, ids, outcomes = fused_runs(tmp_path, trials)
    assert furthest(solo, (url, ids)) < REL
    assert len({o["steps"] for o in outcomes}) > 1, "the members reached the budget at one step: no one left early"


def test_a_wall_clock_budget_is_read_as_the_steps_a_solo_run_makes_in_it(tmp_path):
    """A fused group on a 1 s budget: a short solo run measures the trial's step on this machine, and each member
    trains the steps that fit in 1 s (its notes say how the budget was read); each then equals a solo run given that
    many steps."""
    trials = [make_trial(seed, budget={"wall_clock": "1s"}) for seed in (0, 1)]
    url, ids, outcomes = fused_runs(tmp_path, trials)
    read = store.get_run(store.connect(url), ids[0]).notes["budget_read"]
    steps = read["steps"]
    assert [o["steps"] for o in outcomes] == [steps, steps] and read["wall_clock_seconds"] == 1.0
    assert steps * read["solo_step_seconds"] <= 1.0 < (steps + 1) * read["solo_step_seconds"]
    solo = solo_runs(tmp_path, [make_trial(seed, budget={"steps": steps}) for seed in (0, 1)])
    assert furthest(solo, (url, ids)) < REL
    from ablate.cli import main

    assert main(["report", "fused", "--db", url, "--out", str(tmp_path / "report")]) == 0
    said = (tmp_path / "report" / "report.md").read_text()
    assert "Fused: run(s) 1, 2 trained 2 at a time" in said
    assert f"trained their 1 s wall clock as the {steps:,} steps a solo run makes in it on cpu" in said


def test_a_wall_clock_with_charged_evals_is_read_as_the_steps_that_fit_beside_them(tmp_path):
    """The studies' recipe charges its evals to the clock (the whole split every 4,000 steps within 12 h): the
    steps a solo run makes are fewer by the evals they bring. 12 h at 0.1 s a step and 300 s an eval every 4,000
    steps (plus one at half the budget): (43,200 - 300) / (0.1 + 300 / 4,000) = 245,142 steps, not 432,000."""
    from ablate.train.members import steps_in

    studies = make_trial(eval={"at": [0.5], "every_steps": 4000, "charged": True})
    assert steps_in(43_200, 0.1, 300.0, studies) == 245_142
    assert steps_in(43_200, 0.1, 0.0, make_trial()) == 432_000
    trials = [make_trial(seed, budget={"wall_clock": "1s"}, eval={"at": [0.5], "every_steps": 20, "charged": True})
              for seed in (0, 1)]
    url, ids, outcomes = fused_runs(tmp_path, trials)
    read = store.get_run(store.connect(url), ids[0]).notes["budget_read"]
    assert read["eval_seconds"] > 0 and all(o["status"] == "completed" for o in outcomes)
    assert read["steps"] == steps_in(1.0, read["solo_step_seconds"], read["eval_seconds"], trials[0])


def test_fp16_members_keep_their_own_loss_scale_and_equal_their_solo_runs(tmp_path):
    """fp16 (a v100 sweep's precision): each member is scaled, unscaled and stepped by its own loss scale, as its own
    GradScaler does alone; within 1e-4 of its solo run (fp16 keeps 11 bits: the points part by 1e-6 to 3e-5 here),
    and its checkpoint holds its own scaler's state."""
    trials = [make_trial(seed, precision="fp16") for seed in (0, 1)]
    solo = solo_runs(tmp_path, trials)
    url, ids, outcomes = fused_runs(tmp_path, trials)
    assert furthest(solo, (url, ids)) < 1e-4
    for rid in ids:
        saved = torch.load(store.get_run(store.connect(url), rid).checkpoint_path, weights_only=True)
        assert saved["scaler"]["scale"] == 65536.0 and saved["scaler"]["_growth_tracker"] == 50


def test_a_member_whose_fp16_gradient_overflows_skips_its_step_alone(tmp_path):
    """One member's scaled gradient holds an inf: that member skips its step and halves its scale, its weights and
    moments as they were; the other member steps exactly as torch's AdamW behind its own GradScaler does alone (one
    scaler for the group would have skipped both)."""
    from ablate.train.fused import _member
    from ablate.train.optim import make_optimizer
    from ablate.train.stack import Stack

    trials = [make_trial(seed, precision="fp16") for seed in (0, 1)]
    members = [_member(t, TrainerSettings(artifacts=tmp_path / "art", progress=False, resume=False)) for t in trials]
    alone = copy.deepcopy(members[0].model)
    stack = Stack(members)
    before = {n: p.detach().clone() for n, p in stack.params.items()}
    torch.manual_seed(5)
    grads = {n: torch.randn_like(p) * 0.01 * 65536 for n, p in stack.params.items() if p.requires_grad}
    first = next(iter(grads))
    grads[first][1].view(-1)[0] = float("inf")
    for n, g in grads.items():
        stack.params[n].grad = g.clone()
    stack.update([3e-3, 3e-3])
    assert stack.adam_steps == [1, 0] and [s["scale"] for s in stack.scalers] == [65536.0, 32768.0]
    for n in grads:
        assert torch.equal(stack.params[n][1], before[n][1])
    optimizer = make_optimizer(alone, trials[0], torch.device("cpu"))
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(torch.zeros(()))  # its scale made, as the backward of a scaled loss makes it
    named = dict(alone.named_parameters())
    for n, g in grads.items():
        named[n.removeprefix("model.")].grad = g[0].clone()
    for group in optimizer.param_groups:
        group["lr"] = 3e-3
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(alone.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    for n in grads:
        torch.testing.assert_close(stack.params[n][0], named[n.removeprefix("model.")].detach(), rtol=1e-6, atol=1e-7)


def test_a_member_that_diverges_leaves_and_the_others_finish_as_alone(tmp_path):
    """One member at lr 1 without warm-up blows up (loss 1,429 at step 2): it ends `diverged`, its curve up to there
    recorded, and the other members' curves stay equal to their solo runs."""
    trials = [make_trial(0), make_trial(1, lr=1.0, warmup=0.0), make_trial(2)]
    url, ids, outcomes = fused_runs(tmp_path, trials)
    assert [o["status"] for o in outcomes] == ["completed", "diverged", "completed"], outcomes
    assert "train loss became" in outcomes[1]["error"] and outcomes[1]["steps"] < 50
    calm = [trials[0], trials[2]]
    solo = solo_runs(tmp_path, calm)
    assert furthest(solo, (url, [ids[0], ids[2]])) < REL


def test_a_model_that_does_not_vmap_trains_alone_and_says_why(tmp_path):
    """gpt's default dropout draws random numbers, which a fused step refuses (its draws would not be the solo run's):
    the group's runs train one after another, each complete, its notes saying why it was not fused."""
    trials = [make_trial(seed, architecture="gpt", heads=4, budget={"steps": 6}) for seed in (0, 1)]
    url, ids, outcomes = fused_runs(tmp_path, trials)
    assert [o["status"] for o in outcomes] == ["completed", "completed"]
    for rid in ids:
        refused = store.get_run(store.connect(url), rid).notes["fused"]["refused"]
        assert "does not train batched" in refused and "random" in refused.lower(), refused


def test_a_run_cancelled_before_its_turn_alone_is_skipped_and_the_rest_train(tmp_path):
    """Trained one after another (gpt's dropout does not vmap), a member cancelled before its turn is not started
    and ends `cancelled`; the member after it still trains (a cancel is that run's, not the group's)."""
    trials = [make_trial(seed, architecture="gpt", heads=4, budget={"steps": 4}) for seed in (0, 1, 2)]
    url = f"sqlite:///{tmp_path / 'fused.db'}"
    ids = register(url, trials)
    store.update_run(store.connect(url), ids[1], status="cancelled")
    outcomes = train_group(trials, [settings(tmp_path / "fused", url, rid) for rid in ids])
    assert [o["status"] for o in outcomes] == ["completed", "cancelled", "completed"]
    rows = [store.get_run(store.connect(url), rid) for rid in ids]
    assert [r.status for r in rows] == ["completed", "cancelled", "completed"] and not rows[1].steps


def _claimed(url: str, ids: list[int]) -> str:
    claimant = store.new_claimant()
    for rid in ids:
        assert store.claim_run(store.connect(url), rid, claimant)
    return claimant


def _group_command(url: str, ids: list[int], art: Path, every: float) -> list[str]:
    launch = json.dumps({"artifacts": str(art), "checkpoint_every": every, "threads": 1, "quiet": True})
    return [sys.executable, "-m", "ablate.train", "--run-ids", ",".join(map(str, ids)), "--db", url,
            "--launch", launch]


@pytest.mark.slow
def test_a_killed_group_resumes_every_member_without_writing_a_point_twice(tmp_path):
    """SIGKILL once every member has a checkpoint and points past it; the group started again resumes each from its
    own checkpoint: every member's curve and final losses equal its uninterrupted solo run, each point once. One
    member of the killed group then resumes alone from the same kind of checkpoint (a fused checkpoint is a solo
    run's). ~40 CPU-s: 3 x 600 steps trained up to three times."""
    trials = [make_trial(seed, budget={"steps": 600}, eval={"at": [0.25, 0.5, 0.75]}) for seed in (0, 1, 2)]
    solo = solo_runs(tmp_path, trials, log_points=200)  # as the trainer's command line logs
    url = f"sqlite:///{tmp_path / 'killed.db'}"
    ids = register(url, trials)
    env = {**os.environ, "ABLATE_CLAIMANT": _claimed(url, ids), "PYTHONPATH": str(REPO)}
    art = tmp_path / "killed-art"
    proc = subprocess.Popen(_group_command(url, ids, art, 0.5), env=env, stdout=subprocess.DEVNULL)

    def checkpointed_and_past() -> bool:
        return (len(list(art.glob("runs/*/*/checkpoint.pt"))) == 3
                and all(len([p for p in curve(url, rid) if p[0] == "train"]) >= 6 for rid in ids))

    wait_until(checkpointed_and_past, 240, "every member checkpointed, with points past it")
    assert proc.poll() is None, "the group finished before it could be killed: raise the steps"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert {store.get_run(store.connect(url), rid).status for rid in ids} == {"running"}
    # the last member alone, the other two as a group: both resume from the group's checkpoints
    alone_env = {**os.environ, "PYTHONPATH": str(REPO), "ABLATE_CLAIMANT": _claimed_again(url, ids[2:])}
    subprocess.run([sys.executable, "-m", "ablate.train", "--run-id", str(ids[2]), "--db", url, "--artifacts", str(art),
                    "--quiet", "--threads", "1"], env=alone_env, check=True, timeout=patience(300),
                   stdout=subprocess.DEVNULL)
    env["ABLATE_CLAIMANT"] = _claimed_again(url, ids[:2])
    subprocess.run(_group_command(url, ids[:2], art, 1e9), env=env, check=True, timeout=patience(300),
                   stdout=subprocess.DEVNULL)
    for rid in ids:
        points = [p[:2] for p in curve(url, rid)]
        assert len(points) == len(set(points)), "a point was written twice"
    assert furthest(solo, (url, ids)) < REL


def _claimed_again(url: str, ids: list[int]) -> str:
    """The claims of a dead group taken over, as a runner does once their heartbeats are stale."""
    claimant = store.new_claimant()
    for rid in ids:
        assert store.claim_run(store.connect(url), rid, claimant, statuses=("running",))
    return claimant


@pytest.mark.slow
def test_cancelling_one_member_stops_it_alone(tmp_path):
    """A run of a training group cancelled (its row, from any host): its heartbeat tells that member, which
    checkpoints and ends `cancelled` at its next step; the other members train on to `completed`."""
    trials = [make_trial(0, budget={"steps": 3000})]
    url = f"sqlite:///{tmp_path / 'cancel.db'}"
    ids = register(url, [trials[0], make_trial(1, budget={"steps": 400})])
    env = {**os.environ, "ABLATE_CLAIMANT": _claimed(url, ids), "PYTHONPATH": str(REPO),
           "ABLATE_HEARTBEAT_SECONDS": "0.5"}
    proc = subprocess.Popen(_group_command(url, ids, tmp_path / "art", 1e9), env=env, stdout=subprocess.DEVNULL)
    wait_until(lambda: len(curve(url, ids[0])) >= 3, 120, "the group trains")
    store.update_run(store.connect(url), ids[0], status="cancelled")
    assert proc.wait(timeout=patience(300)) == 3  # not every run has its outcome: one was cancelled
    first, second = (store.get_run(store.connect(url), rid) for rid in ids)
    assert first.status == "cancelled" and 0 < first.steps < 3000 and first.checkpoint_path
    assert second.status == "completed" and second.steps == 400


@pytest.mark.slow
def test_a_group_out_of_memory_is_split_down_to_runs_alone_and_each_ends_as_its_solo_run(tmp_path):
    """Out of memory at every size (a 1 MB cap, checked against the process's peak as on any CPU run): the group of 4
    checkpoints every member and ends, the runner trains the halves, they split again, and each run, alone at last,
    ends `oom` at step 0 as its solo run does under that cap; each run's notes say both splits, no point is written
    twice. (The cap is below any process: what fits in a half depends on the machine's libraries, whose peaks differ
    by hundreds of MB between this machine and a clean CI clone, so no cap between group sizes holds everywhere.)"""
    trials = [make_trial(seed, budget={"steps": 6}) for seed in range(4)]
    url = f"sqlite:///{tmp_path / 'split.db'}"
    ids = register(url, trials)
    opts = runner.LaunchOptions(db_url=url, artifacts=tmp_path / "art", threads=1, memory_cap_mb=1, warm=False)
    assert runner.run_group(ids, opts) == dict.fromkeys(ids, "oom")
    alone = train(trials[0], settings(tmp_path / "solo", None, None, memory_cap_mb=1))
    for rid in ids:
        row = store.get_run(store.connect(url), rid)
        splits = row.notes["fused"]["split"]
        assert [s.split(" ran out")[0] for s in splits] == ["a fused group of 4", "a fused group of 2"], splits
        assert row.steps == alone["steps"] == 0 and "out of memory at step 0" in row.error and row.attempts == 3
        points = [p[:2] for p in curve(url, rid)]
        assert len(points) == len(set(points))
