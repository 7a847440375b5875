"""Multiple-token prediction by n chained passes (masked-mixers-2.md, its simple form).

Pass 1 is ordinary next-token prediction. Pass i + 1 runs the same model on pass i's greedy
predictions (input position t then holds the guess for token t + i), and its logits at t are scored
against token t + 1 + i. The loss is the token-weighted mean over all passes, so a run's eval loss is
comparable across runs with the same n, not with plain `clm` runs.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ablate.objectives import IGNORE_INDEX, LossFn, aligned_loss, count_next_tokens, next_token_loss


def build(trial: Any, vocab_size: int) -> nn.Module:
    from ablate import models

    return models.build(trial, vocab_size)


def loss(trial: Any) -> LossFn:
    n = trial.objective_settings().n_tokens

    def multi_token_loss(model: nn.Module, input_ids: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        if input_ids.shape[1] <= n:
            return next_token_loss(model, input_ids, labels)
        x, total, count = input_ids, 0, 0
        for i in range(n):
            logits = model(x)
            s, c = aligned_loss(logits[:, : -(1 + i)], labels[:, 1 + i:])
            total, count = total + s, count + c
            x = logits.argmax(-1).detach()  # the guesses are inputs, not a path for gradients
        return total, count

    return multi_token_loss


def count(trial: Any):
    n = trial.objective_settings().n_tokens

    def targets(labels: Tensor) -> int:
        if labels.shape[1] <= n:
            return count_next_tokens(labels)
        return sum(int((labels[:, 1 + i:] != IGNORE_INDEX).sum()) for i in range(n))

    return targets
