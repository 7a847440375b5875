"""Multiple-token prediction's knowledge, torch-free: its options, and n passes of the model per token."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from ablate.config.units import Frozen, Whole

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig

NEXT_TOKEN = True  # pass 1 is next-token prediction: a report samples completions from it


class Options(Frozen):
    n_tokens: Whole = Field(2, ge=2, le=16, description="tokens ahead, one chained pass each")
    loss: Literal["mean", "sum"] = Field("mean", description="mean: token-weighted mean over all passes (comparable "
                                         "across n); sum: the study's sum of the passes' mean losses (n times larger)")


def passes(trial: TrialConfig) -> tuple[float, float]:
    n = trial.objective_settings().n_tokens
    return float(n), float(n)
