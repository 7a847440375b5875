"""The torch side every objective shares: the trainer's entry points, the Objective wrapper, the common losses.

Losses are returned as (sum over counted tokens, number of counted tokens) so that callers form
token-weighted means across batches, micro-batches and ranks (the studies averaged per-batch means).

The trainer never calls a loss on a bare model: it wraps `Objective(trial, model)`, one module whose
forward(input_ids, labels) is the model AND its loss, in DDP and torch.compile. Every forward pass of
every objective then goes through the wrapper's forward (DDP's gradient hooks, the compiled graph), and
a loss a model adds internally (mixture-of-depths' router loss) comes back from that same forward.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ablate.config import registry

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig

IGNORE_INDEX = -100

LossFn = Callable[[nn.Module, Tensor, Tensor], tuple[Tensor, Tensor]]


def module(objective: str) -> ModuleType:
    """The objective's torch module, from the registry."""
    return registry.objective(objective).load()


def loss_function(trial: TrialConfig) -> LossFn:
    """The trainer's loss for a trial: (model, input_ids, labels) -> (loss sum, token count); next-token loss for
    an objective registered without one."""
    loss = getattr(module(trial.objective), "loss", None)
    return next_token_loss if loss is None else loss(trial)


def target_counter(trial: TrialConfig) -> Callable[[Tensor], int]:
    """labels (B, T) on the host -> how many targets the trial's loss counts in them.

    The same number the loss returns as its count, known before the forward pass without a device
    sync, so that a step's micro-batches are weighted by tokens over the whole step.
    """
    count = getattr(module(trial.objective), "count", None)
    return count_next_tokens if count is None else count(trial)


def token_counter(trial: TrialConfig) -> Callable[[Tensor], int]:
    """labels (B, T) on the host -> the real input tokens they stand for (throughput, token budgets)."""
    return getattr(module(trial.objective), "input_tokens", count_next_tokens)


def check_data(trial: TrialConfig, prepared: Any) -> None:
    """The objective's own check of the prepared corpus, once before training (most have none)."""
    check = getattr(module(trial.objective), "check_data", None)
    if check is not None:
        check(trial, prepared)


def reports_accuracy(trial: TrialConfig) -> bool:
    """Whether the eval pass reports the fraction of rows classified right (the objective's ACCURACY)."""
    return getattr(module(trial.objective), "ACCURACY", False)


def count_next_tokens(labels: Tensor) -> int:
    return int((labels[:, 1:] != IGNORE_INDEX).sum())


def count_aligned(labels: Tensor) -> int:
    return int((labels != IGNORE_INDEX).sum())


def model_for(trial: TrialConfig, vocab_size: int) -> nn.Module:
    """The model a trial trains: the registry's model for `clm`; other objectives wrap or pair stacks."""
    return module(trial.objective).build(trial, vocab_size)


class Objective(nn.Module):
    """A trial's model and its loss as one module: what DDP and torch.compile wrap.

    forward(input_ids, labels) -> (loss sum, target count, auxiliary loss, correct): the objective's summed
    loss over its counted targets, how many it counted, the sum of the losses the model added inside its
    forward (0 when none; the trainer adds them, weight 1, to the step's mean loss before any loss
    scaling, so an fp16 GradScaler scales them like the main loss), and for classification how many rows
    it classified right (None otherwise). `model` is the bare model (checkpoints, generation and
    retrieval use it).
    """

    def __init__(self, trial: TrialConfig, model: nn.Module):
        super().__init__()
        self.model = model
        self.loss_fn = loss_function(trial)
        # found once, not per forward: the submodules that add losses of their own (mixture-of-depths)
        self._aux_sources = [m for m in model.modules() if hasattr(m, "auxiliary_loss")]

    def forward(self, input_ids: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        total, count = self.loss_fn(self.model, input_ids, labels)
        correct = self.model.take_correct() if hasattr(self.model, "take_correct") else None
        return total, count, self._auxiliary_loss(total), correct

    def _auxiliary_loss(self, like: Tensor) -> Tensor:
        """The sum of the sources' `auxiliary_loss()` since the last call (collecting clears them); 0 if none."""
        parts = [aux for m in self._aux_sources for aux in [m.auxiliary_loss()] if aux is not None]
        return sum(parts, like.new_zeros((), dtype=torch.float32))


def causal_lm_loss(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Next-token cross-entropy: logits (B, T, V) at t predict labels (B, T) at t + 1."""
    return aligned_loss(logits[:, :-1], labels[:, 1:])


def aligned_loss(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Cross-entropy of logits (B, T, V) against targets (B, T) at the same positions, -100 ignored: (sum, count)."""
    import torch.nn.functional as F

    total = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
                            ignore_index=IGNORE_INDEX, reduction="sum")
    return total, (targets != IGNORE_INDEX).sum()


def next_token_loss(model: nn.Module, input_ids: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """The causal LM objective on a batch: (loss sum, token count)."""
    return causal_lm_loss(model(input_ids), labels)


def stacks(trial: TrialConfig, vocab_size: int) -> tuple[nn.Module, nn.Module]:
    """Two models of the trial's architecture; the second without embedding and head (it uses the first's)."""
    from ablate import models

    first = models.build(trial, vocab_size)
    second = models.build(trial, vocab_size)
    second.strip_ends()
    return first, second
