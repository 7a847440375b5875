"""What a member of a fused group (fused.py) holds of its own beside its Trainer: its budget clock (its seconds before
the group plus the group's stepping time, its own meters), its stop flag (the group's SIGTERM, or a cancel of its run
alone), and how its budget is read (a wall clock as the steps a solo run of its trial makes in it on this device)."""

from __future__ import annotations

import dataclasses
import time

import torch

from ablate.config import TrialConfig
from ablate.train import budget as bud
from ablate.train.evaluate import evaluate
from ablate.train.state import Dist, TrainerSettings
from ablate.train.stopping import StopSignal
from ablate.train.trainer import Trainer

PROBE_STEPS = 20  # timed steps of the solo run that reads a wall-clock budget as steps


def read_wall_clock(members: list[Trainer], settings: TrainerSettings) -> None:
    """A wall-clock budget means what a solo run of the trial gets in that time on this device (fused, the members
    share the device's time): a short solo run measures its step (and, where evals are charged to the clock, as the
    studies' recipe charges them, one eval), and each member still reading the wall clock trains the steps that fit
    in it with those evals, said in its notes (`budget_read`, kept in its checkpoints: a resumed member keeps it)."""
    owed = [t for t in members if t.reading[0] == "wall_clock"]
    if not owed:
        return
    trial, amount = owed[0].trial, owed[0].reading[1]
    seconds, eval_seconds = solo_seconds(trial, settings)
    steps = steps_in(amount, seconds, eval_seconds, trial)
    for t in owed:
        t.reading = ("steps", steps)
        t.progress.notes["budget_read"] = {"wall_clock_seconds": amount, "steps": steps, "device": t.device_name,
                                           "solo_step_seconds": seconds, "probe_steps": PROBE_STEPS,
                                           **({"eval_seconds": eval_seconds} if eval_seconds else {})}


def steps_in(amount: float, step: float, eval_seconds: float, trial: TrialConfig) -> int:
    """The steps a solo run makes in `amount` seconds at `step` seconds a step, with its charged evals on the clock:
    one at each eval.at fraction and one every eval.every_steps steps, `eval_seconds` each (0: none charged)."""
    plan = trial.eval
    at_fractions = len(plan.at) * eval_seconds
    per_step = step + (eval_seconds / plan.every_steps if plan.every_steps else 0.0)
    return max(1, int((amount - at_fractions) / per_step))


def solo_seconds(trial: TrialConfig, settings: TrainerSettings) -> tuple[float, float]:
    """(seconds of one training step, of one intermediate eval where evals are charged to the clock, else 0) of the
    trial alone on this device, as its solo run would take them (its own build, compiled where the solo run would
    be, its untimed warm-up first; the mean of PROBE_STEPS steps). Nothing is recorded or kept."""
    t = Trainer(trial, dataclasses.replace(settings, run_id=None, claimant=None, resume=False, progress=False), Dist())
    t.build()
    t.resume()
    for _ in range(max(settings.warmup_steps, 1)):
        t.one_step(0.0)
    t.sync()
    t0 = time.perf_counter()
    for _ in range(PROBE_STEPS):
        t.one_step(trial.lr)
    t.sync()
    seconds = (time.perf_counter() - t0) / PROBE_STEPS
    eval_seconds = 0.0
    plan = trial.eval
    if plan.charged and (plan.at or plan.every_steps):
        t0 = time.perf_counter()
        evaluate(t.wrapped, t.prepared.eval, trial, t.device, t.dist, plan.batches, t.precision, t.progress.micro_batch)
        eval_seconds = time.perf_counter() - t0
    t.recorder.close()
    del t
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return seconds, eval_seconds


class MemberClock(bud.Clock):
    """A member's budget clock: its own seconds before the group (a resumed run's) plus the group's clock (the
    members step together: its stepping time is each one's); its own meters (its evals, its checkpoints). Pausing it
    pauses the group: nobody steps meanwhile."""

    def __init__(self, group: bud.Clock, before: bud.Clock):
        super().__init__(sync=group.sync, elapsed=before.elapsed())
        self.group, self.joined = group, group.elapsed()
        self.meters.update(before.meters)

    def start(self) -> None:
        self.group.start()

    def stop(self) -> None:
        self.group.stop()

    @property
    def is_running(self) -> bool:
        return self.group.is_running

    def elapsed(self) -> float:
        return self.elapsed_before + self.group.elapsed() - self.joined


class MemberStop:
    """A member's stop flag, as the solo loop's `decide` reads it: the group's (SIGTERM) or its own (a cancel of
    this run alone, told by its recorder's heartbeat)."""

    def __init__(self, group: StopSignal):
        self.group, self.own = group, False

    @property
    def flag(self) -> bool:
        return self.group.flag or self.own

    @flag.setter
    def flag(self, value: bool) -> None:
        self.own = self.own or value
