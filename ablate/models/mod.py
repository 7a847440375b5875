"""Mixture-of-depths over Llama-style blocks (mixture-of-depths.md, arxiv 2404.02258).

Every `every`-th block (the 2nd, 4th, ... by default; `first_routed: 0` for the blog's 1st, 3rd, ...) is routed:
a linear router scores each token, the top C = ceil(capacity * T) tokens (or int(), the blog's rounding) of each
sequence go through the block (gathered in causal order, RoPE at their ORIGINAL positions; the blog restarted
positions at 0), the others skip it, and the router weight scales the block's update:
x_i <- x_i + w_i * (block(x_S)_i - x_i)  for i in S  (output: delta, the paper's x + r f(x)), or the blog's code,
x_i <- x_i + w_i * block(x_S)_i  (output: block; its block returns x plus the residual branches).

Causality, honestly stated:
- Top-k over the sequence is itself non-causal in training: whether token t is selected depends on
  the scores of later tokens. This is how MoD trains; train-mode outputs (and the train loss) are not
  causal (mod_options.TRAIN_MODE_CAUSAL, said under the report's tables).
- In eval mode a small auxiliary router (d -> d/2 -> 1, SiLU), trained with BCE on the top-k selection
  from detached inputs, decides per token (probability > 0.5), and the router weight is the sigmoid of
  the token's own score, so eval-mode forward (eval loss, samples, embeddings) is causal. Selected
  tokens then attend only to earlier selected tokens, exactly as in the gathered subsequence.
- The blog's softmax router and top-k selection in eval have no causal evaluation: the options list
  them, and a spec that asks for them is refused with the reason (Options.non_causal_reason).

The auxiliary loss is the trainer's to add: in train mode with grad enabled each routed layer keeps its
loss, graph attached, in `aux_loss`, and `MixtureOfDepths.auxiliary_loss()` hands over their sum (and
clears them), so that it joins the main loss before any fp16 loss scaling.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ablate.models.hybrid import DecoderLayer
from ablate.models.llama import RMSNorm, init_llama_style, rotary
# options and sizes live without torch in mod_options; the registry contract re-exports them here
from ablate.models.mod_options import Options, dimensions, inter_token_params, mixing_flops_per_token, param_count  # noqa: F401

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig


class RoutedLayer(nn.Module):
    def __init__(self, d_model: int, heads: int, kv_heads: int, inner: int, opts: Options):
        super().__init__()
        if reason := opts.non_causal_reason():
            raise ValueError(reason)
        self.opts, self.head_dim = opts, d_model // heads
        self.adds_input = opts.output == "delta"  # the update is block(x) - x, else block(x) itself
        self.block = DecoderLayer(d_model, heads, kv_heads, inner, dropout=opts.dropout)
        self.router = nn.Linear(d_model, 1, bias=False)
        self.aux_router = nn.Sequential(nn.Linear(d_model, d_model // 2), nn.SiLU(), nn.Linear(d_model // 2, 1))
        self.last_selected: Tensor | None = None  # (B, T) bool, for tests and diagnostics
        self.topk_in_eval = False  # set only by MixtureOfDepths.routing_as_in_training (a non-causal eval)
        self.aux_loss: Tensor | None = None  # the aux router's BCE from the last train-mode forward, with its graph

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        scores = self.router(x)[..., 0].float()  # (B, T)
        if self.training or self.topk_in_eval:
            c = self.opts.capacity_tokens(t)
            index = scores.topk(c, dim=1).indices.sort(dim=1).values  # (B, C), causal order
            selected = torch.zeros(b, t, dtype=torch.bool, device=x.device).scatter(1, index, True)
            out = self._through_gathered(x, scores, index)
        else:
            selected = self.aux_router(x)[..., 0] > 0  # sigmoid(aux) > 0.5, per token
            out = self._through_masked(x, scores, selected)
        self.aux_loss = None
        if self.training and torch.is_grad_enabled():
            aux_logits = self.aux_router(x.detach())[..., 0].float()  # (B, T)
            self.aux_loss = F.binary_cross_entropy_with_logits(aux_logits, selected.float())
        self.last_selected = selected
        return out

    def _through_gathered(self, x: Tensor, scores: Tensor, index: Tensor) -> Tensor:
        """Training path: only the C selected tokens are computed."""
        d = x.shape[-1]
        gather = index[..., None].expand(-1, -1, d)  # (B, C, D)
        xs = x.gather(1, gather)  # (B, C, D)
        cos, sin = rotary(index, self.head_dim)  # original positions, (B, 1, C, hd)
        delta = self.block(xs, cos, sin) - (xs if self.adds_input else 0)  # (B, C, D)
        weight = torch.sigmoid(scores.gather(1, index))  # (B, C)
        return x.scatter_add(1, gather, (weight[..., None] * delta).to(x.dtype))

    def _through_masked(self, x: Tensor, scores: Tensor, selected: Tensor) -> Tensor:
        """Inference path for a per-token selection: all tokens computed, selected ones attend to selected ones."""
        t = x.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        itself = torch.eye(t, dtype=torch.bool, device=x.device)  # keeps skipped rows finite; they are discarded
        mask = (causal & (selected[:, None, :] | itself))[:, None]  # (B, 1, T, T)
        cos, sin = rotary(torch.arange(t, device=x.device), self.head_dim)
        delta = self.block(x, cos, sin, mask) - (x if self.adds_input else 0)  # (B, T, D)
        weight = torch.where(selected, torch.sigmoid(scores), torch.zeros_like(scores))  # (B, T)
        return x + (weight[..., None] * delta).to(x.dtype)


class MixtureOfDepths(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, layers: int, heads: int, kv_heads: int, opts: Options):
        super().__init__()
        self.head_dim = d_model // heads
        inner = opts.intermediate or 4 * d_model
        self.embed = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(
            RoutedLayer(d_model, heads, kv_heads, inner, opts) if opts.is_routed(i)
            else DecoderLayer(d_model, heads, kv_heads, inner, dropout=opts.dropout) for i in range(layers)
        )
        self.norm = RMSNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        init_llama_style(self)
        if opts.tie_weights:
            self.lm_head.weight = self.embed.weight

    def routed_layers(self) -> list[RoutedLayer]:
        return [layer for layer in self.layers if isinstance(layer, RoutedLayer)]

    def auxiliary_loss(self) -> Tensor | None:
        """The sum of the routed layers' aux-router losses from the last train-mode forward (clears them); None if none."""
        losses = [layer.aux_loss for layer in self.routed_layers() if layer.aux_loss is not None]
        for layer in self.routed_layers():
            layer.aux_loss = None
        return sum(losses[1:], losses[0]) if losses else None

    @contextmanager
    def routing_as_in_training(self) -> Iterator[None]:
        """Eval-mode forwards inside route by top-k over the sequence, as training does: NOT causal. The MoD blog's
        validation loss was this one (its model.eval() kept top-k routing; its inference() is unimplemented,
        joey00072/ohara experiments/mixture_of_depth/mixture_of_depth.py@2f01778:165-170); the trainer reports it
        apart from the causal test loss, labelled non-causal."""
        for layer in self.routed_layers():
            layer.topk_in_eval = True
        try:
            yield
        finally:
            for layer in self.routed_layers():
                layer.topk_in_eval = False

    def hidden_states(self, input_ids: Tensor) -> Tensor:
        cos, sin = rotary(torch.arange(input_ids.shape[1], device=input_ids.device), self.head_dim)
        x = self.embed(input_ids)  # (B, T, D)
        for layer in self.layers:
            x = layer(x) if isinstance(layer, RoutedLayer) else layer(x, cos, sin)
        return self.norm(x)

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.lm_head(self.hidden_states(input_ids))  # (B, T, V)


# ---------------------------------------------------------------- registry contract


def build(trial: TrialConfig, vocab_size: int) -> nn.Module:
    o, heads, kv_heads, _ = dimensions(trial)
    return MixtureOfDepths(vocab_size, trial.d_model, trial.layers, heads, kv_heads, o)
