"""Autoencoding through one vector (masked-mixers-2.md): encoder -> last token's last hidden state -> decoder.

The encoder stack reads the window; only its last position's final hidden state (which, causally,
has seen every token) goes on, repeated over the window as the decoder stack's input; the LM head
reconstructs the input at every position. The decoder sees the input only through that vector, so
the task cannot be solved by copying tokens. Mixer and Llama stacks, sharing one embedding and head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor, nn

from ablate.objectives.base import LossFn, aligned_loss, count_aligned, stacks

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig


class Autoencoder(nn.Module):
    def __init__(self, trial: TrialConfig, vocab_size: int):
        super().__init__()
        self.encoder, self.decoder = stacks(trial, vocab_size)

    def encode(self, input_ids: Tensor) -> Tensor:
        """(B, 1, D): the encoder's last hidden state at the last position."""
        return self.encoder.hidden_from_embeds(self.encoder.embed(input_ids))[:, -1:]

    def decode(self, code: Tensor, length: int) -> Tensor:
        """Logits (B, length, V) reconstructed from the code alone."""
        return self.encoder.head(self.decoder.hidden_from_embeds(code.expand(-1, length, -1)))

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.decode(self.encode(input_ids), input_ids.shape[1])


def build(trial: TrialConfig, vocab_size: int) -> nn.Module:
    return Autoencoder(trial, vocab_size)


def reconstruction_loss(model: nn.Module, input_ids: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    return aligned_loss(model(input_ids), labels)  # position t reconstructs token t (pads are -100)


def loss(trial: TrialConfig) -> LossFn:
    return reconstruction_loss


def count(trial: TrialConfig):
    return count_aligned
