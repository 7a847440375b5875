"""The study over runs: embed the pairs with each run's checkpoint, train one retrieval model per c."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ablate import store
from ablate.config import RetrievalPlan, RetrievalSettings, TrialConfig
from ablate.config.errors import AblateError
from ablate.train.generate import load_checkpoint_model, load_checkpoint_tokenizer, run_checkpoint
from ablate.retrieval.embed import embed_texts
from ablate.retrieval.pairs import pair_columns
from ablate.retrieval.training import train_retrieval


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
    summaries, texts = pair_columns(pairs)
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
                                  epochs=plan.epochs, settings=model_settings, eval_every=plan.eval_every,
                                  progress=progress)
            rows.append({"run_id": run_id, "architecture": trial.architecture, "d_model": trial.d_model,
                         "layers": trial.layers, "heads": trial.heads, "c": c, "eval_loss": out["eval_loss"],
                         "accuracy": out["accuracy"], "best_eval_loss": out["best_eval_loss"],
                         "best_accuracy": out["best_accuracy"], "best_step": out["best_step"],
                         "evaluations": len(out["curve"]), "chance_loss": out["chance_loss"],
                         "train_loss": out["train_loss"], "steps": out["steps"], "curve": out["curve"]})
    return pd.DataFrame(rows)
