"""The model contract, as typing.Protocols: what a family's two modules and its built model must offer.

Torch-free (tensors are only named for type checkers), so that the registry, planning and a plugin's own check can
name the contract without importing torch. `runtime_checkable`: `isinstance(obj, Contract)` checks that the names
exist (not their signatures); tests/models/test_models.py holds every built-in family to it, and the causality,
fidelity and parameter-count tests hold the behaviour behind the names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import Tensor, nn

    from ablate.config.trial import TrialConfig


@runtime_checkable
class FamilyOptions(Protocol):
    """A family's torch-free options module: what validation and planning read."""

    Options: type  # frozen pydantic model of the family's options, extra keys forbidden

    def param_count(self, trial: TrialConfig, vocab_size: int) -> int: ...

    def inter_token_params(self, trial: TrialConfig) -> int: ...

    def mixing_flops_per_token(self, trial: TrialConfig) -> float: ...


@runtime_checkable
class FamilyModule(Protocol):
    """A family's model module (imports torch): the options module's names plus the builder."""

    def build(self, trial: TrialConfig, vocab_size: int) -> nn.Module: ...


@runtime_checkable
class LanguageModel(Protocol):
    """What `build` returns: input_ids (B, T) -> logits (B, T, V), causal in train and eval mode (position t sees
    tokens <= t only), for every built-in objective that reads next-token logits. A family whose training is not
    causal by design (mod's top-k routing) declares TRAIN_MODE_CAUSAL = False in its options module."""

    def __call__(self, input_ids: Tensor) -> Tensor: ...

    def hidden_states(self, input_ids: Tensor) -> Tensor:
        """(B, T, D) after the last block and its norm: what classification pools and retrieval embeds."""
        ...


@runtime_checkable
class ModelWithParts(LanguageModel, Protocol):
    """A model the stack-rebuilding objectives take apart (objectives/stack_options.WITH_PARTS)."""

    layers: Any  # the block ModuleList

    def embed(self, input_ids: Tensor) -> Tensor: ...

    def hidden_from_embeds(self, x: Tensor) -> Tensor: ...

    def head(self, hidden: Tensor) -> Tensor: ...

    def strip_ends(self) -> None:
        """Drop the embedding and head: a second stack uses the first's."""
        ...
