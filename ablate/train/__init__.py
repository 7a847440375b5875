"""One process trains one trial: `python -m ablate.train --run-id N` (also what torchrun and the warm helper run).

    loop.py        train(): the loop in named phases (setup, warm-up, decide/bookkeeping/eval/checkpoint/step, finish)
    trainer.py     Trainer: what setup builds, a resumed run's state, one optimizer step, finalize (the outcome)
    fused.py       train_group(): several runs of one shape as one batched model, member by member the loop's phases
    stack.py       a fused group's stacked parameters and moments, its vmapped forward, each member's AdamW update
    members.py     a fused member's own clock, stop flag and budget reading (a wall clock as a solo run's steps)
    state.py       TrainerSettings (how to run, not what), Dist (ranks), Progress (saved in checkpoints),
                   Batches (data order)
    budget.py      the budget clock and the learning-rate schedule (torch-free: planning and search read it)
    stopping.py    stop signals: SIGTERM / SIGINT become a checkpoint and a clean end
    points.py      train-loss points (divergence check), the progress line, checkpoint points
    recorder.py    metric points to the DB in batches, the heartbeat, the cancel/orphan watch
    checkpoint.py  the atomic checkpoint write, the weights-only read, every generator's state
    evaluate.py    the eval pass
    device.py      device, precision, autocast, the hardware profile's memory cap, OOM
    optim.py       AdamW, its step without torch.optim's compile-only wrappers, on_oom: shrink
    generate.py    completions from a run's checkpoint (the report's samples, `ablate generate`)
    cli.py         main(): the command line, the claim, distributed start-up; __main__.py runs it

The package face is lazy: `ablate.train.budget` is read by torch-free callers (planning, the search loop), so
importing the package loads nothing until a name is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOMES = {"state": ("TrainerSettings",), "cli": ("main",),
          "device": ("autocast", "hardware_check", "resolve_precision"),
          "evaluate": ("evaluate",), "loop": ("train",), "optim": ("apply_update", "make_optimizer", "plain_step")}
_HOME = {name: module for module, names in _HOMES.items() for name in names}

__all__ = ["TrainerSettings", "apply_update", "autocast", "evaluate", "hardware_check", "main", "make_optimizer", "plain_step",
           "resolve_precision", "train"]

if TYPE_CHECKING:  # for readers and type checkers; at run time the names come through __getattr__
    from ablate.train.cli import main
    from ablate.train.device import autocast, hardware_check, resolve_precision
    from ablate.train.evaluate import evaluate
    from ablate.train.loop import train
    from ablate.train.optim import make_optimizer, plain_step
    from ablate.train.state import TrainerSettings


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})
