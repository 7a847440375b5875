"""How fairly the trainer spends a budget: fraction of wall time in training steps, and its speed vs a bare loop.

    python -m bench.train                      # 60 s budget, mixer and llama at CPU sizes
    python -m bench.train --seconds 20 --steps 60

Prints, per architecture:
  - budget use: the budget clock (training steps only) over the wall time of the whole `train()` call
    (data cache open, model build, untimed warm-up, evals, checkpoints, final eval included);
  - trainer tokens/s over a fixed number of steps vs a bare hand-written loop (same model, same
    batches, same optimizer and precision), and their ratio.
A script, not a test: the numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ablate import models, objectives
from ablate.data import prepare
from ablate.spec import TrialConfig
from ablate.train import Settings, train


def trial_for(arch: str, budget: dict, d_model: int, context: int, batch: int) -> TrialConfig:
    return TrialConfig(architecture=arch, heads=4 if arch != "mixer" else None, d_model=d_model, layers=4,
                       context=context, lr=2e-3, batch_size=batch, precision="fp32", warmup=0.05,
                       dataset={"source": "ablate:tinystories-sample", "eval": {"holdout": 24}},
                       tokenizer={"vocab_size": 1024}, budget=budget, eval={"at": [0.25, 0.5, 0.75]})


def bare_loop(trial: TrialConfig, root: Path, steps: int) -> float:
    """The same model, batches and optimizer, no clock, no logging: tokens/s."""
    prepared = prepare(trial.dataset, trial.tokenizer, trial.context, root, progress=False)
    torch.manual_seed(trial.seed)
    model = models.build(trial, prepared.vocab_size)
    opt = torch.optim.AdamW(model.parameters(), lr=trial.lr, betas=(0.9, 0.95))
    order = prepared.train.order(0, trial.seed)
    n = len(order)
    tokens = 0
    for step in range(steps + 2):
        if step == 2:  # same untimed warm-up as the trainer
            t0, tokens = time.perf_counter(), 0
        idx = np.array([order[(step * trial.batch_size + j) % n] for j in range(trial.batch_size)])
        ids, labels = prepared.train.batch(idx)
        tokens += int((labels[:, 1:] != -100).sum())
        s, c = objectives.causal_lm_loss(model(ids), labels)
        (s / c).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return tokens / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0, help="wall-clock budget for the budget-use run")
    p.add_argument("--steps", type=int, default=80, help="steps for the trainer vs bare loop comparison")
    p.add_argument("--archs", nargs="+", default=["mixer", "llama"])
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ablate-bench-"))
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, artifacts {root}")
    for arch in args.archs:
        wall_trial = trial_for(arch, {"wall_clock": f"{args.seconds}s"}, args.d_model, args.context, args.batch)
        prepare(wall_trial.dataset, wall_trial.tokenizer, wall_trial.context, root, progress=False)  # cache warm
        t0 = time.perf_counter()
        out = train(wall_trial, Settings(artifacts=root, progress=False, checkpoint_every=15.0))
        wall = time.perf_counter() - t0
        meters = out["notes"]["meters"] if out.get("notes") else {}
        print(f"{arch:6s} budget {args.seconds:.0f}s: clock {out['train_seconds']:.2f}s of {wall:.2f}s wall "
              f"= {out['train_seconds'] / wall:.1%} in training steps; "
              f"off-clock: " + ", ".join(f"{k} {v:.2f}s" for k, v in sorted(meters.items()) if k != "data")
              + f"; data wait {out['data_wait_fraction']:.1%}; final eval {out['final_eval_loss']:.3f}")
        step_trial = trial_for(arch, {"steps": args.steps}, args.d_model, args.context, args.batch)
        runs = []
        for _ in range(2):  # interleave and keep the best of two: the machine is shared and noisy
            trainer_tps = train(step_trial, Settings(artifacts=root, progress=False, resume=False,
                                                     checkpoint_every=1e9))["tokens_per_second"]
            runs.append((trainer_tps, bare_loop(step_trial, root, args.steps)))
        trainer_tps, bare_tps = max(r[0] for r in runs), max(r[1] for r in runs)
        print(f"{arch:6s} {args.steps} steps: trainer {trainer_tps:,.0f} tok/s, bare loop {bare_tps:,.0f} tok/s, "
              f"ratio {trainer_tps / bare_tps:.3f}")


if __name__ == "__main__":
    main()
