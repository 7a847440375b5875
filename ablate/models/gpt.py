"""Early causal-LM transformers: transformers' OpenAI GPT (default) or GPT-2, built from a config.

OpenAI GPT is post-norm with learned positions and no final norm; GPT-2 is pre-norm with a final
LayerNorm. Both tie the LM head to the token embedding, as transformers does by default
(`tie_weights: false` unties). Dropout defaults to 0.1, the library's default, which the studies kept:
their GPT rows show eval loss below train loss (masked-mixers-1.md, 2.04/1.96).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor, nn

# options and sizes live without torch in gpt_options; the registry contract re-exports them here
from ablate.models.gpt_options import Options, inter_token_params, mixing_flops_per_token, param_count  # noqa: F401

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig


def preload() -> None:
    """What GPT's constructor imports (the warm helper loads it once, before it forks this family's trainers)."""
    from transformers import GPT2Config, GPT2LMHeadModel, OpenAIGPTConfig, OpenAIGPTLMHeadModel  # noqa: F401


class GPT(nn.Module):
    """Wraps the transformers model so that forward returns a plain logits tensor."""

    def __init__(self, trial: TrialConfig, vocab_size: int):
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


def build(trial: TrialConfig, vocab_size: int) -> nn.Module:
    return GPT(trial, vocab_size)
