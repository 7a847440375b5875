"""The benchmark suite behind `python -m bench all --out DIR`: one command on any machine.

1. throughput: tokens/s, step time, MFU (the trainer's FLOP convention) and peak memory per
   architecture at the studies' sizes on GPU (bf16; with and without torch.compile), scaled down on CPU;
2. ways of training the same model: (a) ablate's trainer, (b) a bare hand-written loop, (c) the
   studies' way (HF Trainer, fp16 on GPU, the mixer's mask re-applied by writing `.data` every forward);
3. the studies' context-memory table: one unbatched forward+backward without the LM head, mixer vs
   Llama, d_model 1024, layers 4/8/16, context 512..8192, with a 12 GB cap as OOM cells (GPU); on CPU
   a scaled-down table of parameter + gradient + saved-activation bytes.
Writes results.json and results.md (GPU name, torch/CUDA versions, date). A script, not a test.
"""

from __future__ import annotations

import datetime as dt
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ablate.train import budget as bud
from ablate import models
from ablate.objectives.base import causal_lm_loss
from ablate.config import TrialConfig, registry
from bench.gpu_report import cell as _cell

VOCAB = 4096


def environment(device: torch.device) -> dict[str, Any]:
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.processor() or platform.machine()})",
        "torch": torch.__version__, "cuda": torch.version.cuda, "threads": torch.get_num_threads(),
    }


def trial(arch: str, d_model: int, layers: int, context: int, batch: int, heads: int | None = 4,
          budget: dict | None = None, **options: Any) -> TrialConfig:
    return TrialConfig(architecture=arch, options=options, d_model=d_model, layers=layers,
                       heads=heads if arch not in ("mixer",) else None, context=context, lr=1e-3, batch_size=batch,
                       precision="bf16", dataset={"source": "ablate:tinystories-sample", "eval": {"holdout": 24}},
                       tokenizer={"vocab_size": 1024}, budget=budget or {"steps": 1}, eval={"at": [0.5]})


def flops_per_token(model: torch.nn.Module, t: TrialConfig) -> float:
    heads = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    emb = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding) and id(m.weight) not in heads)
    n = sum(p.numel() for p in model.parameters())
    return bud.train_flops_per_token(n - emb, registry.check_architecture(t.architecture).mixing_flops_per_token(t))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- 1. throughput


def throughput(device: torch.device, quick: bool) -> list[dict[str, Any]]:
    gpu = device.type == "cuda"
    archs = [("llama", {}), ("mixer", {}), ("gpt", {}), ("hybrid", {}), ("metaformer", {"token_mixer": "metric"}),
             ("mod", {})]
    if quick:
        archs = archs[:2]
    sizes = [256, 512, 1024] if gpu else [64]
    layers, context, batch = (8, 512, 16) if gpu else (2, 128, 8)
    compile_modes = [False, True] if gpu else [False]
    rows = []
    for arch, options in archs:
        for d in sizes:
            for use_compile in compile_modes:
                t = trial(arch, d, layers, context, batch, **options)
                rows.append(_time_model(t, device, use_compile, seconds=3.0 if gpu else (0.5 if quick else 1.5)))
                if gpu:
                    torch.cuda.empty_cache()
    return rows


def training_step(model: torch.nn.Module, t: TrialConfig, device: torch.device, use_compile: bool = False) -> Any:
    """One step of `model` on a fixed random batch of the trial's shape: bf16 autocast on CUDA (fp32 on CPU), the
    LM loss, fused AdamW on CUDA. What the throughput table times and the node check's profile records."""
    step_model = torch.compile(model) if use_compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    x = torch.randint(0, VOCAB, (t.batch_size, t.context), device=device)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            s, c = causal_lm_loss(step_model(x), x)
        (s / c).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _time_model(t: TrialConfig, device: torch.device, use_compile: bool, seconds: float) -> dict[str, Any]:
    row: dict[str, Any] = {"arch": t.architecture + "".join(f" {k}={v}" for k, v in t.options.items()),
                           "d_model": t.d_model, "compile": use_compile}
    try:
        torch.manual_seed(0)
        model = models.build(t, VOCAB).to(device)
        fpt = flops_per_token(model, t)
        step = training_step(model, t, device, use_compile)
        for _ in range(3):
            step()
        _sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        n, t0 = 0, time.perf_counter()
        while n < 3 or time.perf_counter() - t0 < seconds:
            step()
            n += 1
        _sync(device)
        elapsed = time.perf_counter() - t0
        tps = n * t.batch_size * t.context / elapsed
        peak = bud.peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
        row.update(params=sum(p.numel() for p in model.parameters()), tokens_per_s=tps, step_ms=1000 * elapsed / n,
                   mfu=tps * fpt / peak if peak else None,
                   peak_mb=torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None)
    except torch.OutOfMemoryError:
        row.update(params=None, tokens_per_s=None, step_ms=None, mfu=None, peak_mb="OOM")
    return row


# ---------------------------------------------------------------- 2. ways of training


def ways(device: torch.device, quick: bool, root: Path) -> list[dict[str, Any]]:
    from ablate.train import TrainerSettings, train
    from bench.train import bare_loop

    gpu = device.type == "cuda"
    d, layers, context, batch, steps = (512, 8, 512, 16, 60) if gpu else (64, 2, 128, 8, 12 if quick else 40)
    rows = []
    for arch in ("mixer", "llama"):
        t = trial(arch, d, layers, context, batch, budget={"steps": steps})
        t = t.model_copy(update={"precision": "bf16" if gpu else "fp32", "compile": gpu})  # both sides alike
        a = train(t, TrainerSettings(artifacts=root, progress=False, resume=False, checkpoint_every=1e9,
                                     device=str(device)))["tokens_per_second"]
        b = bare_loop(t, root, steps, device)
        c = studies_way(t, root, steps, device)
        rows.append({"arch": arch, "d_model": d, "steps": steps, "trainer_tok_s": a, "bare_tok_s": b, "studies_tok_s": c,
                     "trainer/bare": a / b, "trainer/studies": a / c})
    return rows


def studies_way(t: TrialConfig, root: Path, steps: int, device: torch.device) -> float:
    """HF Trainer (fp16 on GPU), a mean-of-batch loss, and for the mixer the mask re-applied via .data each forward."""
    from transformers import Trainer, TrainingArguments

    from ablate.data import prepare

    prepared = prepare(t.dataset, t.tokenizer, t.context, root, progress=False)
    torch.manual_seed(t.seed)
    inner = models.build(t, prepared.vocab_size)
    if t.architecture == "mixer":
        def remask(module: torch.nn.Module, _inputs: Any) -> None:
            with torch.no_grad():
                module.weight.data = torch.tril(module.weight.data)  # what the studies' code did every forward

        from ablate.models.mixer import SequenceMixing

        for m in inner.modules():
            if isinstance(m, SequenceMixing):
                m.register_forward_pre_hook(remask)

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            s, c = causal_lm_loss(self.inner(input_ids), labels)
            return {"loss": s / c}

    class Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(prepared.train)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            ids, labels = prepared.train.batch(np.array([i]))
            return {"input_ids": ids[0], "labels": labels[0]}

    gpu = device.type == "cuda"
    args = TrainingArguments(output_dir=str(root / "hf"), per_device_train_batch_size=t.batch_size, max_steps=steps,
                             learning_rate=t.lr, warmup_steps=min(500, steps // 10), lr_scheduler_type="linear",
                             fp16=gpu, logging_strategy="no", log_level="error", save_strategy="no", report_to=[],
                             dataloader_num_workers=0, use_cpu=not gpu, disable_tqdm=True, seed=t.seed)
    trainer = Trainer(model=Wrapped(), args=args, train_dataset=Rows())
    real_per_row = prepared.train.n_tokens / max(len(prepared.train), 1)
    metrics = trainer.train().metrics
    return steps * t.batch_size * real_per_row / metrics["train_runtime"]


# ---------------------------------------------------------------- 3. context memory


def context_memory(device: torch.device, quick: bool) -> list[dict[str, Any]]:
    gpu = device.type == "cuda"
    d, layer_list, contexts = (1024, [4, 8, 16], [512, 1024, 2048, 4096, 8192]) if gpu else \
        (128, [1, 2] if quick else [2, 4], [128, 256] if quick else [128, 256, 512, 1024])
    cap_mb = 12 * 1024
    rows = []
    for arch in ("mixer", "llama"):
        for layers in layer_list:
            row: dict[str, Any] = {"arch": arch, "d_model": d, "layers": layers}
            for ctx in contexts:
                row[str(ctx)] = _probe(trial(arch, d, layers, ctx, 1, heads=16 if d >= 256 else 4), device)
            rows.append(row)
    if gpu:  # the studies' 12 GB RTX 3060: above the cap is OOM
        for row in rows:
            for ctx in contexts:
                v = row[str(ctx)]
                row[f"{ctx} (12 GB)"] = "OOM" if v == "OOM" or v > cap_mb else v
    return rows


def _probe(t: TrialConfig, device: torch.device) -> float | str:
    """Peak MB of one unbatched forward+backward of the hidden states (no LM head)."""
    try:
        model = models.build(t, VOCAB).to(device)
        x = torch.randint(0, VOCAB, (1, t.context), device=device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)  # the peak still counts the parameters already here
            with torch.autocast("cuda", dtype=torch.bfloat16):
                h = model.hidden_states(x)
            h.float().sum().backward()
            _sync(device)
            peak = torch.cuda.max_memory_allocated(device)
            del model, h
            torch.cuda.empty_cache()
            return round(peak / 2**20, 1)
        saved = [0]

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            saved[0] += tensor.numel() * tensor.element_size()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            h = model.hidden_states(x)
        h.sum().backward()
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        return round((2 * params + saved[0]) / 2**20, 1)  # parameters + gradients + saved activations
    except torch.OutOfMemoryError:
        return "OOM"


# ---------------------------------------------------------------- output


def markdown(result: dict[str, Any]) -> str:
    env = result["environment"]
    out = [f"# ablate benchmark, {env['date']}", "", f"{env['device']}, torch {env['torch']}, CUDA {env['cuda']}", ""]
    for key, title in (("throughput", "Training throughput per architecture"),
                       ("ways", "Same model, three ways of training (tokens/s)"),
                       ("context_memory", "Context memory: one unbatched forward+backward, no LM head (MB)")):
        rows = result.get(key) or []
        if not rows:
            continue
        cols = list(rows[0])
        out += [f"## {title}", "", "| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
        for r in rows:
            out.append("| " + " | ".join(_cell(r.get(c)) for c in cols) + " |")
        out.append("")
    return "\n".join(out)


def run_all(out: Path, quick: bool = False, device: str = "auto", parts: tuple[str, ...] = ("throughput", "ways", "context_memory")) -> dict[str, Any]:
    dev = torch.device("cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu")
    out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="ablate-bench-"))
    result: dict[str, Any] = {"environment": environment(dev), "quick": quick}
    if "throughput" in parts:
        result["throughput"] = throughput(dev, quick)
    if "ways" in parts:
        result["ways"] = ways(dev, quick, root)
    if "context_memory" in parts:
        result["context_memory"] = context_memory(dev, quick)
    (out / "results.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "results.md").write_text(markdown(result))
    return result
