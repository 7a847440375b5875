"""CPU cost of a short trial outside its training steps: cold trainer processes against the warm helper.

    python -m bench.trial_cost [--trials 8] [--steps 3] [--out bench/trial-cost-results.md]

Registers the smoke sweep (tiny mixer and Llama, the embedded TinyStories) with a step budget of
`--steps` and seeds enough for `--trials` runs, then runs every trial through `runner.run_trial` one
after another, once with ABLATE_WARM_TRAINER=0 (a fresh `python -m ablate.train` per trial) and once
with the warm helper (ablate/runner/warm.py). CPU seconds are user + system, so load on the machine matters
little: each trainer's own (its rusage when reaped), the runner's own per trial (claim, row updates,
classification), and the helper's one-off start. Non-training work is a trainer's CPU less its timed
training and eval seconds (one thread, so seconds of CPU). A script, not a test.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_all(url: str, ids: list[int], artifacts: Path, warm_on: bool) -> dict:
    from ablate import runner, store
    from ablate.runner import trials, warm

    os.environ["ABLATE_WARM_TRAINER"] = "1" if warm_on else "0"
    handles: list = []
    start = trials.start_trainer  # where run_trial looks it up

    def recording(*args, **kwargs):  # keep each trainer handle: a warm child carries its own rusage
        handle = start(*args, **kwargs)
        handles.append(handle)
        return handle

    trials.start_trainer = recording
    try:
        children0, self0 = _children_cpu(), _self_cpu()
        opts = runner.LaunchOptions(db_url=url, artifacts=artifacts, threads=1)
        for rid in ids:
            assert runner.run_trial(rid, opts) == "completed", f"run {rid} did not complete"
        runner_cpu = _self_cpu() - self0
        if warm_on and warm._HELPER is not None:
            warm._HELPER.close()  # reaped: its CPU, and its children's, land in RUSAGE_CHILDREN
            warm._HELPER = None
        total_children = _children_cpu() - children0
    finally:
        trials.start_trainer = start
    engine = store.connect(url)
    runs = [store.get_run(engine, rid) for rid in ids]
    trainer_cpu = [h.cpu_seconds for h in handles] if warm_on else None
    if trainer_cpu is None:  # cold: serial trainers, so the children's total splits per trial by their own notes
        trainer_cpu = [total_children / len(ids)] * len(ids)
    # CPU, not wall seconds: the trainer's own process_time from its first timed step to its result (a wall time
    # subtracted from CPU seconds went negative on a loaded host, where a step waits for a core)
    training = [r.notes["process_cpu"]["total"] - r.notes["process_cpu"]["before_training"] for r in runs]
    helper = total_children - sum(trainer_cpu) if warm_on else 0.0
    return {
        "trainer": statistics.median(trainer_cpu), "training": statistics.median(training),
        "non_training": statistics.median(c - t for c, t in zip(trainer_cpu, training)),
        "runner": runner_cpu / len(ids), "helper": helper,
        "before_training": statistics.median(r.notes["process_cpu"]["before_training"] for r in runs),
        "per_trial_all_in": (total_children + runner_cpu) / len(ids),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(REPO))
    from ablate import runner

    work = Path(tempfile.mkdtemp(prefix="ablate-bench-trial-"))
    spec = yaml.safe_load((REPO / "sweeps" / "smoke.yaml").read_text())
    spec["budget"] = {"steps": args.steps, "hardware": "cpu"}
    spec["eval"] = {"at": [0.5]}
    seeds = list(range(max(1, -(-args.trials // 4))))  # the grid has four cells
    spec["defaults"]["seed"] = seeds[0]
    for cell in spec["grid"]:
        cell["seed"] = seeds
    results = {}
    for mode in ("cold", "warm"):
        path = work / f"{mode}.yaml"
        path.write_text(yaml.safe_dump({**spec, "name": f"trial-cost-{mode}"}, sort_keys=False))
        url = f"sqlite:///{work / mode}.db"
        _, _, ids = runner.register(path, url, artifacts=work / "art")
        ids = ids[: args.trials]  # registering with artifacts built the tokenizer and token cache: not measured
        results[mode] = run_all(url, ids, work / "art", warm_on=(mode == "warm"))
    rows = [
        ("trainer process CPU per trial (warm: median; cold: mean)", "trainer"),
        ("  of which training + eval (CPU from the first timed step to the result)", "training"),
        ("  non-training (imports, data, model, optimizer, warm-up, DB)", "non_training"),
        ("  CPU before the first timed step (the trainer's own note)", "before_training"),
        ("runner CPU per trial (claim, rows, classification)", "runner"),
        ("warm helper start (once per runner)", "helper"),
        ("all in, per trial (trainers + helper + runner) / trials", "per_trial_all_in"),
    ]
    title = (f"Per-trial CPU seconds, {args.trials} smoke trials of {args.steps} steps each, one thread "
             f"({os.cpu_count()} cores, Python {sys.version.split()[0]}).")
    lines = [title, "",
             "| measurement | cold process | warm helper |", "|---|---|---|"]
    lines += [f"| {label} | {results['cold'][key]:.2f} | {results['warm'][key]:.2f} |" for label, key in rows]
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")


if __name__ == "__main__":
    main()
