"""Completions of the sweep's prompt: a few trained runs' models, loaded from their checkpoints, continue the
spec's `report.prompt` greedily (torch is imported only when some run has a checkpoint to load)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from ablate.config import registry
from ablate.config.errors import AblateError
from ablate.report.tables import finished_values
from ablate.report.views import RunView, config_label, varying_axes

MAX_COMPLETIONS = 10  # prompt completions in a report (each loads a run's model); past it, the lowest test losses


def prompt_completions(views: list[RunView], prompt: str, url: str | None, artifacts: str | Path | None,
                       max_new: int = 48) -> tuple[list[tuple[int, str, str]], int]:
    """(run id, label, greedy completion) for the completed runs whose checkpoint is inside `artifacts`, at most
    MAX_COMPLETIONS of them (the lowest final test losses), and how many runs had such a checkpoint."""
    from ablate.plugins.recorded import unloaded

    candidates = [v for v in views if v.row.status == "completed" and v.row.checkpoint_path
                  and _samples(v.axes.get("objective", "clm")) and not (v.trial and unloaded(v.trial))]
    if not candidates:
        return [], 0  # no model to load: torch is not even imported
    from ablate.train.generate import complete, load_run_model, run_checkpoint

    reachable = []
    for v in candidates:
        try:
            run_checkpoint(v.row, artifacts)
        except AblateError:  # not reachable from here (another machine's artifacts, or outside the folder)
            continue
        reachable.append(v)
    best = sorted(reachable, key=lambda v: finished_values([v], "final_eval_loss") or [math.inf])[:MAX_COMPLETIONS]
    chosen = {v.row.id for v in best}
    keys = varying_axes(views, set()) or ["architecture"]
    out = []
    for v in reachable:
        if v.row.id in chosen:  # each checkpoint loaded once; loading takes seconds on a busy CPU: say so
            print(f"prompt completions: loading run {v.row.id}'s checkpoint ({len(out) + 1}/{len(chosen)})",
                  file=sys.stderr, flush=True)
            trial, model, tokenizer = load_run_model(v.row.id, url, artifacts)
            text = complete(model, tokenizer, prompt, trial.context, max_new=max_new).replace("\n", " ")
            out.append((v.row.id, config_label(v.axes, keys), text))
    return out, len(reachable)


def _samples(objective: str) -> bool:
    """Whether a run of `objective` has a next-token head to sample from (an objective no longer registered: no)."""
    entry = registry.objectives().get(objective)
    return entry is not None and entry.next_token
