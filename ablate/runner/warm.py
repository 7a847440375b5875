"""A warm trainer: one helper process per runner imports torch and the trainer once, then forks a child per trial.

A cold `python -m ablate.train` spends about 2 CPU-s importing before it builds anything (torch, the trainer; the
built-in families are our own modules: none imports transformers' models, which pull in torch._dynamo). Searches
and smoke sweeps run many short trials, so the runner hands each single-process trial to this helper instead (a
plugin family whose build() imports a heavy library names it in its `preload()`, which the helper runs when a trial
of that family first asks, so a sweep without it never pays for it): the forked child starts with every import done
and runs `ablate.train.main` with the trial's arguments, environment, working directory and log file, in its own
session like a cold trainer, so signals, cancellation and outcome classification work unchanged.

The helper never runs a tensor operation (no thread pool is started before a fork) and never touches
CUDA: each forked child initialises CUDA itself, which works only if the helper neither initialised it nor
asked the CUDA runtime anything (torch's default `torch.cuda.is_available()` calls cuInit and poisons every
later fork: "Cannot re-initialize CUDA in forked subprocess"). So the helper runs with
PYTORCH_NVML_BASED_CUDA_CHECK=1 (an import that asks `is_available()` gets NVML's answer, which poisons
nothing), and after its preload it checks both: `torch.cuda.is_initialized()`, and a probe child forked
then asks torch whether it is in a bad fork. Its ready message reports them (`cuda_initialized`,
`cuda_fork_safe`); a helper that fails either is not used (the runner's trainers start cold).

ABLATE_WARM_TRAINER: unset or 1, the helper is used only where no GPU is visible (trainers on GPU hosts stay
cold processes: CUDA after a fork is measured by the node check, tests/gpu/test_cuda_processes.py, not assumed);
`always`, on GPU hosts too; 0, never. Torchrun trials are always cold processes. Protocol: JSON lines,
requests on the helper's stdin, replies and exits on its stdout.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, NoReturn

from ablate.runner import host
from ablate.config.settings import environment

READY_SECONDS = 300.0  # a loaded host may take a while to import torch; past this the runner goes cold
ANSWER_SECONDS = 60.0  # a fork is quick: a helper silent this long after a request is stopped, the trial goes cold


# ---------------------------------------------------------------- the helper process


def _preload() -> None:
    """What every trainer imports before its first step (measured with -X importtime on a tiny trial). A family's
    heavy libraries (a plugin's `preload()`) are loaded when a trial of it first asks (`_load`)."""
    import torch
    import torch.optim  # noqa: F401

    from ablate import models, store  # noqa: F401
    from ablate.config import registry
    from ablate.train import cli, loop  # noqa: F401  - the package face is lazy: the trainer's own modules

    for name in models.families():  # each family's torch module (light), imported lazily by a trainer
        models.family(name)
    for objective in registry.objectives().values():  # and each objective's
        objective.load()


_LOADED: set[str] = set()


def _load(families: list[str]) -> bool:
    """Import what these families' trainers import inside build() (a family's optional `preload()`: no built-in has
    one), once, before forking: each forked trainer of them then has it. Whether any family was new."""
    from ablate import models

    new = [f for f in families if f not in _LOADED]
    for name in new:
        _LOADED.add(name)
        try:
            getattr(models.family(name), "preload", lambda: None)()
        except Exception:  # noqa: BLE001 - an unknown family, a library missing: the forked trainer says which
            continue
    return bool(new)


def _cuda_state() -> dict[str, bool]:
    """Whether this process initialised CUDA, and whether a child forked now could (torch marks a fork after
    a CUDA runtime call as bad: its first CUDA use raises). Asked without touching CUDA; a CPU build says
    False, True."""
    import torch

    initialized = torch.cuda.is_initialized()
    in_bad_fork = getattr(torch.cuda, "_is_in_bad_fork", lambda: False)
    pid = os.fork()
    if pid == 0:  # the probe: answers by its exit code, runs nothing else
        os._exit(1 if in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return {"cuda_initialized": bool(initialized), "cuda_fork_safe": os.waitstatus_to_exitcode(status) == 0}


def threads_now() -> dict[str, Any]:
    """This process's threads, native ones too (a fork is safe only from a single thread), with their names
    (`jemalloc_bg_thd`, say), so a ready message with more than one says which library started it."""
    tasks = Path("/proc/self/task")
    if not tasks.exists():
        return {"threads": threading.active_count(), "thread_names": [t.name for t in threading.enumerate()]}
    names = []
    for task in sorted(os.listdir(tasks)):
        try:
            names.append((tasks / task / "comm").read_text().strip())
        except OSError:  # a thread that ended between the listing and the read
            continue
    return {"threads": len(names), "thread_names": names}


def _child(request: dict[str, Any], protocol_fd: int) -> None:
    """In the forked child: become a cold trainer's equal (own session, log, env, cwd), run it, exit."""
    exit_with(lambda: _train(request, protocol_fd))


def _train(request: dict[str, Any], protocol_fd: int) -> int:
    """The trainer's exit code."""
    os.close(protocol_fd)
    os.setsid()  # its own process group: the runner's SIGTERM/SIGKILL to -pid reach it and only it
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - line-buffered, like PYTHONUNBUFFERED
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    from ablate import train  # its timings are read from this trial's environment as it starts

    sys.argv = ["python -m ablate.train", *request["argv"]]
    return train.main(request["argv"])


def exit_with(body: Callable[[], int]) -> NoReturn:
    """In a forked child: run `body` and end the process with its code (a SystemExit's; 1 for any other exception,
    its traceback on stderr), whatever happens: a fork must never return into its parent's code."""
    code = 1
    try:
        code = body()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - whatever it is, the child ends here
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF)


def serve() -> int:
    """The helper's loop: preload, say ready, then fork on each request and report each child's exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the runner's to handle (it stops the trainers)
    protocol = os.dup(1)
    os.dup2(2, 1)  # anything an import prints goes to stderr, never into the protocol
    _preload()
    out = os.fdopen(protocol, "w", buffering=1)

    def say(message: dict[str, Any]) -> None:
        out.write(json.dumps(message) + "\n")

    say({"ready": os.getpid(), **threads_now(), **_cuda_state()})
    pending = b""
    alive: set[int] = set()
    while True:
        readable, _, _ = select.select([0], [], [], 0.1)
        if readable:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                return 0  # the runner is gone; running children notice it themselves (ABLATE_RUNNER_PID)
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                loaded = _load(request.get("families", []))
                try:
                    pid = os.fork()
                except OSError as exc:
                    say({"id": request["id"], "error": f"fork failed: {exc}"})
                    continue
                if pid == 0:
                    _child(request, protocol)
                alive.add(pid)
                say({"id": request["id"], "pid": pid, **(threads_now() if loaded else {})})
        for pid in list(alive):
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                alive.discard(pid)
                say({"exit": pid, "code": os.waitstatus_to_exitcode(status),
                     "cpu": round(usage.ru_utime + usage.ru_stime, 3)})


# ---------------------------------------------------------------- the runner's side


class Child:
    """A trainer forked by the helper, with the part of `subprocess.Popen` the runner uses."""

    def __init__(self, helper: WarmTrainer, pid: int) -> None:
        self.helper, self.pid = helper, pid
        self.returncode: int | None = None
        self.cpu_seconds: float | None = None  # the child's own CPU time, from the helper's wait4

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode, self.cpu_seconds = self.helper.exit_of(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"warm trainer {self.pid}", timeout)
            self.helper.wait_for_news(0.5 if left is None else min(left, 0.5))
        return self.returncode


def helper_env() -> dict[str, str]:
    """The helper's environment: what keeps it single-threaded and CUDA-free until it forks.

    - numpy's OpenBLAS starts its thread pool at import: one thread (the trainers compute with torch, whose pools
      start in the child; numpy only indexes data).
    - pyarrow's jemalloc starts a background thread at import (`jemalloc_bg_thd`); transformers imports pyarrow
      where pandas or scikit-learn is installed, as on the lent H200 image: the node check found the helper with
      2 threads there. jemalloc reads this variable after its built-in settings.
    - NVML for `torch.cuda.is_available()`: the CUDA runtime's answer would poison every fork (a trainer's own
      environment replaces this one in the child, where CUDA is initialised for real).
    """
    return {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false", **os.environ,
            "PYTHONUNBUFFERED": "1", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}


class WarmTrainer:
    """The runner's handle on its helper process (one per runner process, shared by its threads)."""

    def __init__(self, log: Path | None = None) -> None:
        if log:  # a runner's first trainer may come before its artifacts' logs folder exists
            log.parent.mkdir(parents=True, exist_ok=True)
        err = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - the helper keeps it
        self.proc = subprocess.Popen([sys.executable, "-m", "ablate.runner.warm"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=err, env=helper_env(), start_new_session=True)
        if log:
            err.close()
        self._ids = itertools.count(1)
        self._asked: set[str] = set()
        self._news = threading.Condition()
        self._replies: dict[int, dict[str, Any]] = {}
        self._exits: dict[int, tuple[int, float]] = {}
        self.ready: dict[str, Any] | None = None
        self.dead = False
        self._reader = threading.Thread(target=self._read, name="ablate-warm-trainer", daemon=True)
        self._reader.start()
        with self._news:
            self._news.wait_for(lambda: self.ready is not None or self.dead, timeout=READY_SECONDS)
        if self.ready is None:
            self.close()
            raise RuntimeError("the warm trainer did not start" + (f" (see {log})" if log else ""))
        if self.ready.get("cuda_initialized") or not self.ready.get("cuda_fork_safe", True):
            self.close()  # its children could not use CUDA: every trainer would fail
            raise RuntimeError(f"the warm trainer's imports touched CUDA, so its forks could not use it ({self.ready})")

    def _read(self) -> None:
        try:
            for line in self.proc.stdout:
                message = json.loads(line)
                with self._news:
                    if "ready" in message:
                        self.ready = message
                    elif "exit" in message:
                        self._exits[message["exit"]] = (message["code"], message["cpu"])
                    else:
                        self._replies[message["id"]] = message
                    self._news.notify_all()
        finally:  # the helper exited, or said something unreadable: its children are then watched by pid
            with self._news:
                self.dead = True
                self._news.notify_all()

    def spawn(self, argv: list[str], env: dict[str, str], log: Path, families: tuple[str, ...] = ()) -> Child:
        """Fork a trainer running `python -m ablate.train *argv` with this environment, output appended to `log`;
        `families`: the model families it builds (the helper loads their libraries first, once)."""
        request_id = next(self._ids)
        request = {"id": request_id, "argv": argv, "env": env, "cwd": os.getcwd(), "log": str(log),
                   "families": list(families)}
        # a family asked for the first time is imported before the fork: as long as the helper's own start
        answer = ANSWER_SECONDS if set(families) <= self._asked else READY_SECONDS
        self._asked.update(families)
        with self._news:
            if self.dead:
                raise RuntimeError("the warm trainer has exited")
            try:
                self.proc.stdin.write((json.dumps(request) + "\n").encode())
                self.proc.stdin.flush()
            except OSError as exc:  # it died since (a broken pipe)
                raise RuntimeError(f"the warm trainer has exited ({exc})") from exc
            self._news.wait_for(lambda: request_id in self._replies or self.dead, timeout=answer)
            reply = self._replies.pop(request_id, None)
        if reply is None and not self.dead:
            # a helper that may still fork this trial later must not: the runner starts it cold instead
            self.proc.kill()
            raise RuntimeError(f"the warm trainer did not answer in {answer:.0f} s; stopped it")
        if reply is not None and reply.get("threads", 1) > 1:  # a library it loaded started a thread: forks copy none
            print(f"warning: the warm trainer holds {reply['threads']} threads after loading {', '.join(families)} "
                  f"({reply.get('thread_names')}); its forks may hang on a lock one of them held", file=sys.stderr)
        if reply is None or "pid" not in reply:
            raise RuntimeError((reply or {}).get("error", "the warm trainer has exited"))
        return Child(self, reply["pid"])

    def exit_of(self, pid: int) -> tuple[int | None, float | None]:
        """(exit code, CPU seconds) of a finished child; (None, None) while it runs. If the helper died, its
        children were handed to init: one still alive is waited for, one gone counts as killed (resumable)."""
        with self._news:
            if pid in self._exits:
                return self._exits.pop(pid)
            if not self.dead:
                return None, None
        return (None, None) if host.pid_alive(pid) else (-signal.SIGKILL, None)

    def wait_for_news(self, timeout: float) -> None:
        with self._news:
            self._news.wait(timeout)

    def close(self, grace: float = 10.0) -> None:
        """End the helper: its stdin closed, it exits; killed after `grace` seconds, and reaped either way."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()  # reaped: no zombie left, and its CPU lands in this process's RUSAGE_CHILDREN
        with self._news:  # dead now, not once the reader thread sees the pipe close (`helper()` would hand it out)
            self.dead = True
            self._news.notify_all()


_HELPER: WarmTrainer | None = None
_HELPER_LOCK = threading.Lock()
_FAILED = False
_GPUS: int | None = None


def enabled() -> bool:
    """Whether this host forks trainers from a warm helper: on Linux, unless ABLATE_WARM_TRAINER=0, where no GPU
    is visible (or, with ABLATE_WARM_TRAINER=always, where GPUs are visible too)."""
    mode = environment().warm_trainer
    if not mode or _FAILED:
        return False
    if not sys.platform.startswith("linux"):  # fork after importing torch is unsafe on macOS
        return False
    if mode == "always":
        return True
    global _GPUS
    if _GPUS is None:
        _GPUS = host.visible_gpus()  # nvidia-smi once per process
    return _GPUS == 0


def helper(log: Path | None = None) -> WarmTrainer | None:
    """This process's helper, started on first use; None (the runner goes cold) if it cannot start."""
    global _HELPER, _FAILED
    with _HELPER_LOCK:
        if _HELPER is not None and not _HELPER.dead:
            return _HELPER
        try:
            _HELPER = WarmTrainer(log)
        except (OSError, RuntimeError) as exc:
            _FAILED = True
            print(f"warning: trainers start cold ({exc})", file=sys.stderr)
            return None
        import atexit

        atexit.register(_HELPER.close)
        return _HELPER


if __name__ == "__main__":
    sys.exit(serve())
