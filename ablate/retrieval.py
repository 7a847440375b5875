"""Summary -> text retrieval on a trained run's embeddings (masked-mixers-1.md and -2.md, "Retrieval").

Two stages, as in the studies: a CLM-trained run embeds every summary and text (last hidden layer at
the second-to-last real token), then a small bidirectional mixer is trained on those embeddings to
pick the one matching text among c candidates for a summary, with cross-entropy over the candidates.
`info_nce_loss` is the studies' temperature-free contrastive alternative, for comparison.

The studies' models saw millions of stories; a run trained on the 221-story sample gives embeddings
with no usable match signal (tests/test_retrieval.py keeps that claim as a strict xfail).
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ablate import data as data_mod
from ablate import store
from ablate.budget import lr_at
from ablate.config.errors import AblateError, did_you_mean
from ablate.generate import load_checkpoint_model, load_checkpoint_tokenizer, run_checkpoint
from ablate.config import RetrievalPlan, RetrievalSettings, TrialConfig

PAIR_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


# ---------------------------------------------------------------- pairs


def load_pairs(source: str | Path, summary_column: str = "summary", text_column: str = "text", split: str = "train"):
    """A (summary, text) pairs dataset from a local file or `datasets` folder, or a hub id; columns renamed."""
    import datasets

    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix not in PAIR_FORMATS:
            raise AblateError(f"pairs: {path} is not one of {', '.join(PAIR_FORMATS)}")
        ds = datasets.load_dataset(PAIR_FORMATS[path.suffix], data_files=[str(path)], split="train")
    elif path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            ds = datasets.load_from_disk(str(path))
        else:
            ds = datasets.load_dataset(str(path), split=split)
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise AblateError(f"pairs: {path} has splits {list(ds)}, not {split!r}{did_you_mean(split, list(ds))}")
            ds = ds[split]
    elif str(source).startswith(("/", ".", "~")):
        raise AblateError(f"pairs: no such file or folder {path}")
    else:
        from huggingface_hub import is_offline_mode

        try:
            ds = datasets.load_dataset(str(source), split=split)
        except Exception as exc:  # noqa: BLE001 - offline, unknown id, auth: all need the user's action
            why = "HF_HUB_OFFLINE is set" if is_offline_mode() else f"{type(exc).__name__}: {str(exc)[:200]}"
            raise AblateError(f"pairs: cannot load {source!r} from the HuggingFace hub ({why}); pass a local "
                              "path (.jsonl, .json, .csv, .parquet or a save_to_disk folder) or run online") from None
    for column in (summary_column, text_column):
        if column not in ds.column_names:
            raise AblateError(f"pairs: no column {column!r} in {source} (columns: {', '.join(ds.column_names)})"
                              f"{did_you_mean(column, ds.column_names)}")
    ds = ds.select_columns([summary_column, text_column])
    return ds.rename_columns({c: n for c, n in ((summary_column, "summary"), (text_column, "text")) if c != n})


def pairs_from_stories(path_or_text: str | Path = "ablate:tinystories-sample"):
    """Pairs from TinyStories-format text: summary = a story's first sentence, text = the rest of the story.

    The studies' summaries were written by an LLM, which cannot run here; the first sentence is a
    stand-in that shares names and setting with the text without being a substring of it.
    """
    import datasets

    source = str(path_or_text)
    if source.startswith("ablate:"):
        text = data_mod.embedded_text(source)
    elif isinstance(path_or_text, Path) or ("\n" not in source and Path(source).expanduser().is_file()):
        text = Path(source).expanduser().read_text(encoding="utf-8")
    else:
        text = source
    stories = [s.strip() for s in re.split(rf"^\s*{re.escape(data_mod.SEPARATOR)}\s*$", text, flags=re.MULTILINE)]
    summaries, texts = [], []
    for story in stories:
        parts = re.split(r"(?<=[.!?])[\"”']?\s+", story, maxsplit=1)
        if len(parts) < 2:
            continue
        rest = parts[1].strip()
        summary = story[: len(story) - len(parts[1])].strip()
        if rest and summary not in rest:
            summaries.append(summary)
            texts.append(rest)
    return datasets.Dataset.from_dict({"summary": summaries, "text": texts})


def _columns(pairs: Any) -> tuple[list[str], list[str]]:
    return list(pairs["summary"]), list(pairs["text"])


# ---------------------------------------------------------------- embeddings


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


# ---------------------------------------------------------------- retrieval model


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
                    progress: bool = False, **overrides: Any) -> dict[str, float]:
    """Train a retrieval mixer on (summary, text) embedding pairs (row i matches row i), scoring `candidates`
    texts per query; held-out pairs are never seen in training, not even as negatives. Deterministic for a seed
    (on one device). Length: `steps`, `epochs` (passes over the training pairs) or `seconds`, whichever ends
    first. The model and optimiser: `settings` (spec.RetrievalSettings), any of its fields overridden by keyword
    (lr=..., d_model=..., standardize=...)."""
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
    t0, step, losses = time.perf_counter(), 0, []
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
    train_seconds = time.perf_counter() - t0
    eval_loss, accuracy = _evaluate(model, summaries, texts, held_out, candidates, eval_rounds, settings.batch_size, seed)
    if progress:
        sys.stderr.write(f"\rretrieval c={candidates}: eval loss {eval_loss:.3f}, accuracy {accuracy:.3f}\n")
    tail = losses[-max(1, len(losses) // 10):]
    return {"train_loss": sum(tail) / len(tail), "eval_loss": eval_loss, "accuracy": accuracy,
            "chance_loss": math.log(candidates), "steps": step, "seconds": train_seconds,
            "train_pairs": len(train_pool), "eval_pairs": len(held_out)}


def info_nce_loss(query_emb: Tensor, match_emb: Tensor, negative_embs: Tensor) -> Tensor:
    """Temperature-free InfoNCE per query: -log(e^cos(q,d+) / (e^cos(q,d+) + sum_i e^cos(q,n_i))).

    query_emb (B, D), match_emb (B, D), negative_embs (B, N, D) -> (B,) losses.
    """
    positive = F.cosine_similarity(query_emb, match_emb, dim=-1)  # (B,)
    negative = F.cosine_similarity(query_emb[:, None], negative_embs, dim=-1)  # (B, N)
    logits = torch.cat([positive[:, None], negative], dim=1)  # (B, 1+N)
    return torch.logsumexp(logits, dim=1) - positive


# ---------------------------------------------------------------- study


def retrieval_study(run_ids: Sequence[int], db_url: str | None, pairs: Any, plan: RetrievalPlan | None = None,
                    candidates: Sequence[int] | None = None, steps: int | None = None, seconds: float | None = None,
                    seed: int = 0, progress: bool = True, artifacts: str | Path | None = None, **settings: Any):
    """For each run: embed the pairs with its checkpoint (inside `artifacts`) and train one retrieval model per c.

    `plan`: a sweep's retrieval block (embedding position, candidates, length, model settings); `candidates` and
    `steps` override it, and keyword settings (lr=..., d_model=...) override its model settings."""
    import pandas as pd

    plan = plan or RetrievalPlan(pairs={"source": "-"})
    if steps is not None or seconds is not None:
        plan = plan.model_copy(update={"steps": steps, "epochs": None})
    model_settings = RetrievalSettings(**{**plan.settings().model_dump(), **settings})
    summaries, texts = _columns(pairs)
    engine = store.connect(db_url)  # the process-wide engine for this URL: not ours to dispose
    rows = []
    for run_id in run_ids:
        run = store.get_run(engine, run_id)
        trial = TrialConfig.model_validate(run.config)
        path = run_checkpoint(run, artifacts)
        tokenizer = load_checkpoint_tokenizer(path, trial)
        model = load_checkpoint_model(path, trial, len(tokenizer))
        if not hasattr(model, "hidden_states"):
            raise AblateError(f"the {trial.architecture}/{trial.objective} model has no hidden_states(); "
                              "retrieval embeds with causal-LM runs")
        summary_emb, text_emb = (embed_texts(model, tokenizer, column, trial.context, plan.index, progress=progress,
                                             position=plan.position) for column in (summaries, texts))
        for c in candidates or plan.candidates:
            out = train_retrieval(summary_emb, text_emb, plan.texts_per_query(c), plan.steps, seconds, seed,
                                  epochs=plan.epochs, settings=model_settings, progress=progress)
            rows.append({"run_id": run_id, "architecture": trial.architecture, "d_model": trial.d_model,
                         "layers": trial.layers, "heads": trial.heads, "c": c, "eval_loss": out["eval_loss"],
                         "accuracy": out["accuracy"], "chance_loss": out["chance_loss"],
                         "train_loss": out["train_loss"], "steps": out["steps"]})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- a sweep's retrieval stage

RETRIEVAL_SPLIT = "retrieval"  # metrics rows: split 'retrieval', step = c, loss = held-out retrieval loss


def stage_pairs(plan: Any):
    """The pairs a sweep's `retrieval.pairs` names (`ablate:tinystories-pairs`: built from the embedded sample)."""
    ref = plan.pairs
    if ref.source == "ablate:tinystories-pairs":
        pairs = pairs_from_stories("ablate:tinystories-sample")
    else:
        pairs = load_pairs(ref.source, ref.summary_field, ref.text_field, ref.split)
    return pairs.select(range(min(ref.limit, len(pairs)))) if ref.limit else pairs


def run_stage(name: str, db_url: str | None = None, out: Path | None = None, *, steps: int | None = None,
              candidates: Sequence[int] | None = None, progress: bool = True,
              artifacts: str | Path | None = None) -> tuple[Any, list[Path]]:
    """The retrieval stage of a registered sweep: every completed run, every c of its `retrieval` block.

    Results go into the results DB (metrics split 'retrieval', step = c) and into
    results/reports/NAME/retrieval.{md,csv} beside the published numbers. Runs done before are redone
    (their rows replaced), so a changed plan or a resumed sweep gets fresh numbers.
    """
    import sqlalchemy as sa

    from ablate.config import SweepSpec

    engine = store.connect(db_url)
    with engine.connect() as conn:
        sweep = conn.execute(sa.select(store.Sweep).where(store.Sweep.name == name)).first()
        names = [r[0] for r in conn.execute(sa.select(store.Sweep.name))]
    if sweep is None:
        raise AblateError(f"no sweep named {name!r} in the results DB{did_you_mean(name, names)}; "
                          "register and train it first (ablate sweep run SPEC)")
    spec = SweepSpec.model_validate(sweep.spec)
    if spec.retrieval is None:
        raise AblateError(f"sweep {name!r} has no `retrieval:` block; add retrieval: {{pairs: {{source: ...}}, "
                          "candidates: [32, 128]}} to its spec and register it again")
    plan = spec.retrieval
    with engine.connect() as conn:
        runs = conn.execute(sa.select(store.Run.id).where(store.Run.sweep_id == sweep.id, store.Run.status == "completed")
                            .order_by(store.Run.id)).scalars().all()
    if not runs:
        raise AblateError(f"sweep {name!r} has no completed runs to embed with yet (ablate sweep status {name})")
    table = retrieval_study(runs, db_url, stage_pairs(plan), plan, candidates, steps, progress=progress,
                            artifacts=artifacts)
    with engine.begin() as conn:
        conn.execute(sa.delete(store.Metric).where(store.Metric.run_id.in_(runs), store.Metric.split == RETRIEVAL_SPLIT))
        conn.execute(sa.insert(store.Metric), [
            {"run_id": int(r.run_id), "split": RETRIEVAL_SPLIT, "step": int(r.c), "elapsed_seconds": 0.0, "tokens": 0,
             "loss": float(r.eval_loss), "lr": plan.lr} for r in table.itertuples()])
    table["published"] = [_published(plan, TrialConfig.model_validate(store.get_run(engine, int(r.run_id)).config), r.c)
                          for r in table.itertuples()]
    out = out or Path("results/reports") / name
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "retrieval.csv", index=False)
    (out / "retrieval.md").write_text(stage_markdown(name, table, plan))
    return table, [out / "retrieval.md", out / "retrieval.csv"]


def _published(plan: Any, trial: TrialConfig, c: int) -> float | None:
    from ablate.config.sweep import _same

    axes = trial.axes()
    hits = [r for r in plan.reference if r.candidates == c and all(_same(axes.get(k), v) for k, v in r.match.items())]
    return max(hits, key=lambda r: len(r.match)).eval if hits else None


def stage_markdown(name: str, table: Any, plan: Any) -> str:
    """Runs as rows, candidate counts as columns; each cell 'ours (published)' held-out loss, then accuracy."""
    cs = sorted(set(table.c))
    slots = ("c counts the query's slot: the query and c-1 texts (the authors' n_context), chance ln(c-1)"
             if plan.candidates_count_query else "the query and c texts, chance ln c")
    steps = sorted(set(table.steps)) if "steps" in table else [plan.steps]
    lines = [f"# Retrieval: {name}", "",
             f"Held-out cross-entropy over the candidates ({slots}), ours (published); embeddings "
             f"{'standardized per feature (not the study method)' if plan.standardize else 'as the model gave them (the study method)'}.", "",
             f"Retrieval model: {plan.describe()} ({', '.join(str(s) for s in steps)} steps trained).", "",
             "| run | model | " + " | ".join(f"c={c}" for c in cs) + " |", "| --- | --- |" + " --- |" * len(cs)]
    for run_id, rows in table.groupby("run_id", sort=True):
        first = rows.iloc[0]
        heads = "" if first.heads is None or first.heads != first.heads else f" h={int(first.heads)}"
        cells = []
        for c in cs:
            row = rows[rows.c == c]
            if row.empty:
                cells.append("")
                continue
            r = row.iloc[0]
            ref = "" if r.published is None or r.published != r.published else f" ({r.published:.2f})"
            cells.append(f"{r.eval_loss:.2f}{ref}, acc {r.accuracy:.2f}")
        lines.append(f"| {run_id} | {first.architecture} d={first.d_model} n={first.layers}{heads} | "
                     + " | ".join(cells) + " |")
    lines += ["", "Chance: " + ", ".join(f"c={c}: {math.log(plan.texts_per_query(c)):.2f}" for c in cs), ""]
    return "\n".join(lines)
