"""How fairly the trainer spends a budget: fraction of wall time in training steps, and its speed vs a bare loop.

    python -m bench.train                      # 60 s budget, mixer and llama at CPU sizes
    python -m bench.train --seconds 20 --steps 60

Prints, per architecture:
  - budget use: the budget clock (training steps only) over the wall time of the whole `train()` call
    (data cache open, model build, untimed warm-up, evals, checkpoints, final eval included);
  - trainer tokens/s over a fixed number of steps vs a bare hand-written loop on the same device, in the
    same precision, with the same compile setting, model, batches, optimizer (train.make_optimizer: the same
    parameter groups) and update (train.apply_update), run in interleaved pairs; the median of the pairs' ratios.
A script, not a test: the numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ablate import models
from ablate.objectives import base as objectives
from ablate.data import prepare
from ablate.config import TrialConfig
from ablate.train import TrainerSettings, train


def trial_for(arch: str, budget: dict, d_model: int, context: int, batch: int, precision: str = "fp32",
              compile_: bool = False) -> TrialConfig:
    return TrialConfig(architecture=arch, heads=4 if arch != "mixer" else None, d_model=d_model, layers=4,
                       context=context, lr=2e-3, batch_size=batch, precision=precision, compile=compile_, warmup=0.05,
                       dataset={"source": "ablate:tinystories-sample", "eval": {"holdout": 24}},
                       tokenizer={"vocab_size": 1024}, budget=budget, eval={"at": [0.25, 0.5, 0.75]})


def bare_loop(trial: TrialConfig, root: Path, steps: int, device: torch.device) -> float:
    """The trainer's model, batches, optimizer, precision and compile setting on its device, with no clock, no
    logging and no budget checks: tokens/s over `steps` after the same two untimed warm-up steps."""
    from ablate.train import apply_update, autocast as _autocast, make_optimizer

    prepared = prepare(trial.dataset, trial.tokenizer, trial.context, root, progress=False)
    torch.manual_seed(trial.seed)
    model = models.build(trial, prepared.vocab_size).to(device)
    opt = make_optimizer(model, trial, device)
    scaler = torch.amp.GradScaler(device.type) if trial.precision == "fp16" else None
    forward = torch.compile(model) if trial.compile else model
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    order = prepared.train.order(0, trial.seed)
    n = len(order)
    tokens = 0
    for step in range(steps + 2):
        if step == 2:  # same untimed warm-up as the trainer
            sync()
            t0, tokens = time.perf_counter(), 0
        idx = np.array([order[(step * trial.batch_size + j) % n] for j in range(trial.batch_size)])
        ids, labels = prepared.train.batch(idx)
        tokens += int((labels[:, 1:] != -100).sum())
        ids, labels = ids.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        with _autocast(device, trial.precision):
            s, c = objectives.causal_lm_loss(forward(ids), labels)
        loss = s / c
        (scaler.scale(loss) if scaler is not None else loss).backward()
        apply_update(model, opt, scaler, opt.step)
    sync()
    return tokens / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0, help="wall-clock budget for the budget-use run")
    p.add_argument("--steps", type=int, default=80, help="steps for the trainer vs bare loop comparison")
    p.add_argument("--archs", nargs="+", default=["mixer", "llama"])
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default=None,
                   help="default: bf16 on CUDA, fp32 on CPU (both sides use it)")
    p.add_argument("--compile", choices=["auto", "on", "off"], default="auto",
                   help="torch.compile on both sides (auto: on CUDA, off on CPU, as the trainer)")
    p.add_argument("--pairs", type=int, default=3, help="interleaved trainer/bare pairs per architecture")
    args = p.parse_args()
    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    precision = args.precision or ("bf16" if device.type == "cuda" else "fp32")
    compile_ = device.type == "cuda" if args.compile == "auto" else args.compile == "on"
    root = Path(tempfile.mkdtemp(prefix="ablate-bench-"))
    print(f"torch {torch.__version__}, device {device}, {precision}, compile {'on' if compile_ else 'off'}, "
          f"threads {torch.get_num_threads()}, artifacts {root}")
    for arch in args.archs:
        wall_trial = trial_for(arch, {"wall_clock": f"{args.seconds}s"}, args.d_model, args.context, args.batch,
                               precision, compile_)
        prepare(wall_trial.dataset, wall_trial.tokenizer, wall_trial.context, root, progress=False)  # cache warm
        t0 = time.perf_counter()
        out = train(wall_trial, TrainerSettings(artifacts=root, progress=False, checkpoint_every=15.0,
                                                device=device.type))
        wall = time.perf_counter() - t0
        meters = out["notes"]["meters"] if out.get("notes") else {}
        print(f"{arch:6s} budget {args.seconds:.0f}s: clock {out['train_seconds']:.2f}s of {wall:.2f}s wall "
              f"= {out['train_seconds'] / wall:.1%} in training steps; "
              f"off-clock: " + ", ".join(f"{k} {v:.2f}s" for k, v in sorted(meters.items()) if k != "data")
              + f"; data wait {out['data_wait_fraction']:.1%}; final eval {out['final_eval_loss']:.3f}")
        step_trial = trial_for(arch, {"steps": args.steps}, args.d_model, args.context, args.batch, precision, compile_)
        pairs = []
        for i in range(args.pairs):  # interleaved, alternating which side goes first: the machine drifts
            trainer = lambda: train(step_trial, TrainerSettings(artifacts=root, progress=False, resume=False,  # noqa: E731
                                                                checkpoint_every=1e9, device=device.type))["tokens_per_second"]
            bare = lambda: bare_loop(step_trial, root, args.steps, device)  # noqa: E731
            if i % 2 == 0:
                t, b = trainer(), bare()
            else:
                b, t = bare(), trainer()
            pairs.append((t, b))
        ratios = sorted(t / b for t, b in pairs)
        print(f"{arch:6s} {args.steps} steps, {len(pairs)} pairs: trainer "
              + ", ".join(f"{t:,.0f}" for t, _ in pairs) + " tok/s; bare loop " + ", ".join(f"{b:,.0f}" for _, b in pairs)
              + f" tok/s; median ratio {statistics.median(ratios):.3f} (range {ratios[0]:.3f}-{ratios[-1]:.3f})")


if __name__ == "__main__":
    main()
