"""Mixture-of-depths over Llama-style blocks (mixture-of-depths.md, arxiv 2404.02258).

Every `every`-th block (the 2nd, 4th, ... by default) is routed: a linear router scores each token, the
top C = ceil(capacity * T) tokens of each sequence go through the block (gathered in causal order, RoPE
at their ORIGINAL positions; the blog restarted positions at 0), the others skip it, and the block's
output delta is scaled by the router weight:  x_i <- x_i + w_i * (block(x_S)_i - x_i)  for i in S.

Causality, honestly stated:
- Top-k over the sequence is itself non-causal in training: whether token t is selected depends on
  the scores of later tokens. This is how MoD trains; train-mode outputs are not causal.
- `router: sigmoid` (default) weights each token by its own score; `router: softmax` (the blog's)
  normalises the selected scores over the sequence and leaks the future even at inference.
- At inference (`model.eval()` with `inference_router: aux`, the default) a small auxiliary router
  (d -> d/2 -> 1, SiLU), trained with BCE on the top-k selection from detached inputs, decides per
  token (probability > 0.5), so eval-mode forward is causal with the sigmoid router. Selected tokens
  then attend only to earlier selected tokens, exactly as in the gathered subsequence.
  `inference_router: topk` keeps training-time routing in eval (matches train loss, not causal).

The auxiliary loss reaches the aux router without the trainer knowing about it: its gradient is added
in backward (AddAuxiliaryLoss, as in DeepSeek-MoE's code), weight 1, from a loss that only depends on
aux-router parameters. The last value is kept in `last_aux_loss` for logging.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ablate.models.hybrid import DecoderLayer, RMSNorm, init_llama_style, rotary
# options and sizes live without torch in mod_options; the registry contract re-exports them here
from ablate.models.mod_options import Options, dimensions, inter_token_params, mixing_flops_per_token, param_count  # noqa: F401


class AddAuxiliaryLoss(torch.autograd.Function):
    """Identity on x; in backward, also sends gradient 1 to `loss` (as if it were added to the total loss)."""

    @staticmethod
    def forward(ctx, x: Tensor, loss: Tensor) -> Tensor:
        ctx.loss_dtype = loss.dtype
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor]:
        return grad, torch.ones((), dtype=ctx.loss_dtype, device=grad.device)


class RoutedLayer(nn.Module):
    def __init__(self, d_model: int, heads: int, kv_heads: int, inner: int, opts: Options):
        super().__init__()
        self.opts, self.head_dim = opts, d_model // heads
        self.block = DecoderLayer(d_model, heads, kv_heads, inner)
        self.router = nn.Linear(d_model, 1, bias=False)
        self.aux_router = nn.Sequential(nn.Linear(d_model, d_model // 2), nn.SiLU(), nn.Linear(d_model // 2, 1))
        self.last_selected: Tensor | None = None  # (B, T) bool, for tests and diagnostics
        self.last_aux_loss: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        scores = self.router(x)[..., 0].float()  # (B, T)
        if self.training or self.opts.inference_router == "topk":
            c = math.ceil(self.opts.capacity * t)
            index = scores.topk(c, dim=1).indices.sort(dim=1).values  # (B, C), causal order
            selected = torch.zeros(b, t, dtype=torch.bool, device=x.device).scatter(1, index, True)
            out = self._through_gathered(x, scores, index)
        else:
            selected = self.aux_router(x)[..., 0] > 0  # sigmoid(aux) > 0.5, per token
            out = self._through_masked(x, scores, selected)
        if self.training and torch.is_grad_enabled():
            aux_logits = self.aux_router(x.detach())[..., 0].float()
            aux_loss = F.binary_cross_entropy_with_logits(aux_logits, selected.float())
            out = AddAuxiliaryLoss.apply(out, aux_loss)
            self.last_aux_loss = aux_loss.detach()
        self.last_selected = selected
        return out

    def _through_gathered(self, x: Tensor, scores: Tensor, index: Tensor) -> Tensor:
        """Training path: only the C selected tokens are computed."""
        d = x.shape[-1]
        gather = index[..., None].expand(-1, -1, d)  # (B, C, D)
        xs = x.gather(1, gather)  # (B, C, D)
        cos, sin = rotary(index, self.head_dim)  # original positions, (B, 1, C, hd)
        delta = self.block(xs, cos, sin) - xs  # (B, C, D)
        picked = scores.gather(1, index)  # (B, C)
        weight = torch.sigmoid(picked) if self.opts.router == "sigmoid" else torch.softmax(picked, dim=1)
        return x.scatter_add(1, gather, (weight[..., None] * delta).to(x.dtype))

    def _through_masked(self, x: Tensor, scores: Tensor, selected: Tensor) -> Tensor:
        """Inference path for a per-token selection: all tokens computed, selected ones attend to selected ones."""
        t = x.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        itself = torch.eye(t, dtype=torch.bool, device=x.device)  # keeps skipped rows finite; they are discarded
        mask = (causal & (selected[:, None, :] | itself))[:, None]  # (B, 1, T, T)
        cos, sin = rotary(torch.arange(t, device=x.device), self.head_dim)
        delta = self.block(x, cos, sin, mask) - x  # (B, T, D)
        if self.opts.router == "sigmoid":
            weight = torch.sigmoid(scores)
        else:
            weight = torch.softmax(scores.masked_fill(~selected, torch.finfo(scores.dtype).min), dim=1)
        weight = torch.where(selected, weight, torch.zeros_like(weight))  # (B, T)
        return x + (weight[..., None] * delta).to(x.dtype)


class MixtureOfDepths(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, layers: int, heads: int, kv_heads: int, opts: Options):
        super().__init__()
        self.head_dim = d_model // heads
        inner = opts.intermediate or 4 * d_model
        self.embed = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(
            RoutedLayer(d_model, heads, kv_heads, inner, opts) if opts.is_routed(i) else DecoderLayer(d_model, heads, kv_heads, inner)
            for i in range(layers)
        )
        self.norm = RMSNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        init_llama_style(self)
        if opts.tie_weights:
            self.lm_head.weight = self.embed.weight

    def routed_layers(self) -> list[RoutedLayer]:
        return [layer for layer in self.layers if isinstance(layer, RoutedLayer)]

    def hidden_states(self, input_ids: Tensor) -> Tensor:
        cos, sin = rotary(torch.arange(input_ids.shape[1], device=input_ids.device), self.head_dim)
        x = self.embed(input_ids)  # (B, T, D)
        for layer in self.layers:
            x = layer(x) if isinstance(layer, RoutedLayer) else layer(x, cos, sin)
        return self.norm(x)

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.lm_head(self.hidden_states(input_ids))  # (B, T, V)


# ---------------------------------------------------------------- registry contract


def build(trial, vocab_size: int) -> nn.Module:
    o, heads, kv_heads, _ = dimensions(trial)
    return MixtureOfDepths(vocab_size, trial.d_model, trial.layers, heads, kv_heads, o)
