"""Early causal-LM transformers, written here: transformers' OpenAI GPT (default) or GPT-2, the same modules, names
and arithmetic as transformers' OpenAIGPTLMHeadModel and GPT2LMHeadModel built from the studies' config.

OpenAI GPT is post-norm with learned positions and no final norm, its attention written out (scores / sqrt(d_head),
-1e4 above the diagonal, softmax); GPT-2 is pre-norm with a final LayerNorm and SDPA. Both use transformers' Conv1D
(a linear map whose weight is stored (in, out)) and its tanh GELU, tie the LM head to the token embedding, as
transformers does by default (`tie_weights: false` unties), and draw their weights in transformers 5's order (a seed
gives the same weights). Dropout defaults to 0.1, the library's default, which the studies kept: their GPT rows show
eval loss below train loss (masked-mixers-1.md, 2.04/1.96). Written as our own modules because importing
transformers' models pulls in torch._dynamo (issue 49 item 2); tests/models/test_gpt_fidelity.py holds both to
transformers' models, and a checkpoint written while the family wrapped them (names under `hf.`) loads as it is.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

# options and sizes live without torch in gpt_options; the registry contract re-exports them here
from ablate.models.gpt_options import Options, inter_token_params, mixing_flops_per_token, param_count  # noqa: F401
from ablate.models.llama import unwrap_transformers_names

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig

STD = 0.02  # transformers' initializer_range


class Conv1D(nn.Module):
    """transformers' Conv1D: y = x @ W + b with W (in, out), drawn normal(0, 0.02) when built."""

    def __init__(self, out_features: int, in_features: int):
        super().__init__()
        self.nf = out_features
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features))
        nn.init.normal_(self.weight, std=STD)

    def forward(self, x: Tensor) -> Tensor:
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(*x.shape[:-1], self.nf)


def gelu_new(x: Tensor) -> Tensor:
    """transformers' `gelu_new` (OpenAI GPT's and GPT-2's tanh approximation), in its own operation order."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class MLP(nn.Module):
    def __init__(self, d_model: int, dropout: float):
        super().__init__()
        self.c_fc = Conv1D(4 * d_model, d_model)
        self.c_proj = Conv1D(d_model, 4 * d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(gelu_new(self.c_fc(x))))


class Attention(nn.Module):
    """Causal self-attention: OpenAI GPT's written out (`sdpa` False), or GPT-2's through SDPA."""

    def __init__(self, d_model: int, heads: int, context: int, dropout: float, sdpa: bool):
        super().__init__()
        self.heads, self.d_model, self.sdpa = heads, d_model, sdpa
        if not sdpa:  # OpenAI GPT's mask, as its buffer (not saved)
            self.register_buffer("bias", torch.tril(torch.ones(context, context)).view(1, 1, context, context),
                                 persistent=False)
        self.c_attn = Conv1D(3 * d_model, d_model)
        self.c_proj = Conv1D(d_model, d_model)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = (t.view(*t.shape[:-1], self.heads, -1).transpose(1, 2)  # (B, H, T, E)
                   for t in self.c_attn(x).split(self.d_model, dim=2))
        if self.sdpa:
            p = self.attn_dropout.p if self.training else 0.0
            y = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True,
                                                           scale=q.shape[-1] ** -0.5)
        else:
            w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(v.size(-1))
            b = self.bias[:, :, : w.size(-2), : w.size(-1)]
            y = torch.matmul(self.attn_dropout(nn.functional.softmax(w * b + -1e4 * (1 - b), dim=-1)), v)
        y = y.transpose(1, 2).reshape(*x.shape[:-1], -1)  # (B, T, D)
        return self.resid_dropout(self.c_proj(y))


class OpenAIBlock(nn.Module):
    """Post-norm: n = ln_1(x + attn(x)); ln_2(n + mlp(n))."""

    def __init__(self, d_model: int, heads: int, context: int, dropout: float):
        super().__init__()
        self.attn = Attention(d_model, heads, context, dropout, sdpa=False)
        self.ln_1 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, dropout)
        self.ln_2 = nn.LayerNorm(d_model)

    def forward(self, x: Tensor) -> Tensor:
        n = self.ln_1(x + self.attn(x))
        return self.ln_2(n + self.mlp(n))


class GPT2Block(nn.Module):
    """Pre-norm: x + attn(ln_1(x)), then + mlp(ln_2(x))."""

    def __init__(self, d_model: int, heads: int, context: int, dropout: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, heads, context, dropout, sdpa=True)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Stack(nn.Module):
    """transformers' OpenAIGPTModel (`tokens_embed`, `positions_embed`, `h`) or GPT2Model (`wte`, `wpe`, `h`,
    `ln_f`): token and position embeddings, dropout, the blocks (and GPT-2's final norm)."""

    def __init__(self, vocab_size: int, d_model: int, layers: int, heads: int, context: int, dropout: float,
                 variant: str):
        super().__init__()
        names = ("tokens_embed", "positions_embed") if variant == "openai" else ("wte", "wpe")
        self.tokens, self.positions = names
        setattr(self, names[0], nn.Embedding(vocab_size, d_model))
        setattr(self, names[1], nn.Embedding(context, d_model))
        self.drop = nn.Dropout(dropout)
        block = OpenAIBlock if variant == "openai" else GPT2Block
        self.h = nn.ModuleList(block(d_model, heads, context, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model) if variant == "gpt2" else None
        self._init_weights(layers)

    def _init_weights(self, layers: int) -> None:
        """transformers 5's draws after building: both embeddings normal(0, 0.02); GPT-2's Conv1Ds again, each
        c_proj once more at 0.02 / sqrt(2 * layers) (children before their parent, as transformers walks them)."""
        for name in (self.tokens, self.positions):
            nn.init.normal_(getattr(self, name).weight, std=STD)
        if self.ln_f is None:
            return
        for block in self.h:
            for part in (block.attn, block.mlp):
                for conv in (part.c_attn if part is block.attn else part.c_fc, part.c_proj):
                    nn.init.normal_(conv.weight, std=STD)
                nn.init.normal_(part.c_proj.weight, std=STD / math.sqrt(2 * layers))

    def forward(self, input_ids: Tensor) -> Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        x = self.drop(getattr(self, self.tokens)(input_ids) + getattr(self, self.positions)(positions))
        for block in self.h:
            x = block(x)
        return x if self.ln_f is None else self.ln_f(x)  # (B, T, D)


class GPT(nn.Module):
    """transformers' OpenAIGPTLMHeadModel or GPT2LMHeadModel; forward returns a plain logits tensor."""

    def __init__(self, trial: TrialConfig, vocab_size: int):
        super().__init__()
        o = Options(**trial.options)
        self.context = trial.context
        self.transformer = Stack(vocab_size, trial.d_model, trial.layers, trial.heads, trial.context, o.dropout,
                                 o.variant)
        self.lm_head = nn.Linear(trial.d_model, vocab_size, bias=False)
        nn.init.normal_(self.lm_head.weight, std=STD)
        if o.tie_weights:
            self.lm_head.weight = getattr(self.transformer, self.transformer.tokens).weight
        self._register_load_state_dict_pre_hook(unwrap_transformers_names, with_module=True)

    def hidden_states(self, input_ids: Tensor) -> Tensor:
        if input_ids.shape[1] > self.context:
            raise ValueError(f"sequence length {input_ids.shape[1]} exceeds n_positions {self.context}")
        return self.transformer(input_ids)  # (B, T, D)

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.lm_head(self.hidden_states(input_ids))  # (B, T, V)


def build(trial: TrialConfig, vocab_size: int) -> nn.Module:
    return GPT(trial, vocab_size)
