"""The dashboard's study read again as a sweep's runs finish: what the first read costs (every run read and
validated, the statistics), and a read after `--finish` runs finished with the sweep's views held between reads
(results/liveviews.py: only the changed runs read again; the statistics of the cells whose runs did not change
reused), in CPU seconds of this process.

    python -m bench study_reread --db sqlite:///.../bench.db [--sweep bench-db] [--finish 10] [--rounds 5]

On a copy of a SQLite database that `python -m bench.db --runs 10000 --backends sqlite --keep` filled (the copy is
what the finished runs are written to, and is removed after). Compare two trees side by side by running it from
each with PYTHONPATH pointing at that tree. A script, not a test: it prints measured numbers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", required=True, help="sqlite:///PATH of a filled database (a copy is measured)")
    p.add_argument("--sweep", default="bench-db")
    p.add_argument("--finish", type=int, default=10, help="runs that finish before each read again")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    import sqlalchemy as sa

    from ablate import store
    from ablate.results.liveviews import LiveViews
    from ablate.results.study import study

    if not args.db.startswith("sqlite:///"):
        raise SystemExit("--db: give sqlite:///PATH (the script measures a copy of the file)")
    work = tempfile.mkdtemp(prefix="ablate-bench-reread-")
    copy = os.path.join(work, "copy.db")
    shutil.copy(args.db.removeprefix("sqlite:///"), copy)
    try:
        engine = store.connect(f"sqlite:///{copy}")
        live = LiveViews(args.sweep)
        start = time.process_time()
        study(engine, args.sweep, live)
        first = time.process_time() - start
        r = store.Run
        with engine.connect() as conn:
            ids = conn.execute(sa.select(r.id).where(r.status == "completed").order_by(r.id)).scalars().all()
        costs = []
        for k in range(args.rounds):  # each round: the next runs finish again, with a slightly worse loss
            chosen = ids[k * args.finish:(k + 1) * args.finish]
            with engine.begin() as conn:
                conn.execute(sa.update(r).where(r.id.in_(chosen)).values(
                    finished_at=store.utcnow(), final_eval_loss=r.final_eval_loss + 0.01))
            start = time.process_time()
            study(engine, args.sweep, live)
            costs.append(time.process_time() - start)
            assert live.changed == len(chosen), (live.changed, len(chosen))
        print(f"study of {len(ids):,} completed runs: first read {first:.3f} CPU-s; read again after {args.finish} "
              f"runs finished (median of {args.rounds}): {statistics.median(costs):.3f} CPU-s "
              f"(each: {', '.join(f'{c:.3f}' for c in costs)})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
