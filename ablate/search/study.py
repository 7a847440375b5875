"""The study and its storage: Optuna's tables on the results DB, creating the study of a spec, a worker's handle
on it with its own sampler and pruner, and the default sampler seed."""

from __future__ import annotations

import warnings
import zlib
from typing import Any

import optuna
import sqlalchemy as sa

from ablate import store
from ablate.config.errors import AblateError, did_you_mean
from ablate.config import SearchBlock, SweepSpec
from ablate.search.claims import requeue
from ablate.search.space import require_cmaes, check_search, grid_space

HEARTBEAT_SECONDS = 30  # a running trial's worker records a heartbeat this often
GRACE_SECONDS = 180  # a RUNNING trial without a heartbeat for this long belongs to a dead worker
MEDIAN_STARTUP_TRIALS = 2  # the median pruner prunes once this many trials have completed


def open_storage(url: str | None = None, *, create: bool = False, heartbeat_seconds: int = HEARTBEAT_SECONDS,
                 grace_seconds: int = GRACE_SECONDS) -> optuna.storages.RDBStorage:
    """Optuna's storage on the results DB (creating its tables when `create`).

    The ablate schema is brought up first; its Alembic revision lives in `ablate_alembic_version`, so
    Optuna's own (`alembic_version`) and its schema version check work as on a database of its own.
    """
    url = store.resolve_url(url)
    store.connect(url) if create else store.reader(url)  # reading a study (its report) never creates or migrates
    is_sqlite = sa.make_url(url).get_backend_name() == "sqlite"
    engine_kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}} if is_sqlite else {"pool_pre_ping": True}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeat_interval
        storage = optuna.storages.RDBStorage(
            url, engine_kwargs=engine_kwargs, skip_table_creation=not create,
            heartbeat_interval=heartbeat_seconds, grace_period=grace_seconds, heartbeat_stale_trial_callback=requeue,
        )
    if create:  # `ablate sql` (as the reader role on PostgreSQL) may join runs with Optuna's trials
        from optuna.storages._rdb.models import BaseModel  # Optuna's schema: its table names, whatever its version

        store.grant_reader(store.connect(url), BaseModel.metadata.tables)
    return storage


def create_study(spec: SweepSpec, db_url: str | None = None, spec_path: str | None = None,
                 storage: optuna.storages.RDBStorage | None = None) -> optuna.Study:
    """Create the study of a spec (once, before any worker starts; idempotent) and the sweep row its runs join."""
    check_search(spec, spec_path or "<spec>")
    url = store.resolve_url(db_url)
    engine = store.connect(url)
    store.register_sweep(engine, spec, [], spec_path=spec_path)
    storage = storage or open_storage(url, create=True)
    study = optuna.create_study(storage=storage, study_name=spec.name, direction=spec.search.direction,
                                load_if_exists=True)
    study.set_user_attr("eval_at", list(spec.eval.at))  # Optuna step k is the eval at eval_at[k - 1]
    study.set_user_attr("objective", spec.search.objective)
    return study


def make_sampler(search: SearchBlock, seed: int | None) -> optuna.samplers.BaseSampler:
    if search.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed)  # constant_liar is on by default (Optuna 5): parallel-safe
    if search.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if search.sampler == "grid":
        return optuna.samplers.GridSampler(grid_space(search), seed=seed)
    require_cmaes()
    # CMA-ES samples float and int parameters; categorical ones fall back to random sampling
    return optuna.samplers.CmaEsSampler(seed=seed, independent_sampler=optuna.samplers.RandomSampler(seed=seed),
                                        warn_independent_sampling=False)


def make_pruner(search: SearchBlock, n_evals: int) -> optuna.pruners.BasePruner:
    """Pruners read the intermediate evals, reported at steps 1..n_evals."""
    if search.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=MEDIAN_STARTUP_TRIALS, n_warmup_steps=0)
    if search.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max(n_evals, 1), reduction_factor=3)
    return optuna.pruners.NopPruner()


def load_study(spec: SweepSpec, storage: optuna.storages.BaseStorage, seed: int | None = None) -> optuna.Study:
    """A worker's handle on the study: the shared storage with its own sampler and pruner."""
    try:
        return optuna.load_study(study_name=spec.name, storage=storage, sampler=make_sampler(spec.search, seed),
                                 pruner=make_pruner(spec.search, len(spec.eval.at)))
    except KeyError:
        names = optuna.get_all_study_names(storage)
        raise AblateError(f"no search study named {spec.name!r} in the results DB{did_you_mean(spec.name, names)}; "
                          f"known: {', '.join(names) or 'none yet'} (`ablate search run SPEC` creates it)") from None


def default_seed(name: str) -> int:
    """A study's sampler seed when none is given: stable per spec name (numpy seeds must stay below 2**32)."""
    return zlib.crc32(name.encode()) % 2**31
