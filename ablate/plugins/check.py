"""The model contract as a check any registered architecture runs (`ablate check ARCH`, and sweep registration).

The properties tests/models holds the built-in zoo to, asked of one family's built model at tiny sizes on the CPU:
shape, causality in eval and train mode, rows kept apart, the closed-form parameter count, a few steps lowering the
loss, the state-dict round trip and DDP. Each is answered as a Finding, so that a plugin's author sees every failure
at once. Imports torch: the torch-free paths (plan, reading a spec) never import this module.
"""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from pydantic import ValidationError
from torch import Tensor, nn

from ablate import models
from ablate.config import TrialConfig, registry
from ablate.config.errors import AblateError
from ablate.objectives.base import causal_lm_loss

SIZES = dict(d_model=16, layers=2, heads=2, context=8, batch_size=3, lr=1e-3)
# the check reads no data; a label column lets an objective that needs one (classification) validate too
DATASET = {"source": "x", "label_field": "label"}
NOISE = 0.02  # every weight is nudged by this much, so that a mask kept only in the initial weights shows
STEPS, STEP_LR = 10, 1e-2  # the training check: AdamW steps on one fixed batch
RANKS = 2  # the DDP check's processes


@dataclass(frozen=True)
class Finding:
    """One property of the contract: ok True (held), False (failed), None (skipped, the reason in detail)."""

    name: str
    ok: bool | None
    detail: str


@dataclass(frozen=True)
class _Subject:
    """What every property is asked of."""

    trial: TrialConfig
    vocab: int
    ddp: bool
    plugins: tuple[str, ...]


class _Leak(NamedTuple):
    """Logits at `position` moved by `amount` when the tokens after it `how` (change, are dropped), at length T."""

    position: int
    amount: float
    how: str
    length: int


def small_trial(architecture: str, options: dict | None = None, objective: str = "clm", **sizes: Any) -> TrialConfig:
    """A tiny CPU trial of `architecture` (SIZES, each overridable, as are dataset and budget): what `ablate check`
    builds."""
    registry.check_architecture(architecture)  # an unknown name: the registry's message, with the nearest names
    try:
        return TrialConfig(architecture=architecture, options=options or {}, objective=objective,
                           **{"dataset": DATASET, "budget": {"steps": 1}, **SIZES, **sizes})
    except ValidationError as exc:
        raise AblateError(f"cannot check architecture {architecture!r} with options {options or {}}: "
                          f"{_tidy(exc)}") from None


def _tidy(exc: ValidationError) -> str:
    """A ValidationError's messages on one line, each after its field where it has one."""
    return "; ".join((f"{'.'.join(map(str, e['loc']))}: " if e["loc"] else "") + e["msg"].removeprefix("Value error, ")
                     for e in exc.errors())


def check_trial(trial: TrialConfig, vocab: int = 32, *, fast: bool = False, ddp: bool = False,
                plugins: Sequence[str] = ()) -> list[Finding]:
    """Every property of the contract for the trial's model; fast: shape, causal (eval and train) and rows
    independent only (what registering a sweep runs). `plugins`: what a DDP rank loads to find the architecture again.
    Runs on one torch thread (tiny models are fastest so); the caller's thread count and RNG are restored."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            return list(_findings(_Subject(trial, vocab, ddp, tuple(plugins)), fast))
    finally:
        torch.set_num_threads(threads)


def _findings(s: _Subject, fast: bool) -> Iterator[Finding]:
    shape = _run("shape", _shape, s)
    yield shape
    for name, check in PROPERTIES.items():
        if not fast or name in FAST:
            yield _run(name, check, s) if shape.ok else Finding(name, None, "not run: the shape check failed")


def _run(name: str, check: Callable[[_Subject], tuple[bool | None, str]], s: _Subject) -> Finding:
    """One property; an exception it raises is its failure, never the whole check's."""
    try:
        ok, detail = check(s)
    except Exception as exc:  # noqa: BLE001 - a plugin's property may raise anything: that is its finding
        ok, detail = False, f"raised {_one_line(exc)}"
    return Finding(name, ok, detail)


def _one_line(exc: BaseException) -> str:
    """'ExcType: the message's last line' (a child process's error carries its whole traceback)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"


# ---------------------------------------------------------------- models, tokens, logits


def _build(s: _Subject, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return models.build(s.trial, s.vocab)


def _nudged(s: _Subject, train: bool = False) -> nn.Module:
    """The model with every weight nudged, so that a mask kept only in the initial weights shows."""
    model = _build(s).train(train)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(NOISE * torch.randn_like(p))
    return model


def _tokens(s: _Subject, length: int, seed: int) -> Tensor:
    rows = max(2, s.trial.batch_size)  # rows independent needs other rows
    return torch.randint(0, s.vocab, (rows, length), generator=torch.Generator().manual_seed(seed))


def _changed(s: _Subject, x: Tensor, seed: int) -> Tensor:
    """x with every token replaced by a different one."""
    return (x + 1 + _tokens(s, x.shape[1], seed)[: x.shape[0]] % (s.vocab - 1)) % s.vocab


def _logits(model: nn.Module, x: Tensor) -> Tensor:
    """Logits (B, T, V) without grad, the RNG seeded alike before every forward (train mode: equal dropout masks)."""
    torch.manual_seed(0)
    with torch.no_grad():
        return model(x)


def _tolerance(reference: Tensor) -> float:
    return 1e-5 * max(1.0, reference.abs().max().item())


def _lengths(context: int) -> list[int]:
    """The full length, a shorter one and one token: a model takes any T <= context."""
    return sorted({n for n in (context, context - 3, 1) if n > 0}, reverse=True)


def _listed(lengths: list[int]) -> str:
    return ", ".join(map(str, lengths))


def _positions(length: int) -> Sequence[int]:
    """Each t after which tokens are replaced: every one of a short sequence, 16 spread over a long one."""
    return range(length - 1) if length <= 33 else sorted({round(i * (length - 2) / 15) for i in range(16)})


# ---------------------------------------------------------------- the properties


def _shape(s: _Subject) -> tuple[bool, str]:
    try:
        model = _build(s).eval()
    except Exception as exc:  # noqa: BLE001 - a plugin's builder may raise anything: that is its finding
        return False, f"build raised {_one_line(exc)}"
    x = _tokens(s, s.trial.context, seed=0)
    out = _logits(model, x)
    expected = (*x.shape, s.vocab)
    got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
    if got != expected:
        return False, f"expected logits (B, T, V) = {expected}, got {got}: build must return input_ids -> logits"
    if not torch.isfinite(out).all():
        return False, f"logits (B, T, V) = {expected} hold NaN or inf at initialisation: nothing would train"
    if not any(p.requires_grad for p in model.parameters()):
        return False, "the model has no trainable parameters: nothing would train"
    return True, f"(B, T, V) = {expected}, finite, with trainable parameters"


def _causal_eval(s: _Subject) -> tuple[bool | None, str]:
    model = _nudged(s)
    full = _tokens(s, s.trial.context, seed=1)
    reference = _logits(model, full)
    tol, leaks = _tolerance(reference), []
    for length in _lengths(s.trial.context):
        x = full[:, :length]
        base = _logits(model, x)
        leaks += _first_leak(base, reference[:, :length], length, "are dropped", tol)
        leaks += _replacement_leaks(s, model, x, base, tol)
    return _verdict(s, leaks, f"later tokens never move earlier logits (T = {_listed(_lengths(s.trial.context))})")


def _causal_train(s: _Subject) -> tuple[bool | None, str]:
    family = registry.options_module(s.trial.architecture)
    if getattr(family, "TRAIN_MODE_CAUSAL", True) is False:
        return None, getattr(family, "TRAIN_MODE_NOTE", "the family declares TRAIN_MODE_CAUSAL = False")
    model = _nudged(s, train=True)
    x = _tokens(s, s.trial.context, seed=1)
    base = _logits(model, x)
    leaks = _replacement_leaks(s, model, x, base, _tolerance(base))
    return _verdict(s, leaks, f"later tokens never move earlier logits in train mode (T = {s.trial.context})")


def _replacement_leaks(s: _Subject, model: nn.Module, x: Tensor, base: Tensor, tol: float) -> list[_Leak]:
    """For each t, the first position <= t whose logits move when every token after t is replaced."""
    leaks = []
    for t in _positions(x.shape[1]):
        y = x.clone()
        y[:, t + 1 :] = _changed(s, x, seed=10 + t)[:, t + 1 :]
        leaks += _first_leak(_logits(model, y)[:, : t + 1], base[:, : t + 1], x.shape[1], "change", tol)
    return leaks


def _first_leak(moved: Tensor, base: Tensor, length: int, how: str, tol: float) -> list[_Leak]:
    """The first position where `moved` differs from `base` by more than tol, as a one-item list (else empty)."""
    change = (moved - base).abs().amax(dim=(0, 2))  # (T,)
    over = (change > tol).nonzero()
    return [_Leak(int(over[0]), change[over[0]].item(), how, length)] if len(over) else []


def _verdict(s: _Subject, leaks: list[_Leak], held: str) -> tuple[bool | None, str]:
    """Held, or the first leaking position; a leak is no failure for an objective that reads whole documents."""
    if not leaks:
        return True, held
    first = min(leaks)
    said = (f"logits at position {first.position} change when tokens after it {first.how} "
            f"(by {first.amount:.1e}; T={first.length})")
    if registry.objective(s.trial.objective).unmasked:
        return None, f"not required: objective {s.trial.objective!r} reads whole documents ({said})"
    return False, f"{said}: mask the model so that position t reads tokens <= t only"


def _rows_independent(s: _Subject) -> tuple[bool, str]:
    model = _nudged(s)
    for length in _lengths(s.trial.context):
        x = _tokens(s, length, seed=2)
        base = _logits(model, x)
        for row in range(x.shape[0]):
            y = _changed(s, x, seed=20 + row)
            y[row] = x[row]
            moved = (_logits(model, y)[row] - base[row]).abs().max().item()
            if moved > _tolerance(base):
                return False, (f"row {row}'s logits change when the other rows change (by {moved:.1e}; T={length}): "
                               f"nothing may mix the rows of a batch in eval mode")
    return True, f"no row moves when the other {x.shape[0] - 1} change (T = {_listed(_lengths(s.trial.context))})"


def _closed_form(trial: TrialConfig, vocab: int) -> int | None:
    """The family's param_count(trial, vocab), or None where it gives none (a plugin need not)."""
    family = registry.check_architecture(trial.architecture)
    return family.param_count(trial, vocab) if family.closed_form else None


def _param_count(s: _Subject) -> tuple[bool | None, str]:
    expected = _closed_form(s.trial, s.vocab)
    if expected is None:
        return None, "no closed form given (the options module has no param_count(trial, vocab_size))"
    actual = sum(p.numel() for p in _build(s).parameters())
    if actual != expected:
        return False, f"param_count says {expected:,}, the model has {actual:,}: correct param_count or the model"
    return True, f"{actual:,} parameters, as param_count says"


def _training(s: _Subject) -> tuple[bool, str]:
    model = _build(s).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=STEP_LR)
    x = _tokens(s, s.trial.context, seed=3)
    losses = []
    for step in range(STEPS + 1):  # the last forward only measures the loss after the last step
        torch.manual_seed(0)
        loss = _next_token_loss(model, x)
        losses.append(loss.item())
        if step < STEPS:
            optimizer.zero_grad()
            (loss + _auxiliary_loss(model)).backward()
            optimizer.step()
    said = f"loss {losses[0]:.2f} -> {losses[-1]:.2f} in {STEPS} AdamW steps (lr {STEP_LR:g}) on one batch"
    if not losses[-1] < losses[0]:  # nan too
        return False, f"{said}: it must go down; do the gradients reach the weights?"
    return True, said


def _next_token_loss(model: nn.Module, x: Tensor) -> Tensor:
    total, count = causal_lm_loss(model(x), x)
    return total / count


def _auxiliary_loss(model: nn.Module) -> Tensor | float:
    """The losses a model keeps from its last forward (mixture-of-depths' router), added as the trainer adds them."""
    return sum(aux for m in model.modules() if hasattr(m, "auxiliary_loss") for aux in [m.auxiliary_loss()]
               if aux is not None)


def _state_dict(s: _Subject) -> tuple[bool, str]:
    first, second = _build(s, seed=0).eval(), _build(s, seed=1).eval()
    second.load_state_dict(first.state_dict())
    x = _tokens(s, s.trial.context, seed=4)
    expected = _logits(first, x)
    moved = (_logits(second, x) - expected).abs().max().item()
    if moved > _tolerance(expected):
        return False, (f"a model built with another seed, given this one's state_dict, gives other logits (by "
                       f"{moved:.1e}): keep every seed-dependent tensor in a parameter or a persistent buffer")
    return True, "a model built with another seed gives equal logits after load_state_dict"


def _ddp(s: _Subject) -> tuple[bool | None, str]:
    if not s.ddp:
        return None, "pass --ddp"
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "difference"
        torch.multiprocessing.spawn(_ddp_rank, nprocs=RANKS, args=(
            _free_port(), s.trial.model_dump(mode="json"), s.vocab, s.plugins, str(out)))
        difference = float(out.read_text())
    if difference > 1e-6:
        return False, (f"parameters differ across {RANKS} ranks by {difference:.1e} after one DDP step: DDP averages "
                       f"only the gradients of parameters every rank's loss reaches; none may change in forward")
    return True, f"parameters equal across {RANKS} gloo ranks after one step on different batches"


PROPERTIES: dict[str, Callable[[_Subject], tuple[bool | None, str]]] = {
    "causal (eval)": _causal_eval, "causal (train)": _causal_train, "rows independent": _rows_independent,
    "param count": _param_count, "training": _training, "state dict": _state_dict, "ddp": _ddp}
FAST = ("causal (eval)", "causal (train)", "rows independent")  # what registering a sweep (and plan) asks


# ---------------------------------------------------------------- DDP's ranks


def _ddp_rank(rank: int, port: int, trial: dict[str, Any], vocab: int, plugins: tuple[str, ...], out: str) -> None:
    """One rank: the model built alike, one AdamW step on this rank's own batch, the parameters compared on rank 0."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    load_plugins(plugins)  # a fresh process knows the built-in families only
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=RANKS)
    try:
        s = _Subject(TrialConfig.model_validate(trial), vocab, True, plugins)
        model = nn.parallel.DistributedDataParallel(_build(s).train())
        optimizer = torch.optim.AdamW(model.parameters(), lr=STEP_LR)
        x = _tokens(s, s.trial.context, seed=100 + rank)
        (_next_token_loss(model, x) + _auxiliary_loss(model.module)).backward()
        optimizer.step()
        mine = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
        everyone = [torch.empty_like(mine) for _ in range(RANKS)]
        dist.all_gather(everyone, mine)
        if rank == 0:
            Path(out).write_text(str(max((theirs - mine).abs().max().item() for theirs in everyone)))
        dist.barrier()  # no rank tears gloo down while another still writes its end (SIGABRT at exit)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def load_plugins(refs: Sequence[str], **where: Any) -> None:
    """Register the architectures of plugins (file paths or module names); `where`: load_plugin's base_dir."""
    from ablate.plugins.load import load_plugin

    for ref in refs:
        load_plugin(ref, **where)
