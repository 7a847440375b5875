"""What a member of a fused group (fused.py) holds of its own beside its Trainer: its budget clock (its seconds before
the group plus the group's stepping time, its own meters), its stop flag (the group's SIGTERM, or a cancel of its run
alone), and how its budget is read (a wall clock as the steps a solo run of its trial makes in it on this device)."""

from __future__ import annotations

import dataclasses
import time

import torch

from ablate.config import TrialConfig
from ablate.train import budget as bud
from ablate.train.state import Dist, TrainerSettings
from ablate.train.stopping import StopSignal
from ablate.train.trainer import Trainer

PROBE_STEPS = 20  # timed steps of the solo run that reads a wall-clock budget as steps


def read_wall_clock(members: list[Trainer], settings: TrainerSettings) -> None:
    """A wall-clock budget means what a solo run of the trial gets in that time on this device (fused, the members
    share the device's time): a short solo run measures its step, and each member still reading the wall clock
    trains the steps that fit in it, said in its notes (`budget_read`, kept in its checkpoints: a resumed member
    keeps its reading). Evals a solo run charges to its clock (eval.charged) are not taken off."""
    owed = [t for t in members if t.reading[0] == "wall_clock"]
    if not owed:
        return
    seconds = solo_step_seconds(owed[0].trial, settings)
    amount = owed[0].reading[1]
    steps = max(1, int(amount / seconds))
    for t in owed:
        t.reading = ("steps", steps)
        t.progress.notes["budget_read"] = {"wall_clock_seconds": amount, "steps": steps, "device": t.device_name,
                                           "solo_step_seconds": round(seconds, 6), "probe_steps": PROBE_STEPS}


def solo_step_seconds(trial: TrialConfig, settings: TrainerSettings) -> float:
    """The seconds of one training step of the trial alone on this device, as its solo run would take it (its own
    build, compiled where the solo run would be, its untimed warm-up first): the mean of PROBE_STEPS steps. Nothing
    is recorded or kept."""
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
    t.recorder.close()
    del t
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return seconds


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
