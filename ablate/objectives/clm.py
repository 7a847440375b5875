"""Causal language modelling: every position predicts the next token (the studies' main task)."""

from __future__ import annotations

from typing import Any

from torch import nn

from ablate.objectives.base import LossFn, count_next_tokens, next_token_loss


def build(trial: Any, vocab_size: int) -> nn.Module:
    from ablate import models

    return models.build(trial, vocab_size)


def loss(trial: Any) -> LossFn:
    return next_token_loss


def count(trial: Any):
    return count_next_tokens
