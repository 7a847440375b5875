"""The gpt family's options and closed-form sizes, without torch (read when a spec is planned)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig


class Options(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    variant: Literal["openai", "gpt2"] = Field("openai", description="OpenAI GPT (post-norm) or GPT-2 (pre-norm): transformers' OpenAIGPTLMHeadModel or GPT2LMHeadModel")
    dropout: float = Field(0.1, ge=0, lt=1, description="residual, embedding and attention dropout (0.1: transformers' default, as the studies ran it)")
    tie_weights: bool = Field(True, description="share the token embedding with the LM head (both models tie by default)")

    def check_trial(self, trial: TrialConfig) -> None:
        if trial.heads is None:
            raise ValueError("the gpt family needs heads (attention heads), e.g. heads: 4")
        if trial.kv_heads not in (None, trial.heads):
            raise ValueError("the gpt family has no grouped key/value heads; leave kv_heads unset")


def inter_token_params(trial: TrialConfig) -> int:
    """c_attn (d -> 3d) and attention c_proj (d -> d), with biases."""
    d = trial.d_model
    return trial.layers * (4 * d * d + 4 * d)


def param_count(trial: TrialConfig, vocab_size: int) -> int:
    o, d = Options(**trial.options), trial.d_model
    mlp = 8 * d * d + 5 * d  # c_fc (d -> 4d) and c_proj (4d -> d), with biases
    layer = mlp + 4 * d  # + two LayerNorms
    n = vocab_size * d * (1 if o.tie_weights else 2) + trial.context * d
    n += inter_token_params(trial) + trial.layers * layer
    return n + (2 * d if o.variant == "gpt2" else 0)  # GPT-2's final LayerNorm


def mixing_flops_per_token(trial: TrialConfig) -> float:
    """Attention scores (2*T*d) and weighted sum (2*T*d) per layer at T = context, no causal halving."""
    return float(trial.layers * 4 * trial.context * trial.d_model)
