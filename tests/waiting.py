"""Waits that adapt to a busy machine, and timeouts that say when it was busy.

A wait written as N seconds lasts N x ABLATE_TEST_TIME_SCALE (default 1) x the load per core beyond 1, read
again at every check: on a 2-core box at load 20 a 120 s wait may take 20 minutes before it fails, and a
timeout prints the load average, so that "the machine was busy" is told apart from a bug. No assertion about
what the code does is weakened: only how long the suite waits for it.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

SCALE_ENV = "ABLATE_TEST_TIME_SCALE"


def scale(load: float | None = None, cores: int | None = None, setting: str | None = None) -> float:
    """How many times longer than written a wait may last now."""
    setting = os.environ.get(SCALE_ENV) if setting is None else setting
    try:
        base = float(setting) if setting else 1.0
    except ValueError:
        raise ValueError(f"{SCALE_ENV}={setting!r} is not a number; e.g. {SCALE_ENV}=3 waits three times longer") from None
    load = os.getloadavg()[0] if load is None else load
    cores = (os.cpu_count() or 1) if cores is None else cores
    return max(base, 0.01) * max(1.0, load / cores)


def patience(seconds: float) -> float:
    """`seconds`, scaled for this machine now (for a timeout handed to a library or a subprocess)."""
    return seconds * scale()


def busy(what: str, waited: float, load: tuple[float, float, float] | None = None, cores: int | None = None) -> str:
    """`what` went wrong after `waited` seconds, with the load average; on a busy machine, says so."""
    load1, load5, _ = os.getloadavg() if load is None else load
    cores = (os.cpu_count() or 1) if cores is None else cores
    note = f"{what} (after {waited:.0f} s; load average {load1:.1f}, {load5:.1f} over 5 min, on {cores} cores"
    if max(load1, load5) > cores:
        note += f": the machine was busy, which may be all that is wrong; {SCALE_ENV}=N waits N times longer"
    return note + ")"


def wait_until(predicate: Callable[[], Any], seconds: float, what: str, every: float = 0.2) -> Any:
    """Poll `predicate` until it returns something true (returned); fail with `busy(what)` once `seconds`,
    scaled by the machine's load as it goes, have passed."""
    start = time.monotonic()
    limit = seconds * scale()
    while not (value := predicate()):
        waited = time.monotonic() - start
        limit = max(limit, seconds * scale())
        if waited > limit:
            raise AssertionError(busy(what, waited))
        time.sleep(every)
    return value


class Deadline:
    """A wait of `seconds` for a loop that checks more than one thing, scaled like `wait_until` at every check:
    `deadline = Deadline(240)`, then `deadline.check(what)` in the loop (or `deadline.passed()`)."""

    def __init__(self, seconds: float):
        self.seconds, self.start = seconds, time.monotonic()
        self.limit = seconds * scale()

    def passed(self) -> bool:
        self.limit = max(self.limit, self.seconds * scale())
        return time.monotonic() - self.start > self.limit

    def check(self, what: Any) -> None:
        """Fail with `busy(what)` once the (scaled) wait is over."""
        if self.passed():
            raise AssertionError(busy(str(what), time.monotonic() - self.start))
