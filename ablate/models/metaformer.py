"""MetaFormer: one block design, the token mixer swapped (nlp-metaformer.md).

Block = LayerNorm -> token mixer -> residual, LayerNorm -> MLP (d -> 4d -> d, GELU) -> residual;
learned positional embeddings, a final LayerNorm, nanoGPT-style init (normal 0.02).

Causal by default (language modelling). `causal: false` is the study's classifier: no mask in any mixer, and
pooling over a centred window; only a classification objective may build it (metaformer_options.check_trial).

Token mixers (per head h, head width k = d_model / heads):
- attention: scaled dot-product attention, causal.
- metric: one shared projection p = P x; scores p M_h p^T / sqrt(k) with a symmetric per-head metric
  M_h (`metric_form: psd` M = A A^T, or `symmetric` M = A + A^T); values are p itself. The causal mask
  is applied before the softmax (the MetaFormer repo multiplied unmasked scores by the values).
- quadratic: as metric with a free k x k form U_h per head. The text's quadratic form acts on x
  itself (d x d per head); here it acts on the shared projection, as the sweep asks.
- pool: causal average pooling minus the token itself (PoolFormer): mean(x_<=t) - x_t; unmasked, the mean of
  a centred window of `pool_kernel` positions (and features, `pool_features`, as the study code's avg_pool2d on
  (B, T, D)), padding not counted, minus the token (PoolFormer's avg_pool(k, stride 1, pad k // 2) - x).
- identity: no token mixing at all (a per-token model; the text's lower bound): the mixer sublayer adds LN(x);
  none: the block has no mixer sublayer (the study code's IDENTITY).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

# options and sizes live without torch in metaformer_options; the registry contract re-exports them here
from ablate.models.metaformer_options import Options, inter_token_params, mixing_flops_per_token, param_count  # noqa: F401

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig


# ---------------------------------------------------------------- token mixers


class Attention(nn.Module):
    def __init__(self, d_model: int, heads: int, bias: bool = True, is_causal: bool = True):
        super().__init__()
        self.heads, self.is_causal = heads, is_causal
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = rearrange(self.qkv(x), "b t (n h e) -> n b h t e", n=3, h=self.heads)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.is_causal)  # (B, H, T, E)
        return self.out(rearrange(y, "b h t e -> b t (h e)"))


class FormAttention(nn.Module):
    """Scores p F_h p^T on one shared projection p = P x, values p: metric (F symmetric) or quadratic (F free)."""

    def __init__(self, d_model: int, heads: int, form: str, bias: bool = True, is_causal: bool = True):
        super().__init__()
        self.heads, self.form, self.is_causal = heads, form, is_causal
        k = d_model // heads
        self.proj = nn.Linear(d_model, d_model, bias=False)  # P, shared by queries, keys and values
        start = torch.eye(k) / (2 if form == "symmetric" else 1)  # every form starts near the identity
        self.form_weight = nn.Parameter(start.repeat(heads, 1, 1) + 0.02 * torch.randn(heads, k, k))  # (H, k, k)
        self.out = nn.Linear(d_model, d_model, bias=bias)

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
        y = F.scaled_dot_product_attention(query, p, p, is_causal=self.is_causal)  # mask before softmax
        return self.out(rearrange(y, "b h t e -> b t (h e)"))


class CausalPool(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        t = x.shape[1]
        counts = torch.arange(1, t + 1, device=x.device, dtype=torch.float32)[:, None]  # (T, 1)
        mean = x.float().cumsum(dim=1) / counts  # (B, T, D), mean of positions <= t
        return (mean - x.float()).to(x.dtype)


class CentredPool(nn.Module):
    """The mean of a centred window minus the token; the window spans `kernel` positions (and features)."""

    def __init__(self, kernel: int, features: bool):
        super().__init__()
        self.kernel, self.features = kernel, features

    def forward(self, x: Tensor) -> Tensor:
        k = self.kernel
        if self.features:  # (B, 1, T, D): a k x k window over positions and features
            mean = F.avg_pool2d(x.float()[:, None], k, stride=1, padding=k // 2, count_include_pad=False)[:, 0]
        else:  # (B, D, T): a window of k positions
            mean = F.avg_pool1d(x.float().transpose(1, 2), k, stride=1, padding=k // 2,
                                count_include_pad=False).transpose(1, 2)
        return (mean - x.float()).to(x.dtype)  # (B, T, D)


class Identity(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x


def token_mixer(opts: Options, d_model: int, heads: int | None) -> nn.Module | None:
    """The block's token mixer; None for `none` (no mixer sublayer)."""
    name = opts.token_mixer
    if name == "attention":
        return Attention(d_model, heads, opts.bias, opts.causal)
    if name in ("metric", "quadratic"):
        return FormAttention(d_model, heads, opts.metric_form if name == "metric" else "quadratic", opts.bias, opts.causal)
    if name == "pool":
        return CausalPool() if opts.causal else CentredPool(opts.pool_kernel, opts.pool_features)
    return Identity() if name == "identity" else None


# ---------------------------------------------------------------- block and model


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int | None, opts: Options):
        super().__init__()
        self.mixer = token_mixer(opts, d_model, heads)
        self.norm1 = nn.LayerNorm(d_model) if self.mixer is not None else None
        self.norm2 = nn.LayerNorm(d_model)
        inner = opts.ffn_mult * d_model
        self.mlp = nn.Sequential(nn.Linear(d_model, inner, bias=opts.bias), nn.GELU(),
                                 nn.Linear(inner, d_model, bias=opts.bias))

    def forward(self, x: Tensor) -> Tensor:
        if self.mixer is not None:
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


def build(trial: TrialConfig, vocab_size: int) -> nn.Module:
    return MetaFormer(vocab_size, trial.d_model, trial.layers, trial.heads, trial.context, Options(**trial.options))
