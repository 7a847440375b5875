"""Llama-style transformer: transformers' LlamaForCausalLM built from a config (never from the hub).

The studies' baseline: `LlamaConfig` with hidden_size = d_model, num_hidden_layers = layers,
num_attention_heads = heads, intermediate 4 * d_model, max_position_embeddings = context, SDPA.
transformers is imported inside build() so that validating a spec does not pay for importing it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.nn.functional as F
from torch import Tensor, nn

# options and sizes live without torch in llama_options; the registry contract re-exports them here
from ablate.models.llama_options import Options, inter_token_params, mixing_flops_per_token, param_count  # noqa: F401

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig


class Llama(nn.Module):
    """Wraps LlamaForCausalLM so that forward returns a plain logits tensor. `dropout` > 0 adds, in training only,
    dropout on each layer's attention output and MLP output, as the MoD blog's Llama (joey00072/ohara
    ohara/models/llama.py@2f01778: res_dropout after the output projection, SwiGLU's dropout after down); the
    attention weights' own dropout is transformers' `attention_dropout` (hf_config)."""

    def __init__(self, config, dropout: float = 0.0):
        super().__init__()
        from transformers import LlamaForCausalLM

        self.hf = LlamaForCausalLM(config)
        if dropout:
            for layer in self.hf.model.layers:
                for proj in (layer.self_attn.o_proj, layer.mlp.down_proj):
                    proj.register_forward_hook(_dropout_after(dropout))

    @property
    def layers(self) -> nn.ModuleList:
        return self.hf.model.layers

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.hf.model.embed_tokens(input_ids)

    def hidden_from_embeds(self, x: Tensor) -> Tensor:
        return self.hf.model(inputs_embeds=x, use_cache=False).last_hidden_state  # (B, T, D), after the final norm

    def hidden_states(self, input_ids: Tensor) -> Tensor:
        return self.hf.model(input_ids=input_ids, use_cache=False).last_hidden_state  # (B, T, D), after the final norm

    def head(self, hidden: Tensor) -> Tensor:
        return self.hf.lm_head(hidden)

    def strip_ends(self) -> None:
        """Drop the token embedding and LM head: this stack runs on another model's embeddings."""
        self.hf.model.embed_tokens = None
        self.hf.lm_head = None

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.hf.lm_head(self.hidden_states(input_ids))  # (B, T, V)


def _dropout_after(p: float):
    def hook(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        return F.dropout(output, p, module.training)

    return hook


def preload() -> None:
    """What build() imports (the warm helper loads it once, before it forks this family's trainers)."""
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: F401


def hf_config(trial: TrialConfig, vocab_size: int):
    from transformers import LlamaConfig

    o = Options(**trial.options)
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=trial.d_model,
        intermediate_size=o.intermediate or 4 * trial.d_model,
        num_hidden_layers=trial.layers,
        num_attention_heads=trial.heads,
        num_key_value_heads=trial.kv_heads or trial.heads,
        head_dim=trial.d_model // trial.heads,
        max_position_embeddings=trial.context,
        tie_word_embeddings=o.tie_weights,
        attention_dropout=o.dropout,
        attn_implementation="sdpa",
        use_cache=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def build(trial: TrialConfig, vocab_size: int) -> nn.Module:
    return Llama(hf_config(trial, vocab_size), Options(**trial.options).dropout)
