"""What the dashboard read, kept per sweep and change token (app.py's Dashboard reads through it)."""

from __future__ import annotations

import threading
import time
from typing import Any


class Cache:
    """Per sweep, what was read at a change token: read again only when the token moved, and (`every`) no sooner
    than that many seconds after the last read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[tuple[str, int], tuple[str, float, Any]] = {}

    def get(self, kind: str, sweep_id: int, token: str, read: Any, every: Any = 0.0) -> Any:
        """`every`: seconds, or a function of the value read that gives them (negative: never reused)."""
        with self._lock:
            hit = self._items.get((kind, sweep_id))
        wait = every(hit[2]) if hit is not None and callable(every) else every
        if hit is not None and wait >= 0 and (hit[0] == token or time.monotonic() - hit[1] < wait):
            return hit[2]
        value = read()
        with self._lock:
            self._items[(kind, sweep_id)] = (token, time.monotonic(), value)
        return value
