"""The optimizer: AdamW as the studies configured it, its step without torch.optim's compile-only wrappers,
and the on_oom: shrink fallback."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch

from ablate.config import TrialConfig
from ablate.train.state import Progress


def make_optimizer(model: torch.nn.Module, trial: TrialConfig, device: torch.device,
                   compiling: bool = False) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms, biases or other vectors); fused on CUDA."""
    if not compiling:
        _optimizer_without_dynamo()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": trial.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=trial.lr, betas=tuple(trial.betas), fused=device.type == "cuda",
    )


# torch.compile's sake: four Optimizer methods at their first call, to build a "do not trace" marker, and step()
# on every call, to mark a graph break. A trainer that compiles nothing traces none of them, so it skips both
# (where dynamo is loaded already, as transformers' models load it, nothing is saved). tests/train/test_train_cost.py checks
# that the import stays out and that the plain step is the same update, should torch change these wrappers.


def _optimizer_without_dynamo() -> None:
    """Cache each marked method's own function as its marker (`__dynamo_disable`, which torch's wrapper looks up
    first), so its first call runs it as is."""
    if "torch._dynamo" in sys.modules:
        return
    for name in ("add_param_group", "zero_grad", "state_dict", "load_state_dict"):
        fn = getattr(getattr(torch.optim.Optimizer, name), "__wrapped__", None)
        if fn is not None and getattr(fn, "__dynamo_disable", None) is None:
            setattr(fn, "__dynamo_disable", fn)


def plain_step(optimizer: torch.optim.Optimizer) -> Callable[[], Any]:
    """The optimizer's update without torch.optim's step wrappers (the graph break, the profiler's label, step
    hooks, of which ablate registers none): its step function under no_grad, as the wrapper runs it."""
    update = inspect.unwrap(type(optimizer).step)

    def step() -> Any:
        with torch.no_grad():
            return update(optimizer)

    return step


def apply_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: Any,
                 step: Callable[[], Any]) -> None:
    """One update after a step's backward passes: unscale (fp16's scaler), clip the gradient norm at 1.0, step
    (`step`: the trainer's plain_step, or optimizer.step; through the scaler, which skips a step whose gradients
    are not finite), zero the gradients. The trainer and bench/train.py's bare loop both update this way."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        step()
    optimizer.zero_grad(set_to_none=True)


def shrink(trial: TrialConfig, progress: Progress, optimizer: Any, device: torch.device) -> bool:
    """on_oom: shrink — halve the micro-batch and double accumulation (same effective batch); False if it can't."""
    if trial.on_oom != "shrink" or progress.micro_batch <= 1:
        return False
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    progress.micro_batch //= 2
    progress.grad_accum *= 2
    progress.notes.setdefault("oom_shrink", []).append(
        {"step": progress.step, "micro_batch": progress.micro_batch, "grad_accum": progress.grad_accum})
    return True

