"""The hybrid family's options and closed-form sizes, without torch (read when a spec is planned).

The Llama-style layer sizes here (attention_params, decoder_layer_params) also size mod's layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from ablate.models.mixer_options import sequence_mixing_params

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig


class Options(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    placement: Literal["sequential", "parallel"] = Field("sequential", description="mixer after attention (on its output) or beside it (same input), outputs summed")
    intermediate: int | None = Field(None, gt=0, description="SwiGLU inner width; default 4 * d_model")
    tie_weights: bool = Field(False, description="share the token embedding with the LM head")

    def check_trial(self, trial: TrialConfig) -> None:
        if trial.heads is None:
            raise ValueError("the hybrid family needs heads (attention heads), e.g. heads: 4")


def head_counts(trial: TrialConfig) -> tuple[int, int]:
    """(query heads, key/value heads)."""
    return trial.heads, trial.kv_heads or trial.heads


def attention_params(d_model: int, heads: int, kv_heads: int) -> int:
    """Parameters of llama.Attention: q, k, v, o projections without biases."""
    head_dim = d_model // heads
    return 2 * d_model * heads * head_dim + 2 * d_model * kv_heads * head_dim


def decoder_layer_params(d_model: int, heads: int, kv_heads: int, inner: int) -> int:
    """Parameters of hybrid.DecoderLayer without a mixer: attention, SwiGLU and two RMSNorms."""
    return attention_params(d_model, heads, kv_heads) + 3 * d_model * inner + 2 * d_model


def param_count(trial: TrialConfig, vocab_size: int) -> int:
    o, d = Options(**trial.options), trial.d_model
    heads, kv_heads = head_counts(trial)
    layer = decoder_layer_params(d, heads, kv_heads, o.intermediate or 4 * d) + sequence_mixing_params(trial.context)
    return vocab_size * d * (1 if o.tie_weights else 2) + trial.layers * layer + d


def inter_token_params(trial: TrialConfig) -> int:
    heads, kv_heads = head_counts(trial)
    return trial.layers * (attention_params(trial.d_model, heads, kv_heads) + sequence_mixing_params(trial.context))


def mixing_flops_per_token(trial: TrialConfig) -> float:
    """Attention scores and weighted sum, 2*T*d each (full T = context, no causal halving), plus the
    mixer's actual 2*T*d + d per token minus the 2*(T^2 + T) that 6N counts for its weights."""
    c, d = trial.context, trial.d_model
    attention = 4 * c * d
    mixer = (2 * c * d + d) - 2 * (c * c + c)
    return float(trial.layers * (attention + mixer))
