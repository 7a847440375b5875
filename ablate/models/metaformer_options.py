"""The metaformer family's options and closed-form sizes, without torch (read when a spec is planned)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ablate.config import registry

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig

MIXERS_WITH_HEADS = ("attention", "metric", "quadratic")


class Options(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    token_mixer: Literal["attention", "metric", "quadratic", "pool", "identity", "none"] = Field(
        "attention", description="the block's token mixer; identity: x + LN(x) in the mixer's residual; none: no mixer "
        "sublayer at all (x + MLP(LN(x)): the MetaFormer study code's IDENTITY)")
    metric_form: Literal["psd", "symmetric"] = Field("psd", description="metric parametrisation: A A^T (positive semi-definite) or A + A^T")
    ffn_mult: int = Field(4, ge=1, description="MLP inner width as a multiple of d_model")
    bias: bool = Field(True, description="biases in the mixers' and MLP's linear maps (the study code has none)")
    causal: bool = Field(True, description="false: unmasked token mixers (attention and forms without a mask; pool a "
                         "centred window), the MetaFormer study's classifier; only for objective: classification")
    pool_kernel: int = Field(3, ge=1, description="unmasked pool: the centred window's width (odd)")
    pool_features: bool = Field(False, description="unmasked pool: the window also spans pool_kernel features (the "
                                "study code's avg_pool2d over a (B, T, D) tensor pools positions x features)")
    tie_weights: bool = Field(False, description="share the token embedding with the LM head")

    @field_validator("pool_kernel")
    @classmethod
    def _odd(cls, v: int) -> int:
        if v % 2 == 0:
            raise ValueError(f"pool_kernel must be odd (a window centred on each position), got {v}")
        return v

    def check_trial(self, trial: TrialConfig) -> None:
        if self.token_mixer in MIXERS_WITH_HEADS and trial.heads is None:
            raise ValueError(f"token_mixer {self.token_mixer!r} needs heads, e.g. heads: 4")
        if trial.kv_heads not in (None, trial.heads):
            raise ValueError("the metaformer family has no grouped key/value heads; leave kv_heads unset")
        # only an objective that reads whole documents at once (its UNMASKED) may use them; a language model needs
        # causal ones
        if (reason := self.non_causal_reason()) and not registry.objective(trial.objective).unmasked:
            allowed = " or ".join(registry.unmasked_objectives())
            raise ValueError(f"{reason}; unmasked models are for objective {allowed}")

    def non_causal_reason(self) -> str | None:
        """Why these options cannot be evaluated causally, or None (a classifier may still use them)."""
        if not self.causal:
            return ("options.causal: False cannot be evaluated causally: unmasked token mixers let every position "
                    "read later tokens")
        return None


def inter_token_params(trial: TrialConfig) -> int:
    o, d = Options(**trial.options), trial.d_model
    bias = 1 if o.bias else 0
    if o.token_mixer == "attention":
        per_layer = 4 * d * d + 4 * d * bias
    elif o.token_mixer in ("metric", "quadratic"):
        k = d // trial.heads
        per_layer = d * d + trial.heads * k * k + d * d + d * bias
    else:
        per_layer = 0
    return trial.layers * per_layer


def param_count(trial: TrialConfig, vocab_size: int) -> int:
    o, d = Options(**trial.options), trial.d_model
    inner = o.ffn_mult * d
    norms = 2 * d if o.token_mixer == "none" else 4 * d  # no mixer sublayer: no norm before it either
    layer = norms + 2 * d * inner + (inner + d if o.bias else 0)  # LayerNorms + MLP
    n = vocab_size * d * (1 if o.tie_weights else 2) + trial.context * d + 2 * d
    return n + inter_token_params(trial) + trial.layers * layer


def mixing_flops_per_token(trial: TrialConfig) -> float:
    """Attention-like mixers: scores 2*T*d + weighted sum 2*T*d per layer at T = context (no causal
    halving); p F is a per-token matmul with the form's weights, already in 2N. Pooling is elementwise
    (cumulative sums), not counted, like norms and activations."""
    o = Options(**trial.options)
    if o.token_mixer in MIXERS_WITH_HEADS:
        return float(trial.layers * 4 * trial.context * trial.d_model)
    return 0.0
