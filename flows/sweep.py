"""Flow `sweep(spec)`: register the spec's runs and dispatch one flow `trial(run_id)` per run still owed.

Locally the trials run as nested flow runs, one per GPU slot at a time (sequential on CPU); on a
cluster (`use_deployments=True`) each goes to the `trial/<hardware>` deployment of the spec's work
pool through `run_deployment`, and the pool's concurrency limit is the number of GPU slots.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prefect import flow, get_run_logger

from ablate import db, runner


@flow(name="trial", log_prints=True)
def trial(run_id: int, db_url: str | None = None, artifacts: str = "results/artifacts",
          checkpoint_every: float = 600.0, memory_cap_mb: float | None = None,
          gpu_ids: list[int] | None = None, threads: int | None = None, retry_failed: bool = False) -> str:
    """Claim one run and train it (resuming from its checkpoint); its status. A run another process holds
    or finished is left alone (its current status is returned)."""
    opts = runner.RunOptions(db_url=db_url, artifacts=Path(artifacts), checkpoint_every=checkpoint_every,
                             memory_cap_mb=memory_cap_mb, gpu_ids=tuple(gpu_ids) if gpu_ids is not None else None,
                             threads=threads)
    statuses = runner.CLAIMABLE + (("cancelled",) if retry_failed else ())
    status = runner.run_trial(run_id, opts, statuses=statuses)
    get_run_logger().info("run %s: %s", run_id, status)
    return status


@flow(name="sweep", log_prints=True)
def sweep(spec: str, db_url: str | None = None, artifacts: str = "results/artifacts", gpu_slots: int = 1,
          retry_failed: bool = False, use_deployments: bool = False, checkpoint_every: float = 600.0,
          memory_cap_mb: float | None = None, threads: int | None = None) -> dict[int, str]:
    """Run every trial of a sweep file that is not finished yet; returns {run id: status}.

    `threads`: torch threads per trainer process; default, the cores other jobs leave free, shared by the
    trials at once.
    """
    log = get_run_logger()
    parsed, sweep_id, run_ids = runner.register(spec, db_url, say=log.info)
    engine = db.connect(db_url)
    todo = runner.runs_to_do(engine, sweep_id, run_ids, retry_failed=retry_failed)
    log.info("sweep %s: %d trials, %d to run", parsed.name, len(run_ids), len(todo))
    kwargs = dict(db_url=db_url, artifacts=artifacts, checkpoint_every=checkpoint_every, memory_cap_mb=memory_cap_mb,
                  retry_failed=retry_failed)
    if use_deployments:
        return _dispatch_to_pool(parsed.budget.hardware, todo, {**kwargs, "threads": threads})
    gpus_per_trial = parsed.budget.gpus
    slots = max(1, gpu_slots // gpus_per_trial)
    kwargs["threads"] = threads or runner.default_threads(min(slots, max(1, len(todo))), gpus_per_trial)
    if slots == 1:
        results = {}
        for rid in todo:
            if runner.STOP.is_set():  # the user stopped the sweep: no new trial starts
                break
            results[rid] = trial(rid, **kwargs, gpu_ids=None)
        return results
    # one trial per slot at a time, each with its own CUDA_VISIBLE_DEVICES
    groups = [list(range(s * gpus_per_trial, (s + 1) * gpus_per_trial)) for s in range(slots)]
    results: dict[int, str] = {}
    with ThreadPoolExecutor(max_workers=slots) as pool:
        queue = list(todo)
        futures = {}
        for s in range(slots):
            futures[s] = pool.submit(_drain, queue, groups[s], kwargs, results)
        for f in futures.values():
            f.result()
    return {rid: results[rid] for rid in todo if rid in results}


def _drain(queue: list[int], gpu_ids: list[int], kwargs: dict, results: dict[int, str]) -> None:
    while not runner.STOP.is_set():
        try:
            rid = queue.pop(0)  # list.pop is atomic under the GIL
        except IndexError:
            return
        results[rid] = trial(rid, **kwargs, gpu_ids=gpu_ids)


def _dispatch_to_pool(hardware: str, todo: list[int], kwargs: dict) -> dict[int, str]:
    """Each run becomes a flow run of deployment trial/<hardware>; workers of that pool pick them up."""
    from prefect.deployments import run_deployment

    def one(rid: int) -> str:
        run_deployment(f"trial/{hardware}", parameters={"run_id": rid, **kwargs}, timeout=None)
        return db.get_run(engine, rid).status  # the run row, not the flow state, is the outcome

    engine = db.connect(kwargs["db_url"])
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(todo)))) as pool:
        return dict(zip(todo, pool.map(one, todo)))
