"""The dashboard at scale: what each page and endpoint of `ablate ui` costs the server at 10,000 runs x 200 points,
and how long a real browser takes to first paint and to a drawn table and chart.

    python -m bench ui [--runs 10000] [--points 200] [--reuse URL] [--keep] [--out bench/ui-results.md]

Fills a SQLite results DB as bench/db.py does (the project's own register and the trainers' own writes), starts
`ablate ui` as its own process, and for each request reads that process's CPU time (user + system, from
/proc/PID/stat) before and after: the first request (nothing cached) and the median of the next five. With
chromium and chromedriver installed (`apt-get install chromium chromium-driver`) it also opens the sweep's page
in headless chromium and reads the first contentful paint and the time until the runs table and the chart are
drawn. A script, not a test: it prints measured numbers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(pid: int) -> float:
    """CPU seconds (user + system) the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(url: str, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "ablate.cli", "ui", "--db", url, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/static/ui.css", timeout=5).read()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ablate ui did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
            time.sleep(0.2)


def measure(proc: subprocess.Popen, base: str, path: str, repeat: int = 5) -> dict:
    """Server CPU of the first request for `path` and the median of `repeat` more; bytes of the answer."""
    costs = []
    size = 0
    for _ in range(1 + repeat):
        before = cpu_of(proc.pid)
        t0 = time.perf_counter()
        with urllib.request.urlopen(base + path, timeout=300) as response:
            size = len(response.read())
        wall = time.perf_counter() - t0
        time.sleep(0.05)  # let the server's thread account the tail of its work
        costs.append((cpu_of(proc.pid) - before, wall))
    warm = costs[1:]
    return {"first_cpu": costs[0][0], "first_wall": costs[0][1], "cpu": statistics.median(c for c, _ in warm),
            "wall": statistics.median(w for _, w in warm), "bytes": size}


def browser_times(base: str, sweep: str) -> dict | None:
    """First contentful paint, and seconds until the table and the chart are drawn, in headless chromium."""
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None
    if not chromium or not driver_path:
        return None
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        out = {}
        for visit in ("first", "again"):
            t0 = time.perf_counter()
            driver.get(f"{base}/sweep?{urllib.parse.urlencode({'name': sweep})}")
            while not driver.execute_script(
                    "return document.querySelectorAll('#runs tbody tr').length > 0 && "
                    "!!document.getElementById('chart').dataset.points"):
                time.sleep(0.02)
            drawn = time.perf_counter() - t0
            paint = driver.execute_script(
                "const e = performance.getEntriesByName('first-contentful-paint')[0]; return e ? e.startTime : null;")
            out[visit] = {"first_paint_s": (paint or 0) / 1000, "table_and_chart_s": drawn}
        return out
    finally:
        driver.quit()


def fill_db(runs: int, points: int, work: Path) -> str:
    from ablate import runner, store
    from bench.db import fill, spec_for

    url = f"sqlite:///{work / 'bench-ui.db'}"
    store.connect(url)
    _, _, ids = runner.register(spec_for(runs, work), url, max_trials=runs)
    print(f"registered {len(ids):,} runs; writing {points} points each", flush=True)
    fill(url, ids, points)
    return url


def unkeep(url: str) -> None:
    """No kept study: the dashboard computes it (the database brought to this code's schema first)."""
    from ablate import store

    engine = store.connect(url)
    with engine.begin() as conn:
        conn.execute(store.StudyCache.__table__.delete())


def keep(url: str, sweep: str) -> float:
    """The study kept as the sweep flow keeps it at a big sweep's end; the CPU-s that cost."""
    import logging

    from ablate import store
    from ablate.runner.keeper import keep_final

    engine = store.connect(url)
    before = time.process_time()
    keep_final(logging.getLogger("bench-ui"), engine, sweep)
    return time.process_time() - before


def once(proc: subprocess.Popen, base: str, path: str) -> dict:
    """Server CPU and wall seconds of one request for `path`."""
    before, t0 = cpu_of(proc.pid), time.perf_counter()
    with urllib.request.urlopen(base + path, timeout=300) as response:
        size = len(response.read())
    wall = time.perf_counter() - t0
    time.sleep(0.05)
    cost = cpu_of(proc.pid) - before
    return {"first_cpu": cost, "first_wall": wall, "cpu": cost, "wall": wall, "bytes": size}


def while_training(url: str, sweep: str, port: int, path: str, work: Path, training: int = 20
                   ) -> tuple[dict[str, dict], dict[str, float]]:
    """The study while the sweep trains, on a copy of the DB with its last `training` runs back to running: kept by
    the runner's keeper and read by a new server; the keeper's CPU when half of them finish; then with nothing
    kept, the dashboard's own first read as a quarter more finish, and its read again after the last quarter
    finish (its views held from the read before)."""
    import logging

    import sqlalchemy as sa

    from ablate import store
    from ablate.runner.keeper import StudyKeeper
    from ablate.ui.app import STUDY_EVERY

    copy = work / "training.db"
    shutil.copy(url.removeprefix("sqlite:///"), copy)
    engine = store.connect(f"sqlite:///{copy}")
    r = store.Run
    with engine.connect() as conn:
        finals = conn.execute(sa.select(r.id, r.status, r.steps, r.final_train_loss, r.final_eval_loss)
                              .order_by(r.id.desc()).limit(training)).all()
    with engine.begin() as conn:
        conn.execute(sa.update(r).where(r.id.in_([f.id for f in finals])).values(
            status="running", finished_at=None, steps=None, final_train_loss=None, final_eval_loss=None))

    def finish(rows: list) -> None:  # as a trainer's last write does
        for f in rows:
            store.update_run(engine, f.id, status=f.status, steps=f.steps, final_train_loss=f.final_train_loss,
                             final_eval_loss=f.final_eval_loss, finished_at=store.utcnow())

    keeper = StudyKeeper(engine, sweep, store.sweep_named(engine, sweep, store.Sweep.id).id, logging.getLogger("bench-ui"))
    cpu = {"keeper's first keep": keeper.keep()}
    proc = start_server(f"sqlite:///{copy}", port)
    base = f"http://127.0.0.1:{port}"
    out = {}
    try:
        out["study while training, kept by the runner (a new server)"] = once(proc, base, path)
        finish(finals[: training // 2])
        cpu[f"keeper's keep after {training // 2} runs finished"] = keeper.keep()
        out[f"study, kept again after {training // 2} runs finished"] = once(proc, base, path)
        unkeep(f"sqlite:///{copy}")  # from here the dashboard computes the study itself
        rest = finals[training // 2:]
        finish(rest[: len(rest) // 2])
        out[f"study computed here, first read ({len(rest) // 2} more runs finished, nothing kept)"] = once(
            proc, base, path)
        finish(rest[len(rest) // 2:])
        time.sleep(STUDY_EVERY + 1)  # the dashboard reads a study it computes at most this often
        out[f"study computed here again after {len(rest) - len(rest) // 2} runs finished (its views held)"] = once(
            proc, base, path)
    finally:
        proc.terminate()
        proc.wait(30)
    return out, cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--points", type=int, default=200)
    p.add_argument("--reuse", default=None, metavar="URL", help="a database a --keep run (or bench.db --keep) filled")
    p.add_argument("--keep", action="store_true", help="keep the filled database")
    p.add_argument("--out", default=None, help="also write the table (markdown) here")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ablate-bench-ui-"))
    url = args.reuse or fill_db(args.runs, args.points, work)
    unkeep(url)  # "study" below is computed by the dashboard; the kept one is measured after
    port = free_port()
    proc = start_server(url, port)
    base = f"http://127.0.0.1:{port}"
    try:
        sweep = "bench-db"
        q = lambda **kw: "?" + urllib.parse.urlencode({"sweep": sweep, **kw})  # noqa: E731
        paths = {
            "sweeps page (/)": "/", "sweeps (json)": "/api/sweeps", "sweep page (html)": "/sweep?name=" + sweep,
            "change token (poll)": "/api/token" + q(), "runs, first page": "/api/runs" + q(),
            "runs, filter + sort": "/api/runs" + q(filter="d_model=64 layers>=2 eval<3", sort="-eval"),
            "curves, seeds as bands": "/api/curves" + q(), "curves, one per run": "/api/curves" + q(group="runs"),
            "curves, by d_model (flops)": "/api/curves" + q(group="d_model", x="flops"),
            "curves, faceted by d_model": "/api/curves" + q(facet="d_model"),
            "curves, a selection of 4 runs": "/api/curves" + q(group="runs", runs="1,2,3,4"),
            "curves as SVG": "/api/curves.svg" + q(group="d_model"),
            "runs as CSV (every run)": "/api/runs.csv" + q(),
            "compare 3 runs": "/api/compare?runs=1,2,3",
            "study (tables + verdicts)": "/api/study" + q(), "run page (json)": "/api/run/1",
            "run curves": "/api/run/1/curves",
        }
        results = {name: measure(proc, base, path) for name, path in paths.items()}
        paint = browser_times(base, sweep)
    finally:
        proc.terminate()
        proc.wait(30)
    kept_cpu = keep(url, sweep)
    proc = start_server(url, port)
    try:
        results["study, kept at the sweep's end (a new server)"] = measure(proc, base, paths["study (tables + verdicts)"])
    finally:
        proc.terminate()
        proc.wait(30)
    keeper_cpu = {}
    if url.startswith("sqlite:///"):  # measured on a copy of the file
        training, keeper_cpu = while_training(url, sweep, port, paths["study (tables + verdicts)"], work)
        results.update(training)
    lines = [f"`ablate ui` over {url.rsplit('/', 1)[-1]} ({args.runs:,} runs x {args.points} points, SQLite), server "
             "CPU per request (goal < 0.5 CPU-s):", "",
             "| request | first: CPU-s | first: wall s | then (median of 5): CPU-s | wall s | bytes |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['first_cpu']:.2f} | {r['first_wall']:.2f} | {r['cpu']:.2f} | {r['wall']:.2f} | "
                     f"{r['bytes']:,} |")
    lines += ["", f"Keeping the study at the sweep's end (the sweep flow's `keep_final`): {kept_cpu:.2f} "
              "CPU-s in the flow's process."]
    if keeper_cpu:
        lines[-1] += (" While it trains (20 runs back to running, on a copy), the runner's keeper thread: "
                      + ", ".join(f"{k} {v:.2f} CPU-s" for k, v in keeper_cpu.items()) + ".")
    if paint:
        lines += ["", "Headless chromium on the sweep's page (goal: first paint < 2 s):", "",
                  "| visit | first contentful paint (s) | table and chart drawn (s) |", "| --- | --- | --- |"]
        lines += [f"| {k} | {v['first_paint_s']:.2f} | {v['table_and_chart_s']:.2f} |" for k, v in paint.items()]
    else:
        lines += ["", "(no chromium/chromedriver/selenium here: no browser timings)"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if not args.keep and not args.reuse:
        shutil.rmtree(work, ignore_errors=True)
    elif args.keep:
        print(f"kept {url}")


if __name__ == "__main__":
    main()
