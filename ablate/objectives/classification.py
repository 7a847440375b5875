"""Text classification (nlp-metaformer.md, "Text Classification"): one class per document, loss and accuracy.

The registry's model reads the document; a linear head maps its hidden states to class scores:
- `pooling: mean` (default), the study's head: a point-wise projection into the classes at every position,
  averaged over the document's tokens (the same as projecting the mean hidden state);
- `pooling: last`: the last token's hidden state, which in a causal model has read the whole document.
The model may be unmasked (metaformer `causal: false`, the study's classifier): a class is read from the whole
document at once, so no causal evaluation is needed (classification_options.UNMASKED).
The LM head is not used: its own weights are frozen (a tied LM head is the embedding, which trains).
Rows come from a labelled corpus (dataset.label_field): the labels tensor holds each row's class at the
row's last real token and -100 elsewhere, so one tensor gives both the class and the length.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ablate.objectives.base import IGNORE_INDEX, LossFn

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig

ACCURACY = True  # the eval pass reports the fraction of rows classified right (Classifier.take_correct)


class Classifier(nn.Module):
    def __init__(self, trial: TrialConfig, vocab_size: int):
        super().__init__()
        from ablate import models

        settings = trial.objective_settings()
        self.model = models.build(trial, vocab_size)
        self.classes, self.pooling = settings.classes, settings.pooling
        self.head = nn.Linear(trial.d_model, self.classes, bias=settings.bias)
        embeddings = {id(m.weight) for m in self.model.modules() if isinstance(m, nn.Embedding)}
        for name, module in self.model.named_modules():
            if name.endswith("lm_head") and module is not None:
                for p in module.parameters():
                    if id(p) not in embeddings:
                        p.requires_grad_(False)  # unused: DDP and the optimizer skip it
        self.correct: Tensor | None = None

    def forward(self, input_ids: Tensor, lengths: Tensor) -> Tensor:
        """Class scores (B, classes) of documents whose first `lengths` positions are real tokens."""
        hidden = self.model.hidden_states(input_ids)  # (B, T, D)
        if self.pooling == "last":
            pooled = hidden[torch.arange(len(hidden), device=hidden.device), lengths - 1]
        else:
            mask = (torch.arange(hidden.shape[1], device=hidden.device)[None, :] < lengths[:, None]).to(hidden.dtype)
            pooled = (hidden * mask[..., None]).sum(1) / lengths[:, None].to(hidden.dtype)
        return self.head(pooled)

    def take_correct(self) -> Tensor | None:
        """How many rows the last forward of the loss classified right (cleared once read)."""
        correct, self.correct = self.correct, None
        return correct


def build(trial: TrialConfig, vocab_size: int) -> nn.Module:
    return Classifier(trial, vocab_size)


def rows_of(labels: Tensor) -> tuple[Tensor, Tensor]:
    """(lengths, classes) of labelled rows from their labels tensor: every row holds exactly one class, at its
    last real token (a row is never empty: it ends with eos). Shapes only, no host sync."""
    lengths = (labels != IGNORE_INDEX).float().argmax(1) + 1  # (B,)
    return lengths, labels.gather(1, (lengths - 1)[:, None]).squeeze(1)


def classification_loss(model: nn.Module, input_ids: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    lengths, classes = rows_of(labels)  # labels beyond `classes` are refused before training (check_data)
    scores = model(input_ids, lengths)
    model.correct = (scores.argmax(-1) == classes).sum()
    return F.cross_entropy(scores.float(), classes, reduction="sum"), classes.new_tensor(len(classes))


def loss(trial: TrialConfig) -> LossFn:
    return classification_loss


def count(trial: TrialConfig):
    def targets(labels: Tensor) -> int:
        return int((labels != IGNORE_INDEX).sum())  # one class per labelled row

    return targets


def input_tokens(labels: Tensor) -> int:
    """Real tokens the rows hold (for throughput and token budgets): each row's length."""
    return int(rows_of(labels)[0].sum())


def check_data(trial: TrialConfig, prepared: Any) -> None:
    """Before training: the corpus's labels fit the head (else one message naming both settings)."""
    from ablate.config.errors import AblateError

    needed = max(prepared.train.n_classes, prepared.eval.n_classes)
    classes = trial.objective_settings().classes
    if needed > classes:
        raise AblateError(f"objective_options.classes={classes}, but dataset.label_field "
                          f"{trial.dataset.label_field!r} has labels up to {needed - 1}; set classes: {needed}")
