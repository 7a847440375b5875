"""Throughput of every architecture family: parameters, training tokens/s, peak memory (CUDA).

    python -m bench.models              # CPU: scaled-down sizes, < 60 s; CUDA: the studies' sizes, bf16
    python -m bench.models --only mixer llama --seconds 3

Also times the masked mixer's sequence map two ways (our batched matmul vs the studies' Conv1d over
tokens-as-channels) on the same masked weights, which is how the matmul formulation was chosen.
This is a script, not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange

from ablate import models
from ablate.models.mixer import SequenceMixing
from ablate.objectives.base import causal_lm_loss
from ablate.config import TrialConfig

VOCAB = 4096  # the studies' TinyStories tokenizer


@dataclass(frozen=True)
class Arch:
    label: str
    architecture: str
    options: dict[str, Any] = field(default_factory=dict)
    heads: int | None = 4
    gpu_d_model: int = 512  # the studies' sizes, used on CUDA


ARCHS = [
    Arch("llama h4", "llama"),
    Arch("gpt (openai)", "gpt", {}, 8),
    Arch("gpt2", "gpt", {"variant": "gpt2"}, 8),
    Arch("mixer flat", "mixer", {}, None, 1024),
    Arch("mixer expand 2", "mixer", {"expand": 2}, None, 1024),
    Arch("mixer 2 parallel", "mixer", {"parallel_convs": 2}, None, 1024),
    Arch("mixer kernel 4", "mixer", {"kernel": 4}, None, 1024),
    Arch("mixer 2 heads", "mixer", {"mixer_heads": 2}, None, 1024),
    Arch("hybrid sequential", "hybrid"),
    Arch("hybrid parallel", "hybrid", {"placement": "parallel"}),
    Arch("metaformer attention", "metaformer", {"token_mixer": "attention"}),
    Arch("metaformer metric", "metaformer", {"token_mixer": "metric"}),
    Arch("metaformer quadratic", "metaformer", {"token_mixer": "quadratic"}),
    Arch("metaformer pool", "metaformer", {"token_mixer": "pool"}, None),
    Arch("metaformer identity", "metaformer", {"token_mixer": "identity"}, None),
    Arch("mod sigmoid c=0.125", "mod"),
]


def make_trial(arch: Arch, d_model: int, layers: int, context: int, batch: int) -> TrialConfig:
    return TrialConfig(
        architecture=arch.architecture, options=arch.options, d_model=d_model, layers=layers, heads=arch.heads,
        context=context, lr=1e-3, batch_size=batch, dataset={"source": "bench"}, budget={"steps": 1},
    )


def timed(step: Callable[[], None], seconds: float, device: torch.device, warmup: int = 2) -> tuple[float, int]:
    """(elapsed seconds, iterations) of repeated calls after warm-up, at least 3 iterations."""
    for _ in range(warmup):
        step()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start, iterations = time.perf_counter(), 0
    while iterations < 3 or time.perf_counter() - start < seconds:
        step()
        iterations += 1
        sync()
    return time.perf_counter() - start, iterations


def bench_arch(arch: Arch, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    d_model = args.d_model or (arch.gpu_d_model if device.type == "cuda" else 128)
    trial = make_trial(arch, d_model, args.layers, args.context, args.batch)
    torch.manual_seed(0)
    model = models.build(trial, VOCAB).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, VOCAB, (args.batch, args.context), device=device)
    use_bf16 = device.type == "cuda"

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(x)
        total, count = causal_lm_loss(logits, x)
        optimizer.zero_grad(set_to_none=True)
        (total / count).backward()
        optimizer.step()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    elapsed, iterations = timed(step, args.seconds, device)
    row = {
        "arch": arch.label, "d_model": d_model,
        "params": sum(p.numel() for p in model.parameters()),
        "tokens/s": iterations * args.batch * args.context / elapsed,
        "peak MB": torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None,
    }
    return row


def conv1d_mixing(mixing: SequenceMixing, x: torch.Tensor) -> torch.Tensor:
    """The studies' formulation: Conv1d(context, context, k, padding='same') on (B, T, D), tokens as channels."""
    weight = rearrange(torch.tril(mixing.weight).sum(0)[:, 0], "k o i -> o i k")  # (T, T, k)
    return F.conv1d(x, weight, mixing.bias.sum(0)[0], padding="same")


def matmul_mixing(mixing: SequenceMixing, x: torch.Tensor) -> torch.Tensor:
    return mixing(x[:, None])[:, 0]


def compare_mixing(args: argparse.Namespace, device: torch.device) -> list[dict[str, Any]]:
    """Forward+backward time of one masked sequence map, matmul vs Conv1d, same weights and result."""
    shapes = [(8, 128, 128), (8, 512, 256)] if device.type == "cpu" else [(16, 512, 1024), (16, 1024, 1024)]
    rows = []
    for batch, context, width in shapes:
        for kernel in (1, 4):
            mixing = SequenceMixing(context, kernel=kernel).to(device)
            x = torch.randn(batch, context, width, device=device, requires_grad=True)
            torch.testing.assert_close(matmul_mixing(mixing, x), conv1d_mixing(mixing, x), atol=1e-4, rtol=1e-4)
            row = {"B,T,D": f"{batch},{context},{width}", "kernel": kernel}
            for name, fn in (("matmul ms", matmul_mixing), ("conv1d ms", conv1d_mixing)):
                def step(fn=fn) -> None:
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                        y = fn(mixing, x)
                    y.float().square().mean().backward()
                elapsed, iterations = timed(step, args.seconds / 4, device)
                row[name] = 1000 * elapsed / iterations
            rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    columns = list(rows[0])
    cells = [[_fmt(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.models", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--only", nargs="+", metavar="FAMILY", help="families to run (e.g. mixer llama)")
    parser.add_argument("--d-model", type=int, default=None, help="override every family's d_model")
    parser.add_argument("--layers", type=int, default=None, help="default: 2 on CPU, 8 on CUDA")
    parser.add_argument("--context", type=int, default=None, help="default: 128 on CPU, 512 on CUDA")
    parser.add_argument("--batch", type=int, default=None, help="default: 8 on CPU, 16 on CUDA")
    parser.add_argument("--seconds", type=float, default=None, help="timing per architecture (default 1 CPU, 3 CUDA)")
    parser.add_argument("--no-mixing-compare", action="store_true", help="skip the matmul vs Conv1d comparison")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message="Using padding='same' with even kernel")  # the Conv1d reference

    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu")
    on_gpu = device.type == "cuda"
    args.layers = args.layers or (8 if on_gpu else 2)
    args.context = args.context or (512 if on_gpu else 128)
    args.batch = args.batch or (16 if on_gpu else 8)
    args.seconds = args.seconds or (3.0 if on_gpu else 1.0)
    what = "bf16 autocast" if on_gpu else "fp32"
    print(f"device {device}, {what}, layers {args.layers}, context {args.context}, batch {args.batch}, vocab {VOCAB}")
    print("training step = forward + causal LM loss + backward + AdamW\n")

    archs = [a for a in ARCHS if not args.only or a.architecture in args.only]
    rows = []
    for arch in archs:
        try:
            rows.append(bench_arch(arch, args, device))
        except torch.OutOfMemoryError:
            rows.append({"arch": arch.label, "d_model": None, "params": None, "tokens/s": None, "peak MB": "OOM"})
        if on_gpu:
            torch.cuda.empty_cache()
    print_table(rows)
    if not args.no_mixing_compare and (not args.only or "mixer" in args.only):
        print("\nmasked sequence map, forward+backward: our matmul vs the studies' Conv1d (same weights)")
        print_table(compare_mixing(args, device))


if __name__ == "__main__":
    main()
