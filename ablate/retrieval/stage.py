"""A sweep's retrieval stage: its pairs, every completed run and every c, the metrics rows and the table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ablate import store
from ablate.config import TrialConfig
from ablate.config.errors import AblateError
from ablate.retrieval.pairs import load_pairs, pairs_from_stories
from ablate.retrieval.study import retrieval_study

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
    sweep = store.sweep_named(engine, name, store.Sweep.id, store.Sweep.spec)
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
    from ablate.config.sweep import same_value

    axes = trial.axes()
    hits = [r for r in plan.reference if r.candidates == c and all(same_value(axes.get(k), v) for k, v in r.match.items())]
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
