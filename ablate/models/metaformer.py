"""MetaFormer for causal LM: one block design, the token mixer swapped (nlp-metaformer.md).

Block = LayerNorm -> token mixer -> residual, LayerNorm -> MLP (d -> 4d -> d, GELU) -> residual;
learned positional embeddings, a final LayerNorm, nanoGPT-style init (normal 0.02).

Token mixers (per head h, head width k = d_model / heads):
- attention: scaled dot-product attention, causal.
- metric: one shared projection p = P x; scores p M_h p^T / sqrt(k) with a symmetric per-head metric
  M_h (`metric_form: psd` M = A A^T, or `symmetric` M = A + A^T); values are p itself. The causal mask
  is applied before the softmax (the MetaFormer repo multiplied unmasked scores by the values).
- quadratic: as metric with a free k x k form U_h per head. The text's quadratic form acts on x
  itself (d x d per head); here it acts on the shared projection, as the sweep asks.
- pool: causal average pooling minus the token itself (PoolFormer): mean(x_<=t) - x_t.
- identity: no token mixing at all (a per-token model; the text's lower bound).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

# options and sizes live without torch in metaformer_options; the registry contract re-exports them here
from ablate.models.metaformer_options import Options, inter_token_params, mixing_flops_per_token, param_count  # noqa: F401


# ---------------------------------------------------------------- token mixers


class Attention(nn.Module):
    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = rearrange(self.qkv(x), "b t (n h e) -> n b h t e", n=3, h=self.heads)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, E)
        return self.out(rearrange(y, "b h t e -> b t (h e)"))


class FormAttention(nn.Module):
    """Scores p F_h p^T on one shared projection p = P x, values p: metric (F symmetric) or quadratic (F free)."""

    def __init__(self, d_model: int, heads: int, form: str):
        super().__init__()
        self.heads, self.form = heads, form
        k = d_model // heads
        self.proj = nn.Linear(d_model, d_model, bias=False)  # P, shared by queries, keys and values
        start = torch.eye(k) / (2 if form == "symmetric" else 1)  # every form starts near the identity
        self.form_weight = nn.Parameter(start.repeat(heads, 1, 1) + 0.02 * torch.randn(heads, k, k))  # (H, k, k)
        self.out = nn.Linear(d_model, d_model)

    def forms(self) -> Tensor:
        a = self.form_weight
        if self.form == "psd":
            return a @ a.transpose(-1, -2)
        if self.form == "symmetric":
            return a + a.transpose(-1, -2)
        return a  # quadratic: a free form

    def forward(self, x: Tensor) -> Tensor:
        p = rearrange(self.proj(x), "b t (h e) -> b h t e", h=self.heads)
        query = p @ self.forms().to(p.dtype)  # (B, H, T, k): scores = (p F) p^T
        y = F.scaled_dot_product_attention(query, p, p, is_causal=True)  # mask before softmax
        return self.out(rearrange(y, "b h t e -> b t (h e)"))


class CausalPool(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        t = x.shape[1]
        counts = torch.arange(1, t + 1, device=x.device, dtype=torch.float32)[:, None]  # (T, 1)
        mean = x.float().cumsum(dim=1) / counts  # (B, T, D), mean of positions <= t
        return (mean - x.float()).to(x.dtype)


class Identity(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x


def token_mixer(name: str, d_model: int, heads: int | None, metric_form: str) -> nn.Module:
    if name == "attention":
        return Attention(d_model, heads)
    if name == "metric":
        return FormAttention(d_model, heads, metric_form)
    if name == "quadratic":
        return FormAttention(d_model, heads, "quadratic")
    return CausalPool() if name == "pool" else Identity()


# ---------------------------------------------------------------- block and model


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int | None, opts: Options):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.mixer = token_mixer(opts.token_mixer, d_model, heads, opts.metric_form)
        self.norm2 = nn.LayerNorm(d_model)
        inner = opts.ffn_mult * d_model
        self.mlp = nn.Sequential(nn.Linear(d_model, inner), nn.GELU(), nn.Linear(inner, d_model))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.mixer(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class MetaFormer(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, layers: int, heads: int | None, context: int, opts: Options):
        super().__init__()
        self.context = context
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, opts) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        if opts.tie_weights:
            self.lm_head.weight = self.wte.weight

    def hidden_states(self, input_ids: Tensor) -> Tensor:
        t = input_ids.shape[1]
        if t > self.context:
            raise ValueError(f"sequence length {t} exceeds the positional table of {self.context}")
        x = self.wte(input_ids) + self.wpe.weight[:t]  # (B, T, D)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.lm_head(self.hidden_states(input_ids))  # (B, T, V)


# ---------------------------------------------------------------- registry contract


def build(trial, vocab_size: int) -> nn.Module:
    return MetaFormer(vocab_size, trial.d_model, trial.layers, trial.heads, trial.context, Options(**trial.options))
