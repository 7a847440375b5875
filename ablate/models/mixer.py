"""The masked mixer: attention replaced by a causally masked linear map over the sequence.

Block = norm -> sequence mixing -> residual, norm -> feed-forward -> residual (masked-mixers-1.md).
The studies wrote the sequence mixing as `Conv1d(context, context, kernel)` over (B, T, D), tokens as
channels, and re-masked `weight.data` every step. Here the mask is part of the computation:
`torch.tril(weight)` in forward, so masked entries get exactly zero gradient, are initialised to zero
and stay zero under AdamW. The map is a batched matmul over the sequence axis (measured faster than
Conv1d on CPU, see bench/models.py); `kernel > 1` convolves along d_model with PyTorch's 'same'
padding, one masked (context x context) matrix per kernel tap, exactly as the studies' Conv1d did.

A shorter T uses the top-left T x T block of every sequence weight (still causal), which equals
running the full window on right-padded input.

`parallel_convs: n` runs n separate masked maps on the same input and sums their outputs, as the studies'
n Conv1d did: n times the mixing compute per step. (For the flat mixer the sum is linear, so it is the
same function as one map with summed weights, and every map gets the same gradient; only the cost differs.)

`positional: first|every` is the studies' position input (masked-mixers-1.md, "Mixers do not benefit from
positional encoding"): one fixed, unlearned channel holding the position -context/2 .. context/2-1 is
concatenated to the token embedding, the blocks run at d_model + 1, and the LM head reads the other d_model
channels; `every` writes the positions back into that channel after every block. `learned_first|learned_every`
add a learned positional embedding instead.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

# options and sizes live without torch in mixer_options; the registry contract re-exports them here
from ablate.models.mixer_options import Options, inter_token_params, mixing_flops_per_token, param_count  # noqa: F401

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig


# ---------------------------------------------------------------- sequence mixing


def _shifted_matmul(weight: Tensor, x: Tensor) -> Tensor:
    """Sequence map with a kernel along d_model: weight (k, ..., To, Ti), x (..., Ti, D) -> (..., To, D), broadcast.

    Tap i multiplies x shifted by i - (k - 1) // 2 along D with zero fill: Conv1d(padding='same').
    """
    k, width = weight.shape[0], x.shape[-1]
    if k == 1:
        return torch.matmul(weight[0], x)
    x = F.pad(x, ((k - 1) // 2, k // 2))  # (B, G, Ti, D + k - 1)
    return sum(torch.matmul(weight[i], x[..., i : i + width]) for i in range(k))


def _init_like_conv1d(weight: Tensor, bias: Tensor, fan_in: int) -> None:
    """Conv1d's default init (uniform +-1/sqrt(fan_in)), then zero the masked upper triangle."""
    bound = 1 / math.sqrt(fan_in)
    with torch.no_grad():
        weight.uniform_(-bound, bound)
        weight.copy_(torch.tril(weight))
        bias.uniform_(-bound, bound)


class SequenceMixing(nn.Module):
    """Causal linear map(s) over the sequence axis of (B, G, T, D), one set of weights per group G.

    Flat: y = sum_n tril(W_n) x + b_n, the n parallel maps applied separately (one matmul batched over n).
    Expanded (expand=e): y = sum_n tril(W2_n) gelu(tril(W1_n) x + b1_n) + b2_n with W1_n (e*C, C) and
    W2_n (C, e*C): the masks leave inner channels >= C unused, as masked-mixers-1.md explains.
    """

    def __init__(self, context: int, groups: int = 1, expand: int = 1, kernel: int = 1, parallel: int = 1):
        super().__init__()
        self.context, self.expand = context, expand
        c, inner = context, context * expand
        if expand == 1:
            self.weight = nn.Parameter(torch.empty(parallel, kernel, groups, c, c))
            self.bias = nn.Parameter(torch.empty(parallel, groups, c))
            _init_like_conv1d(self.weight, self.bias, c * kernel)
        else:
            self.weight_in = nn.Parameter(torch.empty(parallel, kernel, groups, inner, c))
            self.bias_in = nn.Parameter(torch.empty(parallel, groups, inner))
            self.weight_out = nn.Parameter(torch.empty(parallel, kernel, groups, c, inner))
            self.bias_out = nn.Parameter(torch.empty(parallel, groups, c))
            _init_like_conv1d(self.weight_in, self.bias_in, c * kernel)
            _init_like_conv1d(self.weight_out, self.bias_out, inner * kernel)

    def forward(self, x: Tensor) -> Tensor:
        t = x.shape[-2]
        if t > self.context:
            raise ValueError(f"sequence length {t} exceeds the mixer's context window {self.context}")
        x = x[:, None]  # (B, 1, G, T, D): one input for the n maps
        if self.expand == 1:
            w = rearrange(torch.tril(self.weight[..., :t, :t]), "n k g o i -> k n g o i")
            y = _shifted_matmul(w, x) + self.bias[..., :t, None]  # (B, n, G, T, D)
            return y.sum(1)  # (B, G, T, D)
        e = self.expand * t
        w_in = rearrange(torch.tril(self.weight_in[..., :e, :t]), "n k g o i -> k n g o i")
        w_out = rearrange(torch.tril(self.weight_out[..., :t, :e]), "n k g o i -> k n g o i")
        h = F.gelu(_shifted_matmul(w_in, x) + self.bias_in[..., :e, None])  # (B, n, G, eT, D)
        y = _shifted_matmul(w_out, h) + self.bias_out[..., :t, None]  # (B, n, G, T, D)
        return y.sum(1)  # (B, G, T, D)

    def causal_masks(self) -> list[tuple[nn.Parameter, Tensor]]:
        """(parameter, boolean tensor of the entries the causal mask zeroes) for the contract tests."""
        out = []
        for p in (self.weight,) if self.expand == 1 else (self.weight_in, self.weight_out):
            rows, cols = p.shape[-2:]
            upper = ~torch.ones(rows, cols, dtype=torch.bool, device=p.device).tril()
            out.append((p, upper.expand_as(p)))
        return out


class MixingLayer(nn.Module):
    """(B, T, D) -> (B, T, D): one sequence mixing, or mixer heads each with their own projection and mixing."""

    def __init__(self, d_model: int, context: int, opts: Options):
        super().__init__()
        self.heads = opts.mixer_heads
        groups = max(self.heads, 1)
        if self.heads:
            width = opts.head_width(d_model)
            self.proj = nn.Linear(d_model, self.heads * width)  # h separate (d -> width) projections, stacked
            self.out = nn.Linear(self.heads * width, d_model)
        self.mixing = SequenceMixing(context, groups, opts.expand, opts.kernel, opts.parallel_convs)

    def forward(self, x: Tensor) -> Tensor:
        if not self.heads:
            return self.mixing(x[:, None])[:, 0]  # (B, T, D)
        h = rearrange(self.proj(x), "b t (h e) -> b h t e", h=self.heads)
        h = self.mixing(h)  # (B, H, T, E), head i mixed by its own weights
        return self.out(rearrange(h, "b h t e -> b t (h e)"))


# ---------------------------------------------------------------- block and model


class MixerBlock(nn.Module):
    def __init__(self, d_model: int, context: int, opts: Options):
        super().__init__()
        norm = (lambda: nn.LayerNorm(d_model)) if opts.norm else nn.Identity
        self.seq_norm = norm()
        self.seq = MixingLayer(d_model, context, opts)
        self.ffn_norm = norm()
        inner = opts.ffn_mult * d_model
        act = nn.GELU() if opts.activation == "gelu" else nn.Identity()
        self.ffn = nn.Sequential(nn.Linear(d_model, inner), act, nn.Linear(inner, d_model))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.seq(self.seq_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class MaskedMixer(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, layers: int, context: int, opts: Options):
        super().__init__()
        self.opts, self.context = opts, context
        self.wte = nn.Embedding(vocab_size, d_model)
        self.embed_linear = nn.Linear(d_model, d_model) if opts.embed_linear else None
        self.wpe = nn.Embedding(context, d_model) if opts.positional.startswith("learned") else None
        # the studies' position channel: fixed values, a buffer (not learned, not in checkpoints)
        positions = torch.arange(-context // 2, context // 2, dtype=torch.float32) if opts.is_position_channel else None
        self.register_buffer("positions", positions, persistent=False)
        width = opts.block_width(d_model)
        self.blocks = nn.ModuleList(MixerBlock(width, context, opts) for _ in range(layers))
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        if opts.tie_weights:
            self.lm_head.weight = self.wte.weight

    @property
    def layers(self) -> nn.ModuleList:
        return self.blocks

    def embed(self, input_ids: Tensor) -> Tensor:
        x = self.wte(input_ids)  # (B, T, D)
        return self.embed_linear(x) if self.embed_linear is not None else x

    def hidden_from_embeds(self, x: Tensor) -> Tensor:
        b, t = x.shape[:2]
        if t > self.context:
            raise ValueError(f"sequence length {t} exceeds the mixer's context window {self.context}")
        if self.positions is not None:
            channel = self.positions[:t].to(x.dtype)[None, :, None].expand(b, t, 1)  # (B, T, 1)
            x = torch.cat((x, channel), dim=-1)  # (B, T, D + 1)
        for i, block in enumerate(self.blocks):
            if self.wpe is not None and (i == 0 or self.opts.positional == "learned_every"):
                x = x + self.wpe.weight[:t]
            x = block(x)
            if self.opts.positional == "every":
                x = torch.cat((x[..., :-1], channel), dim=-1)  # the block's update of the channel is discarded
        if self.positions is not None:
            x = x[..., :-1]  # (B, T, D): the LM head reads the token channels
        return x  # the studies' mixer has no final norm

    def hidden_states(self, input_ids: Tensor) -> Tensor:
        return self.hidden_from_embeds(self.embed(input_ids))

    def head(self, hidden: Tensor) -> Tensor:
        return self.lm_head(hidden)

    def strip_ends(self) -> None:
        """Drop the token embedding and LM head: this stack runs on another model's embeddings."""
        self.wte = self.embed_linear = self.lm_head = None

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.lm_head(self.hidden_states(input_ids))  # (B, T, V)


# ---------------------------------------------------------------- registry contract


def build(trial: TrialConfig, vocab_size: int) -> nn.Module:
    return MaskedMixer(vocab_size, trial.d_model, trial.layers, trial.context, Options(**trial.options))
