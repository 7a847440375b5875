"""The retrieval model: a small bidirectional mixer scoring c candidate texts for a summary, and the studies'
temperature-free InfoNCE loss for comparison."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RetrievalBlock(nn.Module):
    """norm -> dense (unmasked) linear map over the c+1 positions -> residual, norm -> feed-forward -> residual."""

    def __init__(self, d_model: int, length: int, ffn_mult: int = 4):
        super().__init__()
        self.seq_norm = nn.LayerNorm(d_model)
        self.seq = nn.Linear(length, length)  # every position sees every other: bidirectional
        self.ffn_norm = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(nn.Linear(d_model, ffn_mult * d_model), nn.GELU(), nn.Linear(ffn_mult * d_model, d_model))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.seq(self.seq_norm(x).transpose(1, 2)).transpose(1, 2)  # (B, c+1, d), mixed along c+1
        return x + self.ffn(self.ffn_norm(x))


class RetrievalMixer(nn.Module):
    """Scores c candidate texts for a query: position 0 is the summary embedding, 1..c the texts.

    `d_model` None works at the embeddings' own width with no projection, and without `input_norm` and
    `final_norm` this is the authors' RetrievalMixer (blocks, then a linear score per position)."""

    def __init__(self, input_dim: int, candidates: int, d_model: int | None = 128, layers: int = 2,
                 input_norm: bool = True, final_norm: bool = True):
        super().__init__()
        self.candidates = candidates
        width = d_model or input_dim
        # CLM hidden states (the mixer has no final norm) vary in scale: the norm evens them out (not the authors')
        self.input_norm = nn.LayerNorm(input_dim) if input_norm else nn.Identity()
        self.proj = nn.Linear(input_dim, width) if d_model is not None else nn.Identity()
        self.blocks = nn.ModuleList(RetrievalBlock(width, candidates + 1) for _ in range(layers))
        self.norm = nn.LayerNorm(width) if final_norm else nn.Identity()
        self.score = nn.Linear(width, 1)

    def forward(self, query: Tensor, texts: Tensor) -> Tensor:
        """query (B, D), texts (B, c, D) -> scores (B, c)."""
        x = torch.cat([query[:, None], texts], dim=1)  # (B, c+1, D)
        x = self.proj(self.input_norm(x))  # (B, c+1, d)
        for block in self.blocks:
            x = block(x)
        return self.score(self.norm(x[:, 1:])).squeeze(-1)  # (B, c)


def info_nce_loss(query_emb: Tensor, match_emb: Tensor, negative_embs: Tensor) -> Tensor:
    """Temperature-free InfoNCE per query: -log(e^cos(q,d+) / (e^cos(q,d+) + sum_i e^cos(q,n_i))).

    query_emb (B, D), match_emb (B, D), negative_embs (B, N, D) -> (B,) losses.
    """
    positive = F.cosine_similarity(query_emb, match_emb, dim=-1)  # (B,)
    negative = F.cosine_similarity(query_emb[:, None], negative_embs, dim=-1)  # (B, N)
    logits = torch.cat([positive[:, None], negative], dim=1)  # (B, 1+N)
    return torch.logsumexp(logits, dim=1) - positive
