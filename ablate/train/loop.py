"""The fixed-budget training loop: one loop for every architecture and objective, in named phases.

    setup      Trainer(...): device, precision, memory cap, seeds; build(): data, model, optimizer; resume()
    warm-up    untimed steps at lr 0 (compile, allocator), then the optimizer and RNGs as they were
    the loop   decide (every rank alike) -> bookkeeping at log/read points -> stop? -> eval and checkpoint
               points (clock paused) -> one training step
    finish     the final eval and checkpoint, and the outcome: one dict of run-row fields (Trainer.finalize)

Outcomes are results, not crashes: the run row ends `completed`, `oom`, `diverged` or `preempted` (SIGTERM:
checkpoint first). A killed run resumes from its last checkpoint and continues the same trajectory.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from ablate.train import budget as bud
from ablate.config import EvalPlan, TrialConfig
from ablate.config.errors import one_line
from ablate.config.settings import environment
from ablate.train.checkpoint import load_checkpoint, rng_state, set_rng_state
from ablate.train.device import check_memory, is_oom
from ablate.train.recorder import PendingLosses
from ablate.train.state import Dist, Progress, TrainerSettings
from ablate.train.stopping import Stopped, StopSignal
from ablate.objectives import base as objectives
from ablate.train.evaluate import evaluate
from ablate.train.optim import shrink
from ablate.train.points import checkpoint, final_train_loss, progress_bar, record_losses
from ablate.train.trainer import Outcome, Trainer


def train(trial: TrialConfig, settings: TrainerSettings, dist_: Dist | None = None) -> Outcome:
    """Train one trial to its budget and record it. Returns the outcome fields written to the run row."""
    t = Trainer(trial, settings, dist_ or Dist())
    if trial.mode == "memory_probe":
        return t.memory_probe()
    t.build()
    t.resume()
    # SIGTERM (a cancel, a stopped sweep, a worker shutting down): checkpoint at the next step once training
    # runs; before that (warm-up, compile: minutes on a GPU) nothing to save: stop at once (ablate/stopping.py)
    stop = StopSignal()
    stop.install(t.stopped)  # nothing trained: no checkpoint; the next attempt starts over
    ended = warm_up(t, stop)
    if ended is not None:
        return ended
    begin(t)
    state = LoopState(t)
    try:
        ended = loop(t, state, stop)
    except Exception as exc:  # recorded, then re-raised for the runner
        t.clock.stop()
        t.finalize("failed", one_line(exc, whole_log()))
        raise
    finally:
        stop.uninstall()
    return ended if ended is not None else finish(t, state)


def whole_log() -> str:
    """Where this trainer's whole output goes: the runner's log for its run, else the terminal that started it."""
    return environment().run_log or "the trainer's stderr"


# ---------------------------------------------------------------- warm-up


def warm_up(t: Trainer, stop: StopSignal) -> Outcome | None:
    """Untimed warm-up steps (compile, allocator) at lr 0, which leaves every weight as it was (AdamW moves a
    weight by lr times its update, decay included); the optimizer's moments, the scaler and the RNGs are reset
    afterwards (a resumed run's from its checkpoint), so they teach the model nothing. A resumed run warms up
    too: its compile is start-up, not training time. No copy of model or optimizer is made. Returns an outcome
    when the run ends here (out of memory, or stopped), else None."""
    t.warmup_seconds = 0.0
    steps = t.settings.warmup_steps
    t0 = time.perf_counter()
    saved_rng = rng_state() if steps > 0 else None
    data_before = t.clock.meters["data"]
    try:
        while steps > 0:
            try:
                for _ in range(steps):
                    t.one_step(0.0)
                    check_memory(t.device, t.settings.memory_cap_mb)
                break
            except Exception as exc:  # OOM during warm-up is a result (or a reason to shrink)
                if not is_oom(exc):
                    raise
                if not shrink(t.trial, t.progress, t.optimizer, t.device):
                    stop.end_startup()
                    stop.uninstall()
                    return t.finish_oom(exc)
        # from here a SIGTERM is seen at the next step, which checkpoints first; one that came during start-up
        # but whose handler ran late (compile code can hold it back, or swallow what it raised) stops here
        stop.begin_training()
    except Stopped:  # nothing trained yet: no checkpoint, the next attempt starts from step 0
        stop.end_startup()
        stop.uninstall()
        return t.stopped()
    if steps > 0:
        _undo_warm_up(t, saved_rng, data_before, t0)
    return None


def _undo_warm_up(t: Trainer, saved_rng: dict[str, Any], data_before: float, t0: float) -> None:
    t.sync()
    if t.resumed:  # the moments and scaler as checkpointed (read again: the warm-up moved them in place)
        saved = load_checkpoint(t.ckpt_path, map_location="cpu")
        t.optimizer.load_state_dict(saved["optimizer"])
        if t.scaler is not None and saved["scaler"] is not None:
            t.scaler.load_state_dict(saved["scaler"])
        del saved
    else:
        t.optimizer.state.clear()  # as built: no moments, step counts from 0
        if t.scaler is not None:
            t.scaler = torch.amp.GradScaler(t.device.type)
    t.optimizer.zero_grad(set_to_none=True)
    set_rng_state(saved_rng)
    t.clock.meters["data"] = data_before
    t.warmup_seconds = time.perf_counter() - t0
    t.clock.meters["warmup"] += t.warmup_seconds
    if t.compiled:
        t.clock.meters["compile"] += t.warmup_seconds


def begin(t: Trainer) -> None:
    """Start-up's accounting on the run row: what was built, how long it took, this process's CPU so far."""
    # this attempt's own start-up (a resumed run's meters also hold its earlier attempts' warm-up)
    startup = time.perf_counter() - t.t_start - t.warmup_seconds
    t.clock.meters["startup"] = startup  # data cache, model build, optimizer
    # this process's CPU so far: interpreter, imports (none in a trainer forked warm), start-up and warm-up
    t.progress.notes["process_cpu"] = {"before_training": round(time.process_time(), 3)}
    t.recorder.update(params=t.params, inter_token_params=t.family.inter_token_params(t.trial),
                      flops_per_token=t.flops_per_token, device_name=t.device_name, startup_seconds=startup,
                      checkpoint_path=str(t.ckpt_path.resolve()), threads=torch.get_num_threads(),
                      precision=t.precision)


# ---------------------------------------------------------------- the loop


@dataclass
class Decision:
    """What this step does, taken alike on every rank."""

    f: float  # budget fraction spent
    log: bool  # close the open log interval
    read: bool  # read the logged losses from the device (one host sync)
    checkpoint: bool
    stop: bool
    past_horizon: bool
    eval: bool


class LoopState:
    """The loop's own counters: the open log interval (on the device), when it last logged, read, checkpointed."""

    def __init__(self, t: Trainer):
        (kind, amount), settings = t.reading, t.settings
        self.log_every_s = max(amount / settings.log_points, 0.05) if kind == "wall_clock" else None
        self.log_every_steps = max(1, int(amount // settings.log_points)) if kind == "steps" else None
        self.last_log_t = t.clock.elapsed()
        self.last_ckpt_wall = time.monotonic()
        # a resumed run continues the open log interval (held by rank 0; the log step sums across ranks)
        carried = t.progress.open_interval if t.dist.is_main else (0.0, 0.0)
        self.interval_sum = torch.tensor(carried[0], device=t.device)
        self.interval_count = torch.tensor(carried[1], device=t.device)
        self.status = "completed"
        self.error: str | None = None
        self.bar = progress_bar(settings.progress and t.dist.is_main, t.trial)
        self.pending = PendingLosses(t.dist)
        self.last_read = time.monotonic()

    @property
    def interval(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.interval_sum, self.interval_count


def loop(t: Trainer, s: LoopState, stop: StopSignal) -> Outcome | None:
    """Steps until the budget, the horizon, a stop or a divergence; an outcome if it ended out of memory."""
    t.clock.start()
    while True:
        if t.recorder.lost:  # another process took this run over (we were thought dead): stop, write nothing
            stop.flag = True
        d = decide(t, s, stop)
        if not bookkeeping(t, s, d):
            s.status = "diverged"
            return None
        if d.stop:
            if stop.flag:
                s.status = "preempted"
            elif d.past_horizon and d.f < 1.0:
                t.progress.notes["ended_at_horizon"] = {"step": t.progress.step, "budget_fraction": round(d.f, 4)}
            return None
        if d.eval:  # intermediate evals at budget fractions or every N steps (clock paused unless eval.charged)
            intermediate_eval(t, d.f)
        if d.checkpoint:  # on a wall-time interval (clock paused)
            with t.clock.paused("checkpoint"):
                checkpoint(t, s.interval)
            s.last_ckpt_wall = time.monotonic()
        ended = train_step(t, s, d.f)
        if ended is not None:
            return ended


def intermediate_eval(t: Trainer, f: float) -> None:
    """An eval on eval.batches of the split: at a budget fraction (its eval_point) and/or a multiple of
    eval.every_steps (none). Charged to the budget clock under eval.charged, the studies' HF Trainer's way.
    `f`: the budget fraction all ranks agreed on."""
    p, plan = t.progress, t.trial.eval
    at_fraction = fraction_due(plan, p, f)
    with t.clock.timed("eval_on_clock" if plan.charged else "eval", plan.charged):  # notes.meters: how much was charged
        ev, _ = evaluate(t.wrapped, t.prepared.eval, t.trial, t.device, t.dist, plan.batches, t.precision,
                         t.progress.micro_batch)
        t.recorder.log(step=p.step, split="eval", elapsed_seconds=t.clock.elapsed(), tokens=p.tokens, loss=ev,
                       lr=None, eval_point=plan.at[p.next_eval] if at_fraction else None)
        t.recorder.flush()
    p.next_eval += at_fraction
    p.evaluated_step = p.step


def train_routing_eval(t: Trainer) -> float:
    """The whole eval split once more with the model routing as in training (top-k over each sequence: not
    causal): the loss the MoD blog called validation loss. Uncompiled and outside DDP: eval only, no gradients."""
    with t.model.routing_as_in_training():
        loss, _ = evaluate(objectives.Objective(t.trial, t.model), t.prepared.eval, t.trial, t.device, t.dist, None,
                           t.precision, t.progress.micro_batch)
    return loss


def decide(t: Trainer, s: LoopState, stop: StopSignal) -> Decision:
    """Whether this step logs, reads, checkpoints, evaluates or stops: every decision every rank takes alike (a
    wall-clock fraction differs by a few microseconds between ranks: the largest is everyone's, for the stop, the
    evals and the learning rate alike)."""
    p, kind = t.progress, t.reading[0]
    f = t.fraction()
    elapsed = t.clock.elapsed()
    want_log = (s.log_every_s is not None and elapsed - s.last_log_t >= s.log_every_s) or (
        s.log_every_steps is not None and p.step % s.log_every_steps == 0 and p.step > 0
    ) or (kind in ("tokens", "flops") and p.step % 50 == 0 and p.step > 0)
    want_read = time.monotonic() - s.last_read >= t.settings.read_every
    want_ckpt = time.monotonic() - s.last_ckpt_wall >= bud.checkpoint_interval(t.settings.checkpoint_every, elapsed, f)
    f, *flags = t.dist.agree(f, want_log, want_read, want_ckpt, stop.flag, t.recorder.lost)
    want_log, want_read, want_ckpt, stop.flag, t.recorder.lost = (v > 0 for v in flags)
    past_horizon = t.along_horizon is not None and t.along_horizon(f, p.step, p.tokens, p.samples, p.rows) >= 1.0
    return Decision(f=f, log=want_log, read=want_read, checkpoint=want_ckpt, stop=f >= 1.0 or stop.flag or past_horizon,
                    past_horizon=past_horizon,
                    eval=eval_due(t.trial.eval, p, f))


def fraction_due(plan: EvalPlan, p: Progress, f: float) -> bool:
    """The budget has reached eval.at's next fraction."""
    return p.next_eval < len(plan.at) and f >= plan.at[p.next_eval]


def eval_due(plan: EvalPlan, p: Progress, f: float) -> bool:
    """An intermediate eval is due at the next budget fraction of eval.at, or at a multiple of eval.every_steps."""
    by_steps = plan.every_steps is not None and p.step > 0 and p.step % plan.every_steps == 0
    return fraction_due(plan, p, f) or (by_steps and p.step != p.evaluated_step)


def bookkeeping(t: Trainer, s: LoopState, d: Decision) -> bool:
    """Close the log interval (its losses stay on the device) and, at a read point, record what was logged and
    flush it when due. False when a loss diverged (s.error says where)."""
    if d.log or d.stop:
        s.pending.add(s.interval_sum, s.interval_count, f=d.f, step=t.progress.step,
                      elapsed_seconds=t.clock.elapsed(), tokens=t.progress.tokens, lr=t.optimizer.param_groups[0]["lr"])
        s.interval_sum.zero_()
        s.interval_count.zero_()
        s.last_log_t = t.clock.elapsed()
    if s.pending.items and (d.read or d.stop or d.eval or d.checkpoint):
        with t.clock.paused("bookkeeping"):
            s.error = record_losses(s.pending.read(), t.progress, t.recorder, s.bar, t.divergence_limit)
            if s.error is None and t.recorder.maybe_flush():
                t.recorder.flush()
        s.last_read = time.monotonic()
    return s.error is None


def train_step(t: Trainer, s: LoopState, f: float) -> Outcome | None:
    """One optimizer step at the schedule's learning rate; out of memory shrinks the micro-batch (on_oom:
    shrink) or ends the run with its curve up to there."""
    p = t.progress
    lr = t.lr_at(f, p.step, p.tokens, p.samples, p.rows)
    try:
        loss_sum, count, n_samples, n_tokens = t.one_step(lr)
        check_memory(t.device, t.settings.memory_cap_mb)
    except Exception as exc:
        if not is_oom(exc):
            raise
        if shrink(t.trial, p, t.optimizer, t.device):
            return None
        t.clock.stop()
        record_losses(s.pending.read(), p, t.recorder, s.bar, t.divergence_limit)  # the curve up to the OOM
        return t.finish_oom(exc)
    s.interval_sum += loss_sum
    s.interval_count += count
    p.step += 1
    p.samples += n_samples
    p.tokens += n_tokens
    return None


# ---------------------------------------------------------------- finish


def finish(t: Trainer, s: LoopState) -> Outcome:
    """The run's end: a stopped run checkpoints, a diverged one records why, a finished one is evaluated on the
    whole eval split and checkpointed with its tokenizer."""
    t.clock.stop()
    t.progress.elapsed = t.clock.elapsed()
    if t.recorder.lost:
        t.recorder.close()
        return {"status": "lost", "error": "another process took this run over (its heartbeat was stale)"}
    if s.status == "preempted":
        checkpoint(t, s.interval, wait=True)
        return t.stopped()
    if s.status == "diverged":
        t.recorder.flush()
        return t.finalize("diverged", s.error)

    with t.clock.paused("eval"):
        final_eval, accuracy = evaluate(t.wrapped, t.prepared.eval, t.trial, t.device, t.dist, None, t.precision,
                                        t.progress.micro_batch)
        if hasattr(t.model, "routing_as_in_training"):  # MoD: also as its training routes, labelled non-causal
            routed = train_routing_eval(t)
            if math.isfinite(routed):  # run notes are JSON: a diverged run's NaN has no place there
                t.progress.notes["eval_loss_train_routing"] = routed
    if accuracy is not None:
        t.recorder.update(final_eval_accuracy=accuracy)
    t.recorder.log(step=t.progress.step, split="eval", elapsed_seconds=t.clock.elapsed(), tokens=t.progress.tokens,
                   loss=final_eval, lr=None, eval_point=1.0)
    final_train = final_train_loss(t.progress.intervals, steps=t.trial.train_loss_steps)
    with t.clock.paused("checkpoint"):
        try:
            checkpoint(t, s.interval, wait=True)
            if t.dist.is_main:
                t.prepared.save_tokenizer(t.ckpt_path.parent / "tokenizer")
        except Exception as exc:  # noqa: BLE001 - the result is in hand and its points are in the DB: keep it
            said = one_line(exc, "the run's log").split("; the whole traceback")[0][:500]
            t.progress.notes["final_checkpoint"] = f"not written: {said}"
            print(f"warning: the run's result is kept, but its final checkpoint was not written: {said}",
                  file=sys.stderr)
    if not math.isfinite(final_eval):
        return t.finalize("diverged", f"eval loss {final_eval}", final_train, final_eval)
    return t.finalize("completed", None, final_train, final_eval)
