"""SIGTERM inside a trainer: checkpoint at the next step once training runs; before that, stop at once.

Before training begins (data, model, the untimed warm-up with its compile: minutes on a GPU) there is
nothing to save, so the handler raises `Stopped` wherever the main thread is. Library code can delay that:
a handler runs only when the main thread is back in Python, and compile code may catch or outlive the
exception. So the signal also wakes a watcher thread (through `signal.set_wakeup_fd`, which the C-level
handler writes even while the Python handler waits): if the trainer is still in its start-up `grace`
seconds later, the watcher records the stopped run itself and ends the process. Once training runs, the
step loop sees `flag` at its next step and checkpoints; the runner's SIGKILL after its own grace bounds that.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Callable

from ablate.config.settings import environment


class Stopped(BaseException):
    """SIGTERM before training began (not an Exception: no handler of errors catches it)."""


class StopSignal:
    """The trainer's SIGTERM state: `flag` (a stop was asked), `training` (the step loop checks `flag`)."""

    def __init__(self, grace: float | None = None):
        self.flag = False
        self.training = False
        self.grace = environment().stop_grace_seconds if grace is None else grace  # as the trainer starts
        self._ending = False  # the main thread is ending start-up: a second SIGTERM must not interrupt that
        self._phase = threading.Lock()  # held by whoever ends the start-up phase: the main thread or the watcher
        self._on_hard_stop: Callable[[], Any] | None = None
        self._previous: Any = None
        self._wakeup: tuple[int, int] | None = None
        self._old_wakeup_fd = -1

    def install(self, on_hard_stop: Callable[[], Any]) -> None:
        """Take SIGTERM (main thread only); `on_hard_stop` records the stopped run if the watcher has to end it."""
        if threading.current_thread() is not threading.main_thread():
            return
        self._on_hard_stop = on_hard_stop
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        r, w = os.pipe()
        os.set_blocking(w, False)
        self._wakeup = (r, w)
        self._old_wakeup_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(r,), name="stop-watch", daemon=True).start()

    def uninstall(self) -> None:
        if self._wakeup is None:
            return
        signal.signal(signal.SIGTERM, self._previous)
        signal.set_wakeup_fd(self._old_wakeup_fd)
        os.close(self._wakeup[1])  # the watcher's read returns b"": it ends
        self._wakeup = None

    def _handle(self, *_: Any) -> None:
        self.flag = True
        if not self.training and not self._ending:
            raise Stopped()

    def begin_training(self) -> None:
        """From here the step loop sees `flag` (and checkpoints). Raises `Stopped` if a SIGTERM came during
        start-up but its handler's exception never arrived (held back or swallowed by compile code); blocks
        forever if the watcher is ending the process."""
        with self._phase:
            if self.flag:
                raise Stopped()
            self.training = True

    def end_startup(self) -> None:
        """The main thread stops during start-up: the watcher must not record the run a second time. Never
        released: the process ends after this."""
        self._ending = True
        self._phase.acquire()

    def _watch(self, fd: int) -> None:
        try:
            while True:
                data = os.read(fd, 64)
                if not data:
                    return  # uninstalled
                if signal.SIGTERM in data:
                    break
        except OSError:
            return
        finally:
            os.close(fd)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline:
            time.sleep(0.1)
            if self.training:
                return
        if not self._phase.acquire(blocking=False):
            return  # the main thread is ending start-up itself (or began training)
        if self.training:
            self._phase.release()
            return
        try:
            if self._on_hard_stop is not None:
                self._on_hard_stop()
        finally:
            print(f"stopped {self.grace:.0f} s after SIGTERM, still inside start-up (compile, warm-up): nothing "
                  "trained yet, nothing to save", flush=True)
            os._exit(128 + signal.SIGTERM)
