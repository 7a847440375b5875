"""The node check's `fused` part: a sweep's small trials fused into one process (ablate/train/fused.py) against the
same trials one after another and K processes packed on the device, at the studies' reduced-budget shapes.

For each shape and group size k: tokens/s per device of the fused group (every member's tokens over the group's
stepping time), of one trial alone (one after another gives the same rate k times over), and of k trainer processes
at once (their tokens over the longest one's stepping time, start-up excluded); and how far each fused member's
final train loss is from its solo run's (the first four seeds). Every trial uncompiled (a fused step is), the
studies' precision on a GPU (bf16), steps budgets. On CPU the same code at CPU sizes: there a step is compute-bound,
so fusing gives nothing; the part runs so that its code is checked where CI runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

GOAL = 4.0  # fused k = 8 at d 256 against one after another, tokens/s per GPU (issue 73: aim 8x)


def fused(part: Any) -> None:
    from ablate.data import prepare
    from ablate.train import TrainerSettings, train
    from ablate.train.fused import train_group
    from bench.train import trial_for

    if part.gpu:
        shapes, groups, (layers, context, batch, steps, precision) = (
            [("mixer", 256), ("llama", 256), ("mixer", 512), ("llama", 512)], (1, 4, 8, 16), (8, 512, 16, 40, "bf16"))
    else:
        shapes = [("mixer", 64), ("llama", 64)] if part.quick else [("mixer", 64), ("llama", 64), ("mixer", 128)]
        groups, (layers, context, batch, steps, precision) = ((1, 2) if part.quick else (1, 2, 4)), (2, 128, 8, 8, "fp32")
    device = part.device.type

    def make(arch: str, d: int, seed: int) -> Any:
        return trial_for(arch, {"steps": steps}, d, context, batch, precision).model_copy(
            update={"layers": layers, "seed": seed})

    def settings() -> Any:
        return TrainerSettings(artifacts=part.work, progress=False, resume=False, checkpoint_every=1e9, device=device)

    first = make("mixer", 64, 0)
    prepare(first.dataset, first.tokenizer, first.context, part.work, progress=False)  # the token cache, once
    for arch, d in shapes:
        if not part.has_time(f"{arch} d {d} solo", 30 if part.gpu else 15):
            continue
        solo = [train(make(arch, d, seed), settings()) for seed in range(min(4, max(groups)))]
        alone = sum(o["tokens"] for o in solo) / sum(o["train_seconds"] for o in solo)
        for k in groups:
            if k == 1 or not part.has_time(f"{arch} d {d} k {k}", (20 + 4 * k) if part.gpu else 10 + 5 * k):
                continue
            row: dict[str, Any] = {"arch": arch, "d_model": d, "layers": layers, "context": context, "batch": batch,
                                   "precision": precision, "k": k, "alone_tok_s": alone}
            try:
                outcomes = train_group([make(arch, d, seed) for seed in range(k)], [settings() for _ in range(k)])
                seconds = max(o["train_seconds"] for o in outcomes)
                row["fused_tok_s"] = sum(o["tokens"] for o in outcomes) / seconds
                row["fused_vs_alone"] = row["fused_tok_s"] / alone
                row["fused"] = all("members" in (o.get("notes") or {}).get("fused", {}) for o in outcomes)
                row["peak_mb"] = max(o["peak_memory_mb"] for o in outcomes)
                worst = max(abs(o["final_train_loss"] - s["final_train_loss"]) / s["final_train_loss"]
                            for o, s in zip(outcomes, solo))
                row["loss_rel_diff"] = f"{worst:.1e}"
            except Exception as exc:  # noqa: BLE001 - a group's failure (out of memory) is a row
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            if part.has_time(f"{arch} d {d} k {k} packed", (30 + 2 * k) if part.gpu else 20 + 5 * k):
                try:
                    row["packed_tok_s"] = packed([make(arch, d, seed) for seed in range(k)], part, device)
                    row["packed_vs_alone"] = row["packed_tok_s"] / alone
                except Exception as exc:  # noqa: BLE001 - k processes out of memory is a row too
                    row["error"] = (row.get("error", "") + f" packed: {type(exc).__name__}: {exc}")[:300]
            part.row(**row)
            part.free()
    part.note(f"steps budgets of {steps}; fused_vs_alone is the fused group's tokens/s over one trial's alone (one "
              f"after another: the same rate k times); goal on a GPU: k = 8 at d 256 >= {GOAL:g}x")


def packed(trials: list[Any], part: Any, device: str) -> float:
    """k trainer processes at once on the device (`python -m ablate.train --config`): their tokens over the longest
    one's stepping time (each measures its own; start-up is not counted)."""
    cmd = [sys.executable, "-m", "ablate.train", "--artifacts", str(part.work), "--no-resume", "--quiet",
           "--checkpoint-every", "1e9", "--device", device]
    if device == "cpu":  # each its share of the cores, as the runner gives trainers at once
        cmd += ["--threads", str(max(1, (os.cpu_count() or 1) // len(trials)))]
    procs = [subprocess.Popen([*cmd, "--config", t.model_dump_json()], stdout=subprocess.PIPE, text=True)
             for t in trials]
    outs = []
    for p in procs:
        stdout, _ = p.communicate(timeout=max(part.left(), 30))
        if p.returncode != 0:
            raise RuntimeError(f"a packed trainer exited {p.returncode}")
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    return sum(o["tokens"] for o in outs) / max(o["train_seconds"] for o in outs)


def goal_row(rows: list[dict[str, Any]]) -> list[Any] | None:
    """The goal line of results.md: fused k = 8 at d 256 against one after another."""
    found = [r for r in rows if r.get("k") == 8 and r.get("d_model") == 256 and
             isinstance(r.get("fused_vs_alone"), (int, float))]
    if not found:
        return None
    worst = min(r["fused_vs_alone"] for r in found)
    return ["fused k = 8 at d 256, tokens/s per GPU", f">= {GOAL:g}x one after another",
            ", ".join(f"{r['arch']} {r['fused_vs_alone']:.2f}x" for r in found),
            "met" if worst >= GOAL else f"missed ({worst / GOAL:.0%} of the goal)"]
