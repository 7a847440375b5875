"""The node check's CUDA tests, training (`python -m pytest -m gpu tests/gpu`, run by `python -m bench gpu`): compile,
bf16, fp16 with the scaler, fused AdamW, the memory cap to `oom` and `on_oom: shrink`, checkpoint and resume, the
memory probe. Sizes: a mixer of width 32-64, 1-2 layers, context 64 (512 for the probe's growth), batches of 8 (256
and 1024 where a memory cap must bite on CUDA), the embedded TinyStories sample, a few dozen steps. See
tests/gpu/common.py for the device and the CPU rule."""

from __future__ import annotations

import math
import os
import resource
import signal
import threading
import warnings

import pytest
import torch

from ablate import store
from ablate.train import TrainerSettings, train
from ablate.train.state import Dist
from tests.gpu.common import assert_learns, device_name, fresh, needs_cuda, settings, tiny
from tests.train.test_train import registered

pytestmark = pytest.mark.gpu


# ---------------------------------------------------------------- 1-3: compile and precisions


def test_compile_trains_and_lowers_the_loss(device, tmp_path, sqlite_url, record_property):
    """`compile: true`: the trainer wraps the model and its loss in torch.compile, trains to its budget, and the
    loss goes down; the warm-up, which compiles, is counted as compile time."""
    needs_cuda(device, "torch.compile on CPU costs ~45 s for this model and is off in CPU tests by project rule")
    trial = tiny(compile=True)
    rid = registered(sqlite_url, trial)
    out = train(trial, settings(device, tmp_path / "art", db_url=sqlite_url, run_id=rid))
    assert out["status"] == "completed" and out["steps"] == 30, out
    assert out["compile_seconds"] > 0, out  # the trainer compiled (t.compiled): its warm-up counted as compile
    record_property("compile_seconds", round(out["compile_seconds"], 2))
    assert_learns(sqlite_url, rid, out)
    run = store.get_run(store.connect(sqlite_url), rid)
    assert run.device_name == device_name(device)


def _trained_in(device: torch.device, tmp_path, url: str, precision: str):
    """A registered one-layer run (CPU half-precision kernels are slow) trained to its 30 steps in `precision`,
    having learned (assert_learns); its run row."""
    trial = tiny(precision=precision, layers=1)
    rid = registered(url, trial)
    out = train(trial, settings(device, tmp_path / "art", db_url=url, run_id=rid))
    assert out["status"] == "completed" and out["steps"] == 30, out
    assert_learns(url, rid, out)
    return store.get_run(store.connect(url), rid)


def test_bf16_autocast_trains_and_records_bf16(device, tmp_path, sqlite_url):
    """`precision: bf16`: autocast to bfloat16 on this device (CPU autocast has bf16 too), a finite, falling loss,
    and the run row says bf16."""
    if device.type == "cuda":
        assert torch.cuda.is_bf16_supported(), "this GPU has no bf16 (H100/H200 do)"
    run = _trained_in(device, tmp_path, sqlite_url, "bf16")
    assert run.precision == "bf16" and run.device_name == device_name(device)


def _fp16_unsupported(device: torch.device) -> str | None:
    """Why this torch cannot train fp16 with a grad scaler on `device` (None: it can). CPU autocast turns itself
    off with a warning for a dtype it lacks, so warnings are errors here."""
    if device.type == "cuda":
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.amp.GradScaler("cpu")
            with torch.autocast("cpu", dtype=torch.float16):
                dtype = (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
    except (RuntimeError, ValueError, AttributeError, UserWarning) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if dtype == torch.float16 else f"CPU autocast computed a matmul in {dtype}, not float16"


def test_fp16_trains_with_the_grad_scaler(device, tmp_path, sqlite_url):
    """`precision: fp16`: autocast to float16 with the trainer's GradScaler, a finite, falling loss, the run row
    says fp16, and the scaler's state (its scale) is in the run's checkpoint."""
    why = _fp16_unsupported(device)
    if why is not None:
        pytest.skip(f"this torch ({torch.__version__}) has no fp16 autocast with a GradScaler on CPU: {why}")
    run = _trained_in(device, tmp_path, sqlite_url, "fp16")
    assert run.precision == "fp16" and run.device_name == device_name(device)
    scaler = torch.load(run.checkpoint_path, map_location="cpu", weights_only=True)["scaler"]
    assert scaler and scaler["scale"] > 0, scaler  # an enabled GradScaler ran (a disabled one saves {})


# ---------------------------------------------------------------- 4: the optimizer


def test_the_optimizer_is_fused_adamw_on_cuda_and_a_step_moves_the_weights(device, tmp_path):
    """The trainer's AdamW (optim.make_optimizer) is fused exactly on CUDA, its state lives on the device, and one
    step of the real trainer changes the weights and leaves them finite."""
    from ablate.train.trainer import Trainer

    t = Trainer(tiny(), settings(device, tmp_path / "art"), Dist())
    try:
        t.build()
        t.resume()
        assert isinstance(t.optimizer, torch.optim.AdamW)
        fused = bool(t.optimizer.defaults.get("fused"))
        assert fused == (device.type == "cuda"), t.optimizer.defaults
        assert all(bool(g.get("fused")) == fused for g in t.optimizer.param_groups)
        before = [p.detach().clone() for p in t.model.parameters()]
        t.one_step(1e-3)
        t.sync()
        after = list(t.model.parameters())
        assert all(p.device.type == device.type for p in after)
        assert all(torch.isfinite(p).all() for p in after)
        moved = sum(not torch.equal(b, a.detach()) for b, a in zip(before, after))
        assert moved >= len(before) // 2, f"{moved} of {len(before)} parameter tensors changed"
        state = next(iter(t.optimizer.state.values()))
        assert state["exp_avg"].device.type == device.type
        if fused:  # fused AdamW keeps its step count on the device
            assert state["step"].device.type == "cuda", state["step"]
    finally:
        t.recorder.close()


# ---------------------------------------------------------------- 5: memory caps


def test_a_memory_cap_below_the_need_ends_oom_with_its_peak(device, tmp_path, whole_gpu_after, record_property):
    """A cap below what the trial needs (`TrainerSettings(memory_cap_mb=...)`, what `--memory-cap-mb` and a hardware
    profile's memory set) ends the run `oom`, a result and not a crash, with the error and its peak memory. On CUDA
    the cap is half the need measured on this GPU and the allocator raises a real OOM (the recorded peak stays
    below the need); on CPU the trainer checks ru_maxrss, a high-water mark of the process, against half of it."""
    art = tmp_path / "art"
    trial = tiny(d_model=64, batch_size=256, budget={"steps": 3})
    if device.type == "cuda":
        fresh(device)
        measured = train(trial, settings(device, art))
        assert measured["status"] == "completed", measured
        need = measured["peak_memory_mb"]
        cap = need / 2
    else:
        need = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        cap = need / 2
    fresh(device)
    out = train(trial, settings(device, art, memory_cap_mb=cap))
    for name, value in (("need_mb", need), ("cap_mb", cap), ("peak_mb", out["peak_memory_mb"])):
        record_property(name, round(value, 1))
    assert out["status"] == "oom", out
    assert "out of memory" in out["error"] and out["steps"] == 0, out  # in the warm-up: the first step is too big
    if device.type == "cuda":
        assert 0 < out["peak_memory_mb"] < need, (out["peak_memory_mb"], cap, need)
    else:
        assert out["peak_memory_mb"] > cap, (out["peak_memory_mb"], cap)


def test_on_oom_shrink_halves_the_micro_batch_under_a_cap_and_keeps_training(device, tmp_path, whole_gpu_after,
                                                                             record_property):
    """`on_oom: shrink` under a cap between the need of the micro-batch and of its half: the trainer halves the
    micro-batch (doubling accumulation, so the effective batch stays), notes `oom_shrink`, and trains the whole
    budget. The cap is computed from both needs measured on this GPU (allocated at the full micro-batch, reserved
    by the allocator at the half)."""
    needs_cuda(device, "on CPU the cap is checked against ru_maxrss, a high-water mark that no smaller batch "
                       "lowers, so shrinking can only end `oom` (tests/train/test_train.py holds that)")
    art = tmp_path / "art"
    batch, steps = 1024, 6
    full = tiny(d_model=64, batch_size=batch, budget={"steps": steps}, on_oom="shrink")
    half = tiny(d_model=64, batch_size=batch // 2, grad_accum=2, budget={"steps": steps})
    fresh(device)
    measured = train(full, settings(device, art))
    assert measured["status"] == "completed", measured
    need_full = measured["peak_memory_mb"]
    fresh(device)
    measured_half = train(half, settings(device, art))
    assert measured_half["status"] == "completed", measured_half
    reserved_half = torch.cuda.max_memory_reserved(device) / 2**20  # since the trainer reset the peaks
    assert reserved_half < 0.85 * need_full, (
        f"the half micro-batch's memory ({reserved_half:.0f} MiB reserved) is too close to the full one's "
        f"({need_full:.0f} MiB allocated) for a cap between them: raise `batch`")
    cap = (reserved_half + need_full) / 2
    fresh(device)
    out = train(full, settings(device, art, memory_cap_mb=cap))
    for name, value in (("need_full_mb", need_full), ("reserved_half_mb", reserved_half), ("cap_mb", cap),
                        ("peak_mb", out.get("peak_memory_mb") or 0.0)):
        record_property(name, round(value, 1))
    assert out["status"] == "completed" and out["steps"] == steps, (out, cap, need_full, reserved_half)
    shrinks = out["notes"]["oom_shrink"]
    assert shrinks and shrinks[0]["micro_batch"] == batch // 2 and shrinks[0]["grad_accum"] == 2, shrinks
    assert all(s["micro_batch"] * s["grad_accum"] == batch for s in shrinks), shrinks  # the effective batch kept
    assert out["samples"] == steps * batch, out
    assert out["peak_memory_mb"] < need_full, (out["peak_memory_mb"], cap, need_full)
    assert math.isfinite(out["final_eval_loss"]), out


# ---------------------------------------------------------------- 6: checkpoint and resume


def test_a_run_stopped_after_a_checkpoint_resumes_on_the_device_to_the_same_loss(device, tmp_path, monkeypatch):
    """A run stopped (SIGTERM, as a preemption) right after a checkpoint ends `preempted`; run again, it loads that
    checkpoint onto the device (map_location), trains only the steps left, and ends at the loss an uninterrupted
    run reaches."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("the trainer takes SIGTERM only on the main thread")
    from ablate.train import loop
    from ablate.train.trainer import Trainer

    steps, stop_at = 20, 8
    trial = tiny(budget={"steps": steps})
    whole = train(trial, settings(device, tmp_path / "a"))
    assert whole["status"] == "completed", whole

    real_checkpoint = loop.checkpoint
    signalled: list[int] = []

    def checkpoint_then_stop(t, interval, wait=False):  # the real checkpoint, then a SIGTERM to this process (once)
        real_checkpoint(t, interval, wait)
        if t.progress.step >= stop_at and not signalled:
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN, None), \
                "the trainer's SIGTERM handler is not installed: the signal would end pytest"
            signalled.append(t.progress.step)
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(loop, "checkpoint", checkpoint_then_stop)
    art = tmp_path / "b"
    first = train(trial, settings(device, art, checkpoint_every=1e-6, resume=True))  # a checkpoint every step
    assert signalled == [stop_at], signalled
    assert first["status"] == "preempted" and stop_at < first["steps"] < steps, first
    monkeypatch.setattr(loop, "checkpoint", real_checkpoint)

    stepped: list[int] = []
    real_step = Trainer.one_step

    def counted_step(self, lr):
        stepped.append(self.progress.step)
        return real_step(self, lr)

    monkeypatch.setattr(Trainer, "one_step", counted_step)
    again = train(trial, settings(device, art, resume=True))
    assert again["status"] == "completed" and again["steps"] == steps, again
    # resumed, not restarted: the warm-up steps (lr 0, undone) and then only the steps after the checkpoint
    warmup = TrainerSettings().warmup_steps
    assert len(stepped) == warmup + steps - first["steps"], (stepped, first["steps"])
    assert stepped[warmup] == first["steps"], stepped
    assert again["samples"] == whole["samples"] == steps * 8
    assert again["final_eval_loss"] == pytest.approx(whole["final_eval_loss"], rel=2e-3, abs=2e-3)
    assert again["final_train_loss"] == pytest.approx(whole["final_train_loss"], rel=2e-3, abs=2e-3)


# ---------------------------------------------------------------- 7: the memory probe


def test_the_memory_probe_completes_and_records_its_peak(device, tmp_path, sqlite_url):
    """`mode: memory_probe` (Trainer.memory_probe: one unbatched forward and backward) completes on the device and
    records a peak memory and the precision it ran in; on CUDA the peak is torch.cuda.max_memory_allocated."""
    trial = tiny(mode="memory_probe", budget={"steps": 1})
    rid = registered(sqlite_url, trial)
    fresh(device)
    out = train(trial, settings(device, tmp_path / "art", db_url=sqlite_url, run_id=rid))
    assert out["status"] == "completed" and out["peak_memory_mb"] > 0, out
    if device.type == "cuda":
        assert out["peak_memory_mb"] == pytest.approx(torch.cuda.max_memory_allocated(device) / 2**20)
    run = store.get_run(store.connect(sqlite_url), rid)
    assert run.status == "completed" and run.precision == "fp32"
    assert run.peak_memory_mb == pytest.approx(out["peak_memory_mb"])


def test_the_memory_probe_peak_grows_with_context(device, tmp_path, record_property):
    """The probe's peak (torch.cuda.max_memory_allocated since the model was built) grows with the context:
    activations scale with the sequence length."""
    needs_cuda(device, "on CPU the probe reads ru_maxrss, the process's high-water mark (and the whole process's "
                       "when a small probe does not raise it), which does not order contexts")
    peaks = {}
    for context in (64, 512):
        fresh(device)
        out = train(tiny(mode="memory_probe", context=context, d_model=64, budget={"steps": 1}),
                    settings(device, tmp_path / "art"))
        assert out["status"] == "completed", out
        peaks[context] = out["peak_memory_mb"]
        record_property(f"peak_mb_context_{context}", round(peaks[context], 2))
    assert 0 < peaks[64] < peaks[512], peaks
