"""Training objectives: map a model's logits and the batch's labels to a summed loss and a token count.

Losses are returned as (sum over counted tokens, number of counted tokens) so that callers form
token-weighted means across batches, micro-batches and ranks (the studies averaged per-batch means).
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from ablate.errors import AblateError

IGNORE_INDEX = -100

LossFn = Callable[[nn.Module, Tensor, Tensor], tuple[Tensor, Tensor]]


def causal_lm_loss(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Next-token cross-entropy: logits (B, T, V) at t predict labels (B, T) at t + 1.

    Returns the fp32 sum of per-token cross-entropy over positions whose shifted label is not -100,
    and the number of such positions (a 0-d long tensor).
    """
    shifted_logits = logits[:, :-1].float()  # (B, T-1, V)
    targets = labels[:, 1:]  # (B, T-1)
    total = F.cross_entropy(
        shifted_logits.reshape(-1, shifted_logits.shape[-1]), targets.reshape(-1),
        ignore_index=IGNORE_INDEX, reduction="sum",
    )
    return total, (targets != IGNORE_INDEX).sum()


def clm(model: nn.Module, input_ids: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """The causal LM objective on a batch: (loss sum, token count)."""
    return causal_lm_loss(model(input_ids), labels)


LOSSES: dict[str, LossFn] = {"clm": clm}


def loss_function(objective: str) -> LossFn:
    """The trainer's loss for a trial objective: (model, input_ids, labels) -> (loss sum, token count)."""
    if objective not in LOSSES:
        raise AblateError(f"objective {objective!r} is not implemented yet; implemented: {', '.join(sorted(LOSSES))}")
    return LOSSES[objective]


def model_for(trial, vocab_size: int) -> nn.Module:
    """The model an objective trains: the registry's model for `clm`; objectives may wrap or pair models."""
    from ablate import models

    builder = MODEL_BUILDERS.get(trial.objective)
    return builder(trial, vocab_size) if builder is not None else models.build(trial, vocab_size)


# objective -> (trial, vocab_size) -> nn.Module, for objectives whose model is not the plain registry model
MODEL_BUILDERS: dict[str, Callable[..., nn.Module]] = {}
