"""The budget clock, the learning-rate schedule and FLOP accounting: what makes runs comparable.

The clock counts only training steps (data, forward, backward, optimizer). Start-up, compile,
warm-up, eval and checkpointing are timed on separate meters. The schedule is a function of the
fraction of budget consumed, so every run finishes its schedule exactly at its budget.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig

# Dense bf16/fp16 tensor-core peaks (FLOP/s, fp32 accumulate) by a substring of the device name.
PEAK_FLOPS: dict[str, float] = {
    "H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12, "A10": 125e12,
    "V100": 125e12, "T4": 65e12, "RTX 4090": 165e12, "RTX 3090": 71e12, "RTX 3060": 25.6e12,
}


def peak_flops(device_name: str | None) -> float | None:
    if not device_name:
        return None
    for key, value in PEAK_FLOPS.items():
        if key.lower() in device_name.lower():
            return value
    return None


def train_flops_per_token(non_embedding_params: int, mixing_flops_per_token: float) -> float:
    """6N + 3 x (token-mixing forward FLOPs): the same convention for every architecture.

    N counts every parameter except the input embedding (a lookup, no FLOPs); the LM head is
    included. Token mixing (attention scores and values, the mixer's sequence matmul) is the
    part of the forward not covered by 2N; backward costs twice the forward, hence 3x.
    """
    return 6.0 * non_embedding_params + 3.0 * mixing_flops_per_token


class Clock:
    """A stopwatch that counts only while running; `sync` makes GPU work finish at each edge."""

    def __init__(self, sync: Callable[[], None] = lambda: None, elapsed: float = 0.0):
        self.sync = sync
        self.elapsed_before = elapsed
        self.started_at: float | None = None
        self.meters: dict[str, float] = defaultdict(float)

    def start(self) -> None:
        if self.started_at is None:
            self.sync()
            self.started_at = time.perf_counter()

    def stop(self) -> None:
        if self.started_at is not None:
            self.sync()
            self.elapsed_before += time.perf_counter() - self.started_at
            self.started_at = None

    @property
    def is_running(self) -> bool:
        return self.started_at is not None

    def elapsed(self) -> float:
        """Seconds on the clock (host time: no device sync between edges)."""
        running = time.perf_counter() - self.started_at if self.started_at is not None else 0.0
        return self.elapsed_before + running

    @contextmanager
    def metered(self, meter: str) -> Iterator[None]:
        """Time the block on `meter` with the budget clock running through it (the block is charged to the budget)."""
        if self.is_running:
            self.sync()  # the meter holds the block's own device work, not the steps queued before it
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.is_running:
                self.sync()
            self.meters[meter] += time.perf_counter() - t0

    def timed(self, meter: str, charged: bool | None) -> AbstractContextManager[None]:
        """`metered` when the block is charged to the budget, else `paused`."""
        return self.metered(meter) if charged else self.paused(meter)

    @contextmanager
    def paused(self, meter: str) -> Iterator[None]:
        """Stop the budget clock, time the block on `meter`, then restart the clock."""
        was_running = self.is_running
        self.stop()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.meters[meter] += time.perf_counter() - t0
            if was_running:
                self.start()


def budget_fraction(kind: str, amount: float, seconds: float, steps: int, tokens: int, flops_per_token: float) -> float:
    """The fraction of the budget consumed so far (may exceed 1 by the last step)."""
    used = {"wall_clock": seconds, "steps": steps, "tokens": tokens, "flops": tokens * flops_per_token}[kind]
    return used / amount


def lr_at(position: float, peak: float, schedule: str, warmup: float, cooldown: float = 0.2,
          ramp: float | None = None) -> float:
    """Learning rate at a position along the schedule (0..1): linear warm-up, then linear / cosine / wsd / constant.

    The position is the budget fraction, or the fraction of the trial's `horizon` (steps, tokens, epochs); past
    1 the schedule stays at its end (0 for linear and cosine). `warmup` is the warm-up's share of the schedule;
    `ramp` (0..1), when given, is a warm-up counted in steps instead (step / warmup_steps), and `warmup` is then
    where it ends on the position axis (0 if unknown). Linear with ramp = step / W and warmup = W / H is HF's
    get_linear_schedule_with_warmup exactly: step / W, then (H - step) / (H - W).
    `wsd` (warmup-stable-decay) holds the peak and decays linearly to zero over the last `cooldown` fraction.
    """
    f = min(max(position, 0.0), 1.0)
    if ramp is not None:
        if ramp < 1.0:
            return peak * max(ramp, 0.0)
    elif warmup > 0 and f < warmup:
        return peak * (f / warmup)
    if schedule == "constant":
        return peak
    progress = min(max((f - warmup) / max(1.0 - warmup, 1e-12), 0.0), 1.0)
    if schedule == "linear":
        return peak * (1.0 - progress)
    if schedule == "cosine":
        return peak * 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "wsd":
        start = 1.0 - cooldown
        return peak if f < start else peak * (1.0 - (f - start) / cooldown)
    raise ValueError(f"unknown schedule {schedule!r}")


def schedule_position(trial: TrialConfig) -> Callable[[float, int, int, int, int | None], float]:
    """Where a trial stands along its schedule (0..1, past 1 after its end) as a function of (budget fraction,
    step, tokens, samples, rows): the fraction of its `horizon` (steps, tokens or epochs), else of its budget."""
    h = trial.horizon
    if h is not None and h.tokens is not None:
        from ablate.config import parse_count

        horizon_tokens = parse_count(h.tokens)

    def position(budget_fraction: float, step: int, tokens: int, samples: int, rows: int | None) -> float:
        if h is None:
            return budget_fraction
        if h.steps is not None:
            return step / h.steps
        if h.tokens is not None:
            return tokens / horizon_tokens
        return samples / (h.epochs * rows) if rows else budget_fraction

    return position


def schedule(trial: TrialConfig) -> Callable[[float, int, int, int, int | None], float]:
    """A trial's learning rate as a function of (budget fraction, step, tokens, samples, rows): its schedule over
    its horizon (else the budget), its warm-up in steps or as a fraction. Settings are read once, here.

    A warm-up in steps ends where the decay starts, at the peak, as HF's schedule does: over a horizon in steps at
    W / H; over one in epochs or tokens at the position step W reached, f * W / step (exact for epochs, whose
    position grows by one global batch a step; for tokens, at the mean tokens per step so far). Over the budget
    the decay starts at 0 (the clock's position of step W is not known in advance)."""
    h, peak, kind, warmup_steps = trial.horizon, trial.lr, trial.schedule, trial.warmup_steps
    position = schedule_position(trial)
    in_steps = h is not None and h.steps is not None
    along_work = h is not None and not in_steps  # epochs or tokens
    ends = min(warmup_steps / h.steps, 0.999) if (warmup_steps and in_steps) else 0.0

    def at(budget_fraction: float, step: int, tokens: int, samples: int, rows: int | None) -> float:
        f = position(budget_fraction, step, tokens, samples, rows)
        if warmup_steps is None:
            return lr_at(f, peak, kind, trial.warmup)
        start = min(f * warmup_steps / step, 0.999) if (along_work and warmup_steps and step) else ends
        return lr_at(f, peak, kind, start, ramp=step / warmup_steps if warmup_steps else 1.0)

    return at


def summarize_meters(clock: Clock) -> dict[str, Any]:
    return {k: round(v, 4) for k, v in clock.meters.items()}


CHECKPOINT_MIN_SECONDS = 30.0
CHECKPOINT_MAX_SECONDS = 600.0


def checkpoint_interval(every: float | None, elapsed: float, fraction: float) -> float:
    """Seconds of wall time between checkpoints: `every` when given; else a tenth of the run's expected
    training time (estimated from the budget used so far), between 30 s and 10 min, so a killed run loses
    at most a tenth of its budget and a long one does not spend its time writing checkpoints."""
    if every:
        return every
    if fraction < 0.01 or elapsed <= 0:
        return CHECKPOINT_MAX_SECONDS
    return min(CHECKPOINT_MAX_SECONDS, max(CHECKPOINT_MIN_SECONDS, elapsed / fraction / 10))
