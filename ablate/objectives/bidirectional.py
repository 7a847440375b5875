"""Bidirectional all-token prediction (masked-mixers-2.md): every token predicted from both sides in one pass.

A forward stack reads the sequence left to right and a reverse stack reads it flipped, both causal, so
the forward state at t - 1 has seen tokens < t and the reverse state at t + 1 has seen tokens > t; the
two are realigned and summed only before the LM head. For the mixer this is the study's parallel
forward (lower-triangular) and reverse (upper, offset past the target) convolutions; summing the
streams inside the blocks would leak the target after two layers, as the study found. For the
transformer it is the study's second causal stack over the flipped sequence. Position t's logits
predict token t itself (no shift): t = 0 only from the right, t = T - 1 only from the left.

The mixer's blocks are the study's DoubleMixerBlock: separate forward and reverse sequence mixings and
sequence norms, but ONE feed-forward and its norm per block, applied to both streams (~151M parameters at
d=1024, 16 layers, where two whole stacks would be ~293M). The transformer's are two whole stacks (the
study's forward_model and reverse_model), sharing only the embedding and head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ablate.objectives.base import LossFn, aligned_loss, count_aligned, stacks

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig


class Bidirectional(nn.Module):
    def __init__(self, trial: TrialConfig, vocab_size: int):
        super().__init__()
        self.forward_stack, self.reverse_stack = stacks(trial, vocab_size)  # the embedding and head are shared
        if trial.architecture == "mixer":
            for f, r in zip(self.forward_stack.blocks, self.reverse_stack.blocks, strict=True):
                r.ffn, r.ffn_norm = f.ffn, f.ffn_norm  # one feed-forward per block for both streams

    def forward(self, input_ids: Tensor) -> Tensor:
        x = self.forward_stack.embed(input_ids)  # (B, T, D)
        left = self.forward_stack.hidden_from_embeds(x)  # left[t]: tokens <= t
        right = self.reverse_stack.hidden_from_embeds(x.flip(1)).flip(1)  # right[t]: tokens >= t
        zero = left.new_zeros(left[:, :1].shape)
        both = torch.cat([zero, left[:, :-1]], 1) + torch.cat([right[:, 1:], zero], 1)  # tokens != t
        return self.forward_stack.head(both)  # (B, T, V): position t predicts token t


def build(trial: TrialConfig, vocab_size: int) -> nn.Module:
    return Bidirectional(trial, vocab_size)


def bidirectional_loss(model: nn.Module, input_ids: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    return aligned_loss(model(input_ids), labels)


def loss(trial: TrialConfig) -> LossFn:
    return bidirectional_loss


def count(trial: TrialConfig):
    return count_aligned
