"""One process trains one trial: `python -m ablate.train --run-id N` (also what torchrun and the warm helper run).

    loop.py      train(): the loop in named phases (setup, warm-up, decide/bookkeeping/eval/checkpoint/step, finish)
    trainer.py   Trainer: what setup builds, a resumed run's state, one optimizer step, finalize (the outcome)
    points.py    train-loss points (divergence check), the progress line, checkpoints
    evaluate.py  the eval pass
    device.py    device, precision, autocast, the hardware profile's memory cap
    optim.py     AdamW, its step without torch.optim's compile-only wrappers, on_oom: shrink
    cli.py       main(): the command line, the claim, distributed start-up; __main__.py runs it
"""

from ablate.runstate import Settings
from ablate.train.cli import main
from ablate.train.device import autocast, hardware_check, resolve_precision
from ablate.train.evaluate import evaluate
from ablate.train.loop import train
from ablate.train.optim import make_optimizer, plain_step

__all__ = ["Settings", "autocast", "evaluate", "hardware_check", "main", "make_optimizer", "plain_step",
           "resolve_precision", "train"]
