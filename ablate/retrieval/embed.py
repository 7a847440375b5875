"""Texts embedded with a trained run: its last hidden layer at one token of each text."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn


def _positions(lengths: Tensor, index: int) -> Tensor:
    """Position `index` counted within each row's real tokens (negative from its true end), clamped."""
    pos = lengths + index if index < 0 else torch.full_like(lengths, index)
    return torch.minimum(pos.clamp(min=0), lengths - 1)


@torch.no_grad()
def embed_texts(model: nn.Module, tokenizer: Any, texts: Sequence[str], context: int, index: int = -2,
                batch_size: int = 32, progress: bool = True, device: str | None = None,
                position: str = "text") -> Tensor:
    """(N, D) float32 last-hidden-layer embeddings at token `index` of each text.

    position "text": texts are tokenized as the trainer packs documents (tokens + eos, truncated to `context`) and
    `index` counts from the end of those, so the default -2 is the last text token; rows are right-padded.
    position "window": every text is truncated and right-padded with pad (= eos) to the whole `context` window and
    `index` counts from the window's end, as the authors' retrieval scripts did (`padding='max_length'`, then
    `hidden[..., -2, :]`): for a text shorter than the window, the state of a pad token that has read all of it.
    """
    device = torch.device(device or next(model.parameters()).device)
    model = model.to(device)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    pad = eos if pad is None else pad
    encoded = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    if position == "window":
        rows = [ids[:context] + [pad] * (context - len(ids[:context])) for ids in encoded]
    else:
        rows = [(ids + ([eos] if eos is not None else []))[:context] or [pad] for ids in encoded]
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))  # similar lengths together: little padding
    out: Tensor | None = None
    last_print = 0.0
    for start in range(0, len(rows), batch_size):
        chunk = order[start: start + batch_size]
        lengths = torch.tensor([len(rows[i]) for i in chunk])  # (b,)
        ids = torch.full((len(chunk), int(lengths.max())), pad, dtype=torch.long)  # (b, T)
        for j, i in enumerate(chunk):
            ids[j, : len(rows[i])] = torch.tensor(rows[i])
        hidden = model.hidden_states(ids.to(device))  # (b, T, D)
        emb = hidden[torch.arange(len(chunk)), _positions(lengths, index).to(device)].float().cpu()  # (b, D)
        if out is None:
            out = torch.empty(len(rows), emb.shape[-1])
        out[torch.tensor(chunk)] = emb
        done = min(start + batch_size, len(rows))
        if progress and (time.monotonic() - last_print > 1.0 or done == len(rows)):
            sys.stderr.write(f"\rembedding {done}/{len(rows)}" + ("\n" if done == len(rows) else ""))
            sys.stderr.flush()
            last_print = time.monotonic()
    return out if out is not None else torch.empty(0, 0)
