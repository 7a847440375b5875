"""Multiple-token prediction by n chained passes (masked-mixers-2.md, its simple form).

Pass 1 is ordinary next-token prediction. Pass i + 1 runs the same model on pass i's greedy
predictions (input position t then holds the guess for token t + i), and its logits at t are scored
against token t + 1 + i. Two losses (objective_options.loss):
- `mean` (default): the token-weighted mean over all passes, comparable across runs with the same n;
- `sum`: the study's (its MTPTransformer adds each pass's mean cross-entropy): the sum over passes of each
  pass's token-weighted mean, about n times the mean. It is returned as (sum, count of pass 1's targets),
  each pass's sum scaled by count_1 / count_i, so that sum / count is exactly that sum of means.
Neither is comparable with plain `clm` runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor, nn

from ablate.objectives.base import IGNORE_INDEX, LossFn, aligned_loss, count_next_tokens, next_token_loss

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig


def build(trial: TrialConfig, vocab_size: int) -> nn.Module:
    from ablate import models

    return models.build(trial, vocab_size)


def loss(trial: TrialConfig) -> LossFn:
    settings = trial.objective_settings()
    n, summed = settings.n_tokens, settings.loss == "sum"

    def multi_token_loss(model: nn.Module, input_ids: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        if input_ids.shape[1] <= n:
            return next_token_loss(model, input_ids, labels)
        x, sums, counts = input_ids, [], []
        for i in range(n):
            logits = model(x)
            s, c = aligned_loss(logits[:, : -(1 + i)], labels[:, 1 + i:])
            sums.append(s)
            counts.append(c)
            x = logits.argmax(-1).detach()  # the guesses are inputs, not a path for gradients
        if summed:
            first = counts[0]
            return sum(s * (first / c.clamp(min=1)) for s, c in zip(sums, counts)), first
        return sum(sums), sum(counts)

    return multi_token_loss


def count(trial: TrialConfig):
    settings = trial.objective_settings()
    n, summed = settings.n_tokens, settings.loss == "sum"

    def targets(labels: Tensor) -> int:
        if labels.shape[1] <= n or summed:
            return count_next_tokens(labels)
        return sum(int((labels[:, 1 + i:] != IGNORE_INDEX).sum()) for i in range(n))

    return targets
