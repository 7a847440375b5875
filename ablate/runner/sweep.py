"""A sweep as a whole: registering it (its token caches built first), finding it by name, and the rows and
counts that a status table shows."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict

from ablate import store
from ablate.plugins.guard import plugin_modules, refuse_broken_plugins
from ablate.plugins.stored import records_of
from ablate.config.errors import AblateError
from ablate.config import TrialConfig, load_trials
from ablate.results.race import cell_of

# ---------------------------------------------------------------- registering a sweep and preparing its data


def register(spec_path: str | Path, db_url: str | None = None, max_trials: int = 10_000,
             say: Callable[[str], None] | None = None, overrides: dict[str, Any] | None = None, merge: bool = False,
             artifacts: Path | None = None) -> tuple[Any, int, list[int]]:
    """Validate and register a sweep: (spec, sweep id, run ids in trial order). Invalid specs write nothing;
    with `artifacts`, neither does a sweep whose data cannot be prepared (`prepare_data` runs first).

    `overrides`: see `spec.apply_overrides`. Runs that an edit of the spec removed and that hold no result
    (pending, failed, cancelled, preempted) are dropped, so the sweep owes only its current trials; a spec
    that would leave results of other trials under its name is refused unless `merge` (store.register_sweep).
    """
    spec, trials = load_trials(spec_path, max_trials=max_trials, overrides=overrides)
    refuse_broken_plugins(trials, modules=plugin_modules(spec))
    for note in spec.overrides if say is not None else ():
        say(f"sweep {spec.name}: {note}")
    engine = store.connect(db_url)
    if artifacts is not None:
        prepare_data(trials, artifacts, say=say)
    sweep_id, ids = store.register_sweep(engine, spec, trials, spec_path=str(spec_path), merge=merge,
                                         plugins=records_of(trials))
    if spec.search is None:
        keep = set(ids)
        if spec.adaptive is not None:  # and the seeds its race added
            keep |= later_seeds(engine, sweep_id, trials)
        dropped = store.drop_stale_runs(engine, sweep_id, keep)
        if dropped and say is not None:
            say(f"sweep {spec.name}: dropped {dropped} unfinished run(s) whose trial is no longer in {spec_path}")
    return spec, sweep_id, ids


def later_seeds(engine: sa.Engine, sweep_id: int, trials: list[TrialConfig]) -> set[int]:
    """The runs of the sweep in the cells of `trials` (a race's later seeds: registering the spec again keeps them)."""
    cells = {cell_of(t.model_dump(mode="json")) for t in trials}
    with engine.connect() as conn:
        rows = conn.execute(sa.select(store.Run.id, store.Run.config).where(store.Run.sweep_id == sweep_id)).all()
    return {r.id for r in rows if cell_of(r.config) in cells}


class Registration(BaseModel):
    """A registered sweep: what running it needs, without its spec file (the sweep flow's `registered` parameter,
    which `ablate sweep run` gives it after registering the spec itself, before Prefect starts)."""

    model_config = ConfigDict(frozen=True)

    sweep_id: int
    name: str
    run_ids: list[int]  # the runs of the spec's trials, in trial order
    gpus: int = 1  # per trial
    hardware: str = "cpu"
    fuse: str = "off"  # the spec's fused groups (ablate/config/fusion.py)

    @classmethod
    def of(cls, spec: Any, sweep_id: int, run_ids: list[int]) -> Registration:
        """From what `register` returns."""
        return cls(sweep_id=sweep_id, name=spec.name, run_ids=run_ids, gpus=spec.budget.gpus,
                   hardware=spec.budget.hardware, fuse=spec.fuse)


def distinct_data(trials: list[TrialConfig]) -> list[TrialConfig]:
    """One trial per (dataset, tokenizer, context) that the trials train on (memory probes read no data)."""
    seen: dict[str, TrialConfig] = {}
    for t in trials:
        if t.mode != "memory_probe":
            key = json.dumps([t.dataset.model_dump(mode="json"), t.tokenizer.model_dump(mode="json"), t.context],
                             sort_keys=True)
            seen.setdefault(key, t)
    return list(seen.values())


def check_sources(trials: list[TrialConfig]) -> None:
    """Each hub dataset of the trials resolves here (cheap: metadata only); `ablate plan` runs this."""
    hub = {t.dataset.model_dump_json(): t.dataset for t in distinct_data(trials) if t.dataset.from_hub}
    if hub:
        from ablate import data  # datasets comes with it (not torch): only when there is a hub dataset to check

        for source in hub.values():
            data.check_source(source)


def prepare_data(trials: list[TrialConfig], artifacts: Path, say: Callable[[str], None] | None = None,
                 progress: bool = True) -> None:
    """Build the sweep's token caches (download, tokenizer, packing) once, before any trial is dispatched: a
    dataset that cannot load, a vocabulary the corpus cannot support or a missing file fails here with one
    message, instead of in every trial. Trials then read the caches (on a cluster, from the shared artifacts).
    Caches that are built and intact are checked without importing torch (ablate/data/tokencache.py)."""
    from ablate.data import tokencache

    todo = distinct_data(trials)
    for k, t in enumerate(todo, 1):
        built = tokencache.cache_intact(tokencache.cache_folder(artifacts, t.dataset, t.tokenizer, t.context))
        if say is not None:
            say(f"data {k}/{len(todo)}: {t.dataset.source} ({t.tokenizer.describe()}, "
                f"context {t.context}){' cached' if built else ''}")
        if built:
            continue
        from ablate import data

        before = _cache_entries(artifacts)
        try:
            data.prepare(t.dataset, t.tokenizer, t.context, artifacts, progress=progress)
        except AblateError:
            _remove_new_entries(artifacts, before)
            raise
        except Exception as exc:  # noqa: BLE001 - a file that does not parse, memory, a full disk: one message
            _remove_new_entries(artifacts, before)
            raise AblateError(f"dataset.source {t.dataset.source}: the token cache could not be built: "
                              f"{_root_cause(exc)}. Nothing was registered or kept (the cache is written to a "
                              "temporary folder first); fix the data and run again") from None


CACHE_FOLDERS = ("tokenizers", "tokens")


def _cache_entries(artifacts: Path) -> set[Path]:
    return {p for name in CACHE_FOLDERS for p in [artifacts / name, *(artifacts / name).glob("*")] if p.exists()}


def _remove_new_entries(artifacts: Path, before: set[Path]) -> None:
    """After a failed build: the lock files and empty folders it made (its data went to temporary folders, already
    removed). Anything with content, or that existed before, stays."""
    for path in sorted(_cache_entries(artifacts) - before, key=lambda p: len(p.parts), reverse=True):
        try:
            if path.is_dir():
                path.rmdir()  # only when empty
            elif path.suffix == ".lock" and path.stat().st_size == 0:
                path.unlink()
        except OSError:
            pass


def _root_cause(exc: BaseException) -> str:
    """The innermost cause's type and first line (datasets wraps a parse error in DatasetGenerationError)."""
    while exc.__cause__ is not None or (exc.__context__ is not None and not exc.__suppress_context__):
        exc = exc.__cause__ or exc.__context__
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


# ---------------------------------------------------------------- a sweep's runs and status


def sweep_id(engine: sa.Engine, name: str) -> int:
    """The id of the sweep named `name`, or an error that lists the known names."""
    return store.sweep_named(engine, name, store.Sweep.id).id


def sweep_runs(engine: sa.Engine, name: str) -> list[store.Run]:
    """Every run of the sweep as full rows (config, versions ...), in trial order."""
    sid = sweep_id(engine, name)
    with store.session_factory(engine)() as session:
        return list(session.scalars(sa.select(store.Run).where(store.Run.sweep_id == sid).order_by(store.Run.trial_index)))
