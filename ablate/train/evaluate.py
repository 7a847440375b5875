"""The eval pass: the token-weighted loss over the eval split (sharded across ranks), and accuracy for classification."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ablate.config import TrialConfig
from ablate.objectives.base import reports_accuracy
from ablate.train.state import Dist
from ablate.train.device import to_device, autocast



@torch.no_grad()
def evaluate(objective: torch.nn.Module, rows: Any, trial: TrialConfig, device: torch.device, dist_: Dist,
             max_batches: int | None, precision: str, micro_batch: int | None = None) -> tuple[float, float | None]:
    """Token-weighted mean loss over the eval split (sharded across ranks), in nats, of the (wrapped) Objective
    in eval mode (every model's eval-mode forward is causal: tests/models/test_causality.py), and for an objective that
    reports accuracy (classification) the fraction of rows classified right (else None). `micro_batch`: the rows a
    forward takes (a run that `on_oom: shrink` halved takes fewer at a time); `max_batches` still counts batches of
    the trial's batch_size, so a shrunk run evaluates the same rows."""
    objective.eval()
    total = torch.zeros(3, device=device, dtype=torch.float64)
    n = len(rows)
    order = np.arange(n)
    bs = min(micro_batch or trial.batch_size, trial.batch_size)
    if max_batches is not None:
        order = order[: max_batches * trial.batch_size * dist_.world]
    shards = [order[i: i + bs] for i in range(0, len(order), bs)]
    for idx in shards[dist_.rank:: dist_.world]:
        ids, labels = rows.batch(idx)
        with autocast(device, precision):
            s, c, _, correct = objective(to_device(ids, device), to_device(labels, device))
        total[0] += s.double()
        total[1] += c.double()
        if correct is not None:
            total[2] += correct.double()
    if dist_.distributed:
        dist.all_reduce(total)
    objective.train()
    s, c, right = total.tolist()
    return (s / c if c else float("nan")), (right / c if reports_accuracy(trial) and c else None)
