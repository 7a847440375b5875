"""A token mixer that is not in the studies, as an ablate plugin in one file: the shift mixer.

Each block mixes tokens with a learned, per-channel weighting of the last `kernel` tokens (a causal depthwise
convolution whose weights are a softmax over the window, so every channel averages its recent past), gated by the
token itself; a feed-forward follows, both pre-norm and residual. Position t reads tokens t-kernel+1 .. t only.

Use it from a sweep with `plugins: [./shift_mixer.py]` (see compare.yaml), or check it with
`ablate check shift-mixer --plugin examples/plugins/shift_mixer.py`.
"""

import torch
from pydantic import BaseModel, Field
from torch import nn

import ablate


class Options(BaseModel):
    kernel: int = Field(4, ge=1, description="tokens each position averages over (itself and kernel-1 before it)")
    ffn_mult: int = Field(4, ge=1, description="feed-forward width / d_model")


class ShiftBlock(nn.Module):
    def __init__(self, d_model: int, opts: Options):
        super().__init__()
        self.kernel = opts.kernel
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.window = nn.Parameter(torch.zeros(d_model, opts.kernel))  # softmax over it: a per-channel average
        self.gate = nn.Linear(d_model, d_model)
        self.ffn = nn.Sequential(nn.Linear(d_model, opts.ffn_mult * d_model), nn.GELU(),
                                 nn.Linear(opts.ffn_mult * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D)
        h = self.norm1(x).transpose(1, 2)  # (B, D, T)
        h = nn.functional.pad(h, (self.kernel - 1, 0))  # the past only: causal
        weights = self.window.softmax(dim=-1).unsqueeze(1)  # (D, 1, kernel)
        mixed = nn.functional.conv1d(h, weights, groups=weights.shape[0]).transpose(1, 2)
        x = x + mixed * torch.sigmoid(self.gate(self.norm1(x)))
        return x + self.ffn(self.norm2(x))


class ShiftMixer(nn.Module):
    def __init__(self, trial, vocab_size: int):
        super().__init__()
        opts = Options(**trial.options)
        self.embed = nn.Embedding(vocab_size, trial.d_model)
        self.blocks = nn.ModuleList(ShiftBlock(trial.d_model, opts) for _ in range(trial.layers))
        self.norm = nn.LayerNorm(trial.d_model)
        self.head = nn.Linear(trial.d_model, vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, V)
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def param_count(trial, vocab_size: int) -> int:
    """The closed form (planning uses it without building anything)."""
    d, opts = trial.d_model, Options(**trial.options)
    hidden = opts.ffn_mult * d
    block = 4 * d + d * opts.kernel + (d * d + d) + (d * hidden + hidden) + (hidden * d + d)
    return vocab_size * d + trial.layers * block + 2 * d + d * vocab_size


@ablate.architecture("shift-mixer", options=Options, param_count=param_count,
                     inter_token_params=lambda trial: trial.layers * trial.d_model * Options(**trial.options).kernel,
                     description="token mixing by a gated per-channel average of the last `kernel` tokens")
def build(trial, vocab_size: int) -> nn.Module:
    return ShiftMixer(trial, vocab_size)
