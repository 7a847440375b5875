"""A deliberately broken architecture for the contract check: both its options module and its model module.

Its logits at t read token t + peek (peek 0: causal); shape_bug adds a logit; explode makes the builder raise.
No param_count: a plugin need not give a closed form.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ablate.config.units import Frozen


class Options(Frozen):
    peek: int = 1  # logits at t read token t + peek
    shape_bug: bool = False  # logits (B, T, V + 1)
    explode: bool = False  # build raises


class Leaky(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, options: Options):
        super().__init__()
        self.peek = options.peek
        self.embed = nn.Embedding(vocab_size, d_model)
        self.head = nn.Linear(d_model, vocab_size + options.shape_bug)

    def forward(self, input_ids: Tensor) -> Tensor:
        x = self.embed(input_ids)  # (B, T, D)
        ahead = torch.roll(x, -self.peek, dims=1)  # (B, T, D): position t holds token t + peek
        return self.head(x + ahead)  # (B, T, V)


def build(trial, vocab_size: int) -> nn.Module:
    options = Options(**trial.options)
    if options.explode:
        raise ValueError("leaky-test was told to explode")
    return Leaky(vocab_size, trial.d_model, options)
