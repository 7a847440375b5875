"""Text classification's knowledge, torch-free: its options, unmasked models allowed, labelled data, the class head."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from ablate.config.units import Frozen, Whole

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig

UNMASKED = True  # a class is read from the whole document at once: no causal evaluation is needed
TOKEN_TARGETS = False  # its target is the class, at the end-of-text position: eos_is_target does not apply


class Options(Frozen):
    classes: Whole = Field(2, ge=2, le=100_000, description="number of classes; labels are 0 .. classes-1")
    pooling: Literal["mean", "last"] = Field("mean", description="mean: the average of the per-position class "
                                             "scores over the document (the MetaFormer study's head); last: the "
                                             "last token's hidden state (which, causally, has read the whole text)")
    bias: bool = Field(True, description="a bias in the class projection (the MetaFormer study code's has none)")


def check_trial(trial: TrialConfig) -> None:
    """Unlabelled documents would train nothing: refused in the spec."""
    if trial.dataset.label_field is None:
        raise ValueError("objective 'classification' needs labelled documents: set dataset.label_field (the "
                         "column of integer class labels, e.g. label_field: label for the hub's imdb)")


def param_counts(trial: TrialConfig, total: int, inter: int, vocab: int, family: ModuleType) -> tuple[int, int]:
    """The model's trained parameters: the family's, less its LM head (built, frozen and never run: a class is read
    from the hidden states) unless tied to the embedding, plus the class head."""
    settings = trial.objective_settings()
    tied = getattr(family.Options(**trial.options), "tie_weights", False) if hasattr(family, "Options") else False
    lm_head = 0 if tied else vocab * trial.d_model
    return total - lm_head + trial.d_model * settings.classes + (settings.classes if settings.bias else 0), inter
