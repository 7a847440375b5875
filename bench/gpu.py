"""`python -m bench gpu --out DIR`: one command that checks a GPU node and writes a full table as it goes.

    python -m bench gpu --out DIR [--bundle BUNDLE] [--minutes 8] [--device auto|cpu|cuda] [--quick] [--parts a,b]

The parts, in the order they run (each in its own process, so a CUDA fault or a hang costs that part only; each
gets a share of the time left, the unused time of the parts before it included, and is stopped at its share):

    env         the device, driver, torch / CUDA / cuDNN, where torch and ablate are imported from
    tests       `pytest -m gpu tests/gpu`: compile, bf16, fp16 + scaler, fused AdamW, the memory cap -> oom and
                shrink, checkpoint and resume, the memory probe, torchrun over NCCL, the warm (forked) trainer
    throughput  tokens/s, MFU and peak memory per architecture at the studies' sizes (d 512 and 1024, 8 layers,
                context 512), uncompiled, then compiled as time allows
    trainer     ablate's trainer against a bare loop on the same model, and the share of a fixed budget that is
                training steps
    memory      the context-memory table: one unbatched forward+backward, mixer vs Llama, context 512..4096
    fused       seeds fused into one process (ablate/train/fused.py) against one after another and K processes
                packed, at d 256 and 512, k = 4, 8, 16: tokens/s per GPU and each member's loss against its solo run
    orderings   the studies' orderings at a reduced budget (widths: flat mixer vs Llama at d 256/512; heads: 4 vs
                16), through the real trainer and a SQLite results DB, with the report's verdicts
    profile     torch.profiler over the slowest architecture's step: what costs most

DIR gets results.md and results.json after every part (a cut run still leaves what it measured), log.txt (every
part's output) and gpu-tests.xml, nothing else (the scratch goes to --work). On a machine without CUDA (or
--device cpu) everything runs at CPU sizes and the CUDA-only rows are listed as skipped: CI runs `--device cpu
--quick` from a venv that holds only torch and the bundle. A script, not a test.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.gpu_report import markdown

REPO = Path(__file__).resolve().parent.parent

# name, share of the time (a part's unused time goes to the parts after it); GRACE: how long a part may overrun
PARTS: list[tuple[str, float]] = [("env", 0.02), ("tests", 0.24), ("throughput", 0.19), ("trainer", 0.12),
                                  ("memory", 0.04), ("fused", 0.14), ("orderings", 0.21), ("profile", 0.04)]
GRACE = 20.0
RESERVE = 15.0  # seconds kept for writing the results at the end


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench gpu", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/gpu-check", help="folder for results.md, results.json, log.txt")
    p.add_argument("--bundle", default=None, help="the bundle this node was installed from (its bundle.json names "
                   "the commit where the checkout has no .git)")
    p.add_argument("--minutes", type=float, default=8.0, help="the whole run's time (default 8)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--quick", action="store_true", help="smallest sizes (what CI runs on CPU)")
    p.add_argument("--work", default=None, help="scratch folder (default: a new one under the system's temp)")
    p.add_argument("--parts", default=",".join(name for name, _ in PARTS),
                   help="a comma-separated subset (env always runs: results.md's header names the device from it)")
    args = p.parse_args(argv)
    wanted = args.parts.split(",")
    unknown = sorted(set(wanted) - {name for name, _ in PARTS})
    if unknown:
        p.error(f"--parts: unknown {', '.join(unknown)}; known: {', '.join(name for name, _ in PARTS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # the parts' scratch (token caches, the orderings' DB and checkpoints): never under DIR, which holds the results
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="ablate-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    result = {"command": "python -m bench gpu " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
              "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "minutes": args.minutes,
              "device_asked": args.device, "quick": args.quick, **_code(args.bundle), "parts": {}}
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))  # bench/ and tests/ importable
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": path}
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the same code path, every CUDA row skipped
    end = time.monotonic() + 60 * args.minutes - RESERVE
    plan = [(name, share) for name, share in PARTS if name in wanted or name == "env"]
    with open(out / "log.txt", "a", buffering=1) as log:
        for i, (name, share) in enumerate(plan):
            left = end - time.monotonic()
            allowance = max(left * share / sum(s for _, s in plan[i:]), 0.0)
            part = _run_part(name, allowance, args, result, env, work, log) if left > 5 else \
                {"status": "skipped", "why": "no time left"}
            result["parts"][name] = part
            _write(out, result)
            print(f"[bench gpu] {name}: {part['status']} ({part.get('seconds', 0):.0f} s of {allowance:.0f})",
                  flush=True)
    result["finished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    _write(out, result)
    print((out / "results.md").read_text())
    return 0


def _code(bundle: str | None) -> dict[str, Any]:
    """The commit every number comes from: the checkout's, else the bundle's (a node without .git)."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, check=True).stdout.strip())
        return {"commit": head, "dirty": dirty, "commit_from": "git"}
    except (OSError, subprocess.CalledProcessError):
        pass
    if bundle and (Path(bundle) / "bundle.json").exists():
        info = json.loads((Path(bundle) / "bundle.json").read_text())
        return {"commit": info.get("commit"), "dirty": info.get("dirty"), "commit_from": "bundle.json",
                "bundle": {k: info.get(k) for k in ("created", "python", "platform", "extras", "mib")}}
    return {"commit": None, "dirty": None, "commit_from": "unknown (no .git, no --bundle)"}


def _run_part(name: str, allowance: float, args: argparse.Namespace, result: dict[str, Any], env: dict[str, str],
              work: Path, log: Any) -> dict[str, Any]:
    """One part in its own process; its rows, read from the JSON lines it wrote, also when it was stopped."""
    rows_file = work / f"{name}.jsonl"
    rows_file.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "bench.gpu_parts", name, "--rows", str(rows_file), "--work", str(work),
           "--deadline", str(time.time() + allowance), "--out", str(Path(args.out).resolve())]
    if args.quick:
        cmd.append("--quick")
    slowest = _slowest(result)
    if name == "profile" and slowest:
        cmd += ["--arch", slowest]
    log.write(f"\n===== {name} ({allowance:.0f} s): {' '.join(cmd)}\n")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = proc.wait(timeout=allowance + GRACE)
        status = "ok" if code == 0 else "failed"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        code, status = None, "cut"
    part: dict[str, Any] = {"status": status, "exit": code, "seconds": round(time.monotonic() - t0, 1),
                            "allowance": round(allowance, 1), "rows": [], "skipped": [], "notes": []}
    for line in rows_file.read_text().splitlines() if rows_file.exists() else []:
        try:
            item = json.loads(line)
        except json.JSONDecodeError:  # the last line of a part killed while writing it
            part["notes"].append(f"a line cut off when the part was stopped: {line[:80]!r}")
            continue
        for key in ("rows", "skipped", "notes"):
            if key in item:
                part[key].append(item[key])
        if "error" in item:
            part["error"] = item["error"]
    if status == "cut":
        part["notes"].append(f"stopped at its time limit ({allowance + GRACE:.0f} s): the rows above are what it "
                             "measured before")
    return part


def _slowest(result: dict[str, Any]) -> str | None:
    """The architecture whose uncompiled step was slowest at the largest size measured (the profile's subject)."""
    rows = [r for r in result["parts"].get("throughput", {}).get("rows", [])
            if not r.get("compile") and isinstance(r.get("step_ms"), (int, float))]
    if not rows:
        return None
    largest = max(r["d_model"] for r in rows)
    return max((r for r in rows if r["d_model"] == largest), key=lambda r: r["step_ms"])["arch"]


def _write(out: Path, result: dict[str, Any]) -> None:
    for name, text in (("results.json", json.dumps(result, indent=1, default=str)), ("results.md", markdown(result))):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text + "\n")
        os.replace(tmp, out / name)


if __name__ == "__main__":
    sys.exit(main())
