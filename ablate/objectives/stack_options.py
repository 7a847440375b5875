"""What the options files of the objectives that rebuild a model from its parts share (torch-free).

Those objectives (bidirectional, autoencoder, one_step) take a model apart: its embedding, block stack and head
(ablate.models: embed / hidden_from_embeds / head / layers), which only some families expose.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ablate.config.units import Frozen

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig

WITH_PARTS = ("mixer", "llama")  # the families whose models expose their parts


class NoOptions(Frozen):
    """No options: objective_options stays empty."""


def two_passes(trial: TrialConfig) -> tuple[float, float]:
    """(forward, backward) passes of two stacks, each run once: the parameters already count both."""
    return 1.0, 2.0


def two_stacks(trial: TrialConfig, total: int, inter: int, vocab: int) -> tuple[int, int]:
    """(total, inter-token) parameters of two stacks sharing one embedding and head, from one model's: the shared
    ends counted once (untied: two vocab x d_model matrices; tied: one)."""
    ends = vocab * trial.d_model * (1 if trial.effective_options().get("tie_weights") else 2)
    return 2 * total - ends, 2 * inter
