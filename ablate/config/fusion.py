"""Fused groups, torch-free: which trials may train together in one process as one batched model, and why a trial
may not. A speed feature, never part of a trial's identity: a member equals its solo run (ablate/train/fused.py).

    off       every trial trains alone (the default)
    seeds     trials that differ only in seed train together
    shapes    trials of the same shapes train together: seed, lr, weight decay, warm-up and schedule may differ
    auto      `shapes` where fusing pays (a GPU, and a step small enough to be launch-bound: `pays`), else `off`
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal

from ablate.config import registry

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig

FuseMode = Literal["off", "seeds", "shapes", "auto"]
FUSE_MODES: tuple[str, ...] = ("off", "seeds", "shapes", "auto")
# what a member may hold of its own under `shapes` (the rest of its config is the group's): none of it changes a
# tensor's shape, and each is read per member (its schedule's learning rate, its weight decay, its data order)
SHAPE_FREE = ("seed", "lr", "weight_decay", "warmup", "warmup_steps", "schedule")
FUSE_MAX = 8  # members per group by default (the bench's k = 8; out of memory halves a group)

# Fusing pays where a solo step is launch-bound: its compute at the GPU's rate is below the fixed cost of a step's
# kernel launches. On the H200 (bench/results/nvidia-h200.md) that fixed cost was 10 ms (mixer, 8 layers) to 24 ms
# (Llama); at an achieved 40% of a 989 TFLOP/s peak, 10 ms is 4e12 FLOPs. A trial whose step is below this fuses
# under `auto` on any GPU; `python -m bench gpu` measures what fusing gives on the device at hand.
AUTO_MAX_STEP_FLOPS = 4e12


def refusal(trial: TrialConfig) -> str | None:
    """Why this trial cannot train in a fused group (it trains alone), or None. A model whose batched step fails
    (a plugin's data-dependent control flow) is found where the group trains (ablate/train/fused.py `probe`)."""
    if trial.mode != "train":
        return "a memory probe trains nothing"
    if trial.budget.gpus > 1:
        return f"a {trial.budget.gpus}-GPU trial trains under torchrun (DDP), one process per GPU"
    if trial.on_oom == "shrink":
        return "on_oom: shrink changes a member's micro-batch alone, and a group's members step together"
    options = registry.options_module(trial.architecture)
    if not getattr(options, "FUSES", True):
        return getattr(options, "FUSE_NOTE", f"{trial.architecture} does not fuse")
    dropout = {k: v for k, v in trial.effective_options().items() if "dropout" in k and v}
    if dropout:
        said = ", ".join(f"{k} {v:g}" for k, v in dropout.items())
        return (f"{said}: a fused step's dropout draws are not the solo run's per-seed stream; with dropout 0 "
                "the trial fuses")
    return None


def group_key(trial: TrialConfig, mode: str) -> str | None:
    """The key trials of one group share under `mode` ('seeds' or 'shapes'), or None: it trains alone."""
    if mode not in ("seeds", "shapes") or refusal(trial) is not None:
        return None
    free = ("seed",) if mode == "seeds" else SHAPE_FREE
    data = {k: v for k, v in trial.model_dump(mode="json").items() if k not in free}
    return json.dumps(data, sort_keys=True, default=str)


def step_flops(trial: TrialConfig) -> float:
    """The training FLOPs of one optimizer step of a trial (6N + 3 x token mixing per position, every position of
    every row), from its family's closed-form counts (a tokenizer of unknown size counted at 32,000)."""
    family = registry.families()[trial.architecture]
    params = family.param_count(trial, trial.tokenizer.vocab_size or 32_000)
    per_token = 6.0 * params + 3.0 * family.mixing_flops_per_token(trial)
    return per_token * trial.batch_size * trial.grad_accum * trial.context


def pays(trial: TrialConfig, gpus: int) -> bool:
    """Whether `auto` fuses this trial here: a GPU, and a step small enough to be launch-bound (a plugin family
    without a closed-form size is not counted here, where no torch is loaded: it trains alone)."""
    if gpus <= 0 or not registry.families()[trial.architecture].closed_form:
        return False
    return step_flops(trial) < AUTO_MAX_STEP_FLOPS


def groups(trials: dict[int, TrialConfig], mode: str, most: int = FUSE_MAX,
           fuses: Any = None) -> list[list[int]]:
    """The run ids of `trials` ({run id: trial}, in dispatch order) in groups: each a list of at most `most` ids
    whose trials share a group key, in first-seen order; a trial that trains alone is a group of one. `fuses`
    (trial -> bool), when given, says which trials may fuse at all (`auto`'s rule)."""
    if mode == "off":
        return [[rid] for rid in trials]
    by_key: dict[str, list[int]] = {}
    order: list[list[int]] = []
    for rid, trial in trials.items():
        key = group_key(trial, "shapes" if mode == "auto" else mode)
        if key is None or (fuses is not None and not fuses(trial)):
            order.append([rid])
            continue
        group = by_key.get(key)
        if group is None or len(group) >= most:
            group = by_key[key] = []
            order.append(group)
        group.append(rid)
    return order
