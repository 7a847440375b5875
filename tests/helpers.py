"""Helpers several test folders share (a sweep file of a small grid, a CLI subprocess's environment,
calls released at once)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import yaml

from tests.waiting import patience


REPO = Path(__file__).resolve().parent.parent


def grid_spec(tmp_path: Path, name: str = "claims", d_models=(32, 48, 64), steps: int = 20) -> Path:
    data = {
        "name": name,
        "dataset": {"source": "ablate:tinystories-sample", "eval": {"holdout": 16}, "packing": "pad"},
        "tokenizer": {"vocab_size": 384},
        "budget": {"steps": steps, "hardware": "cpu"},
        "eval": {"at": [0.5]},
        "defaults": {"architecture": "mixer", "layers": 1, "context": 64, "batch_size": 8, "lr": 3e-3,
                     "precision": "fp32"},
        "grid": [{"d_model": list(d_models)}],
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ABLATE_DB_URL"}
    return {**env, "PYTHONPATH": str(REPO), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": str(int(patience(120))),
            **extra}


def at_once(fn, n: int) -> tuple[list, list[Exception]]:
    """Call `fn(i)` from n threads released together; (results, errors)."""
    barrier = threading.Barrier(n)
    results, errors = [], []

    def one(i: int) -> None:
        barrier.wait()
        try:
            results.append(fn(i))
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


_ONE_SEED: list[Path] = []


def one_seed_smoke() -> Path:
    """sweeps/smoke.yaml with one seed per cell (4 trials, the same name and budget): the DB, CLI and runner tests
    count and list its runs; the smoke sweep's 3 seeds are the report's business. Written once per session."""
    if not _ONE_SEED:
        import tempfile

        data = yaml.safe_load((REPO / "sweeps" / "smoke.yaml").read_text())
        for block in data["grid"]:
            block.pop("seeds", None)
        path = Path(tempfile.mkdtemp(prefix="ablate-smoke-")) / "smoke.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        _ONE_SEED.append(path)
    return _ONE_SEED[0]


def copy_results(source: str, target: str, skip: tuple[str, ...] = ()) -> None:
    """Every row of the results DB at `source` into the one at `target` (migrated, empty), ids kept, but the tables
    in `skip`: what a study read on one engine would be on another."""
    import sqlalchemy as sa

    from ablate import store

    src, dst = store.connect(source), store.connect(target)
    tables = [t for t in store.Base.metadata.sorted_tables if t.name not in (*skip, "ablate_meta")]
    with src.connect() as read, dst.begin() as write:
        for table in tables:
            rows = [dict(r._mapping) for r in read.execute(sa.select(table))]
            if rows:
                write.execute(sa.insert(table), rows)
            if dst.dialect.name == "postgresql" and "id" in table.c and rows:  # the next id after the copied ones
                write.execute(sa.text(f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), "
                                      f"(SELECT max(id) FROM {table.name}))"))
