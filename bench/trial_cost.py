"""CPU cost of a short trial outside its training steps: cold trainer processes against the warm helper.

    python -m bench.trial_cost [--trials 8] [--steps 3] [--out bench/trial-cost-results.md]
    python -m bench.trial_cost --sweep-run [--repeat 2] [--steps 3]
    python -m bench.trial_cost --cold mixer,llama,gpt [--repeat 3] [--steps 3 | --seconds 60]

Registers the smoke sweep (tiny mixer and Llama, the embedded TinyStories) with a step budget of
`--steps` and seeds enough for `--trials` runs, then runs every trial through `runner.run_trial` one
after another, once with ABLATE_WARM_TRAINER=0 (a fresh `python -m ablate.train` per trial) and once
with the warm helper (ablate/runner/warm.py). CPU seconds are user + system, so load on the machine matters
little: each trainer's own (its rusage when reaped), the runner's own per trial (claim, row updates,
classification), and the helper's one-off start. Non-training work is a trainer's CPU less its timed
training and eval seconds (one thread, so seconds of CPU). A script, not a test.

`--sweep-run` measures the whole command instead: `ablate sweep run` on 2 and on 5 tiny mixer trials (alternating,
`--repeat` times each, a warm-up run first builds the token cache), its CPU with every process it started and
reaped (the local Prefect API server, the warm helper and its trainers: a sweep of one trial starts it cold, so
both sizes have the helper); the fixed cost per sweep and the cost per trial are the line through the two sizes.

`--cold FAMILIES` measures a cold trainer (a fresh `python -m ablate.train`, no warm helper) of each family, `--repeat`
trials each (d_model 64, 2 layers, 4 heads): the CPU before its first timed step (its own note), its non-training
CPU; with `--seconds S` a wall-clock budget of S seconds instead of `--steps`, and the share of each run's wall clock
(started to finished, as the database has them) that its budget clock counted.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
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


def sweep_run_cpu(trials: int, steps: int, work: Path, tag: str) -> float:
    """CPU seconds of one `ablate sweep run` of `trials` tiny mixer trials, with the processes it reaped."""
    cmd = [sys.executable, "-m", "ablate.cli", "sweep", "run", str(REPO / "sweeps" / "smoke.yaml"),
           f"grid=[{{architecture: mixer, d_model: 32, seeds: {trials}}}]", "--budget", f"steps={steps}",
           "--db", str(work / f"{tag}.db"), "--artifacts", str(work / "art"), "--threads", "1", "--name", tag]
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect"), "HF_HUB_OFFLINE": "1"}
    env.pop("PREFECT_API_URL", None)
    before = _children_cpu()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"`ablate sweep run` failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return _children_cpu() - before


def sweep_run_table(repeat: int, steps: int) -> str:
    work = Path(tempfile.mkdtemp(prefix="ablate-bench-sweep-run-"))
    sweep_run_cpu(1, steps, work, "warm-up")  # the tokenizer and token cache, the Prefect DB: not measured
    costs: dict[int, list[float]] = {2: [], 5: []}
    for i in range(repeat):
        for n in (2, 5):
            costs[n].append(sweep_run_cpu(n, steps, work, f"cost-{n}-{i}"))
            print(f"{n} trial(s): {costs[n][-1]:.2f} CPU-s", flush=True)
    per_trial = (statistics.mean(costs[5]) - statistics.mean(costs[2])) / 3
    fixed = statistics.mean(costs[2]) - 2 * per_trial
    return "\n".join([
        f"`ablate sweep run` on tiny mixer trials of {steps} steps, one thread, whole command with what it reaped "
        f"({os.cpu_count()} cores, Python {sys.version.split()[0]}):", "",
        "| trials | CPU-s per run of the command |", "|---|---|",
        *(f"| {n} | {', '.join(f'{c:.2f}' for c in cs)} |" for n, cs in costs.items()), "",
        f"Fixed cost per sweep {fixed:.2f} CPU-s; per trial {per_trial:.2f} CPU-s (the line through both sizes)."])


def cold_table(families: list[str], repeat: int, steps: int, seconds: float | None = None) -> str:
    """Cold trainers of each family, one after another: CPU before the first step, non-training CPU."""
    from ablate import runner, store

    work = Path(tempfile.mkdtemp(prefix="ablate-bench-cold-"))
    spec = yaml.safe_load((REPO / "sweeps" / "smoke.yaml").read_text())
    budget = {"wall_clock": f"{seconds:g}s"} if seconds else {"steps": steps}
    spec.update(budget={**budget, "hardware": "cpu"}, eval={"at": [0.5]}, report={})
    lines = [f"Cold trainers (`ABLATE_WARM_TRAINER=0`: a fresh `python -m ablate.train` each), d_model 64, 2 layers, "
             f"{f'{seconds:g} s' if seconds else f'{steps} steps'}, one thread, {repeat} trials each "
             f"({os.cpu_count()} cores, Python {sys.version.split()[0]}); CPU-s, median (each trial's):", "",
             "| family | CPU before the first timed step | non-training CPU | budget clock / wall clock |",
             "|---|---|---|---|"]
    for family in families:
        cell = {"architecture": family, "d_model": 64, "seeds": repeat, **({"heads": 4} if family != "mixer" else {})}
        path = work / f"{family}.yaml"
        path.write_text(yaml.safe_dump({**spec, "name": f"cold-{family}", "grid": [cell]}, sort_keys=False))
        url = f"sqlite:///{work / family}.db"
        _, _, ids = runner.register(path, url, artifacts=work / "art")
        measured = run_all(url, ids, work / "art", warm_on=False)
        engine = store.connect(url)
        runs = [store.get_run(engine, rid) for rid in ids]
        before = [r.notes["process_cpu"]["before_training"] for r in runs]
        walls = [(r.finished_at - r.started_at).total_seconds() for r in runs]
        shares = [f"{r.train_seconds:.2f} of {wall:.2f} s: {r.train_seconds / wall:.1%} "
                  f"({r.train_seconds / (wall - r.notes['meters']['eval']):.1%} of it less its evals)"
                  for r, wall in zip(runs, walls)]
        lines.append(f"| {family} | {statistics.median(before):.2f} ({', '.join(f'{b:.2f}' for b in before)}) | "
                     f"{measured['non_training']:.2f} | {'; '.join(shares)} |")
        print(lines[-1], flush=True)
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default=None, help="also write the table to this markdown file")
    p.add_argument("--sweep-run", action="store_true", help="the whole `ablate sweep run`: fixed and per-trial cost")
    p.add_argument("--repeat", type=int, default=2, help="--sweep-run: runs of each size; --cold: trials per family")
    p.add_argument("--cold", default=None, help="cold trainers of these families (comma-separated): CPU before step 1")
    p.add_argument("--seconds", type=float, default=None, help="with --cold: a wall-clock budget instead of --steps")
    args = p.parse_args()
    if args.sweep_run or args.cold:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        sys.path.insert(0, str(REPO))
        table = (sweep_run_table(args.repeat, args.steps) if args.sweep_run
                 else cold_table(args.cold.split(","), args.repeat, args.steps, args.seconds))
        print(table)
        if args.out:
            Path(args.out).write_text(table + "\n")
        return
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
