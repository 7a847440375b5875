"""An adaptive sweep's rounds (the `adaptive:` block): after each round, decide every claim from the runs, record
the decisions, and register the seeds the next round needs.

`next_round` replays the race from its first round every time it is called, reading only the results DB: round r
reads seeds 0..n_r − 1 of each cell (by seed, not by when they finished), so a race killed or restarted, or run by
two runners at once, decides the same and adds each seed once (a run's fingerprint is unique in its sweep; the
decisions are written once, ablate/store/race.py). It returns the runs the current round still owes; none when the
race is over: every claim decided, `max` seeds reached, or `max_gpu_hours` spent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from ablate import store
from ablate.config import TrialConfig
from ablate.results.race import cell_of, claim_text
from ablate.results.stats import HOLDS, REVERSED, UNTESTED

BEST_OF = "best"  # the race's mode that asks which cell is lowest


@dataclass
class Round:
    """Where a race stands: the runs its current round owes, those another runner is training, and, once over, why."""

    owed: list[int] = field(default_factory=list)
    training: list[int] = field(default_factory=list)  # live under another process: wait for them
    over: str | None = None  # why the race ended (None: not yet)
    said: list[str] = field(default_factory=list)  # each new decision, in words


def is_adaptive(engine: sa.Engine, name: str) -> bool:
    return bool(store.sweep_named(engine, name, store.Sweep.spec).spec.get("adaptive"))


def claim_key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def next_round(engine: sa.Engine, name: str, retry_failed: bool = False) -> Round:
    """Decide every round the results allow; register the seeds the next one needs; what is owed now."""
    from ablate.results.race import CONTINUE, Look, RaceDesign, decide
    from ablate.results.views import load_views
    from ablate.runner.trials import runs_to_do

    spec, views = load_views(engine, name)
    sweep_id = views[0].row.sweep_id if views else store.sweep_named(engine, name, store.Sweep.id).id
    design = RaceDesign.of(spec.adaptive)
    best = BEST_OF if spec.adaptive.mode == "best" else None
    planned = design.planned()
    keys: list[str] = []  # the claim cells (best of k: the cells), as the first round found them (Holm's m)
    decided: set[str] = set()
    looks: dict[str, list[Any]] = {}
    result = Round()
    for r, n in enumerate(planned):
        members = [v for v in views if v.row.seed is not None and v.row.seed < n]
        unfinished = [v.row.id for v in members if v.row.status not in store.FINISHED]
        if unfinished:
            result.owed = runs_to_do(engine, sweep_id, unfinished, retry_failed=retry_failed)
            result.training = [rid for rid in unfinished if rid not in result.owed and
                               store.is_live(store.get_run(engine, rid))]
            if result.owed or result.training:
                return result
            cancelled = [v.row.id for v in members if v.row.status == "cancelled"]
            if cancelled:  # the user's word: no new round after a cancel
                result.over = (f"{len(cancelled)} run(s) of round {r + 1} were cancelled, so the race adds no seeds; "
                               "run the sweep again with --retry-failed to go on")
                return result
            # the rest gave up (failed past the attempt cap): the round is read without them
        found = _claims(spec, members) if best is None else _best_of(spec, members, decided)
        if r == 0:
            keys = list(found)
        for key in keys:
            looks.setdefault(key, []).append(found[key][0] if key in found else Look(0, 0, None, None))
        decisions = decide(design, [looks[k] for k in keys])
        decided = {k for k, d in zip(keys, decisions) if d and d[-1].final}
        at_r = [(k, d[r]) for k, d in zip(keys, decisions) if len(d) > r]
        new = store.record_decisions(engine, sweep_id, [_row(r, k, d, best) for k, d in at_r])
        if new:
            result.said += [f"round {r + 1} (n={n}): {k}: {_said(d, best)}" for k, d in at_r if d.decision != CONTINUE]
        undecided = [k for k, d in zip(keys, decisions) if len(d) == r + 1 and d[-1].decision == CONTINUE]
        if len(undecided) <= (0 if best is None else 1):  # best of k: the last cell left is the best
            result.over = ("every claim is decided" if best is None else "one cell is left: the best"
                           ) if r < len(planned) - 1 else f"max seeds ({design.max}) reached"
            return result
        cap = spec.adaptive.max_gpu_hours
        if cap is not None and _gpu_hours(views) >= cap:
            result.over = f"max_gpu_hours {cap:g} spent ({_gpu_hours(views):.3g} GPU-hours trained)"
            return result
        added = _add_seeds(engine, spec, views, [v for k in undecided if k in found for v in found[k][1]],
                           planned[r + 1])
        if added:
            spec, views = load_views(engine, name)  # with the new seeds (and any another runner added)
    result.over = f"max seeds ({design.max}) reached"
    return result


def _claims(spec: Any, members: list[Any]) -> dict[str, tuple[Any, list[Any]]]:
    """Each claim cell by its text: its look, and the runs whose cells it would give more seeds."""
    from ablate.results.orderings import check_claims

    return {claim_text(c): (_look(c), c.better.runs + c.worse.runs) for c in check_claims(spec, members).cells}


def _best_of(spec: Any, members: list[Any], decided: set[str]) -> dict[str, tuple[Any, list[Any]]]:
    """Best of k: each cell against the cell of lowest mean so far ("better" the best, "worse" the cell; the best
    itself has no test this round). The best is chosen on the same seeds it is compared with, as F-race and irace
    do, so an elimination is a little easier than its level says."""
    import statistics

    from ablate.results.cells import differing, read_seeds
    from ablate.results.orderings import comparable, final_eval_loss
    from ablate.results.race import Look

    cells: dict[str, list[Any]] = {}
    for v in members:
        cells.setdefault(cell_of(v.row.config), []).append(v)
    seeds = {c: read_seeds(runs, final_eval_loss, spec.report.min_steps, comparable) for c, runs in cells.items()}
    axes = differing(members, exclude={"seed"})
    texts = {c: " ".join(f"{k}={runs[0].axes.get(k)}" for k in axes) or c for c, runs in cells.items()}
    means = {c: statistics.fmean(s.values) for c, s in seeds.items() if s.values and texts[c] not in decided}
    best = min(means, key=lambda c: (means[c], c)) if means else None
    found = {}
    for c, runs in cells.items():
        text = texts[c]
        if c == best or best is None:
            found[text] = (Look(seeds[c].n, seeds[c].n, None, None), runs)
        else:
            found[text] = (Look.of(seeds[best].values, seeds[c].values), runs + cells[best])
    return found


def _said(d: Any, best: str | None) -> str:
    """A decision in words; best of k: eliminated, the best, or among the best."""
    if best is None:
        return d.verdict()
    n = min(d.n_better, d.n_worse)
    if d.decision in (HOLDS, REVERSED):
        return f"worse than the best (eliminated at n={n})"
    if d.decision == UNTESTED:
        return f"the best (lowest mean, n={n})"
    return f"among the best ({d.verdict().removeprefix('not significant (')}"


def _look(cell: Any) -> Any:
    """A claim cell's look: its test (diverged seeds counted at the worst loss where leaving them out flatters)."""
    from ablate.results.race import Look

    if cell is None or cell.test is None:
        return Look(0 if cell is None else cell.better.n, 0 if cell is None else cell.worse.n, None, None,
                    None if cell is None else cell.sesoi, parity=cell is not None and bool(cell.ordering.parity))
    counted = {cell.counted_worst[0]: cell.counted_worst[1]} if cell.counted_worst else {}
    return Look.of_test(cell.better.n + counted.get("better", 0), cell.worse.n + counted.get("worse", 0), cell.test,
                        cell.sesoi, bool(cell.ordering.parity))


def _row(r: int, key: str, d: Any, best: str | None) -> dict[str, Any]:
    return dict(round=r, claim_key=claim_key(key), claim=key, n_better=d.n_better, n_worse=d.n_worse, statistic=d.z,
                boundary=d.boundary, level=d.level, decision=_said(d, best) if d.decision != "continue" else "continue")


def _gpu_hours(views: list[Any]) -> float:
    return sum((v.row.train_seconds or 0.0) * (v.row.gpus or 1) for v in views) / 3600


def _add_seeds(engine: sa.Engine, spec: Any, views: list[Any], runs: list[Any], n: int) -> int:
    """Register seeds up to n − 1 for the cells of these runs (the undecided claims' sides); how many were new."""
    configs = {cell_of(v.row.config): v.row.config for v in runs}
    seeds: dict[str, set[int]] = {}
    for v in views:
        seeds.setdefault(cell_of(v.row.config), set()).add(v.row.seed)
    trials = [TrialConfig.model_validate({**config, "seed": s}) for cell, config in configs.items()
              for s in range(n) if s not in seeds.get(cell, set())]
    if not trials:
        return 0
    first = max(v.row.trial_index for v in views) + 1
    before = len(views)
    store.register_sweep(engine, spec, trials, first_index=first)
    with engine.connect() as conn:
        after = conn.execute(sa.select(sa.func.count()).select_from(store.Run)
                             .where(store.Run.sweep_id == views[0].row.sweep_id)).scalar_one()
    return after - before


def say_round(state: Round, say: Callable[[str], None], name: str) -> None:
    for line in state.said:
        say(f"sweep {name}: {line}")
    if state.over:
        say(f"sweep {name}: race over: {state.over}")
    elif state.owed:
        say(f"sweep {name}: race: {len(state.owed)} more seed run(s) for the undecided claims")

