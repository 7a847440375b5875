"""Per-trial orchestration overhead of a sweep run through the real Prefect flow (local, ephemeral API).

    python -m bench.orchestration [--spec sweeps/smoke.yaml] [--steps 5]

For each run: wall time from the runner's start mark to the trainer's finish mark, split into the
trainer's own measured parts (start-up: data cache, model build, optimizer; warm-up; budget clock;
eval; checkpoint) and the rest (interpreter + imports of the trainer process, DB bookkeeping);
plus the dispatch gap between one trial finishing and the next starting (flow + subflow + row
updates). A short step budget keeps the training itself negligible. A script, not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import yaml


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", default="sweeps/smoke.yaml")
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    work = Path(tempfile.mkdtemp(prefix="ablate-bench-orch-"))
    data = yaml.safe_load(Path(args.spec).read_text())
    data["budget"] = {"steps": args.steps, "hardware": data["budget"].get("hardware", "cpu")}
    spec = work / "spec.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    url = f"sqlite:///{work / 'r.db'}"

    from ablate import runner, store
    from flows.sweep import sweep

    # warm the token cache and the Prefect API first, so the numbers are per-trial steady state
    runner.register(spec, url)
    t0 = time.perf_counter()
    sweep(spec=str(spec), db_url=url, artifacts=str(work / "art"))
    total = time.perf_counter() - t0
    runs = sorted(runner.sweep_runs(store.connect(url), data["name"]), key=lambda r: r.started_at)
    rows = []
    for r in runs:
        wall = (r.finished_at - r.started_at).total_seconds()
        meters = (r.notes or {}).get("meters", {})
        measured = (r.startup_seconds or 0) + meters.get("warmup", 0) + (r.train_seconds or 0) + \
            (r.eval_seconds or 0) + (r.checkpoint_seconds or 0)
        rows.append((r, wall, measured))
        print(f"run {r.id} {r.architecture:6s} d={r.d_model:<4d} wall {wall:5.2f}s = start-up {r.startup_seconds:.2f}s "
              f"+ warm-up {meters.get('warmup', 0):.2f}s + train {r.train_seconds:.2f}s + eval {r.eval_seconds:.2f}s "
              f"+ checkpoint {r.checkpoint_seconds:.2f}s + process/imports/bookkeeping {wall - measured:.2f}s")
    gaps = [(b.started_at - a.finished_at).total_seconds() for a, b in zip(runs, runs[1:])]
    overhead = [wall - measured for _, wall, measured in rows]
    print(f"{len(runs)} trials in {total:.1f}s (first includes tokenizer training and cache build)")
    print(f"process start + imports + DB bookkeeping per trial: median {statistics.median(overhead):.2f}s")
    if gaps:
        print(f"dispatch gap between trials (flow, subflow, row updates): median {statistics.median(gaps):.2f}s")
    startup = [r.startup_seconds for r, _, _ in rows]
    print(f"model start-up inside the trainer (cache open, build, optimizer): median {statistics.median(startup):.2f}s")


if __name__ == "__main__":
    main()
