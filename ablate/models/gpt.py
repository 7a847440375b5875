"""Early causal-LM transformers: transformers' OpenAI GPT (default) or GPT-2, built from a config.

OpenAI GPT is post-norm with learned positions and no final norm; GPT-2 is pre-norm with a final
LayerNorm. Both tie the LM head to the token embedding, as transformers does by default
(`tie_weights: false` unties). Dropout defaults to 0 (the library's default is 0.1).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor, nn


class Options(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    variant: Literal["openai", "gpt2"] = Field("openai", description="OpenAIGPTLMHeadModel or GPT2LMHeadModel")
    dropout: float = Field(0.0, ge=0, lt=1, description="residual, embedding and attention dropout")
    tie_weights: bool = Field(True, description="share the token embedding with the LM head (both models tie by default)")

    def check_trial(self, trial) -> None:
        if trial.heads is None:
            raise ValueError("the gpt family needs heads (attention heads), e.g. heads: 4")
        if trial.kv_heads not in (None, trial.heads):
            raise ValueError("the gpt family has no grouped key/value heads; leave kv_heads unset")


class GPT(nn.Module):
    """Wraps the transformers model so that forward returns a plain logits tensor."""

    def __init__(self, trial, vocab_size: int):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel, OpenAIGPTConfig, OpenAIGPTLMHeadModel

        o = Options(**trial.options)
        self.context = trial.context
        common = dict(
            vocab_size=vocab_size, n_embd=trial.d_model, n_layer=trial.layers, n_head=trial.heads,
            n_positions=trial.context, resid_pdrop=o.dropout, embd_pdrop=o.dropout, attn_pdrop=o.dropout,
            tie_word_embeddings=o.tie_weights,
        )
        if o.variant == "openai":
            self.hf = OpenAIGPTLMHeadModel(OpenAIGPTConfig(**common))
        else:
            cfg = GPT2Config(**common, use_cache=False, bos_token_id=None, eos_token_id=None, attn_implementation="sdpa")
            self.hf = GPT2LMHeadModel(cfg)

    def hidden_states(self, input_ids: Tensor) -> Tensor:
        if input_ids.shape[1] > self.context:
            raise ValueError(f"sequence length {input_ids.shape[1]} exceeds n_positions {self.context}")
        return self.hf.transformer(input_ids=input_ids).last_hidden_state  # (B, T, D)

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.hf.lm_head(self.hidden_states(input_ids))  # (B, T, V)


def build(trial, vocab_size: int) -> nn.Module:
    return GPT(trial, vocab_size)


def inter_token_params(trial) -> int:
    """c_attn (d -> 3d) and attention c_proj (d -> d), with biases."""
    d = trial.d_model
    return trial.layers * (4 * d * d + 4 * d)


def param_count(trial, vocab_size: int) -> int:
    o, d = Options(**trial.options), trial.d_model
    mlp = 8 * d * d + 5 * d  # c_fc (d -> 4d) and c_proj (4d -> d), with biases
    layer = mlp + 4 * d  # + two LayerNorms
    n = vocab_size * d * (1 if o.tie_weights else 2) + trial.context * d
    n += inter_token_params(trial) + trial.layers * layer
    return n + (2 * d if o.variant == "gpt2" else 0)  # GPT-2's final LayerNorm


def mixing_flops_per_token(trial) -> float:
    """Attention scores (2*T*d) and weighted sum (2*T*d) per layer at T = context, no causal halving."""
    return float(trial.layers * 4 * trial.context * trial.d_model)
