"""Llama-style transformer, written here: transformers' LlamaForCausalLM, the same modules, names and arithmetic.

The studies' baseline (transformers' LlamaConfig with hidden_size = d_model, num_hidden_layers = layers,
num_attention_heads = heads, intermediate 4 * d_model, max_position_embeddings = context, SDPA), written as modules of
our own: importing transformers' Llama pulls in torch._dynamo, which cost a cold trainer 2.8 CPU-s before its first
step (issue 49 item 2). What transformers' model does, this one does:
- the same module tree and parameter names (`model.embed_tokens`, `model.layers.N.self_attn.q_proj`, ...,
  `model.norm`, `lm_head`), built and initialised in the same order (normal(0, 0.02), norms at 1), so a state_dict
  loads either way and a seed gives the same weights as transformers 5 draws them;
- the same arithmetic: RMSNorm in float32 (eps 1e-6), RoPE tables (theta 1e4) in float32 cast to the hidden
  states' dtype, SDPA with is_causal and scale head_dim ** -0.5, SwiGLU, no biases;
- `dropout`: on the attention weights (transformers' `attention_dropout`) and, in training only, on each layer's
  attention output and MLP output, as the MoD blog's Llama (joey00072/ohara ohara/models/llama.py@2f01778:
  res_dropout after the output projection, SwiGLU's dropout after down).
tests/models/test_llama_fidelity.py holds it to transformers' model: weights, logits, gradients, bf16 autocast.
Checkpoints written while the family wrapped transformers' model hold its names under `hf.`: they load as they are.

The Llama-style pieces (RMSNorm, rotary, Attention, SwiGLU, the init) are reused by the hybrid and mod families.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

# options and sizes live without torch in llama_options; the registry contract re-exports them here
from ablate.models.llama_options import Options, inter_token_params, mixing_flops_per_token, param_count  # noqa: F401

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
    """cos, sin for RoPE at the given positions, in float32: (T,) -> (1, 1, T, hd); (B, T) -> (B, 1, T, hd)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    freqs = positions[..., None].float() * inv_freq  # (..., T, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (..., T, hd)
    if emb.dim() == 2:
        emb = emb[None]
    return emb.cos()[:, None], emb.sin()[:, None]


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x * cos + rotate_half(x) * sin, in the wider of x's and the tables' dtypes (transformers' promotion)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    """Causal multi-head attention with RoPE and grouped key/value heads; `mask` (B, 1, T, T) bool overrides is_causal.
    `dropout` (training only): on the attention weights and on the output projection."""

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
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=mask is None,
                                           scale=self.head_dim ** -0.5)  # (B, H, T, E)
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


def init_llama_style(model: nn.Module, std: float = 0.02) -> None:
    """transformers' Llama init: normal(0, 0.02) weights, zero biases (mixer weights keep their own init)."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)


# ---------------------------------------------------------------- the model


class LlamaLayer(nn.Module):
    """transformers' LlamaDecoderLayer: x + attention(norm(x)), then + SwiGLU(norm(x))."""

    def __init__(self, d_model: int, heads: int, kv_heads: int, inner: int, dropout: float):
        super().__init__()
        self.self_attn = Attention(d_model, heads, kv_heads, dropout)
        self.mlp = SwiGLU(d_model, inner, dropout)
        self.input_layernorm = RMSNorm(d_model)
        self.post_attention_layernorm = RMSNorm(d_model)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaStack(nn.Module):
    """transformers' LlamaModel: the token embedding, the layers and the final norm."""

    def __init__(self, vocab_size: int, d_model: int, layers: int, heads: int, kv_heads: int, inner: int,
                 dropout: float):
        super().__init__()
        self.head_dim = d_model // heads
        self.embed_tokens = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(LlamaLayer(d_model, heads, kv_heads, inner, dropout) for _ in range(layers))
        self.norm = RMSNorm(d_model)

    def forward(self, x: Tensor) -> Tensor:
        """Embeddings (B, T, D) -> hidden states (B, T, D) after the final norm."""
        cos, sin = rotary(torch.arange(x.shape[1], device=x.device), self.head_dim)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class Llama(nn.Module):
    """transformers' LlamaForCausalLM as the studies configured it; forward returns a plain logits tensor."""

    def __init__(self, vocab_size: int, d_model: int, layers: int, heads: int, kv_heads: int, inner: int,
                 dropout: float = 0.0, tie_weights: bool = False):
        super().__init__()
        self.model = LlamaStack(vocab_size, d_model, layers, heads, kv_heads, inner, dropout)
        init_llama_style(self.model)  # transformers 5 initialises its LlamaModel before it builds the head
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        init_llama_style(self.lm_head)
        if tie_weights:
            self.lm_head.weight = self.model.embed_tokens.weight
        self._register_load_state_dict_pre_hook(unwrap_transformers_names, with_module=True)

    @property
    def layers(self) -> nn.ModuleList:
        return self.model.layers

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.model.embed_tokens(input_ids)

    def hidden_from_embeds(self, x: Tensor) -> Tensor:
        return self.model(x)  # (B, T, D), after the final norm

    def hidden_states(self, input_ids: Tensor) -> Tensor:
        return self.model(self.model.embed_tokens(input_ids))  # (B, T, D), after the final norm

    def head(self, hidden: Tensor) -> Tensor:
        return self.lm_head(hidden)

    def strip_ends(self) -> None:
        """Drop the token embedding and LM head: this stack runs on another model's embeddings."""
        self.model.embed_tokens = None
        self.lm_head = None

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.lm_head(self.hidden_states(input_ids))  # (B, T, V)


def unwrap_transformers_names(module: nn.Module, state_dict: dict, prefix: str, *_args) -> None:
    """A checkpoint from when this family wrapped transformers' model holds `hf.model...`, `hf.lm_head...`: the same
    names one level down."""
    old = prefix + "hf."
    for key in [k for k in state_dict if k.startswith(old)]:
        state_dict[prefix + key[len(old):]] = state_dict.pop(key)


# ---------------------------------------------------------------- registry contract


def build(trial: TrialConfig, vocab_size: int) -> nn.Module:
    o = Options(**trial.options)
    return Llama(vocab_size, trial.d_model, trial.layers, trial.heads, trial.kv_heads or trial.heads,
                 o.intermediate or 4 * trial.d_model, o.dropout, o.tie_weights)
