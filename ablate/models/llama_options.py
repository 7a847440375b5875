"""The llama family's options and closed-form sizes, without torch (read when a spec is planned)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig


class Options(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    intermediate: int | None = Field(None, gt=0, description="MLP inner width; default 4 * d_model")
    tie_weights: bool = Field(False, description="share the token embedding with the LM head")
    dropout: float = Field(0.0, ge=0, lt=1, description="training-only dropout on the attention weights (transformers' "
                           "attention_dropout), the attention output and the MLP output of every layer (the MoD blog's "
                           "Llama: 0.2); 0: transformers' Llama as it is")

    def check_trial(self, trial: TrialConfig) -> None:
        if trial.heads is None:
            raise ValueError("the llama family needs heads (attention heads), e.g. heads: 4")


def inter_token_params(trial: TrialConfig) -> int:
    """q, k, v, o projections (no biases)."""
    d, kv = trial.d_model, trial.kv_heads or trial.heads
    head_dim = d // trial.heads
    return trial.layers * (2 * d * d + 2 * d * kv * head_dim)


def param_count(trial: TrialConfig, vocab_size: int) -> int:
    o, d = Options(**trial.options), trial.d_model
    inner = o.intermediate or 4 * d
    layer = 3 * d * inner + 2 * d  # SwiGLU + two RMSNorms
    embeddings = vocab_size * d * (1 if o.tie_weights else 2)
    return embeddings + inter_token_params(trial) + trial.layers * layer + d


def mixing_flops_per_token(trial: TrialConfig) -> float:
    """Attention scores (2*T*d) and weighted sum (2*T*d) per layer at T = context, no causal halving."""
    return float(trial.layers * 4 * trial.context * trial.d_model)
