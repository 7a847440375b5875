"""Transformer-mixer hybrid: Llama decoder layers with a masked-mixer sequence layer.

Written as a Llama-style layer of our own (RMSNorm, RoPE, SDPA with is_causal, SwiGLU), numerically the
same recipe as transformers' Llama (eps 1e-6, rope theta 1e4, no biases, normal(0.02) init), so that the
only difference from the `llama` family is the mixer. The authors' "transfixer" (a branch of
transformers 4.42) placed a flat masked mixer on the attention *output*:
    a = attn(norm(x));  x = x + a + mix(a)               placement: sequential (default)
and the parallel variant feeds the mixer the same normed input as attention:
    h = norm(x);        x = x + attn(h) + mix(h)         placement: parallel
The mixer is a context x context map, so T may not exceed trial.context.

The Llama-style pieces here (RMSNorm, rotary, Attention, SwiGLU, DecoderLayer) are reused by mod.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

# options and sizes live without torch in hybrid_options; the registry contract re-exports them here
from ablate.models.hybrid_options import Options, head_counts, inter_token_params, mixing_flops_per_token, param_count  # noqa: F401
from ablate.models.mixer import SequenceMixing

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig


# ---------------------------------------------------------------- Llama-style pieces


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rotary(positions: Tensor, head_dim: int, theta: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos, sin for RoPE at the given positions: (T,) -> (1, 1, T, hd); (B, T) -> (B, 1, T, hd)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    freqs = positions[..., None].float() * inv_freq  # (..., T, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (..., T, hd)
    if emb.dim() == 2:
        emb = emb[None]
    return emb.cos()[:, None], emb.sin()[:, None]


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat((-x2, x1), dim=-1) * sin.to(x.dtype)


class Attention(nn.Module):
    """Causal multi-head attention with RoPE and grouped key/value heads; `mask` (B, 1, T, T) bool overrides is_causal.
    `dropout` (training only): on the attention weights and on the output projection, as the MoD blog's Llama
    (joey00072/ohara ohara/models/llama.py@2f01778, attn_dropout and res_dropout)."""

    def __init__(self, d_model: int, heads: int, kv_heads: int, dropout: float = 0.0):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.dropout = heads, kv_heads, d_model // heads, dropout
        self.q_proj = nn.Linear(d_model, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, d_model, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None = None) -> Tensor:
        q = rearrange(self.q_proj(x), "b t (h e) -> b h t e", h=self.heads)
        k = rearrange(self.k_proj(x), "b t (h e) -> b h t e", h=self.kv_heads)
        v = rearrange(self.v_proj(x), "b t (h e) -> b h t e", h=self.kv_heads)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=mask is None)  # (B, H, T, E)
        return F.dropout(self.o_proj(rearrange(y, "b h t e -> b t (h e)")), p, self.training)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, inner: int, dropout: float = 0.0):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, inner, bias=False)
        self.up_proj = nn.Linear(d_model, inner, bias=False)
        self.down_proj = nn.Linear(inner, d_model, bias=False)
        self.dropout = dropout  # on the output, training only (the blog's SwiGLU, ohara/modules/mlp.py@2f01778:35)

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)), self.dropout, self.training)


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


def init_llama_style(model: nn.Module, std: float = 0.02) -> None:
    """transformers' Llama init: normal(0, 0.02) weights, zero biases (mixer weights keep their own init)."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)


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
