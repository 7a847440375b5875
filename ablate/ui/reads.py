"""What the dashboard's run page reads: one run's row, error and log tail (the study page reads
ablate/results/study.py); and the drained hosts of a sweep's pool, which its sweep page says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa

from ablate import store
from ablate.config.errors import AblateError

LOG_TAIL = 200  # lines of a run's log on its page
HOSTS_EVERY = 15.0  # seconds: the drained hosts (a Prefect API call of up to 3 s) are asked at most this often


def run(engine: sa.Engine, run_id: int, artifacts: Path | None) -> dict[str, Any]:
    """A run's page: its row (config, timings, losses), error and the tail of its log."""
    with engine.connect() as conn:
        row = conn.execute(sa.select(store.Run.__table__, store.Sweep.name.label("sweep_name"))
                           .join(store.Sweep, store.Sweep.id == store.Run.sweep_id).where(store.Run.id == run_id)).first()
    if row is None:
        raise AblateError(f"no run with id {run_id} in the results DB")
    run = row._mapping
    skip = {"config", "options", "error", "library_versions", "notes", "pid", "claimed_by"}
    fields = {c.key: plain(run[c.key]) for c in store.Run.__table__.columns if c.key not in skip}
    log, log_path = log_tail(engine, run_id, artifacts)
    return {"sweep": run["sweep_name"], "fields": fields, "config": run["config"], "error": run["error"] or "",
            "notes": run["notes"], "log": log, "log_path": log_path}


def plain(v: Any) -> Any:
    return v.isoformat(" ", "seconds") if hasattr(v, "isoformat") else v


def log_tail(engine: sa.Engine, run_id: int, artifacts: Path | None) -> tuple[str, str]:
    """The last LOG_TAIL lines of the run's log under the artifacts folder (where this host's runner wrote it)."""
    if artifacts is None:
        return "", ""
    path = artifacts / "logs" / store.database_id(engine)[:16] / f"run-{run_id}.log"
    if not path.is_file():
        return "", str(path)
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - 256 * 1024))
        lines = f.read().decode("utf-8", "replace").splitlines()
    return "\n".join(lines[-LOG_TAIL:]), str(path)


class Drained:
    """A sweep's pool's drained hosts, as `ablate sweep status` says them (flows/health.py), asked of the Prefect API
    at PREFECT_API_URL at most every HOSTS_EVERY seconds a sweep; none without one."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.asked: dict[str, tuple[float, list[str]]] = {}  # sweep -> (when asked, its lines)

    def __call__(self, sweep: str) -> list[str]:
        import os
        import time

        if not os.environ.get("PREFECT_API_URL"):
            return []
        asked, lines = self.asked.get(sweep, (-HOSTS_EVERY, []))
        if time.monotonic() - asked >= HOSTS_EVERY:
            try:
                from flows.health import drained_of_sweep
            except ImportError:  # ablate without its flows (a reader's install)
                return []
            lines = drained_of_sweep(self.engine, sweep)
            self.asked[sweep] = (time.monotonic(), lines)
        return lines
