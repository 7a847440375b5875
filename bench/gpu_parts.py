"""The parts of `python -m bench gpu` (bench/gpu.py), each in its own process:

    python -m bench.gpu_parts NAME --rows FILE --work DIR --out DIR --deadline EPOCH [--quick] [--arch ARCH]

A part writes one JSON line per result as it goes ({"rows": ...}, {"skipped": ...}, {"notes": ...}), so a part
stopped at its time limit still leaves what it measured. Each looks at the deadline before every row and lists
what it had no time for. CUDA where there is one; else CPU sizes, the CUDA-only rows listed as skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
ARCHS = [("llama", {}), ("mixer", {}), ("gpt", {}), ("hybrid", {}), ("metaformer", {"token_mixer": "metric"}),
         ("mod", {})]
NO_COMPILE_ON_CPU = "CUDA only: torch.compile on CPU costs ~45 s a model and gives nothing at these sizes"


class Part:
    """What every part is handed: the device, the sizes' switch, the deadline, and where its lines go."""

    def __init__(self, args: argparse.Namespace):
        self.lines = open(args.rows, "a", buffering=1)  # noqa: SIM115 - open for the part's life
        self.deadline, self.quick, self.arch = args.deadline, args.quick, args.arch
        self.work, self.out = Path(args.work), Path(args.out)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.gpu = self.device.type == "cuda"

    def left(self) -> float:
        return self.deadline - time.time()

    def _say(self, key: str, value: Any) -> None:
        self.lines.write(json.dumps({key: value}, default=str) + "\n")

    def row(self, **row: Any) -> None:
        self._say("rows", row)
        print(json.dumps(row, default=str), flush=True)

    def skip(self, what: str, why: str) -> None:
        self._say("skipped", {"what": what, "why": why})
        print(f"skipped {what}: {why}", flush=True)

    def note(self, text: str) -> None:
        self._say("notes", text)

    def has_time(self, what: str, seconds: float) -> bool:
        """Whether `seconds` more fit before the deadline; if not, `what` is listed as skipped."""
        if self.left() >= seconds:
            return True
        self.skip(what, f"out of time ({self.left():.0f} s left, about {seconds:.0f} s needed)")
        return False

    def free(self) -> None:
        if self.gpu:
            torch.cuda.empty_cache()


# ---------------------------------------------------------------- env


def env(part: Part) -> None:
    import ablate
    from ablate.train import budget as bud

    row: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
                           "torch_from": str(Path(torch.__file__).parent),
                           "ablate_from": str(Path(ablate.__file__).parent),
                           "cpus": os.cpu_count(), "threads": torch.get_num_threads()}
    for package in ("transformers", "datasets", "tokenizers", "sqlalchemy", "pydantic", "optuna", "numpy", "pytest"):
        try:
            row[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            row[package] = None
    if part.gpu:
        props = torch.cuda.get_device_properties(part.device)
        row.update(device=props.name, capability=f"{props.major}.{props.minor}", sms=props.multi_processor_count,
                   memory_gib=round(props.total_memory / 2**30, 1), bf16=torch.cuda.is_bf16_supported(),
                   nccl=_nccl(), driver=_driver(),
                   peak_bf16_tflops=(bud.peak_flops(props.name) or 0) / 1e12 or None)
    else:
        row["device"] = f"cpu ({platform.processor() or platform.machine()})"
    part.row(**row)


def _nccl() -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a build without NCCL
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
        return out.splitlines()[0] if out else None
    except (OSError, subprocess.SubprocessError):
        return None


# ---------------------------------------------------------------- tests


def tests(part: Part) -> None:
    """`pytest -m gpu tests/gpu`, each test's outcome a row (and what a test measured, from its properties)."""
    try:
        import pytest  # noqa: F401
    except ImportError:
        part.skip("the CUDA tests", "pytest is not installed (the bundle carries it: ablate bundle)")
        return
    xml = part.out / "gpu-tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-rA", "-p", "no:cacheprovider",
           f"--junitxml={xml}", "-o", "junit_family=xunit1"]
    try:
        subprocess.run(cmd, cwd=REPO, timeout=max(part.left() - 5, 10))
    except subprocess.TimeoutExpired:
        part.note("pytest was stopped at the part's time limit; the tests it had not reached are missing below")
    if not xml.exists():
        part.skip("the CUDA tests", "pytest wrote no report (see log.txt)")
        return
    import xml.etree.ElementTree as ET

    for case in ET.parse(xml).getroot().iter("testcase"):
        outcome, detail = "passed", ""
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                outcome = "skipped" if kind == "skipped" else "failed"
                detail = (found.get("message") or found.text or "").strip().splitlines()[0][:300] if \
                    (found.get("message") or found.text) else ""
        measured = {p.get("name"): p.get("value") for p in case.iter("property")}
        part.row(test=case.get("name"), outcome=outcome, seconds=float(case.get("time") or 0), detail=detail,
                 **({"measured": measured} if measured else {}))


# ---------------------------------------------------------------- throughput


def throughput(part: Part) -> None:
    """Tokens/s, MFU and peak memory per architecture: every family uncompiled first, then compiled as time allows."""
    from bench.suite import _time_model, trial

    archs = ARCHS[:2] if part.quick else ARCHS
    if part.gpu:
        sizes, (layers, context, batch), seconds = [512, 1024], (8, 512, 32), 2.0
    else:
        sizes, (layers, context, batch), seconds = ([64] if part.quick else [64, 128]), (2, 128, 8), 0.5
    plan = [(arch, options, d, False) for d in sizes for arch, options in archs]
    if part.gpu:
        plan += [(arch, options, d, True) for arch, options in archs for d in reversed(sizes)]
    else:
        part.skip("the compiled rows", NO_COMPILE_ON_CPU)
    for arch, options, d, use_compile in plan:
        what = f"{arch} d{d}" + (" compiled" if use_compile else "")
        if not part.has_time(what, (60 if use_compile else 8) if part.gpu else 4):
            continue
        t = trial(arch, d, layers, context, batch, heads=16 if part.gpu else 4, **options)
        try:
            row = _time_model(t, part.device, use_compile, seconds=seconds)
        except Exception as exc:  # noqa: BLE001 - one family's failure is a row, the others still run
            row = {"arch": arch, "d_model": d, "compile": use_compile, "error": f"{type(exc).__name__}: {exc}"[:400]}
        part.row(layers=layers, context=context, batch=batch, **row)
        part.free()


# ---------------------------------------------------------------- trainer


def trainer(part: Part) -> None:
    """ablate's trainer against a bare loop on the same model (interleaved pairs, both uncompiled), then the share
    of a fixed wall-clock budget that is training steps (the budget clock over the wall time of `train()`)."""
    from ablate.data import prepare
    from ablate.train import TrainerSettings, train
    from bench.train import bare_loop, trial_for

    if part.gpu:
        d, context, batch, steps, pairs, seconds, precision, layers = 512, 512, 16, 100, 2, 20.0, "bf16", 8
    else:
        d, context, batch, precision, layers = 64, 128, 8, "fp32", 2
        steps, pairs, seconds = (12, 1, 6.0) if part.quick else (40, 2, 20.0)
    device = part.device.type

    def make(arch: str, budget: dict[str, Any]) -> Any:
        return trial_for(arch, budget, d, context, batch, precision).model_copy(update={"layers": layers})

    first = make("llama", {"steps": steps})
    prepare(first.dataset, first.tokenizer, first.context, part.work, progress=False)  # the cache, once
    for arch in ("llama", "mixer"):
        if not part.has_time(f"{arch} trainer vs bare loop", 30 if part.gpu else 10):
            continue
        t = make(arch, {"steps": steps})
        measured = []
        for i in range(pairs):  # interleaved, alternating which side goes first: the machine drifts
            run = lambda: train(t, TrainerSettings(artifacts=part.work, progress=False, resume=False,  # noqa: E731
                                                   checkpoint_every=1e9, device=device))["tokens_per_second"]
            bare = lambda: bare_loop(t, part.work, steps, part.device)  # noqa: E731
            if i % 2 == 0:
                a = run()
                b = bare()
            else:
                b = bare()
                a = run()
            measured.append((a, b))
        ratios = [a / b for a, b in measured]
        part.row(what="trainer vs bare loop", arch=arch, d_model=d, layers=layers, precision=precision, compile=False,
                 steps=steps, pairs=pairs, trainer_tok_s=statistics.median(a for a, _ in measured),
                 bare_tok_s=statistics.median(b for _, b in measured), ratio=statistics.median(ratios),
                 ratio_range=[min(ratios), max(ratios)])
        part.free()
    for arch in ("llama", "mixer"):
        if not part.has_time(f"{arch} budget share", seconds + (25 if part.gpu else 10)):
            continue
        t = make(arch, {"wall_clock": f"{seconds:g}s"})
        t0 = time.perf_counter()
        out = train(t, TrainerSettings(artifacts=part.work, progress=False, resume=False, checkpoint_every=seconds / 3,
                                       device=device))
        wall = time.perf_counter() - t0
        meters = (out.get("notes") or {}).get("meters") or {}
        part.row(what="budget share", arch=arch, d_model=d, layers=layers, budget_s=seconds,
                 clock_s=out["train_seconds"], wall_s=wall, share=out["train_seconds"] / wall, steps=out["steps"],
                 off_clock={k: round(v, 3) for k, v in sorted(meters.items()) if k != "data" and v},
                 data_wait=out["data_wait_fraction"], mfu=out["mfu"])
        part.free()


# ---------------------------------------------------------------- memory


def memory(part: Part) -> None:
    """One unbatched forward+backward of the hidden states (no LM head), mixer vs Llama, by layers and context."""
    from bench.suite import _probe, trial

    if part.gpu:
        d, layer_list, contexts, heads = 1024, [4, 8, 16], [512, 1024, 2048, 4096], 16
    else:
        d, heads = 128, 4
        layer_list, contexts = ([1, 2], [128, 256]) if part.quick else ([2, 4], [128, 256, 512, 1024])
        part.skip("the 12 GB (RTX 3060) OOM column", "CUDA only; on CPU a cell is parameter + gradient + saved-"
                  "activation bytes")
    cap_mb = 12 * 1024
    for arch in ("mixer", "llama"):
        for layers in layer_list:
            if not part.has_time(f"{arch} {layers} layers", 15 if part.gpu else 5):
                continue
            row: dict[str, Any] = {"arch": arch, "d_model": d, "layers": layers}
            for ctx in contexts:
                row[str(ctx)] = _probe(trial(arch, d, layers, ctx, 1, heads=heads), part.device)
            if part.gpu:
                row["OOM at 12 GB from"] = next((c for c in contexts if row[str(c)] == "OOM" or row[str(c)] > cap_mb),
                                                None)
            part.row(**row)
            part.free()


# ---------------------------------------------------------------- profile


def profile(part: Part) -> None:
    """torch.profiler over five steps of the slowest architecture's training step (the throughput part's size):
    the operators that cost most, by their own time on the device (CUDA) or the CPU."""
    from torch.profiler import ProfilerActivity, profile as profiler

    from ablate import models
    from bench.suite import VOCAB, training_step, trial

    arch = part.arch or "llama"
    options = dict(ARCHS)[arch]
    d, layers, context, batch = (1024, 8, 512, 32) if part.gpu else (64, 2, 128, 8)
    t = trial(arch, d, layers, context, batch, heads=16 if part.gpu else 4, **options)
    step = training_step(models.build(t, VOCAB).to(part.device), t, part.device)
    for _ in range(3):
        step()
    sync = torch.cuda.synchronize if part.gpu else (lambda: None)
    sync()
    steps = 5
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if part.gpu else [])
    with profiler(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync()
    events = prof.key_averages()
    self_time = (lambda e: getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)) \
        if part.gpu else (lambda e: e.self_cpu_time_total)
    total = sum(self_time(e) for e in events) or 1.0
    part.note(f"{arch} at d {d}, {layers} layers, context {context}, batch {batch}, bf16 autocast "
              f"{'on' if part.gpu else 'off'}, uncompiled; {steps} steps; times are each operator's own "
              f"{'device' if part.gpu else 'CPU'} time")
    for e in sorted(events, key=self_time, reverse=True)[:12]:
        part.row(arch=arch, op=e.key, calls=e.count, ms_per_step=self_time(e) / 1000 / steps,
                 share=self_time(e) / total)


def main() -> int:
    from bench.gpu_fused import fused
    from bench.gpu_orderings import orderings

    parts = {"env": env, "tests": tests, "throughput": throughput, "trainer": trainer, "memory": memory,
             "fused": fused, "orderings": orderings, "profile": profile}
    p = argparse.ArgumentParser(prog="python -m bench.gpu_parts")
    p.add_argument("name", choices=list(parts))
    p.add_argument("--rows", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--deadline", type=float, required=True)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--arch", default=None)
    args = p.parse_args()
    part = Part(args)
    try:
        parts[args.name](part)
    except BaseException as exc:  # noqa: BLE001 - the part's error is a result too; the run goes on with the next
        import traceback

        traceback.print_exc()
        part._say("error", f"{type(exc).__name__}: {exc}"[:1000])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
