"""The node check's `orderings` part: the studies' claims at a reduced budget, through the real trainer processes and
a SQLite results DB, with the report's verdicts (bench/gpu-studies.yaml; at CPU sizes with --quick or no GPU)."""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

SPEC = Path(__file__).resolve().parent / "gpu-studies.yaml"
AT_ONCE_GPU = 4  # trainers sharing the GPU: their start-up (imports, model build) overlaps the others' steps
CPU_SIZES = {256: 32, 512: 64}  # d_model at CPU sizes (heads 16 and 4 still divide them into even head sizes)


def cpu_spec(data: dict[str, Any], quick: bool) -> dict[str, Any]:
    """The same grid and claims at sizes a 2-core CPU trains in seconds."""
    data = {**data, "name": data["name"] + "-cpu", "recipe": "modern",
            "dataset": {"source": "ablate:tinystories-sample", "eval": {"holdout": 24}, "packing": "pad"},
            "tokenizer": {"vocab_size": 384}, "budget": {"steps": 20 if quick else 60, "hardware": "cpu"},
            "defaults": {**data["defaults"], "layers": 1, "context": 64, "precision": "fp32"},
            "report": {**data["report"], "min_steps": 10}}
    small = lambda d: [CPU_SIZES[x] for x in d] if isinstance(d, list) else CPU_SIZES[d]  # noqa: E731
    data["grid"] = [{**block, "d_model": small(block["d_model"]), "lr": 3e-3, "batch_size": 8}
                    for block in data["grid"]]
    data["report"]["orderings"] = [{**o, "better": _small(o["better"]), "worse": _small(o["worse"])}
                                   for o in data["report"]["orderings"]]
    return data


def _small(match: dict[str, Any]) -> dict[str, Any]:
    return {k: CPU_SIZES.get(v, v) if k == "d_model" else v for k, v in match.items()}


def orderings(part: Any) -> None:
    from ablate import runner

    data = yaml.safe_load(SPEC.read_text())
    if not part.gpu:
        data = cpu_spec(data, part.quick)
        part.note("at CPU sizes (d 32 / 64, 1 layer, context 64, fp32) on the 221-story sample: a check of the "
                  "machinery, whose losses say nothing of the studies")
    spec = part.work / f"{data['name']}.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    url = f"sqlite:///{part.work / 'orderings.db'}"
    artifacts = part.work / "artifacts"
    parsed, _, ids = runner.register(spec, url, artifacts=artifacts, say=print)  # the token cache built first
    at_once = AT_ONCE_GPU if part.gpu else 2
    threads = max(1, runner.host_cores() // at_once)
    opts = runner.LaunchOptions(db_url=url, artifacts=artifacts, threads=threads)
    longest = [40.0 if part.gpu else 8.0]  # one trainer, start to end: a guess until the first ones have ended

    def one(run_id: int) -> str:
        if part.left() < longest[0]:  # a run started now would still train when the part must end
            part.skip(f"run {run_id}", f"out of time ({part.left():.0f} s left, a run takes about {longest[0]:.0f})")
            return "skipped"
        t0 = time.monotonic()
        status = runner.run_trial(run_id, opts)
        longest[0] = max(longest[0], time.monotonic() - t0)
        return status

    with ThreadPoolExecutor(at_once) as pool:
        list(pool.map(one, ids))
    _rows(part, parsed.name, url)


def _rows(part: Any, name: str, url: str) -> None:
    """The runs, then each claim with the report's verdict."""
    from ablate import results

    columns = ("id", "architecture", "d_model", "heads", "seed", "status", "steps", "tokens", "final_eval_loss",
               "tokens_per_second", "mfu", "precision", "peak_memory_mb", "train_seconds", "startup_seconds",
               "device_name", "error")
    for run in results.runs(name, url).to_dict("records"):
        notes = json.loads(run["notes"]) if isinstance(run.get("notes"), str) else (run.get("notes") or {})
        # MFU counts real tokens: beside it, the share of the trained positions that were real (not padding)
        part.row(kind="run", **{c: _plain(run.get(c)) for c in columns}, real_tokens=notes.get("real_token_share"))
    for claim in results.claims(name, url).to_dict("records"):
        part.row(kind="claim", **{k: _plain(v) for k, v in claim.items()})


def _plain(value: Any) -> Any:
    """A JSON value (pandas' NA and NaN become None)."""
    if value is None:
        return None
    try:
        if value != value or (isinstance(value, float) and math.isinf(value)):  # NaN, pandas.NA raises below
            return None
    except TypeError:
        return None
    if hasattr(value, "item"):
        return value.item()
    return value
