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

RETRIEVAL_SPLIT = "retrieval"  # metrics rows: split 'retrieval', step = c, loss = held-out retrieval loss at the end
BEST_SPLIT = "retrieval_best"  # step = c, loss = the lowest held-out loss of the evaluations during training


def curve_split(c: int) -> str:
    """The metrics split of one c's evaluation curve: step = retrieval step, loss = held-out loss there."""
    return f"retrieval_c{c}"


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

    Results go into the results DB (metrics split 'retrieval' the final and 'retrieval_best' the best held-out
    loss, step = c; split 'retrieval_c<c>' every evaluation of that c's curve) and into
    results/reports/NAME/retrieval.{md,csv} beside the published numbers, with the curves in
    retrieval-curves.csv. Runs done before are redone (their rows replaced), so a changed plan or a resumed
    sweep gets fresh numbers.
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
    curves = _curves(table)
    table = table.drop(columns="curve")
    _record(engine, runs, table, curves, plan.lr)
    table["published"] = [_published(plan, TrialConfig.model_validate(store.get_run(engine, int(r.run_id)).config), r.c)
                          for r in table.itertuples()]
    out = out or Path("results/reports") / name
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "retrieval.csv", index=False)
    curves.to_csv(out / "retrieval-curves.csv", index=False)
    (out / "retrieval.md").write_text(stage_markdown(name, table, plan))
    return table, [out / "retrieval.md", out / "retrieval.csv", out / "retrieval-curves.csv"]


def _curves(table: Any) -> Any:
    """One row per evaluation: run_id, c, step, seconds, eval_loss, accuracy."""
    import pandas as pd

    return pd.DataFrame([{"run_id": r.run_id, "c": r.c, **point} for r in table.itertuples() for point in r.curve],
                        columns=["run_id", "c", "step", "seconds", "eval_loss", "accuracy"])


def _record(engine: Any, runs: Sequence[int], table: Any, curves: Any, lr: float) -> None:
    """Replace the runs' retrieval rows: final and best per c, then every evaluation of each c's curve."""
    import sqlalchemy as sa

    def row(run_id: Any, split: str, step: Any, loss: Any, seconds: float = 0.0) -> dict[str, Any]:
        return {"run_id": int(run_id), "split": split, "step": int(step), "elapsed_seconds": float(seconds),
                "tokens": 0, "loss": float(loss), "lr": lr}

    rows = [row(r.run_id, RETRIEVAL_SPLIT, r.c, r.eval_loss) for r in table.itertuples()]
    rows += [row(r.run_id, BEST_SPLIT, r.c, r.best_eval_loss) for r in table.itertuples()]
    rows += [row(p.run_id, curve_split(p.c), p.step, p.eval_loss, p.seconds) for p in curves.itertuples()]
    with engine.begin() as conn:
        conn.execute(sa.delete(store.Metric).where(store.Metric.run_id.in_(runs),
                                                   store.Metric.split.startswith(RETRIEVAL_SPLIT)))
        conn.execute(sa.insert(store.Metric), rows)


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
    during = "evaluations" in table and table.evaluations.max() > 1
    reading = ("best during training (ours at its best evaluation, published: the authors' best), then ours final"
               if during else "ours at the end of training (published: the authors' best during training; give "
               "retrieval.eval_every to compare best with best)")
    lines = [f"# Retrieval: {name}", "",
             f"Held-out cross-entropy over the candidates ({slots}), {reading}; embeddings "
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
            if during:
                cells.append(f"{r.best_eval_loss:.2f}{ref} at step {int(r.best_step)}, final {r.eval_loss:.2f}, "
                             f"acc {r.accuracy:.2f}")
            else:
                cells.append(f"{r.eval_loss:.2f}{ref}, acc {r.accuracy:.2f}")
        lines.append(f"| {run_id} | {first.architecture} d={first.d_model} n={first.layers}{heads} | "
                     + " | ".join(cells) + " |")
    lines += ["", "Chance: " + ", ".join(f"c={c}: {math.log(plan.texts_per_query(c)):.2f}" for c in cs), ""]
    return "\n".join(lines)
