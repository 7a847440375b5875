"""One trial in training: what setup builds (device, data, model, optimizer, clock, recorder), a resumed run's
state read back, one optimizer step, and how a run ends (`finalize`: the outcome fields of the run row)."""

from __future__ import annotations

import dataclasses
import math
import random
import time
from typing import Any, TypedDict

import numpy as np
import torch

from ablate.train import budget as bud
from ablate import data as data_mod
from ablate import models, store
from ablate.config import TrialConfig, registry
from ablate.config.errors import AblateError
from ablate.config.settings import environment
from ablate.objectives import base as objectives
from ablate.train.checkpoint import Writer, load_checkpoint, set_rng_state
from ablate.train.device import check_memory, is_oom, peak_memory_mb
from ablate.train.recorder import Recorder
from ablate.train.state import Batches, Dist, Progress, TrainerSettings, run_dir
from ablate.train.device import (null_context, to_device, autocast, gpu_share, hardware_check, pick_device,
                                 prepare_device, resolve_precision)
from ablate.train.optim import apply_update, make_optimizer, plain_step



class Outcome(TypedDict, total=False):
    """How a run ended: what `train()` returns and `finalize` writes to the run row (store.Run's columns)."""

    status: str  # completed, failed, oom, cancelled, preempted, diverged, ...
    error: str | None
    steps: int
    tokens: int
    samples: int
    train_seconds: float
    eval_seconds: float
    startup_seconds: float | None
    checkpoint_seconds: float
    compile_seconds: float
    data_wait_fraction: float | None
    tokens_per_second: float | None
    final_train_loss: float | None
    final_eval_loss: float | None
    epochs: float | None
    peak_memory_mb: float
    mfu: float | None
    notes: dict[str, Any] | None
    finished_at: Any


class Trainer:
    """Holds what every phase of `ablate.train.loop.train` reads; the phases themselves live there."""

    def __init__(self, trial: TrialConfig, settings: TrainerSettings, dist_: Dist):
        self.t_start = time.perf_counter()
        self.trial, self.dist = trial, dist_
        if settings.threads:
            torch.set_num_threads(settings.threads)  # this trial's share of the host's cores: no oversubscription
        self.device = pick_device(settings, dist_)
        self.hardware = hardware_check(trial, self.device)  # the profile's memory as a cap on a larger GPU, and any mismatch
        if settings.memory_cap_mb is None and self.hardware.get("memory_cap_mb"):
            settings = dataclasses.replace(settings, memory_cap_mb=self.hardware["memory_cap_mb"])
        share = gpu_share(self.device, environment().trials_per_gpu)  # a GPU other trainers share: this one's part
        if share is not None and share < (settings.memory_cap_mb or float("inf")):
            said = {"gpu_share": {"trials_per_gpu": environment().trials_per_gpu, "memory_cap_mb": round(share)}}
            settings = dataclasses.replace(settings, memory_cap_mb=share, notes={**(settings.notes or {}), **said})
        self.settings = settings
        self.precision = resolve_precision(trial, self.device)
        self.recorder = Recorder(settings, dist_.is_main)
        self.checkpoints = Writer()  # checkpoints written in a thread from a host snapshot
        self.device_name = prepare_device(self.device, settings.memory_cap_mb)
        torch.manual_seed(trial.seed)
        random.seed(trial.seed)
        np.random.seed(trial.seed)
        self.clock = bud.Clock()
        self.progress = Progress()
        if self.hardware.get("mismatch"):
            self.progress.notes["hardware"] = self.hardware
        if dist_.distributed:  # the run says how its ranks talked (NCCL on GPUs, gloo on CPUs)
            self.progress.notes["distributed"] = {"world": dist_.world, "backend": torch.distributed.get_backend()}
        self.flops_per_token: float | None = None
        # how the budget is read: the trial's own, or, in a fused group, a wall clock as the steps a solo run of the
        # trial makes in it on this device (notes.budget_read, kept in its checkpoints: ablate/train/fused.py)
        self.reading: tuple[str, float] = (trial.budget.kind, trial.budget.amount)

    # ---------------------------------------------------------------- setup

    def build(self, fused: bool = False) -> None:
        """The token cache, the model inside its objective (DDP, compile), the optimizer and the schedule. `fused`:
        a member of a fused group (ablate/train/fused.py), whose step is the group's: neither compiled nor in DDP."""
        trial, settings, device = self.trial, self.settings, self.device
        self.prepared = data_mod.prepare(trial.dataset, trial.tokenizer, trial.context, settings.artifacts,
                                         progress=settings.progress and self.dist.is_main,
                                         eos_is_target=trial.eos_is_target)
        if self.prepared.eval_bytes_per_token:  # the report's bits per byte (ablate/report/tables.py)
            self.progress.notes["eval_bytes_per_token"] = round(self.prepared.eval_bytes_per_token, 5)
        self.family = registry.check_architecture(trial.architecture)  # its counts, with a plugin's defaults
        self.model = objectives.model_for(trial, self.prepared.vocab_size).to(device)
        # the parameters that train (a classifier's LM head is built but frozen and never run: not counted, nor its FLOPs)
        self.params = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        # lookups cost no FLOPs; a tied embedding is also the LM head, whose FLOPs do count
        head_weights = {id(m.weight) for m in self.model.modules() if isinstance(m, torch.nn.Linear)}
        embedding = sum(m.weight.numel() for m in self.model.modules()
                        if isinstance(m, torch.nn.Embedding) and id(m.weight) not in head_weights)
        # multi-token runs the model n times; two-stack objectives mix tokens twice per pass
        param_passes, mixing_stacks = registry.objective(trial.objective).passes(trial)
        self.flops_per_token = param_passes * bud.train_flops_per_token(
            self.params - embedding, mixing_stacks / param_passes * self.family.mixing_flops_per_token(trial))
        self.count_targets = objectives.target_counter(trial)
        self.count_tokens = objectives.token_counter(trial)
        objectives.check_data(trial, self.prepared)
        self.lr_at = bud.schedule(trial)  # the schedule, its settings read once
        # a run ends at its schedule's horizon when that comes before its budget, as the HF Trainer ends at its
        # num_train_epochs / max_steps (the studies' runs were planned that way, and stopped by hand at a wall clock)
        self.along_horizon = bud.schedule_position(trial) if trial.horizon is not None else None

        self.compiled = not fused and (trial.compile if trial.compile is not None else device.type == "cuda")
        self.optimizer = make_optimizer(self.model, trial, device, compiling=self.compiled)
        self.step_optimizer = self.optimizer.step if self.compiled else plain_step(self.optimizer)
        self.scaler = torch.amp.GradScaler(device.type) if self.precision == "fp16" else None
        # DDP and compile wrap the model together with its loss: every objective's forward goes through them
        wrapped: torch.nn.Module = objectives.Objective(trial, self.model)
        if self.dist.distributed:
            wrapped = torch.nn.parallel.DistributedDataParallel(
                wrapped, device_ids=[device.index] if device.type == "cuda" else None)
        self.wrapped = torch.compile(wrapped) if self.compiled else wrapped

        self.progress.micro_batch, self.progress.grad_accum = trial.batch_size, trial.grad_accum  # a fresh run's
        self.ckpt_path = run_dir(settings, trial) / "checkpoint.pt"
        self.identity = {"db_id": settings.db_id, "run_id": settings.run_id, "fingerprint": trial.fingerprint()}

    def resume(self) -> None:
        """A killed run's model, optimizer, scaler, progress and RNGs from its checkpoint (when it has one), and the
        clock, data order and metric points that continue from there."""
        self.resumed = False
        if self.settings.resume and self.ckpt_path.exists():
            state = load_checkpoint(self.ckpt_path, map_location=self.device)
            theirs = state.get("identity") or {}
            if any(theirs.get(k) not in (None, v) for k, v in self.identity.items()):
                raise AblateError(f"checkpoint {self.ckpt_path} belongs to another run ({theirs}), not {self.identity}; "
                                  "move it away or delete it to restart this run from step 0")
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            if self.scaler is not None and state["scaler"] is not None:
                self.scaler.load_state_dict(state["scaler"])
            self.progress = Progress(**state["progress"])
            set_rng_state(state["rng"])
            self.resumed = True
            del state  # the model's copy (the optimizer holds its own tensors)
        self.progress.notes.update(self.settings.notes or {})
        read = self.progress.notes.get("budget_read")
        if read:  # a fused run's wall clock read as steps: resumed (fused or alone), it keeps that reading
            self.reading = ("steps", read["steps"])
        # points past the checkpoint (or, starting from step 0, every point of earlier attempts) are logged anew
        self.recorder.forget_after(self.progress.step if self.resumed else -1)

        progress = self.progress
        progress.rows = len(self.prepared.train)  # epochs = samples / rows (a checkpoint from before this field lacks it)
        self.batches = Batches(self.prepared.train, self.trial.seed, self.dist)
        device = self.device
        self.sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        self.clock = bud.Clock(sync=self.sync, elapsed=progress.elapsed)
        self.clock.meters.update(progress.meters)
        # diverged: a non-finite loss, or one 4x worse than guessing uniformly over the vocabulary
        self.divergence_limit = 4.0 * math.log(self.prepared.vocab_size)

    # ---------------------------------------------------------------- one step

    def fraction(self) -> float:
        """How much of the budget is spent."""
        p = self.progress
        return bud.budget_fraction(*self.reading, self.clock.elapsed(), p.step, p.tokens, self.flops_per_token)

    def one_step(self, lr: float) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """Forward/backward over the accumulation micro-batches and one optimizer step.

        Returns (loss sum, token count) on device (no host sync), global samples, and this step's
        real tokens counted on the host from the labels before they move to the device. The loss is
        divided by the objective's target count over the whole step, also counted on the host.
        """
        progress, device, world, optimizer, scaler = self.progress, self.device, self.dist.world, self.optimizer, self.scaler
        for group in optimizer.param_groups:
            group["lr"] = lr
        t0 = time.perf_counter()
        micro = [self.batches.take(progress.samples + k * progress.micro_batch * world, progress.micro_batch)
                 for k in range(progress.grad_accum)]
        host_tokens = sum(self.count_tokens(labels) for _, labels in micro)
        host_targets = max(sum(self.count_targets(labels) for _, labels in micro), 1)
        micro = [(to_device(ids, device), to_device(labels, device)) for ids, labels in micro]
        self.clock.meters["data"] += time.perf_counter() - t0
        loss_sum = torch.zeros((), device=device)
        count = torch.zeros((), device=device)
        for k, (ids, labels) in enumerate(micro):
            is_last = k == len(micro) - 1
            no_sync = self.dist.distributed and not is_last and hasattr(self.wrapped, "no_sync")
            with self.wrapped.no_sync() if no_sync else null_context(), autocast(device, self.precision):
                s, c, aux, _ = self.wrapped(ids, labels)
            # token-weighted over the whole step, not a mean of micro-batch means; a model's own losses (router
            # losses) count once per step; both go through the scaler
            loss = s / host_targets + aux / len(micro)
            (scaler.scale(loss) if scaler is not None else loss).backward()
            loss_sum += s.detach().float()
            count += c.detach().float()
        apply_update(self.model, optimizer, scaler, self.step_optimizer)
        return loss_sum, count, progress.micro_batch * progress.grad_accum * world, host_tokens * world

    # ---------------------------------------------------------------- how a run ends

    def finalize(self, status: str, error: str | None = None, final_train: float | None = None,
                 final_eval: float | None = None, peak: float | None = None, mfu: bool = True) -> Outcome:
        """The outcome fields, written to the run row (its points flushed first); the trainer's recorder closes."""
        recorder, progress, clock = self.recorder, self.progress, self.clock
        self.checkpoints.settle()  # a checkpoint still being written (a run that failed or diverged after it)
        recorder.flush()
        if "process_cpu" in progress.notes:
            progress.notes["process_cpu"]["total"] = round(time.process_time(), 3)
        seconds = clock.elapsed()  # the budget clock: evals on it (eval.charged) included
        on_clock = clock.meters.get("eval_on_clock", 0.0)
        stepping = seconds - on_clock  # throughput and data wait are of the training steps alone
        tps = progress.tokens / stepping if stepping > 0 else None
        flops_per_token = self.flops_per_token if mfu else None  # an OOM's throughput says nothing of its MFU
        peak_flops = bud.peak_flops(self.device_name) if flops_per_token else None
        outcome = Outcome(
            status=status, error=error, steps=progress.step, tokens=progress.tokens, samples=progress.samples,
            train_seconds=seconds, eval_seconds=clock.meters.get("eval", 0.0) + on_clock,
            startup_seconds=clock.meters.get("startup"), checkpoint_seconds=clock.meters.get("checkpoint", 0.0),
            compile_seconds=clock.meters.get("compile", 0.0),
            data_wait_fraction=(clock.meters.get("data", 0.0) / stepping) if stepping > 0 else None,
            tokens_per_second=tps, final_train_loss=final_train, final_eval_loss=final_eval,
            epochs=progress.samples / progress.rows if progress.rows else None,
            peak_memory_mb=peak if peak is not None else peak_memory_mb(self.device),
            mfu=(tps * flops_per_token / peak_flops) if (tps and flops_per_token and peak_flops) else None,
            notes={"meters": bud.summarize_meters(clock), **self.real_tokens(), **progress.notes} or None,
            finished_at=store.utcnow(),
        )
        recorder.update(**outcome, pid=None)  # no pid: this trainer is ending (`sweep status` stops saying "cancelling")
        recorder.close()
        return outcome

    def real_tokens(self) -> dict[str, float]:
        """The share of the positions trained on that were real tokens, not padding (29% in the studies' TinyStories
        rows, padded to 512): MFU counts real tokens only, so it reads low by that much where rows pad."""
        p = self.progress
        return {"real_token_share": round(p.tokens / (p.samples * self.trial.context), 4)} if p.samples else {}

    def finish_oom(self, exc: BaseException) -> Outcome:
        """Out of memory is a result: the step it came at and the micro-batch, with the peak memory."""
        peak = peak_memory_mb(self.device)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        progress = self.progress
        msg = (f"out of memory at step {progress.step} (micro-batch {progress.micro_batch}): "
               f"{str(exc).splitlines()[0][:300]}")
        return self.finalize("oom", msg, peak=peak, mfu=False)

    def stopped(self) -> Outcome:
        """A stopped run is `cancelled` when a user cancelled it (its row says so), else `preempted` (resumable)."""
        return self.finalize("cancelled" if self.recorder.cancelled() else "preempted")

    def memory_probe(self) -> Outcome:
        """One unbatched forward+backward without the LM head; peak memory is the result (OOM is a cell value)."""
        trial, device = self.trial, self.device
        vocab = trial.tokenizer.vocab_size or 4096
        self.recorder.update(precision=self.precision)
        try:
            model = models.build(trial, vocab).to(device)
            base = peak_memory_mb(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            ids = torch.randint(0, vocab, (1, trial.context), device=device)
            with autocast(device, self.precision):
                hidden = model.hidden_states(ids)
            hidden.float().sum().backward()
            check_memory(device, self.settings.memory_cap_mb)
            peak = peak_memory_mb(device)
            if device.type == "cpu":
                peak = max(peak - base, 0.0) or peak
            return self.finalize("completed", peak=peak)
        except Exception as exc:
            if is_oom(exc):
                return self.finish_oom(exc)
            raise
