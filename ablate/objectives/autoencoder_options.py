"""Autoencoding's knowledge, torch-free: no options, the families with parts, an encoder and a decoder stack."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from ablate.objectives.stack_options import WITH_PARTS, two_stacks
from ablate.objectives.stack_options import NoOptions as Options, two_passes as passes  # noqa: F401 - the registry's

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig

ARCHITECTURES = WITH_PARTS


def param_counts(trial: TrialConfig, total: int, inter: int, vocab: int, family: ModuleType) -> tuple[int, int]:
    return two_stacks(trial, total, inter, vocab)
