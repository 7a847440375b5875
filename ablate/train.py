"""The fixed-wall-clock training loop: one loop for every architecture and objective.

`python -m ablate.train --run-id N --db URL` trains the run's trial and records it (this is also
what torchrun launches, one process per GPU). Outcomes are results, not crashes: the run row ends
`completed`, `oom`, `diverged` or `preempted` (SIGTERM: checkpoint first). A killed run resumes
from its last checkpoint and continues the same trajectory; metrics are never duplicated.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math
import os
import random
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ablate import budget as bud
from ablate import data as data_mod
from ablate import models, objectives, store
from ablate.config.errors import AblateError
from ablate.runstate import (
    Batches, Dist, PendingLosses, Progress, Recorder, Settings, check_memory, is_oom, load_checkpoint, peak_memory_mb,
    rng_state, run_dir, save_checkpoint, set_rng_state,
)
from ablate.config import HARDWARE_PROFILES, TrialConfig
from ablate.stopping import Stopped, StopSignal


# ---------------------------------------------------------------- the loop


def _device(settings: Settings, dist_: Dist) -> torch.device:
    if settings.device:
        return torch.device(settings.device)
    if torch.cuda.is_available():
        return torch.device("cuda", dist_.local_rank)
    return torch.device("cpu")


def _autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return torch.autocast(device.type, enabled=False)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def train(trial: TrialConfig, settings: Settings, dist_: Dist | None = None) -> dict[str, Any]:
    """Train one trial to its budget and record it. Returns the outcome fields written to the run row."""
    dist_ = dist_ or Dist()
    t_start = time.perf_counter()
    if settings.threads:
        torch.set_num_threads(settings.threads)  # this trial's share of the host's cores: no oversubscription
    device = _device(settings, dist_)
    hardware = hardware_check(trial, device)  # the profile's memory as a cap on a larger GPU, and any mismatch
    if settings.memory_cap_mb is None and hardware.get("memory_cap_mb"):
        settings = dataclasses.replace(settings, memory_cap_mb=hardware["memory_cap_mb"])
    precision = resolve_precision(trial, device)
    recorder = Recorder(settings, dist_.is_main)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.cuda.reset_peak_memory_stats(device)
        if settings.memory_cap_mb:
            total = torch.cuda.get_device_properties(device).total_memory / 2**20
            torch.cuda.set_per_process_memory_fraction(min(1.0, settings.memory_cap_mb / total), device)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"

    torch.manual_seed(trial.seed)
    random.seed(trial.seed)
    np.random.seed(trial.seed)

    if trial.mode == "memory_probe":
        return memory_probe(trial, settings, device, recorder, device_name, precision, hardware)

    prepared = data_mod.prepare(trial.dataset, trial.tokenizer, trial.context, settings.artifacts,
                                progress=settings.progress and dist_.is_main, eos_is_target=trial.eos_is_target)
    fam = models.family(trial.architecture)
    model = objectives.model_for(trial, prepared.vocab_size).to(device)
    params = sum(p.numel() for p in model.parameters())
    # lookups cost no FLOPs; a tied embedding is also the LM head, whose FLOPs do count
    head_weights = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    embedding = sum(m.weight.numel() for m in model.modules()
                    if isinstance(m, torch.nn.Embedding) and id(m.weight) not in head_weights)
    param_passes, mixing_stacks = objectives.passes(trial)  # multi-token runs the model n times; two-stack objectives
    flops_per_token = param_passes * bud.train_flops_per_token(
        params - embedding, mixing_stacks / param_passes * fam.mixing_flops_per_token(trial))
    count_targets = objectives.target_counter(trial)
    count_tokens = objectives.token_counter(trial)
    objectives.check_data(trial, prepared)
    lr_now = bud.schedule(trial)  # the schedule, its settings read once
    # a run ends at its schedule's horizon when that comes before its budget, as the HF Trainer ends at its
    # num_train_epochs / max_steps (the studies' runs were planned that way, and stopped by hand at a wall clock)
    along_horizon = bud.schedule_position(trial) if trial.horizon is not None else None

    use_compile = trial.compile if trial.compile is not None else device.type == "cuda"
    optimizer = make_optimizer(model, trial, device, compiling=use_compile)
    step_optimizer = optimizer.step if use_compile else plain_step(optimizer)
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    # DDP and compile wrap the model together with its loss: every objective's forward goes through them
    wrapped: torch.nn.Module = objectives.Objective(trial, model)
    if dist_.world > 1:
        wrapped = torch.nn.parallel.DistributedDataParallel(wrapped, device_ids=[device.index] if device.type == "cuda" else None)
    if use_compile:
        wrapped = torch.compile(wrapped)

    progress = Progress(micro_batch=trial.batch_size, grad_accum=trial.grad_accum)
    if hardware.get("mismatch"):
        progress.notes["hardware"] = hardware
    ckpt_path = run_dir(settings, trial) / "checkpoint.pt"
    identity = {"db_id": settings.db_id, "run_id": settings.run_id, "fingerprint": trial.fingerprint()}
    resumed = False
    if settings.resume and ckpt_path.exists():
        state = load_checkpoint(ckpt_path, map_location=device)
        theirs = state.get("identity") or {}
        if any(theirs.get(k) not in (None, v) for k, v in identity.items()):
            raise AblateError(f"checkpoint {ckpt_path} belongs to another run ({theirs}), not {identity}; move it away "
                              "or delete it to restart this run from step 0")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if scaler is not None and state["scaler"] is not None:
            scaler.load_state_dict(state["scaler"])
        progress = Progress(**state["progress"])
        set_rng_state(state["rng"])
        resumed = True
        del state  # the model's copy (the optimizer holds its own tensors)
    # points past the checkpoint (or, starting from step 0, every point of earlier attempts) are logged anew
    recorder.forget_after(progress.step if resumed else -1)

    progress.rows = len(prepared.train)  # epochs = samples / rows (a checkpoint from before this field lacks it)
    batches = Batches(prepared.train, trial.seed, dist_)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    clock = bud.Clock(sync=sync, elapsed=progress.elapsed)
    clock.meters.update(progress.meters)
    kind, amount = trial.budget.kind, trial.budget.amount
    log_every_s = max(amount / settings.log_points, 0.05) if kind == "wall_clock" else None
    log_every_steps = max(1, int(amount // settings.log_points)) if kind == "steps" else None

    # diverged: a non-finite loss, or one 4x worse than guessing uniformly over the vocabulary
    divergence_limit = 4.0 * math.log(prepared.vocab_size)
    # SIGTERM (a cancel, a stopped sweep, a worker shutting down): checkpoint at the next step once training
    # runs; before that (warm-up, compile: minutes on a GPU) nothing to save: stop at once (ablate/stopping.py)
    stop = StopSignal()

    def stopped_before_training() -> dict[str, Any]:  # nothing trained: no checkpoint; the next attempt starts over
        return _finalize(recorder, _stopped_status(recorder), None, progress, clock, device, params,
                         flops_per_token, device_name, None, None)

    stop.install(stopped_before_training)

    def fraction() -> float:
        return bud.budget_fraction(kind, amount, clock.elapsed(), progress.step, progress.tokens, flops_per_token)

    def one_step(lr: float) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """Forward/backward over the accumulation micro-batches and one optimizer step.

        Returns (loss sum, token count) on device (no host sync), global samples, and this step's
        real tokens counted on the host from the labels before they move to the device. The loss is
        divided by the objective's target count over the whole step, also counted on the host.
        """
        for group in optimizer.param_groups:
            group["lr"] = lr
        t0 = time.perf_counter()
        micro = [batches.take(progress.samples + k * progress.micro_batch * dist_.world, progress.micro_batch)
                 for k in range(progress.grad_accum)]
        host_tokens = sum(count_tokens(labels) for _, labels in micro)
        host_targets = max(sum(count_targets(labels) for _, labels in micro), 1)
        micro = [(_to_device(ids, device), _to_device(labels, device)) for ids, labels in micro]
        clock.meters["data"] += time.perf_counter() - t0
        loss_sum = torch.zeros((), device=device)
        count = torch.zeros((), device=device)
        for k, (ids, labels) in enumerate(micro):
            is_last = k == len(micro) - 1
            ctx = wrapped.no_sync() if (dist_.world > 1 and not is_last and hasattr(wrapped, "no_sync")) else _null()
            with ctx, _autocast(device, precision):
                s, c, aux, _ = wrapped(ids, labels)
            # token-weighted over the whole step, not a mean of micro-batch means; a model's own losses (router
            # losses) count once per step; both go through the scaler
            loss = s / host_targets + aux / len(micro)
            (scaler.scale(loss) if scaler is not None else loss).backward()
            loss_sum += s.detach().float()
            count += c.detach().float()
        if scaler is not None:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            step_optimizer()
        optimizer.zero_grad(set_to_none=True)
        return loss_sum, count, progress.micro_batch * progress.grad_accum * dist_.world, host_tokens * dist_.world

    # ---- untimed warm-up steps (compile, allocator) at lr 0, which leaves every weight as it was (AdamW moves a
    # weight by lr times its update, decay included); the optimizer's moments, the scaler and the RNGs are reset
    # afterwards (a resumed run's from its checkpoint), so they teach the model nothing. A resumed run warms up
    # too: its compile is start-up, not training time. No copy of model or optimizer is made.
    warmup_seconds = 0.0
    warm_up = settings.warmup_steps > 0
    try:
        if warm_up:
            t0 = time.perf_counter()
            saved_rng = rng_state()
            data_before = clock.meters["data"]
            while True:
                try:
                    for _ in range(settings.warmup_steps):
                        one_step(0.0)
                        check_memory(device, settings.memory_cap_mb)
                    break
                except Exception as exc:  # noqa: BLE001 - OOM during warm-up is a result (or a reason to shrink)
                    if not is_oom(exc):
                        raise
                    if not _shrink(trial, progress, optimizer, device):
                        stop.end_startup()
                        stop.uninstall()
                        return _finish_oom(recorder, trial, progress, clock, device, exc, time.perf_counter() - t_start,
                                           params)
        # from here a SIGTERM is seen at the next step, which checkpoints first; one that came during start-up
        # but whose handler ran late (compile code can hold it back, or swallow what it raised) stops here
        stop.begin_training()
    except Stopped:  # nothing trained yet: no checkpoint, the next attempt starts from step 0
        stop.end_startup()
        stop.uninstall()
        return stopped_before_training()
    if warm_up:
        sync()
        if resumed:  # the moments and scaler as checkpointed (read again: the warm-up moved them in place)
            saved = load_checkpoint(ckpt_path, map_location="cpu")
            optimizer.load_state_dict(saved["optimizer"])
            if scaler is not None and saved["scaler"] is not None:
                scaler.load_state_dict(saved["scaler"])
            del saved
        else:
            optimizer.state.clear()  # as built: no moments, step counts from 0
            if scaler is not None:
                scaler = torch.amp.GradScaler(device.type)
        optimizer.zero_grad(set_to_none=True)
        set_rng_state(saved_rng)
        clock.meters["data"] = data_before
        warmup_seconds = time.perf_counter() - t0
        clock.meters["warmup"] += warmup_seconds
        if use_compile:
            clock.meters["compile"] += warmup_seconds

    # this attempt's own start-up (a resumed run's meters also hold its earlier attempts' warm-up)
    startup = time.perf_counter() - t_start - warmup_seconds
    clock.meters["startup"] = startup  # data cache, model build, optimizer
    # this process's CPU so far: interpreter, imports (none in a trainer forked warm), start-up and warm-up
    progress.notes["process_cpu"] = {"before_training": round(time.process_time(), 3)}
    recorder.update(params=params, inter_token_params=fam.inter_token_params(trial), flops_per_token=flops_per_token,
                    device_name=device_name, startup_seconds=startup, checkpoint_path=str(ckpt_path.resolve()),
                    threads=torch.get_num_threads(), precision=precision)
    last_log_t = clock.elapsed()
    last_ckpt_wall = time.monotonic()
    # a resumed run continues the open log interval (held by rank 0; the log step sums across ranks)
    carried = progress.open_interval if dist_.is_main else (0.0, 0.0)
    interval_sum = torch.tensor(carried[0], device=device)
    interval_count = torch.tensor(carried[1], device=device)
    status = "completed"
    error: str | None = None
    bar = _progress_bar(settings.progress and dist_.is_main, trial)

    pending = PendingLosses(dist_)
    last_read = time.monotonic()

    clock.start()
    try:
        while True:
            if recorder.lost:  # another process took this run over (we were thought dead): stop, write nothing
                stop.flag = True
            f = fraction()
            want_log = (log_every_s is not None and clock.elapsed() - last_log_t >= log_every_s) or (
                log_every_steps is not None and progress.step % log_every_steps == 0 and progress.step > 0
            ) or (kind in ("tokens", "flops") and progress.step % 50 == 0 and progress.step > 0)
            want_read = time.monotonic() - last_read >= settings.read_every
            want_ckpt = time.monotonic() - last_ckpt_wall >= bud.checkpoint_interval(
                settings.checkpoint_every, clock.elapsed(), f)
            # ---- every decision every rank takes alike (a wall-clock fraction differs by a few microseconds
            # between ranks: the largest is everyone's, for the stop, the evals and the learning rate alike)
            f, *flags = dist_.agree(f, want_log, want_read, want_ckpt, stop.flag, recorder.lost)
            want_log, want_read, want_ckpt, stop.flag, recorder.lost = (v > 0 for v in flags)
            past_horizon = along_horizon is not None and along_horizon(
                f, progress.step, progress.tokens, progress.samples, progress.rows) >= 1.0
            want_stop = f >= 1.0 or stop.flag or past_horizon
            want_eval = progress.next_eval < len(trial.eval.at) and f >= trial.eval.at[progress.next_eval]
            if want_log or want_stop:  # the interval's losses stay on the device until they are read
                pending.add(interval_sum, interval_count, f=f, step=progress.step, elapsed_seconds=clock.elapsed(),
                            tokens=progress.tokens, lr=optimizer.param_groups[0]["lr"])
                interval_sum.zero_()
                interval_count.zero_()
                last_log_t = clock.elapsed()
            if pending.items and (want_read or want_stop or want_eval or want_ckpt):
                with clock.paused("bookkeeping"):
                    error = _record_losses(pending.read(), progress, recorder, bar, divergence_limit)
                    if error is None and recorder.maybe_flush():
                        recorder.flush()
                last_read = time.monotonic()
                if error is not None:
                    status = "diverged"
                    break
            if want_stop:
                if stop.flag:
                    status = "preempted"
                elif past_horizon and f < 1.0:
                    progress.notes["ended_at_horizon"] = {"step": progress.step, "budget_fraction": round(f, 4)}
                break
            # ---- intermediate evals at budget fractions (clock paused)
            if want_eval:
                with clock.paused("eval"):
                    ev, _ = evaluate(wrapped, prepared.eval, trial, device, dist_, trial.eval.batches, precision)
                    recorder.log(step=progress.step, split="eval", elapsed_seconds=clock.elapsed(),
                                 tokens=progress.tokens, loss=ev, lr=None, eval_point=trial.eval.at[progress.next_eval])
                    recorder.flush()
                progress.next_eval += 1
            # ---- checkpoint on a wall-time interval (clock paused)
            if want_ckpt:
                with clock.paused("checkpoint"):
                    _checkpoint(ckpt_path, model, optimizer, scaler, progress, clock, recorder, dist_,
                                (interval_sum, interval_count), identity)
                last_ckpt_wall = time.monotonic()
            # ---- one training step
            lr = lr_now(f, progress.step, progress.tokens, progress.samples, progress.rows)
            try:
                s, c, n_samples, n_tokens = one_step(lr)
                check_memory(device, settings.memory_cap_mb)
            except Exception as exc:  # noqa: BLE001
                if not is_oom(exc):
                    raise
                if _shrink(trial, progress, optimizer, device):
                    continue
                clock.stop()
                _record_losses(pending.read(), progress, recorder, bar, divergence_limit)  # the curve up to the OOM
                return _finish_oom(recorder, trial, progress, clock, device, exc, time.perf_counter() - t_start, params)
            interval_sum += s
            interval_count += c
            progress.step += 1
            progress.samples += n_samples
            progress.tokens += n_tokens
    except Exception as exc:  # noqa: BLE001 - recorded, then re-raised for the runner
        clock.stop()
        status, error = "failed", "".join(traceback.format_exception(exc))[-4000:]
        _finalize(recorder, status, error, progress, clock, device, params, flops_per_token, device_name, None, None)
        raise
    finally:
        stop.uninstall()
    clock.stop()
    progress.elapsed = clock.elapsed()
    if recorder.lost:
        recorder.close()
        return {"status": "lost", "error": "another process took this run over (its heartbeat was stale)"}

    if status == "preempted":
        _checkpoint(ckpt_path, model, optimizer, scaler, progress, clock, recorder, dist_,
                                (interval_sum, interval_count), identity)
        return _finalize(recorder, _stopped_status(recorder), None, progress, clock, device, params, flops_per_token,
                         device_name, None, None)
    if status == "diverged":
        recorder.flush()
        return _finalize(recorder, status, error, progress, clock, device, params, flops_per_token, device_name, None, None)

    with clock.paused("eval"):
        final_eval, accuracy = evaluate(wrapped, prepared.eval, trial, device, dist_, None, precision)
    if accuracy is not None:
        recorder.update(final_eval_accuracy=accuracy)
    recorder.log(step=progress.step, split="eval", elapsed_seconds=clock.elapsed(), tokens=progress.tokens,
                 loss=final_eval, lr=None, eval_point=1.0)
    final_train = _final_train_loss(progress.intervals)
    with clock.paused("checkpoint"):
        try:
            _checkpoint(ckpt_path, model, optimizer, scaler, progress, clock, recorder, dist_,
                        (interval_sum, interval_count), identity)
            if dist_.is_main:
                prepared.save_tokenizer(ckpt_path.parent / "tokenizer")
        except (AblateError, OSError) as exc:  # the result is in hand and its points are in the DB: keep it
            progress.notes["final_checkpoint"] = f"not written: {str(exc)[:500]}"
            print(f"warning: the run's result is kept, but its final checkpoint was not written: {exc}",
                  file=sys.stderr)
    if not math.isfinite(final_eval):
        return _finalize(recorder, "diverged", f"eval loss {final_eval}", progress, clock, device, params,
                         flops_per_token, device_name, final_train, final_eval)
    return _finalize(recorder, "completed", None, progress, clock, device, params, flops_per_token, device_name,
                     final_train, final_eval)


def resolve_precision(trial: TrialConfig, device: torch.device) -> str:
    """What `precision: auto` means here: the hardware profile's (bf16 only where it has bf16, so a v100 sweep
    trains in fp16 with a loss scaler even on a newer GPU), else bf16 where this GPU supports it, else fp16;
    fp32 on CPU. An explicit precision is kept as asked."""
    if trial.precision != "auto":
        return trial.precision
    if device.type != "cuda":
        return "fp32"
    profile = HARDWARE_PROFILES.get(trial.budget.hardware)
    if profile is not None and not profile.bf16:
        return "fp16"
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def hardware_check(trial: TrialConfig, device: torch.device) -> dict[str, Any]:
    """The sweep's hardware profile against this device: {profile, device, mismatch, memory_cap_mb}.

    On a GPU larger than the profile's, its memory becomes the run's cap, so the study's out-of-memory cells
    reproduce; a device that is not the profile's is a mismatch (recorded in the run's notes, printed by
    reports). Unknown hardware names (a user's own work pool) have no profile: nothing is checked."""
    profile = HARDWARE_PROFILES.get(trial.budget.hardware)
    if profile is None:
        return {}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    out: dict[str, Any] = {"profile": trial.budget.hardware, "device": name,
                           "mismatch": profile.device.lower() not in name.lower()}
    if device.type == "cuda" and profile.memory_gb:
        total_mb = torch.cuda.get_device_properties(device).total_memory / 2**20
        if total_mb > profile.memory_gb * 1024:
            out["memory_cap_mb"] = profile.memory_gb * 1024
    return out


def make_optimizer(model: torch.nn.Module, trial: TrialConfig, device: torch.device,
                   compiling: bool = False) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms, biases or other vectors); fused on CUDA."""
    if not compiling:
        _optimizer_without_dynamo()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": trial.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=trial.lr, betas=tuple(trial.betas), fused=device.type == "cuda",
    )


# torch.optim's wrappers import torch._dynamo (and sympy: ~0.7 CPU-s, a fifth of a cold trainer's start-up) for
# torch.compile's sake: four Optimizer methods at their first call, to build a "do not trace" marker, and step()
# on every call, to mark a graph break. A trainer that compiles nothing traces none of them, so it skips both
# (where dynamo is loaded already, as transformers' models load it, nothing is saved). tests/test_train_cost.py checks
# that the import stays out and that the plain step is the same update, should torch change these wrappers.


def _optimizer_without_dynamo() -> None:
    """Cache each marked method's own function as its marker (`__dynamo_disable`, which torch's wrapper looks up
    first), so its first call runs it as is."""
    if "torch._dynamo" in sys.modules:
        return
    for name in ("add_param_group", "zero_grad", "state_dict", "load_state_dict"):
        fn = getattr(getattr(torch.optim.Optimizer, name), "__wrapped__", None)
        if fn is not None and getattr(fn, "__dynamo_disable", None) is None:
            setattr(fn, "__dynamo_disable", fn)


def plain_step(optimizer: torch.optim.Optimizer) -> Callable[[], Any]:
    """The optimizer's update without torch.optim's step wrappers (the graph break, the profiler's label, step
    hooks, of which ablate registers none): its step function under no_grad, as the wrapper runs it."""
    update = inspect.unwrap(type(optimizer).step)

    def step() -> Any:
        with torch.no_grad():
            return update(optimizer)

    return step


def _shrink(trial: TrialConfig, progress: Progress, optimizer: Any, device: torch.device) -> bool:
    """on_oom: shrink — halve the micro-batch and double accumulation (same effective batch); False if it can't."""
    if trial.on_oom != "shrink" or progress.micro_batch <= 1:
        return False
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    progress.micro_batch //= 2
    progress.grad_accum *= 2
    progress.notes.setdefault("oom_shrink", []).append(
        {"step": progress.step, "micro_batch": progress.micro_batch, "grad_accum": progress.grad_accum})
    return True


def _stopped_status(recorder: Recorder) -> str:
    """A stopped run is `cancelled` when a user cancelled it (its row says so), else `preempted` (resumable)."""
    return "cancelled" if recorder.cancelled() else "preempted"


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _to_device(batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host batch on the device; to a GPU from pinned memory, so the copy is asynchronous (from pageable memory
    the host waits for it)."""
    if device.type == "cuda":
        batch = batch.pin_memory()
    return batch.to(device, non_blocking=True)


def _record_losses(points: list[tuple[dict[str, Any], float, float]], progress: Progress, recorder: Recorder,
                   bar: Any, divergence_limit: float) -> str | None:
    """Record train-loss points read from the device, oldest first; the divergence error at the first loss that
    is not finite or is past the limit (the points after it are dropped), else None."""
    for point, s, c in points:
        if c <= 0:
            continue
        loss = s / c
        if not math.isfinite(loss) or loss > divergence_limit:
            return f"train loss became {loss:.4g} at step {point['step']}"
        f = point.pop("f")
        progress.intervals.append((f, s, c))
        recorder.log(split="train", loss=loss, **point)
        bar(f, loss)
    return None


def _final_train_loss(intervals: list[tuple[float, float, float]], tail: float = 0.1) -> float | None:
    """Token-weighted mean train loss over the last `tail` of the budget (at least the last log interval)."""
    if not intervals:
        return None
    last_f = intervals[-1][0]
    chosen = [iv for iv in intervals if iv[0] >= last_f - tail] or intervals[-1:]
    s = sum(iv[1] for iv in chosen)
    c = sum(iv[2] for iv in chosen)
    return s / c if c else None


def _checkpoint(path: Path, model: Any, optimizer: Any, scaler: Any, progress: Progress, clock: bud.Clock,
                recorder: Recorder, dist_: Dist, interval: tuple[torch.Tensor, torch.Tensor],
                identity: dict[str, Any] | None = None) -> None:
    """Metrics are flushed first: after a crash the DB holds every point up to the checkpoint."""
    progress.elapsed = clock.elapsed()
    progress.open_interval = (float(interval[0]), float(interval[1]))
    progress.meters = dict(clock.meters)
    failed: AblateError | None = None
    if dist_.is_main:
        recorder.flush()
        try:
            save_checkpoint(path, model, optimizer, scaler, progress, identity)
        except AblateError as exc:  # raised after the barrier: the other ranks do not wait for rank 0 forever
            failed = exc
    if dist_.world > 1:
        dist.barrier()
    if failed is not None:
        raise failed


@torch.no_grad()
def evaluate(objective: torch.nn.Module, rows: Any, trial: TrialConfig, device: torch.device, dist_: Dist,
             max_batches: int | None, precision: str) -> tuple[float, float | None]:
    """Token-weighted mean loss over the eval split (sharded across ranks), in nats, of the (wrapped) Objective
    in eval mode (every model's eval-mode forward is causal: tests/test_causality.py), and for classification
    the fraction of rows classified right (else None)."""
    objective.eval()
    total = torch.zeros(3, device=device, dtype=torch.float64)
    n = len(rows)
    order = np.arange(n)
    bs = trial.batch_size
    shards = [order[i: i + bs] for i in range(0, n, bs)]
    if max_batches is not None:
        shards = shards[: max_batches * dist_.world]
    for idx in shards[dist_.rank:: dist_.world]:
        ids, labels = rows.batch(idx)
        with _autocast(device, precision):
            s, c, _, correct = objective(_to_device(ids, device), _to_device(labels, device))
        total[0] += s.double()
        total[1] += c.double()
        if correct is not None:
            total[2] += correct.double()
    if dist_.world > 1:
        dist.all_reduce(total)
    objective.train()
    s, c, right = total.tolist()
    return (s / c if c else float("nan")), (right / c if trial.objective == "classification" and c else None)


def _finish_oom(recorder: Recorder, trial: TrialConfig, progress: Progress, clock: bud.Clock, device: torch.device,
                exc: BaseException, wall: float, params: int) -> dict[str, Any]:
    peak = peak_memory_mb(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    msg = f"out of memory at step {progress.step} (micro-batch {progress.micro_batch}): {str(exc).splitlines()[0][:300]}"
    return _finalize(recorder, "oom", msg, progress, clock, device, params, None, None, None, None, peak=peak)


def _finalize(recorder: Recorder, status: str, error: str | None, progress: Progress, clock: bud.Clock,
              device: torch.device, params: int | None, flops_per_token: float | None, device_name: str | None,
              final_train: float | None, final_eval: float | None, peak: float | None = None) -> dict[str, Any]:
    recorder.flush()
    if "process_cpu" in progress.notes:
        progress.notes["process_cpu"]["total"] = round(time.process_time(), 3)
    seconds = clock.elapsed()
    tps = progress.tokens / seconds if seconds > 0 else None
    peak_flops = bud.peak_flops(device_name)
    outcome = dict(
        status=status, error=error, steps=progress.step, tokens=progress.tokens, samples=progress.samples,
        train_seconds=seconds, eval_seconds=clock.meters.get("eval", 0.0), startup_seconds=clock.meters.get("startup"),
        checkpoint_seconds=clock.meters.get("checkpoint", 0.0), compile_seconds=clock.meters.get("compile", 0.0),
        data_wait_fraction=(clock.meters.get("data", 0.0) / seconds) if seconds > 0 else None,
        tokens_per_second=tps, final_train_loss=final_train, final_eval_loss=final_eval,
        epochs=progress.samples / progress.rows if progress.rows else None,
        peak_memory_mb=peak if peak is not None else peak_memory_mb(device),
        mfu=(tps * flops_per_token / peak_flops) if (tps and flops_per_token and peak_flops) else None,
        notes={"meters": bud.summarize_meters(clock), **progress.notes} or None,
        finished_at=store.utcnow(),
    )
    recorder.update(**outcome, pid=None)  # no pid: this trainer is ending (`sweep status` stops saying "cancelling")
    recorder.close()
    return outcome


def memory_probe(trial: TrialConfig, settings: Settings, device: torch.device, recorder: Recorder,
                 device_name: str, precision: str, hardware: dict[str, Any]) -> dict[str, Any]:
    """One unbatched forward+backward without the LM head; peak memory is the result (OOM is a cell value)."""
    vocab = trial.tokenizer.vocab_size or 4096
    clock = bud.Clock()
    progress = Progress()
    if hardware.get("mismatch"):
        progress.notes["hardware"] = hardware
    recorder.update(precision=precision)
    try:
        model = models.build(trial, vocab).to(device)
        params = sum(p.numel() for p in model.parameters())
        base = peak_memory_mb(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        ids = torch.randint(0, vocab, (1, trial.context), device=device)
        with _autocast(device, precision):
            hidden = model.hidden_states(ids)
        hidden.float().sum().backward()
        check_memory(device, settings.memory_cap_mb)
        peak = peak_memory_mb(device)
        if device.type == "cpu":
            peak = max(peak - base, 0.0) or peak
        return _finalize(recorder, "completed", None, progress, clock, device, params, None, device_name, None, None, peak=peak)
    except Exception as exc:  # noqa: BLE001
        if is_oom(exc):
            return _finish_oom(recorder, trial, progress, clock, device, exc, 0.0, 0)
        raise


def _progress_bar(enabled: bool, trial: TrialConfig):
    """A one-line progress display: budget fraction and current train loss."""
    if not enabled:
        return lambda f, loss: None
    label = f"{trial.architecture} d={trial.d_model} n={trial.layers}"
    last = {"t": 0.0}

    def show(f: float, loss: float) -> None:
        now = time.monotonic()
        if now - last["t"] < 1.0 and f < 1.0:
            return
        last["t"] = now
        width = 30
        done = int(min(f, 1.0) * width)
        sys.stderr.write(f"\r{label} [{'#' * done}{'.' * (width - done)}] {min(f, 1.0):6.1%} loss {loss:.3f}")
        sys.stderr.flush()
        if f >= 1.0:
            sys.stderr.write("\n")

    return show


# ---------------------------------------------------------------- entry point (python -m ablate.train, torchrun)


def _init_dist() -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    # the loop's per-step decisions go over gloo as host values, beside NCCL's device tensors (on CPU too: one path)
    return Dist(rank=rank, world=world, local_rank=local, control=dist.new_group(backend="gloo"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ablate.train", description="train one run to its budget and record it")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--run-id", type=int, help="train this run of the results DB")
    src.add_argument("--config", help="a trial config as JSON (or @file.json); nothing is recorded without --run-id")
    p.add_argument("--db", default=None, help="results database URL (default: $ABLATE_DB_URL or results/ablate.db)")
    p.add_argument("--artifacts", default=os.environ.get("ABLATE_ARTIFACTS", "results/artifacts"))
    p.add_argument("--checkpoint-every", type=float, default=None,
                   help="seconds between checkpoints (default: a tenth of the run's expected length, 30 s to 10 min)")
    p.add_argument("--memory-cap-mb", type=float, default=None, help="treat peak memory above this as OOM")
    p.add_argument("--no-resume", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--device", default=None)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: every core)")
    args = p.parse_args(argv)
    dist_ = _init_dist()
    engine = claimant = None
    try:
        db_id = None
        if args.run_id is not None:
            engine = store.connect(args.db)
            run = store.get_run(engine, args.run_id)
            trial = TrialConfig.model_validate(run.config)
            db_id = store.database_id(engine)
            claimant = _claim(engine, run, dist_)
        else:
            text = Path(args.config[1:]).read_text() if args.config.startswith("@") else args.config
            trial = TrialConfig.model_validate(json.loads(text))
        settings = Settings(artifacts=Path(args.artifacts).resolve(), db_url=args.db, run_id=args.run_id,
                            checkpoint_every=args.checkpoint_every, memory_cap_mb=args.memory_cap_mb,
                            resume=not args.no_resume, progress=not args.quiet, device=args.device,
                            threads=args.threads, claimant=claimant, db_id=db_id)
        outcome = train(trial, settings, dist_)
        if dist_.world > 1:  # no rank tears gloo/NCCL down while another still writes its end (SIGABRT at exit)
            dist.barrier()
        if dist_.is_main:
            print(json.dumps({k: v for k, v in outcome.items() if k not in ("notes", "finished_at")}, default=str))
        return 0 if outcome["status"] in ("completed", "oom", "diverged") else 3
    except Exception as exc:  # recorded on the run row (under our claim), so no run stays `running`
        message = str(exc) if isinstance(exc, AblateError) else "".join(traceback.format_exception(exc))[-4000:]
        if engine is not None and claimant is not None and dist_.is_main:
            try:
                store.update_run(engine, args.run_id, claimant=claimant, status="failed", error=store.redact(message),
                              pid=None, finished_at=store.utcnow())
            except Exception:  # noqa: BLE001 - the database itself may be the problem (full disk)
                pass
        print(f"error: {store.redact(message)}", file=sys.stderr)
        return 2 if isinstance(exc, AblateError) else 1
    finally:
        if dist_.world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _claim(engine: Any, run: store.Run, dist_: Dist) -> str | None:
    """The claim this trainer runs under: the runner's (ABLATE_CLAIMANT), checked, or, started by hand, its own."""
    claimant = os.environ.get("ABLATE_CLAIMANT")
    if claimant is not None:
        if run.claimed_by != claimant:
            raise AblateError(f"run {run.id} is claimed by {run.claimed_by}, not by the runner that started this trainer "
                              f"({claimant}); it is trained elsewhere")
        return claimant
    if not dist_.is_main:
        return None
    claimant = store.new_claimant()
    takeable = [s for s in store.RUN_STATUSES if s != "running"]  # by hand: any run nobody is training now
    if not store.claim_run(engine, run.id, claimant, statuses=takeable):
        raise AblateError(f"run {run.id} is being trained by {run.claimed_by} (heartbeat {run.heartbeat_at} UTC); wait "
                          f"for it, or for its heartbeat to be {store.STALE_SECONDS:.0f} s old if that process died")
    return claimant


if __name__ == "__main__":
    code = main()
    store.close_engines()
    sys.stdout.flush()
    sys.stderr.flush()
    # the interpreter's teardown (unloading torch and the rest: ~0.8 CPU-s a trial) does nothing a trainer needs:
    # its rows are written, its files and engines closed; it leaves as a child of the warm helper does
    os._exit(code)
