"""One-step completion (masked-mixers-2.md): predict the window's second half from its first in one pass.

The model stays causal; after `mask_layer` blocks (default half of them) the hidden states of the
prediction half (positions >= split * T) are zeroed, so the later blocks carry nothing of those
tokens and every prediction-half position works from the given half alone. Loss is next-token
cross-entropy on the prediction half only (targets at positions >= split * T).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from ablate.objectives.base import IGNORE_INDEX, LossFn, causal_lm_loss

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig


def given_length(split: float, length: int) -> int:
    """How many leading positions of a window of `length` are given (at least one is, and one is predicted)."""
    return max(1, min(length - 1, round(split * length)))


class OneStep(nn.Module):
    def __init__(self, trial: TrialConfig, vocab_size: int):
        super().__init__()
        from ablate import models

        settings = trial.objective_settings()
        self.model = models.build(trial, vocab_size)
        self.split = settings.split
        self.mask_layer = settings.mask_layer or trial.layers // 2
        self.model.layers[self.mask_layer - 1].register_forward_hook(self._mask_prediction_half)

    def given(self, length: int) -> int:
        """How many leading positions are given (the rest is predicted)."""
        return given_length(self.split, length)

    def _mask_prediction_half(self, module: nn.Module, args: Any, output: Any) -> Any:
        hidden = output[0] if isinstance(output, tuple) else output
        keep = hidden.new_ones(hidden.shape[1])
        keep[self.given(hidden.shape[1]):] = 0
        masked = hidden * keep[:, None]
        return (masked, *output[1:]) if isinstance(output, tuple) else masked

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.model(input_ids)


def build(trial: TrialConfig, vocab_size: int) -> nn.Module:
    return OneStep(trial, vocab_size)


def completion_loss(model: nn.Module, input_ids: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    targets = labels.clone()
    targets[:, : model.given(input_ids.shape[1])] = IGNORE_INDEX
    return causal_lm_loss(model(input_ids), targets)


def loss(trial: TrialConfig) -> LossFn:
    return completion_loss


def count(trial: TrialConfig):
    split = trial.objective_settings().split

    def targets(labels: Tensor) -> int:
        return int((labels[:, given_length(split, labels.shape[1]):] != IGNORE_INDEX).sum())

    return targets
