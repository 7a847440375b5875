"""One-step completion's knowledge, torch-free: its options, the families with parts, and its checks of a trial."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from ablate.config.units import Frozen, Real, Whole
from ablate.objectives.stack_options import WITH_PARTS

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig

ARCHITECTURES = WITH_PARTS  # it masks between the model's `layers`


class Options(Frozen):
    split: Real = Field(0.5, gt=0, lt=1, description="fraction of the window given; the rest is predicted")
    mask_layer: Whole | None = Field(None, ge=1, description="blocks before the prediction half is masked; default layers // 2")


def check_trial(trial: TrialConfig) -> None:
    """The mask falls between two blocks: refused in the spec, not as an IndexError when the model is built."""
    mask_layer = trial.objective_settings().mask_layer
    if mask_layer is not None and mask_layer >= trial.layers:
        raise ValueError(f"objective_options.mask_layer={mask_layer} must be below layers={trial.layers}")
    if trial.layers < 2:
        raise ValueError("objective 'one_step' masks the prediction half between blocks: needs layers >= 2")
