"""Transformer-mixer hybrid: Llama decoder layers with a masked-mixer sequence layer.

Built from the `llama` family's own pieces (llama.py: RMSNorm, RoPE, SDPA with is_causal, SwiGLU, transformers'
Llama arithmetic and init), so that the only difference from the `llama` family is the mixer. The authors'
"transfixer" (a branch of transformers 4.42) placed a flat masked mixer on the attention *output*:
    a = attn(norm(x));  x = x + a + mix(a)               placement: sequential (default)
and the parallel variant feeds the mixer the same normed input as attention:
    h = norm(x);        x = x + attn(h) + mix(h)         placement: parallel
The mixer is a context x context map, so T may not exceed trial.context.

Its DecoderLayer (without a mixer) is reused by mod.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

# options and sizes live without torch in hybrid_options; the registry contract re-exports them here
from ablate.models.hybrid_options import Options, head_counts, inter_token_params, mixing_flops_per_token, param_count  # noqa: F401
from ablate.models.llama import Attention, RMSNorm, SwiGLU, init_llama_style, rotary
from ablate.models.mixer import SequenceMixing

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig


# ---------------------------------------------------------------- layer


class DecoderLayer(nn.Module):
    """Pre-norm Llama layer; with `mixer` set, a hybrid layer (see the module docstring for placement)."""

    def __init__(self, d_model: int, heads: int, kv_heads: int, inner: int, mixer: SequenceMixing | None = None,
                 placement: str = "sequential", dropout: float = 0.0):
        super().__init__()
        self.placement = placement
        self.input_norm = RMSNorm(d_model)
        self.attn = Attention(d_model, heads, kv_heads, dropout)
        self.mixer = mixer
        self.post_attention_norm = RMSNorm(d_model)
        self.mlp = SwiGLU(d_model, inner, dropout)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None = None) -> Tensor:
        h = self.input_norm(x)
        a = self.attn(h, cos, sin, mask)
        if self.mixer is None:
            x = x + a
        else:
            mixed = self.mixer((a if self.placement == "sequential" else h)[:, None])[:, 0]  # (B, T, D)
            x = x + a + mixed
        return x + self.mlp(self.post_attention_norm(x))


# ---------------------------------------------------------------- model


class Hybrid(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, layers: int, heads: int, kv_heads: int, context: int, opts: Options):
        super().__init__()
        self.context, self.head_dim = context, d_model // heads
        inner = opts.intermediate or 4 * d_model
        self.embed = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(
            DecoderLayer(d_model, heads, kv_heads, inner, SequenceMixing(context), opts.placement) for _ in range(layers)
        )
        self.norm = RMSNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        init_llama_style(self)
        if opts.tie_weights:
            self.lm_head.weight = self.embed.weight

    def hidden_states(self, input_ids: Tensor) -> Tensor:
        t = input_ids.shape[1]
        if t > self.context:
            raise ValueError(f"sequence length {t} exceeds the hybrid's mixer window {self.context}")
        cos, sin = rotary(torch.arange(t, device=input_ids.device), self.head_dim)
        x = self.embed(input_ids)  # (B, T, D)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.lm_head(self.hidden_states(input_ids))  # (B, T, V)


# ---------------------------------------------------------------- registry contract


def build(trial: TrialConfig, vocab_size: int) -> nn.Module:
    heads, kv_heads = head_counts(trial)
    return Hybrid(vocab_size, trial.d_model, trial.layers, heads, kv_heads, trial.context, Options(**trial.options))
