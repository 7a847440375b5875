"""Training a retrieval mixer on embedding pairs: candidate draws, held-out evaluation, the training loop."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ablate.train.budget import lr_at
from ablate.config import RetrievalSettings
from ablate.config.errors import AblateError
from ablate.retrieval.mixer import RetrievalMixer


def sample_candidates(queries: Tensor, pool: Tensor, candidates: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """For each query (an index into `pool`, whose text is its match): c-1 distinct other texts with the
    match at a random position. Returns (candidate indices (B, c), position of the match (B,))."""
    b, n = len(queries), len(pool)
    local = torch.searchsorted(pool, queries)  # pool is sorted
    noise = torch.rand(b, n, generator=gen)
    noise[torch.arange(b), local] = 2.0  # never drawn as a negative
    negatives = pool[noise.topk(candidates - 1, dim=1, largest=False).indices]  # (B, c-1)
    where = torch.randint(0, candidates, (b,), generator=gen)
    cands = torch.cat([negatives, queries[:, None]], dim=1)  # (B, c), match last
    rows = torch.arange(b)
    cands[rows, -1], cands[rows, where] = cands[rows, where], queries  # swap the match into its position
    return cands, where


@torch.no_grad()
def _evaluate(model: RetrievalMixer, summaries: Tensor, texts: Tensor, pool: Tensor, candidates: int,
              rounds: int, batch_size: int, seed: int) -> tuple[float, float]:
    """Mean cross-entropy and top-1 accuracy over `rounds` fixed candidate draws for every held-out query."""
    model.eval()
    gen = torch.Generator().manual_seed(seed + 1)
    loss_sum, correct, n = 0.0, 0, 0
    for _ in range(rounds):
        for start in range(0, len(pool), batch_size):
            q = pool[start: start + batch_size]
            cands, where = sample_candidates(q, pool, candidates, gen)
            scores = model(summaries[q], texts[cands])  # (b, c)
            loss_sum += float(F.cross_entropy(scores, where, reduction="sum"))
            correct += int((scores.argmax(-1) == where).sum())
            n += len(q)
    model.train()
    return loss_sum / n, correct / n


def _standardize(emb: Tensor, rows: Tensor) -> Tensor:
    """Per-feature z-scores with statistics of the training rows only. CLM states share a large common
    component (every summary ends at '.': pairwise cosine ~0.96), which otherwise hides their differences
    and the retrieval model never breaks symmetry (train loss stays at log c)."""
    mean, std = emb[rows].mean(0), emb[rows].std(0)
    return (emb - mean) / (std + 1e-6)


def train_retrieval(summary_emb: Tensor, text_emb: Tensor, candidates: int = 32, steps: int | None = 1000,
                    seconds: float | None = None, seed: int = 0, *, epochs: float | None = None,
                    settings: RetrievalSettings | None = None, eval_fraction: float = 0.2, eval_rounds: int = 8,
                    eval_every: int | None = None, progress: bool = False, **overrides: Any) -> dict[str, Any]:
    """Train a retrieval mixer on (summary, text) embedding pairs (row i matches row i), scoring `candidates`
    texts per query; held-out pairs are never seen in training, not even as negatives. Deterministic for a seed
    (on one device). Length: `steps`, `epochs` (passes over the training pairs) or `seconds`, whichever ends
    first. The model and optimiser: `settings` (spec.RetrievalSettings), any of its fields overridden by keyword
    (lr=..., d_model=..., standardize=...).

    The held-out pairs are evaluated every `eval_every` steps (the authors' HF `eval_steps`) and at the end, each
    time on the same candidate draws: `curve` holds every evaluation, `eval_loss` the final one and
    `best_eval_loss` the lowest, the authors' reported "peak" (masked-mixers-1.md, Retrieval)."""
    settings = RetrievalSettings(**{**(settings or RetrievalSettings()).model_dump(), **overrides})
    if steps is None and seconds is None and epochs is None:
        raise AblateError("train_retrieval: give steps, epochs or seconds")
    n = len(summary_emb)
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=gen)
    n_eval = round(n * eval_fraction)
    held_out, train_pool = order[:n_eval].sort().values, order[n_eval:].sort().values
    if min(len(held_out), len(train_pool)) < candidates:
        raise AblateError(f"train_retrieval: {len(train_pool)} train / {len(held_out)} held-out pairs, fewer than "
                          f"candidates={candidates}; use more pairs or fewer candidates")
    if epochs is not None:
        by_epochs = math.ceil(epochs * len(train_pool) / settings.batch_size)
        steps = by_epochs if steps is None else min(steps, by_epochs)
    summaries, texts = summary_emb.float(), text_emb.float()
    if settings.standardize:
        summaries, texts = _standardize(summaries, train_pool), _standardize(texts, train_pool)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = RetrievalMixer(summaries.shape[-1], candidates, settings.d_model, settings.layers,
                               settings.input_norm, settings.final_norm)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    warmup = settings.warmup_steps
    t0, step, losses, curve = time.perf_counter(), 0, [], []

    def evaluate() -> None:
        loss, acc = _evaluate(model, summaries, texts, held_out, candidates, eval_rounds, settings.batch_size, seed)
        curve.append({"step": step, "seconds": time.perf_counter() - t0, "eval_loss": loss, "accuracy": acc})
    while True:
        f = max(step / steps if steps else 0.0, (time.perf_counter() - t0) / seconds if seconds else 0.0)
        if f >= 1.0:
            break
        ramp = None if warmup is None else (step / warmup if warmup else 1.0)
        ends = 0.05 if warmup is None else (min(warmup / steps, 0.999) if steps else 0.0)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(f, settings.lr, settings.schedule, ends, ramp=ramp)
        q = train_pool[torch.randint(0, len(train_pool), (settings.batch_size,), generator=gen)]  # (B,)
        cands, where = sample_candidates(q, train_pool, candidates, gen)  # (B, c), (B,)
        loss = F.cross_entropy(model(summaries[q], texts[cands]), where)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        step += 1
        if progress and step % 100 == 0:
            sys.stderr.write(f"\rretrieval c={candidates} step {step} loss {losses[-1]:.3f}")
        if eval_every and step % eval_every == 0:
            evaluate()
    train_seconds = time.perf_counter() - t0  # evaluations included, as the HF Trainer's clock did
    if not curve or curve[-1]["step"] != step:
        evaluate()
    final, best = curve[-1], min(curve, key=lambda point: point["eval_loss"])
    if progress:
        sys.stderr.write(f"\rretrieval c={candidates}: eval loss {final['eval_loss']:.3f} (best {best['eval_loss']:.3f} "
                         f"at step {best['step']}), accuracy {final['accuracy']:.3f}\n")
    tail = losses[-max(1, len(losses) // 10):]
    return {"train_loss": sum(tail) / len(tail), "eval_loss": final["eval_loss"], "accuracy": final["accuracy"],
            "best_eval_loss": best["eval_loss"], "best_accuracy": best["accuracy"], "best_step": best["step"],
            "curve": curve, "chance_loss": math.log(candidates), "steps": step, "seconds": train_seconds,
            "train_pairs": len(train_pool), "eval_pairs": len(held_out)}
