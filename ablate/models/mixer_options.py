"""The mixer family's options and closed-form sizes, without torch (read when a spec is planned)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig


class Options(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    expand: int = Field(1, ge=1, description="1: flat mixer (one sequence layer); e>1: expanded mixer, two sequence layers of inner width e*context with GELU between")
    parallel_convs: int = Field(1, ge=1, description="n separate masked sequence maps per block, each applied to the input, outputs summed (n times the mixing compute)")
    kernel: int = Field(1, ge=1, description="convolution kernel over the d_model axis, one masked context x context matrix per tap")
    mixer_heads: int = Field(0, ge=0, description="0: no heads; h: per-head projection -> own masked mixing -> concat -> output projection")
    head_dim: int = Field(0, ge=0, description="width of each mixer head; 0 means d_model // mixer_heads")
    positional: Literal["none", "first", "every", "learned_first", "learned_every"] = Field("none", description=(
        "first/every: the studies' fixed scalar position channel (-context/2 .. context/2-1) concatenated to the "
        "token embedding, so blocks run at d_model + 1 and the LM head reads the d_model token channels; every: "
        "the channel is overwritten after every block. learned_first/learned_every: a learned (context x d_model) "
        "embedding added before the first or every block"))
    embed_linear: bool = Field(False, description="extra linear layer after the token embedding")
    norm: bool = Field(True, description="LayerNorms before the sequence mixing and the feed-forward (False: the linear-mixer study)")
    activation: Literal["gelu", "none"] = Field("gelu", description="feed-forward nonlinearity (none: the linear-mixer study)")
    tie_weights: bool = Field(False, description="share the token embedding with the LM head")
    ffn_mult: int = Field(4, ge=1, description="feed-forward inner width as a multiple of d_model")

    def check_trial(self, trial: TrialConfig) -> None:
        if self.mixer_heads and not self.head_dim and trial.d_model % self.mixer_heads:
            raise ValueError(
                f"mixer_heads={self.mixer_heads} does not divide d_model={trial.d_model}; "
                f"choose a divisor or set head_dim"
            )
        if self.head_dim and not self.mixer_heads:
            raise ValueError("head_dim is only used with mixer_heads > 0")

    def head_width(self, d_model: int) -> int:
        return self.head_dim or d_model // self.mixer_heads

    @property
    def is_position_channel(self) -> bool:
        """The studies' form: one fixed scalar channel appended to the embedding (not a learned table)."""
        return self.positional in ("first", "every")

    def block_width(self, d_model: int) -> int:
        """Width the blocks run at: d_model, plus the position channel where there is one."""
        return d_model + 1 if self.is_position_channel else d_model


def sequence_mixing_params(context: int, groups: int = 1, expand: int = 1, kernel: int = 1, parallel: int = 1) -> int:
    """Parameters of mixer.SequenceMixing with the same arguments."""
    c, inner = context, context * expand
    if expand == 1:
        return parallel * groups * (kernel * c * c + c)
    return parallel * groups * (2 * kernel * inner * c + inner + c)


def _mixing_params(trial: TrialConfig) -> int:
    o = Options(**trial.options)
    d = o.block_width(trial.d_model)
    n = sequence_mixing_params(trial.context, max(o.mixer_heads, 1), o.expand, o.kernel, o.parallel_convs)
    if o.mixer_heads:
        width = o.mixer_heads * o.head_width(d)
        n += (d * width + width) + (width * d + d)
    return n


def feed_forward_params(trial: TrialConfig) -> int:
    """Parameters of one block's feed-forward and its norm (shared by the bidirectional mixer's two streams)."""
    o = Options(**trial.options)
    w = o.block_width(trial.d_model)
    return 2 * o.ffn_mult * w * w + o.ffn_mult * w + w + (2 * w if o.norm else 0)


def param_count(trial: TrialConfig, vocab_size: int) -> int:
    o, d = Options(**trial.options), trial.d_model
    w = o.block_width(d)
    norms = 4 * w if o.norm else 0
    ffn = 2 * o.ffn_mult * w * w + o.ffn_mult * w + w
    block = _mixing_params(trial) + norms + ffn
    n = vocab_size * d * (1 if o.tie_weights else 2) + trial.layers * block
    n += (d * d + d) if o.embed_linear else 0
    n += trial.context * d if o.positional.startswith("learned") else 0  # the scalar channel has no parameters
    return n


def inter_token_params(trial: TrialConfig) -> int:
    """Sequence-mixing weights and biases, plus the mixer-head projections."""
    return trial.layers * _mixing_params(trial)


def mixing_flops_per_token(trial: TrialConfig) -> float:
    """Actual forward FLOPs/token of the sequence mixing minus the 2 * its-params already in 6N.

    Convention (as for attention elsewhere): dense T x T maps at T = context, masked zeros included,
    since the matmul computes them. A (C x C) map applied to a (C, w) slab costs 2*C*w per token, while
    6N counts 2*C^2 per token for its C^2 weights, so the correction is negative when context > width.
    Head projections are ordinary per-token weights and already right in 2N.
    """
    o, c = Options(**trial.options), trial.context
    d = o.block_width(trial.d_model)
    groups, width = (o.mixer_heads, o.head_width(d)) if o.mixer_heads else (1, d)
    inner = c * o.expand
    if o.expand == 1:
        actual = o.parallel_convs * (2 * o.kernel * c * width + width)  # one matmul per map and tap, + bias or sum
        counted = 2 * o.parallel_convs * (o.kernel * c * c + c)
    else:
        actual = o.parallel_convs * (2 * o.kernel * inner * width * 2 + (inner // c) * width + width)
        counted = 2 * o.parallel_convs * (2 * o.kernel * inner * c + inner + c)
    return float(trial.layers * groups * (actual - counted))
