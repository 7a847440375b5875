"""The metaformer family's options and closed-form sizes, without torch (read when a spec is planned)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MIXERS_WITH_HEADS = ("attention", "metric", "quadratic")


class Options(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    token_mixer: Literal["attention", "metric", "quadratic", "pool", "identity"] = Field("attention", description="the block's token mixer")
    metric_form: Literal["psd", "symmetric"] = Field("psd", description="metric parametrisation: A A^T (positive semi-definite) or A + A^T")
    ffn_mult: int = Field(4, ge=1, description="MLP inner width as a multiple of d_model")
    tie_weights: bool = Field(False, description="share the token embedding with the LM head")

    def check_trial(self, trial) -> None:
        if self.token_mixer in MIXERS_WITH_HEADS and trial.heads is None:
            raise ValueError(f"token_mixer {self.token_mixer!r} needs heads, e.g. heads: 4")
        if trial.kv_heads not in (None, trial.heads):
            raise ValueError("the metaformer family has no grouped key/value heads; leave kv_heads unset")


def inter_token_params(trial) -> int:
    o, d = Options(**trial.options), trial.d_model
    if o.token_mixer == "attention":
        per_layer = 4 * d * d + 4 * d
    elif o.token_mixer in ("metric", "quadratic"):
        k = d // trial.heads
        per_layer = d * d + trial.heads * k * k + d * d + d
    else:
        per_layer = 0
    return trial.layers * per_layer


def param_count(trial, vocab_size: int) -> int:
    o, d = Options(**trial.options), trial.d_model
    inner = o.ffn_mult * d
    layer = 4 * d + 2 * d * inner + inner + d  # two LayerNorms + MLP
    n = vocab_size * d * (1 if o.tie_weights else 2) + trial.context * d + 2 * d
    return n + inter_token_params(trial) + trial.layers * layer


def mixing_flops_per_token(trial) -> float:
    """Attention-like mixers: scores 2*T*d + weighted sum 2*T*d per layer at T = context (no causal
    halving); p F is a per-token matmul with the form's weights, already in 2N. Pooling is elementwise
    (cumulative sums), not counted, like norms and activations."""
    o = Options(**trial.options)
    if o.token_mixer in MIXERS_WITH_HEADS:
        return float(trial.layers * 4 * trial.context * trial.d_model)
    return 0.0
