"""The stacked model of a fused group (fused.py): the members' parameters, buffers and AdamW moments along a leading
member axis, the vmapped forward, and each member's clipped AdamW update with its own scalars, equal to torch's
single-tensor AdamW member by member; a member's weights and moments written back into its own Trainer (for its evals
and its checkpoint, a solo run's)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.func import vmap

from ablate.train.trainer import Trainer


class Stack:
    """The members' parameters, buffers and AdamW moments stacked along a leading member axis; the fused forward
    and backward, and each member's clipped AdamW update."""

    def __init__(self, members: list[Trainer]):
        self.template = members[0].wrapped  # its own weights are swapped out for the stack's in every call
        self.slots = slots(self.template)
        named = [dict(t.wrapped.named_parameters()) for t in members]  # tied weights once, as in the optimizer
        self.names = list(named[0])
        self.params = {n: torch.stack([p[n].detach() for p in named]).requires_grad_(named[0][n].requires_grad)
                       for n in self.names}
        buffers = [dict(t.wrapped.named_buffers()) for t in members]
        self.buffers = {n: torch.stack([b[n] for b in buffers]) for n in buffers[0]}
        self.decays = {n: named[0][n].dim() >= 2 for n in self.names}  # as make_optimizer: matrices only
        group = members[0].optimizer.param_groups[0]
        self.betas, self.eps = group["betas"], group["eps"]
        device = self.device = next(iter(self.params.values())).device
        # every member's own scalars live on the device, so a step never waits for the host: AdamW's step counts
        # and weight decays, and (fp16) each member's loss scale and growth tracker, as its own GradScaler keeps them
        self.weight_decay = on_device([t.optimizer.param_groups[0]["weight_decay"] for t in members], device)
        self.exp_avg: dict[str, torch.Tensor] = {}
        self.exp_avg_sq: dict[str, torch.Tensor] = {}
        steps = [0.0] * len(members)
        for n in self.names:
            if not self.params[n].requires_grad:
                continue
            states = [t.optimizer.state.get(p[n], {}) for t, p in zip(members, named)]
            zeros = torch.zeros_like(named[0][n], memory_format=torch.preserve_format)
            self.exp_avg[n] = torch.stack([s.get("exp_avg", zeros) for s in states])
            self.exp_avg_sq[n] = torch.stack([s.get("exp_avg_sq", zeros) for s in states])
            for i, s in enumerate(states):
                if "step" in s:
                    steps[i] = float(s["step"])
        self.steps = on_device(steps, device)
        for t in members:  # the moments live in the stack now; a checkpoint writes them back first
            t.optimizer.state.clear()
        self.scale = self.growth = None  # fp16: a loss scale per member (None: no scaling)
        if members[0].scaler is not None:
            states = [t.scaler.state_dict() for t in members]
            self.rule = {k: states[0][k] for k in ("growth_factor", "backoff_factor", "growth_interval")}
            self.scale = on_device([s["scale"] for s in states], device, torch.float32)
            self.growth = on_device([s["_growth_tracker"] for s in states], device, torch.int64)

    def __len__(self) -> int:
        return self.steps.numel()

    @property
    def adam_steps(self) -> list[int]:
        """Each member's AdamW step count (read from the device: for checkpoints and tests, not the step)."""
        return [int(s) for s in self.steps.tolist()]

    @property
    def scalers(self) -> list[dict[str, Any]] | None:
        """Each member's GradScaler state as its own scaler would save it (read from the device), or None."""
        if self.scale is None:
            return None
        return [{"scale": scale, **self.rule, "_growth_tracker": int(growth)}
                for scale, growth in zip(self.scale.tolist(), self.growth.tolist())]

    def _one(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], ids: torch.Tensor,
             labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with swapped(self.slots, {**params, **buffers}):
            total, count, aux, _ = self.template(ids, labels)
        return total, count, aux

    def losses(self, ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every member's (loss sum, target count, auxiliary loss) on its own micro-batch, ids (K, B, T): each (K,).
        Random ops are refused (randomness='error'): a member's draws would not be its solo run's."""
        return vmap(self._one, randomness="error")(self.params, self.buffers, ids, labels)

    def loss_scales(self) -> torch.Tensor | float:
        """Each member's loss scale (K,), fp16's; 1 without one."""
        return 1.0 if self.scale is None else self.scale

    def update(self, lrs: list[float]) -> None:
        """Each member's gradient (fp16: unscaled, and a member whose gradient is not finite skips its step and
        halves its scale, as its own GradScaler would) clipped at norm 1.0 by its own norm, then AdamW at its own
        learning rate and weight decay: torch's single-tensor AdamW, its scalars per member in float64 as torch's are
        Python floats; gradients cleared. Nothing is read back to the host."""
        k = len(lrs)
        beta1, beta2 = self.betas
        with torch.no_grad():
            grads = {n: p.grad for n, p in self.params.items() if p.grad is not None}
            finite = self._unscale(grads, k)  # None without scaling
            steps = self.steps + (1.0 if finite is None else finite.double())
            norms = torch.stack([torch.linalg.vector_norm(g.reshape(k, -1), 2.0, dim=1) for g in grads.values()])
            coef = torch.clamp(1.0 / (torch.linalg.vector_norm(norms, 2.0, dim=0) + 1e-6), max=1.0)  # (K,)
            lr, counted = on_device(lrs, self.device), steps.clamp(min=1.0)  # a member skipping its first step: unused
            dtype = next(iter(self.params.values())).dtype
            decay = (1 - lr * self.weight_decay).to(dtype)
            step_size = (-lr / (1 - beta1 ** counted)).to(dtype)
            bias2_sqrt = ((1 - beta2 ** counted) ** 0.5).to(dtype)
            for n, g in grads.items():
                p, m, v = self.params[n], self.exp_avg[n], self.exp_avg_sq[n]
                shape = (k,) + (1,) * (p.dim() - 1)
                before = None if finite is None else (p.clone(), m.clone(), v.clone())
                g.mul_(coef.view(shape))
                if self.decays[n]:
                    p.mul_(decay.view(shape))
                m.lerp_(g, 1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                denom = (v.sqrt() / bias2_sqrt.view(shape)).add_(self.eps)
                p.add_(step_size.view(shape) * m / denom)  # (value * t1) / t2: torch's addcdiv, member by member
                p.grad = None
                if before is not None:  # the members that skip this step: as they were
                    for now, was in zip((p, m, v), before):
                        now.copy_(torch.where(finite.view(shape), now, was))
            self.steps = steps

    def _unscale(self, grads: dict[str, torch.Tensor], k: int) -> torch.Tensor | None:
        """fp16: every member's gradient divided by its scale; which members' gradients are finite (the others skip
        this step); each member's scale updated as GradScaler.update does, on the device. None without scaling."""
        if self.scale is None:
            return None
        inv = self.scale.double().reciprocal().float()
        finite = torch.ones(k, dtype=torch.bool, device=self.device)
        for g in grads.values():
            g.mul_(inv.view((k,) + (1,) * (g.dim() - 1)))
            finite &= torch.isfinite(g.reshape(k, -1)).all(dim=1)
        grown = torch.where(finite, self.growth + 1, 0)
        due = grown == self.rule["growth_interval"]
        larger = self.scale * self.rule["growth_factor"]
        scale = torch.where(finite, self.scale, self.scale * self.rule["backoff_factor"])
        self.scale = torch.where(due & torch.isfinite(larger), larger, scale)
        self.growth = torch.where(due, 0, grown)
        return finite

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None

    def write_back(self, i: int, t: Trainer, moments: bool) -> None:
        """Member i's weights (and, for a checkpoint, its moments as its own AdamW holds them) into its Trainer."""
        named = dict(t.wrapped.named_parameters())
        with torch.no_grad():
            for n in self.names:
                named[n].copy_(self.params[n][i])
        t.optimizer.state.clear()
        if self.scale is not None:
            t.scaler.load_state_dict(self.scalers[i])
        step = self.adam_steps[i]
        if moments and step > 0:
            for n in self.exp_avg:
                t.optimizer.state[named[n]] = {"step": torch.tensor(float(step)), "exp_avg": self.exp_avg[n][i].clone(),
                                               "exp_avg_sq": self.exp_avg_sq[n][i].clone()}

    def drop(self, i: int) -> None:
        """Member i leaves the stack."""
        keep = [j for j in range(len(self)) if j != i]

        def kept(x: torch.Tensor) -> torch.Tensor:
            return x.detach()[keep].clone()

        self.params = {n: kept(p).requires_grad_(p.requires_grad) for n, p in self.params.items()}
        self.buffers = {n: kept(b) for n, b in self.buffers.items()}
        self.exp_avg = {n: kept(m) for n, m in self.exp_avg.items()}
        self.exp_avg_sq = {n: kept(v) for n, v in self.exp_avg_sq.items()}
        self.steps, self.weight_decay = kept(self.steps), kept(self.weight_decay)
        if self.scale is not None:
            self.scale, self.growth = kept(self.scale), kept(self.growth)


def on_device(values: list[float], device: torch.device, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Host values as a tensor on `device` without waiting for it (a GPU's copy from pinned memory, queued)."""
    tensor = torch.tensor(values, dtype=dtype)
    return tensor.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else tensor


def slots(module: torch.nn.Module) -> list[tuple[torch.nn.Module, str, str, str]]:
    """Every place a tensor of `module` is held: (submodule, "_parameters" or "_buffers", attribute, the tensor's
    name in named_parameters / named_buffers). A module shared by two parents is listed once, a parameter two
    modules hold (a tied head) at both, under its one name."""
    names = {id(p): n for n, p in module.named_parameters()} | {id(b): n for n, b in module.named_buffers()}
    return [(sub, kind, attr, names[id(tensor)]) for sub in module.modules()
            for kind in ("_parameters", "_buffers") for attr, tensor in getattr(sub, kind).items()
            if tensor is not None and id(tensor) in names]


@contextlib.contextmanager
def swapped(places: list[tuple[torch.nn.Module, str, str, str]], tensors: dict[str, torch.Tensor]) -> Iterator[None]:
    """The module computing with `tensors` (by name) in place of its own, restored after. torch.func's
    functional_call leaves a vmapped tensor behind in a module shared by two parents (torch 2.13: it restores each
    name in turn, and the second name of a shared module restores what the first had swapped in), so the swap is
    made here, once per place."""
    saved = [getattr(sub, kind)[attr] for sub, kind, attr, _ in places]
    try:
        for sub, kind, attr, name in places:
            getattr(sub, kind)[attr] = tensors[name]
        yield
    finally:
        for (sub, kind, attr, _), tensor in zip(places, saved):
            getattr(sub, kind)[attr] = tensor
