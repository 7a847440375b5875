"""The model (torch): each block mixes tokens with a softmax-weighted per-channel average of the last `kernel`
tokens, gated by the token itself, then a feed-forward; both pre-norm and residual."""

import torch
from torch import nn

from ablate_shiftmix.options import Options, inter_token_params, mixing_flops_per_token, param_count

__all__ = ["Options", "build", "inter_token_params", "mixing_flops_per_token", "param_count"]


class Block(nn.Module):
    def __init__(self, d_model: int, opts: Options):
        super().__init__()
        self.kernel = opts.kernel
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.window = nn.Parameter(torch.zeros(d_model, opts.kernel))
        self.gate = nn.Linear(d_model, d_model)
        self.ffn = nn.Sequential(nn.Linear(d_model, opts.ffn_mult * d_model), nn.GELU(),
                                 nn.Linear(opts.ffn_mult * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = self.norm1(x)
        past = nn.functional.pad(normed.transpose(1, 2), (self.kernel - 1, 0))  # causal: the past only
        weights = self.window.softmax(dim=-1).unsqueeze(1)
        mixed = nn.functional.conv1d(past, weights, groups=weights.shape[0]).transpose(1, 2)
        x = x + mixed * torch.sigmoid(self.gate(normed))
        return x + self.ffn(self.norm2(x))


class Model(nn.Module):
    def __init__(self, trial, vocab_size: int):
        super().__init__()
        opts = Options(**trial.options)
        self.embed = nn.Embedding(vocab_size, trial.d_model)
        self.blocks = nn.ModuleList(Block(trial.d_model, opts) for _ in range(trial.layers))
        self.norm = nn.LayerNorm(trial.d_model)
        self.head = nn.Linear(trial.d_model, vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build(trial, vocab_size: int) -> nn.Module:
    return Model(trial, vocab_size)
