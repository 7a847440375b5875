"""The search loop: a worker claims, runs and tells trials until the study holds n_trials; `run_search` creates
the study and runs its workers here as threads, each on its own GPUs when the machine has enough."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import optuna

from ablate import runner, store
from ablate.config.errors import AblateError
from ablate.config import SweepSpec, load_spec
from ablate.search.claims import claim, unfinished
from ablate.search.gate import Gate
from ablate.search.space import planned_trials
from ablate.search.study import (GRACE_SECONDS, HEARTBEAT_SECONDS, create_study, default_seed, load_study,
                                 make_sampler, open_storage)
from ablate.search.trial import TrialOutcome, run_one


def run_worker(spec: SweepSpec, storage: optuna.storages.RDBStorage, opts: runner.LaunchOptions, n_trials: int, *,
               seed: int | None, spec_path: str | None = None, poll_seconds: float = 1.0,
               heartbeat_seconds: float = HEARTBEAT_SECONDS, on_trial: Callable[[TrialOutcome], None] | None = None,
               stop: threading.Event | None = None, gate: Gate | None = None) -> list[TrialOutcome]:
    """One worker: claim a trial, run it, tell it; until the study holds n_trials, all finished (or `stop` is
    set). While the last ones run under other workers it waits, and takes over one whose trainer died. `gate`:
    its runs train fused with the other workers' of this process (ablate/search/gate.py).

    With a seed, trial n samples with seed + n (reproducible for one worker, distinct across workers).
    """
    try:
        return _work(spec, storage, opts, n_trials, seed, spec_path, poll_seconds, heartbeat_seconds, on_trial, stop,
                     gate)
    finally:
        if gate is not None:
            gate.leave()


def _work(spec: SweepSpec, storage: optuna.storages.RDBStorage, opts: runner.LaunchOptions, n_trials: int,
          seed: int | None, spec_path: str | None, poll_seconds: float, heartbeat_seconds: float,
          on_trial: Callable[[TrialOutcome], None] | None, stop: threading.Event | None,
          gate: Gate | None) -> list[TrialOutcome]:
    study = load_study(spec, storage, seed)
    engine = store.connect(opts.db_url)
    outcomes = []
    while not (stop is not None and stop.is_set()):
        trial = claim(study, storage, engine, n_trials,
                      sampler=None if seed is None else lambda n: make_sampler(spec.search, seed + n))
        if trial is None:
            if not unfinished(study):  # every trial finished, not merely counted
                break
            time.sleep(max(poll_seconds, 1.0))  # another worker's trial runs: taken over here if its trainer dies
            continue
        outcome = run_one(study, storage, trial, spec, opts, spec_path=spec_path, poll_seconds=poll_seconds,
                          heartbeat_seconds=heartbeat_seconds, stop=stop, gate=gate)
        outcomes.append(outcome)
        if on_trial is not None:
            on_trial(outcome)
    return outcomes


def run_search(spec: SweepSpec | str | Path, db_url: str | None = None, opts: runner.LaunchOptions | None = None, *,
               workers: int = 1, n_trials: int | None = None, seed: int | None = None, poll_seconds: float = 1.0,
               on_trial: Callable[[TrialOutcome], None] | None = None, stop: threading.Event | None = None,
               heartbeat_seconds: int = HEARTBEAT_SECONDS, grace_seconds: int = GRACE_SECONDS,
               spec_path: str | None = None) -> list[TrialOutcome]:
    """Run (or continue) a spec's search here with `workers` threads; returns the outcomes of the trials run here.

    The study is created first (once, before any worker). n_trials defaults to the spec's; trials already
    in the study count, so a stopped search continues where it stopped. On a GPU machine each worker gets
    its own GPUs (`budget.gpus` each) unless `opts.gpu_ids` is set. A spec given parsed (with overrides applied)
    records `spec_path`, the file it came from.
    """
    spec_path = str(spec) if isinstance(spec, (str, Path)) else spec_path
    spec = load_spec(spec) if isinstance(spec, (str, Path)) else spec
    url = store.resolve_url(db_url)
    storage = open_storage(url, create=True, heartbeat_seconds=heartbeat_seconds, grace_seconds=grace_seconds)
    create_study(spec, url, spec_path=spec_path, storage=storage)  # the storage is shared by the worker threads
    total = planned_trials(spec.search, n_trials)
    seed = default_seed(spec.name) if seed is None else seed
    opts = (opts or runner.LaunchOptions()).but(db_url=url)
    stop = stop or threading.Event()
    # the workers' trials train fused where the spec says `fuse: shapes` (or `auto`, on a GPU): a search's trials
    # differ in what it searches, and fuse when that does not change shapes (lr, weight decay, warm-up); `seeds`
    # would group none. Fused, the workers may outnumber the GPUs (the gate puts each group on the least busy one)
    fused = workers > 1 and (spec.fuse == "shapes" or (spec.fuse == "auto" and runner.visible_gpus() > 0))
    gpu_groups = (_gpu_groups(workers, spec.budget.gpus, fused) if opts.gpu_ids is None else None)
    gate = Gate(workers, spec.fuse, store.connect(url), spec.budget.gpus) if fused else None

    def worker(i: int) -> list[TrialOutcome]:
        worker_opts = opts.but(gpu_ids=gpu_groups[i]) if gpu_groups else opts
        return run_worker(spec, storage, worker_opts, total, seed=seed, spec_path=spec_path,
                          poll_seconds=poll_seconds, heartbeat_seconds=heartbeat_seconds, on_trial=on_trial, stop=stop,
                          gate=gate)

    if workers <= 1:
        return worker(0)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="search-worker") as pool:
        futures = [pool.submit(worker, i) for i in range(workers)]
        try:
            results = [f.result() for f in futures]
        except BaseException:
            stop.set()  # the other workers stop their trainers (checkpointed) and re-queue their trials
            for f in futures:
                f.exception()
            raise
    return sorted((o for r in results for o in r), key=lambda o: o.number)


def _gpu_groups(workers: int, gpus_per_trial: int, fused: bool = False) -> list[tuple[int, ...]] | None:
    """Disjoint GPU ids per worker when this machine has enough GPUs for all of them; None on CPU, or when fused
    workers outnumber the GPUs."""
    if workers <= 1:
        return None
    import torch

    count = torch.cuda.device_count()
    if count < workers * gpus_per_trial:
        if count and not fused:
            raise AblateError(f"{workers} workers x {gpus_per_trial} GPUs per trial need {workers * gpus_per_trial} GPUs; "
                              f"this machine has {count}: use --workers {max(1, count // gpus_per_trial)}")
        return None
    return [tuple(range(i * gpus_per_trial, (i + 1) * gpus_per_trial)) for i in range(workers)]
