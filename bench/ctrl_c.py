"""Ctrl-C of a training `ablate sweep run`, as a terminal sends it: how long until its trainer has checkpointed and
stopped, and until the command has exited, on an idle machine and with busy loops beside it.

    python -m bench ctrl_c [--busy 0,3] [--repeat 2] [--train-seconds 15]

Starts `ablate sweep run` on two tiny mixer trials with a 10-minute budget, in its own session (a terminal's
foreground process group), waits until the first trainer has trained `--train-seconds`, then sends SIGINT to that
whole group, as the terminal's Ctrl-C does, and times the trainer's end and the command's exit. `--busy N` runs N
busy loops (one per core is a fully loaded machine) during each measurement. A script, not a test: it prints
measured numbers and what the command said while it stopped.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def spec(work: Path) -> Path:
    data = {"name": "ctrl-c", "dataset": {"source": "ablate:tinystories-sample", "eval": {"holdout": 16}},
            "tokenizer": {"vocab_size": 384}, "budget": {"wall_clock": "10m", "hardware": "cpu"},
            "defaults": {"architecture": "mixer", "layers": 1, "context": 64, "batch_size": 8, "lr": 3e-3,
                         "precision": "fp32"},
            "grid": [{"d_model": [32, 48]}]}
    path = work / "ctrl-c.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def one(busy: int, train_seconds: float) -> dict:
    """One Ctrl-C: seconds to the trainer's end and to the command's exit, its exit code, what it printed."""
    import sqlalchemy as sa

    from ablate import store

    work = Path(tempfile.mkdtemp(prefix="ablate-ctrl-c-"))
    url = f"sqlite:///{work / 'r.db'}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    cli = subprocess.Popen([sys.executable, "-m", "ablate.cli", "sweep", "run", str(spec(work)), "--db", url,
                            "--artifacts", str(work / "art"), "--threads", "1"], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, start_new_session=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    trainer = None
    while trainer is None:
        time.sleep(0.5)
        if cli.poll() is not None:
            raise RuntimeError(f"sweep run exited {cli.returncode}:\n{cli.stderr.read()[-3000:]}")
        if (work / "r.db").exists():
            with store.connect(url).connect() as conn:
                trainer = conn.execute(sa.select(store.Run.pid).where(store.Run.status == "running",
                                                                     store.Run.pid.isnot(None))).scalar()
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        time.sleep(train_seconds)
        start = time.monotonic()
        os.killpg(cli.pid, signal.SIGINT)  # the terminal's Ctrl-C: every process of the foreground group
        trainer_end = None
        while cli.poll() is None:
            if trainer_end is None and not _alive(trainer):
                trainer_end = time.monotonic() - start
            time.sleep(0.05)
        exited = time.monotonic() - start
    finally:
        for p in loops:
            p.kill()
    said = [line for line in cli.stderr.read().splitlines() if line.startswith(("stopping", "sweep "))]
    return {"busy": busy, "trainer": trainer_end if trainer_end is not None else exited, "exit": exited,
            "rc": cli.returncode, "said": said}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--busy", default="0,3", help="busy loops beside each measurement, comma separated")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--train-seconds", type=float, default=15.0)
    args = p.parse_args()
    rows = []
    for _ in range(args.repeat):
        for busy in (int(b) for b in args.busy.split(",")):
            r = one(busy, args.train_seconds)
            rows.append(r)
            print(f"busy loops {busy}: trainer ended {r['trainer']:.2f} s and the command exited {r['exit']:.2f} s "
                  f"after Ctrl-C (exit {r['rc']})", flush=True)
            for line in r["said"]:
                print(f"    {line}")
    print("\n| busy loops | trainer ended, s | command exited, s | exit code |\n| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['busy']} | {r['trainer']:.2f} | {r['exit']:.2f} | {r['rc']} |")


if __name__ == "__main__":
    main()
