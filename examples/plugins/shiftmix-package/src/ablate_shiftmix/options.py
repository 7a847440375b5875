"""What planning and validation read, torch-free: the options and the closed-form counts."""

from pydantic import BaseModel, ConfigDict, Field


class Options(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kernel: int = Field(4, ge=1, description="tokens each position averages over (itself and kernel-1 before it)")
    ffn_mult: int = Field(4, ge=1, description="feed-forward width / d_model")


def param_count(trial, vocab_size: int) -> int:
    d, opts = trial.d_model, Options(**trial.options)
    hidden = opts.ffn_mult * d
    block = 4 * d + d * opts.kernel + (d * d + d) + (d * hidden + hidden) + (hidden * d + d)
    return vocab_size * d + trial.layers * block + 2 * d + d * vocab_size


def inter_token_params(trial) -> int:
    return trial.layers * trial.d_model * Options(**trial.options).kernel


def mixing_flops_per_token(trial) -> float:
    return 0.0  # the window's multiplies are parameter multiplies, already in 6N
