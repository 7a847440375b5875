"""A big sweep's study kept in the results DB while it trains, for the dashboard (results/study.py says why).

The sweep flow of a sweep of KEEP_RUNS runs or more starts a StudyKeeper beside its trials: a thread that wakes
every few seconds, reads the study's key (one aggregate query), and when runs started or finished since the study
it kept last, reads the runs that changed (results/liveviews.py), computes the study and keeps it. Computing it
over 10,000 runs costs about 0.4 CPU-s of statistics, so the thread waits at least SHARE_WAIT times what its last
computation cost: it takes at most 1/SHARE_WAIT of one core from the trainers. At the sweep's end `keep_final`
keeps it once more (not after the user stopped the sweep: that stop is bounded). A failure to keep it is a warning
line, never the sweep's failure: the dashboard computes the study itself.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import sqlalchemy as sa

from ablate import store

EVERY = 5.0  # seconds between two looks at the study's key
SHARE_WAIT = 20.0  # after a computation, wait at least this many times its CPU time (5% of a core at most)


class StudyKeeper:
    """The study of sweep `name` kept as its runs start and finish, until `stop()`."""

    def __init__(self, engine: sa.Engine, name: str, sweep_id: int, log: Any) -> None:
        from ablate.results.liveviews import LiveViews

        self.engine, self.name, self.sweep_id, self.log = engine, name, sweep_id, log
        self.live = LiveViews(name)
        self.kept_key: str | None = None
        self.kept = 0  # studies kept
        self.cpu = 0.0  # CPU seconds they cost this thread
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def start_for(cls, engine: sa.Engine, name: str, log: Any) -> StudyKeeper | None:
        """A running keeper for a sweep of KEEP_RUNS runs or more; None for a smaller one (or when its runs cannot
        be counted: said, and the sweep goes on)."""
        from ablate.results.study import KEEP_RUNS

        try:
            sweep_id, runs = _runs_of(engine, name)
            if runs < KEEP_RUNS:
                return None
        except Exception as exc:  # noqa: BLE001 - derived data: never the sweep's failure
            _warn(log, name, exc)
            return None
        keeper = cls(engine, name, sweep_id, log)
        keeper._thread = threading.Thread(target=keeper._loop, name=f"study keeper of {name}", daemon=True)
        keeper._thread.start()
        return keeper

    def _loop(self) -> None:
        from ablate import runner

        wait = EVERY
        while not self._stop.wait(wait):
            if runner.STOP.is_set():
                return
            try:
                spent = self.keep()
            except Exception as exc:  # noqa: BLE001 - derived data: the dashboard computes it instead
                _warn(self.log, self.name, exc)
                return
            wait = max(EVERY, SHARE_WAIT * spent)

    def keep(self) -> float:
        """Keep the study if its key moved since the last one kept; the CPU seconds that cost this thread."""
        from ablate.results.study import study, study_code, study_key

        start = time.thread_time()
        key = study_key(self.engine, self.sweep_id)  # read first: a run that finishes meanwhile makes it stale, never wrong
        if key == self.kept_key:
            return time.thread_time() - start
        payload = json.dumps(study(self.engine, self.name, self.live))
        store.keep_study(self.engine, self.sweep_id, key, study_code(), payload)
        self.kept_key = key
        self.kept += 1
        spent = time.thread_time() - start
        self.cpu += spent
        return spent

    def stop(self) -> None:
        """Stop the thread; it ends its computation first, if one is under way (a second or two at 10,000 runs)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)


def keep_final(log: Any, engine: sa.Engine, name: str, keeper: StudyKeeper | None = None) -> None:
    """A big sweep's study kept at its end (by `keeper`'s views, which read only the runs that changed), unless the
    user stopped the sweep; a failure to keep it is said, and is never the sweep's."""
    from ablate import runner
    from ablate.results.study import KEEP_RUNS

    if runner.STOP.is_set():
        return
    try:
        sweep_id, runs = _runs_of(engine, name)
        if runs < KEEP_RUNS:
            return
        keeper = keeper or StudyKeeper(engine, name, sweep_id, log)
        keeper.keep()
    except Exception as exc:  # noqa: BLE001 - derived data: the dashboard computes it instead
        _warn(log, name, exc)
        return
    log.info("sweep %s: its study kept for the dashboard (%s runs; kept %d times as it trained and at its end, %.1f CPU-s in all)",
             name, f"{runs:,}", keeper.kept, keeper.cpu)


def _runs_of(engine: sa.Engine, name: str) -> tuple[int, int]:
    """The sweep's id and its number of runs."""
    from ablate.runner.sweep import sweep_id

    sid = sweep_id(engine, name)
    with engine.connect() as conn:
        return sid, conn.execute(sa.select(sa.func.count()).where(store.Run.sweep_id == sid)).scalar() or 0


def _warn(log: Any, name: str, exc: BaseException) -> None:
    log.warning("sweep %s: its study was not kept for the dashboard (%s: %s); the dashboard computes it",
                name, type(exc).__name__, (str(exc).splitlines() or [""])[0][:300])
