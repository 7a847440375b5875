"""The mod family's options and closed-form sizes, without torch (read when a spec is planned)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from ablate.models.hybrid_options import attention_params, decoder_layer_params

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig

# MoD trains by top-k over the sequence (the paper's design): read by the contract check (ablate check: train-mode
# logits may read later tokens) and by the report, which says so under the tables of any family that declares it
TRAIN_MODE_CAUSAL = False
TRAIN_MODE_NOTE = ("not causal in train mode by design: top-k routing picks each routed block's tokens by the scores "
                   "of the whole sequence; eval mode routes causally (the auxiliary router)")


class Options(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    capacity: float = Field(0.125, gt=0, le=1, description="fraction of each sequence's tokens that pass through a routed block")
    capacity_rounding: Literal["ceil", "floor"] = Field("ceil", description="C = ceil(capacity * T), or floor: "
                                                        "int(capacity * T) as the blog's code (0.12 x 512 = 61), at least 1")
    router: Literal["sigmoid", "softmax"] = Field("sigmoid", description="router weight: sigmoid of the token's own score; softmax (the blog's, over the selected tokens) is refused: no causal eval")
    every: int = Field(2, ge=1, description="route every n-th block (blocks n-1, 2n-1, ...); 1 routes all blocks")
    first_routed: int | None = Field(None, ge=0, description="the first routed block (0-based), then every n-th; "
                                     "default every - 1; 0 is the blog's [MoD, Block, MoD, Block, ...]")
    output: Literal["delta", "block"] = Field("delta", description="delta: x + w * (block(x) - x), the router weight "
                                              "scales the block's residual update (the paper's x + r f(x)); block: "
                                              "x + w * block(x), the blog's code, whose block output includes x")
    inference_router: Literal["aux", "topk"] = Field("aux", description="eval-mode selection: the causal auxiliary router; topk (training-time top-k in eval) is refused: not causal")
    intermediate: int | None = Field(None, gt=0, description="SwiGLU inner width; default 4 * d_model")
    tie_weights: bool = Field(False, description="share the token embedding with the LM head")
    dropout: float = Field(0.0, ge=0, lt=1, description="training-only dropout on the attention weights, the attention "
                           "output and the MLP output of every block (the blog's code: 0.2)")

    def check_trial(self, trial: TrialConfig) -> None:
        if trial.heads is None:
            raise ValueError("the mod family needs heads (attention heads), e.g. heads: 4")
        if reason := self.non_causal_reason():
            raise ValueError(reason)

    def non_causal_reason(self) -> str | None:
        """Why these options cannot be evaluated causally (eval loss, samples, embeddings), or None."""
        if self.router == "softmax":
            return ("options.router: softmax cannot be evaluated causally: the blog's softmax normalises each "
                    "selected token's weight over the whole sequence, so every output depends on later tokens, "
                    "and the blog gives it no inference form ('breaks causality ... Do we fix it? NO'); use "
                    "router: sigmoid, the blog's causal replacement")
        if self.inference_router == "topk":
            return ("options.inference_router: topk cannot be evaluated causally: top-k selection over the "
                    "sequence decides each token by the scores of later tokens; use inference_router: aux, "
                    "the per-token auxiliary router (the paper's causal sampling)")
        return None

    def is_routed(self, index: int) -> bool:
        first = self.every - 1 if self.first_routed is None else self.first_routed
        return index >= first and (index - first) % self.every == 0

    def capacity_tokens(self, length: int) -> int:
        """C: how many of a sequence's `length` tokens a routed block takes in training."""
        exact = self.capacity * length
        return max(1, math.ceil(exact) if self.capacity_rounding == "ceil" else int(exact))


def dimensions(trial: TrialConfig) -> tuple[Options, int, int, int]:
    """(options, heads, key/value heads, SwiGLU inner width)."""
    o = Options(**trial.options)
    return o, trial.heads, trial.kv_heads or trial.heads, o.intermediate or 4 * trial.d_model


def routed_layer_params(d_model: int, heads: int, kv_heads: int, inner: int) -> int:
    """Parameters of mod.RoutedLayer: its decoder layer, the router and the auxiliary router."""
    half = d_model // 2
    aux = d_model * half + half + half + 1
    return decoder_layer_params(d_model, heads, kv_heads, inner) + d_model + aux


def param_count(trial: TrialConfig, vocab_size: int) -> int:
    o, heads, kv_heads, inner = dimensions(trial)
    d = trial.d_model
    routed = sum(o.is_routed(i) for i in range(trial.layers))
    n = routed * routed_layer_params(d, heads, kv_heads, inner)
    n += (trial.layers - routed) * decoder_layer_params(d, heads, kv_heads, inner)
    return n + vocab_size * d * (1 if o.tie_weights else 2) + d


def inter_token_params(trial: TrialConfig) -> int:
    _, heads, kv_heads, _ = dimensions(trial)
    return trial.layers * attention_params(trial.d_model, heads, kv_heads)


def mixing_flops_per_token(trial: TrialConfig) -> float:
    """Per token, averaged over the sequence, at T = context, no causal halving:
    full blocks: attention 4*T*d; routed blocks: attention among the C routed tokens, 4*C^2*d/T, minus
    2 * block params for the (1 - C/T) tokens that skip the block (6N counts every token through it)."""
    o, heads, kv_heads, inner = dimensions(trial)
    t, d = trial.context, trial.d_model
    c = o.capacity_tokens(t)
    routed = sum(o.is_routed(i) for i in range(trial.layers))
    block = decoder_layer_params(d, heads, kv_heads, inner)
    per_routed = 4 * c * c * d / t - 2 * (1 - c / t) * block
    return float((trial.layers - routed) * 4 * t * d + routed * per_routed)
