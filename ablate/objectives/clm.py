"""Causal language modelling: every position predicts the next token (the studies' main task)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from ablate.objectives.base import LossFn, count_next_tokens, next_token_loss

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig


def build(trial: TrialConfig, vocab_size: int) -> nn.Module:
    from ablate import models

    return models.build(trial, vocab_size)


def loss(trial: TrialConfig) -> LossFn:
    return next_token_loss


def count(trial: TrialConfig):
    return count_next_tokens
