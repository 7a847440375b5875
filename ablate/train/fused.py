"""Fused groups: several runs of one shape trained in one process as one batched model.

A group's members are Trainers (trainer.py), each built as it would be alone: its seed and init, its data order,
its schedule, its recorder, run row and checkpoint. Only the step is the group's: the members' parameters
stacked along a leading member axis, one vmapped forward and backward (torch.func) over each member's own
micro-batches, each member's gradient clipped by its own norm, and AdamW applied to the stack with each member's
own learning rate and weight decay. The rest is the solo loop's own code (loop.py), member by member: decide,
bookkeeping, evals and checkpoints (the member's weights and moments copied out of the stack first, so its
checkpoint is a solo run's: it resumes fused or alone), and the finish. A member that ends its budget, diverges,
is cancelled or loses its claim leaves the group at its step; the others go on. A group out of memory
checkpoints every member and ends with SPLIT_EXIT: the runner trains it again as two halves.

The contract (tests/train/test_fused.py): a member's losses equal its solo run's, within 1e-5 relative in fp32
on CPU (fp16: each member keeps its own loss scale). A group that cannot hold it trains its members alone, one after
another, saying why in their notes (ablate/config/fusion.py says which trials never fuse; here, a model that does
not vmap). A wall-clock budget is read as the steps a solo run makes in it here (members.py).
"""

from __future__ import annotations

import dataclasses
import sys
import time
import warnings

import torch

from ablate import store
from ablate.config import TrialConfig
from ablate.config.errors import one_line
from ablate.train import budget as bud
from ablate.train.device import autocast, check_memory, is_oom, to_device
from ablate.train.loop import LoopState, begin, bookkeeping, decide, finish, intermediate_eval, train, whole_log
from ablate.train.points import checkpoint, record_losses
from ablate.train.members import MemberClock, MemberStop, read_wall_clock
from ablate.train.stack import Stack, on_device
from ablate.train.state import Dist, TrainerSettings
from ablate.train.stopping import Stopped, StopSignal
from ablate.train.trainer import Outcome, Trainer

# CPU attention has no batching rule: vmap runs it member by member (correct, slower; CUDA's kernels batch), and
# says so at every step of every group
warnings.filterwarnings("ignore", message="There is a performance drop because we have not yet implemented the "
                        "batching rule", category=UserWarning)

SPLIT_EXIT = 4  # the trainer's exit code when a group ran out of memory: every member checkpointed, to be split


class OutOfMemory(Exception):
    """The group's step ran out of memory; every member was checkpointed and stopped."""


def train_group(trials: list[TrialConfig], settings: list[TrainerSettings]) -> list[Outcome]:
    """Train the trials as one fused group (or, where the model refuses it, one after another) and record each;
    their outcomes, in order. Raises OutOfMemory when the group should be split."""
    members: list[Trainer] = []
    stop = StopSignal()
    stop.install(lambda: _stop_all(members, settings))
    try:
        for trial, s in zip(trials, settings):
            members.append(_member(trial, s))
        read_wall_clock(members, settings[0])
        stack = Stack(members)
        reason = probe(stack, members)
        if reason is None:
            stop.begin_training()
    except Stopped:  # nothing trained yet: no checkpoint; the next attempt starts over
        stop.end_startup()
        stop.uninstall()
        return _stop_all(members, settings)
    if reason is None:
        try:
            return Group(members, stack).run(stop)
        finally:
            stop.uninstall()
    stop.uninstall()
    for t in members:  # the solo trainers below record these runs
        t.recorder.close()
    print(f"not fused: {reason}; the {len(trials)} runs train one after another", file=sys.stderr, flush=True)
    return alone(trials, settings, reason)


def alone(trials: list[TrialConfig], settings: list[TrainerSettings], reason: str) -> list[Outcome]:
    """Each run trained solo in this process; once one is stopped (SIGTERM: `preempted`), the rest are given back.
    A run cancelled meanwhile (its row, from any host) is not started; the others train."""
    outcomes: list[Outcome] = []
    for trial, s in zip(trials, settings):
        if outcomes and outcomes[-1]["status"] == "preempted":
            outcomes.append(give_back(s))
        elif _cancelled(s):
            outcomes.append(Outcome(status="cancelled"))
        else:
            outcomes.append(train(trial, dataclasses.replace(s, notes={"fused": {"refused": reason}})))
    return outcomes


def _cancelled(s: TrainerSettings) -> bool:
    """Whether a member's run was cancelled before its turn (its claim then dropped, as a stopped trainer's is)."""
    if s.run_id is None:
        return False
    engine = store.connect(s.db_url)
    if store.get_run(engine, s.run_id).status != "cancelled":
        return False
    store.update_run(engine, s.run_id, pid=None, finished_at=store.utcnow())
    return True


def give_back(s: TrainerSettings) -> Outcome:
    """A member this process claimed but never trained: owed again (`preempted`, as a solo run stopped at
    start-up), its claim kept until the runner reads it."""
    if s.run_id is not None:
        store.update_run(store.connect(s.db_url), s.run_id, claimant=s.claimant, status="preempted", pid=None,
                         finished_at=store.utcnow())
    return Outcome(status="preempted")


def _stop_all(members: list[Trainer], settings: list[TrainerSettings]) -> list[Outcome]:
    """Stopped during start-up: the built members end as a solo run stopped then does, the rest are given back."""
    return [t.stopped() for t in members] + [give_back(s) for s in settings[len(members):]]


def _member(trial: TrialConfig, settings: TrainerSettings) -> Trainer:
    """A member built and resumed exactly as its solo run would be (its seed set just before its model is made)."""
    t = Trainer(trial, settings, Dist())
    t.build(fused=True)
    t.resume()
    t.warmup_seconds = 0.0
    return t


def probe(stack: Stack, members: list[Trainer]) -> str | None:
    """One fused forward and backward on the members' first micro-batches, nothing updated (the group's warm-up,
    and the check that the model vmaps): why it cannot fuse, or None. Out of memory is not a refusal: the first
    step meets it again."""
    t0 = time.perf_counter()
    data_before = [t.clock.meters["data"] for t in members]
    try:
        _backward(stack, members)
    except Exception as exc:  # noqa: BLE001 - any failure of the batched forward means: train alone
        if not is_oom(exc):
            return f"its model does not train batched (torch.func.vmap: {str(exc).splitlines()[0][:300]})"
    finally:
        stack.zero_grad()
    for t, data in zip(members, data_before):
        t.sync()
        t.clock.meters["data"] = data  # warm-up is not training: its data wait is not the run's
        t.warmup_seconds = time.perf_counter() - t0
        t.clock.meters["warmup"] += t.warmup_seconds
    return None


def _micro_batches(t: Trainer, offset: int = 0) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int, int]:
    """A member's micro-batches of this step (host), its real tokens and its targets, as Trainer.one_step reads."""
    p = t.progress
    micro = [t.batches.take(p.samples + offset + j * p.micro_batch, p.micro_batch) for j in range(p.grad_accum)]
    tokens = sum(t.count_tokens(labels) for _, labels in micro)
    targets = max(sum(t.count_targets(labels) for _, labels in micro), 1)
    return micro, tokens, targets


def _backward(stack: Stack, members: list[Trainer]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The fused forward and backward of one step: every member's micro-batches, its loss weighted by its own target
    count over the step (as Trainer.one_step). (loss sums (K,), counts (K,), real tokens per member)."""
    device, precision = members[0].device, members[0].precision
    t0 = time.perf_counter()
    batches = [_micro_batches(t) for t in members]
    targets = on_device([float(b[2]) for b in batches], device, torch.float32)  # queued: the step does not wait
    n_micro = len(batches[0][0])
    micro = [(torch.stack([to_device(b[0][j][0], device) for b in batches]),  # ids (K, B, T)
              torch.stack([to_device(b[0][j][1], device) for b in batches])) for j in range(n_micro)]
    waited = time.perf_counter() - t0
    for t in members:  # the group's wait for data is each member's
        t.clock.meters["data"] += waited
    loss_sum = torch.zeros(len(members), device=device)
    count = torch.zeros(len(members), device=device)
    for ids, labels in micro:
        with autocast(device, precision):
            s, c, aux = stack.losses(ids, labels)
        # members are independent: each gets its own gradient; fp16 scales each by its own loss scale
        ((s / targets + aux / n_micro) * stack.loss_scales()).sum().backward()
        loss_sum += s.detach().float()
        count += c.detach().float()
    return loss_sum, count, [b[1] for b in batches]


# ---------------------------------------------------------------- the loop


@dataclasses.dataclass
class Member:
    """A member in the loop: its Trainer, its loop state (the solo loop's counters) and its stop flag."""

    t: Trainer
    state: LoopState
    stop: MemberStop


class Group:
    """The members still training, the stack and the shared clock; each member's outcome once it has left."""

    def __init__(self, members: list[Trainer], stack: Stack):
        self.trainers, self.stack = members, stack
        self.clock = bud.Clock(sync=members[0].sync)  # the group's stepping time
        runs = [t.settings.run_id for t in members]
        for t in members:
            t.clock = MemberClock(self.clock, t.clock)
            before = t.progress.notes.get("fused") or {}  # a larger group's, split (out of memory): said still
            t.progress.notes["fused"] = {"members": len(members), "runs": runs,
                                         **{k: v for k, v in before.items() if k == "split"}}
        self.members: list[Member] = []
        self.outcomes: dict[int, Outcome] = {}

    def run(self, stop: StopSignal) -> list[Outcome]:
        for t in self.trainers:
            begin(t)
            own = MemberStop(stop)
            t.recorder.on_stop = lambda own=own: setattr(own, "flag", True)  # a cancel of this run alone
            self.members.append(Member(t, LoopState(t), own))
        try:
            self.loop()
        except OutOfMemory:
            raise
        except Exception as exc:  # recorded on every member still training, then re-raised for the runner
            self.clock.stop()
            for m in self.members:
                m.t.finalize("failed", one_line(exc, whole_log()))
            raise
        return [self.outcomes[id(t)] for t in self.trainers]

    def loop(self) -> None:
        self.clock.start()
        while self.members:
            lrs: list[float] = []
            for i in reversed(range(len(self.members))):  # from the end: a member leaving does not shift the rest
                lr = self.points(i, self.members[i])
                if lr is None:
                    self.leave(i)
                else:
                    lrs.insert(0, lr)
            if not self.members:
                return
            self.clock.start()
            self.step(lrs)

    def points(self, i: int, m: Member) -> float | None:
        """Member i's decisions before this step (the solo loop's, with its own counters): its evals and checkpoint
        done, and its learning rate for the step; None when it leaves the group (its state's status says how)."""
        t, s = m.t, m.state
        if t.recorder.lost:
            m.stop.flag = True
        d = decide(t, s, m.stop)
        if not bookkeeping(t, s, d):
            s.status = "diverged"
            return None
        if d.stop:
            if m.stop.flag:
                s.status = "preempted"
            elif d.past_horizon and d.f < 1.0:
                t.progress.notes["ended_at_horizon"] = {"step": t.progress.step, "budget_fraction": round(d.f, 4)}
            return None
        if d.eval:
            self.stack.write_back(i, t, moments=False)
            intermediate_eval(t, d.f)
        if d.checkpoint:
            self.stack.write_back(i, t, moments=True)
            with t.clock.paused("checkpoint"):
                checkpoint(t, s.interval)
            t.optimizer.state.clear()
            s.last_ckpt_wall = time.monotonic()
        p = t.progress
        return t.lr_at(d.f, p.step, p.tokens, p.samples, p.rows)

    def leave(self, i: int) -> None:
        """Member i ends as its solo run would at this step (its checkpoint, final eval and outcome: the solo
        loop's finish) and leaves the stack."""
        m = self.members.pop(i)
        self.stack.write_back(i, m.t, moments=True)
        self.outcomes[id(m.t)] = finish(m.t, m.state)
        m.t.optimizer.state.clear()
        self.stack.drop(i)

    def step(self, lrs: list[float]) -> None:
        """One fused optimizer step of every member."""
        device, cap = self.members[0].t.device, self.members[0].t.settings.memory_cap_mb
        try:
            loss_sum, count, tokens = _backward(self.stack, [m.t for m in self.members])
            check_memory(device, cap)  # the peak is the backward's: checked before anything is updated
            self.stack.update(lrs)
        except Exception as exc:
            if not is_oom(exc):
                raise
            self.out_of_memory(exc)
            return
        for i, m in enumerate(self.members):
            m.state.interval_sum += loss_sum[i]
            m.state.interval_count += count[i]
            p = m.t.progress
            p.step += 1
            p.samples += p.micro_batch * p.grad_accum
            p.tokens += tokens[i]

    def out_of_memory(self, exc: BaseException) -> None:
        """Out of memory in a step: one member left ends as its solo run would (`oom`); a group checkpoints every
        member where it stands (nothing of the step was applied) and raises OutOfMemory, to be trained again as
        smaller groups."""
        self.stack.zero_grad()
        self.clock.stop()
        if len(self.members) == 1:
            m = self.members.pop()
            record_losses(m.state.pending.read(), m.t.progress, m.t.recorder, m.state.bar, m.t.divergence_limit)
            self.outcomes[id(m.t)] = m.t.finish_oom(exc)
            return
        k = len(self.members)
        said = f"a fused group of {k} ran out of memory ({str(exc).splitlines()[0][:200]}): trained again in smaller groups"
        for i, m in enumerate(self.members):
            t = m.t
            record_losses(m.state.pending.read(), t.progress, t.recorder, m.state.bar, t.divergence_limit)
            self.stack.write_back(i, t, moments=True)
            t.progress.notes["fused"]["split"] = [*t.progress.notes["fused"].get("split", []), said]  # each split
            checkpoint(t, m.state.interval, wait=True)
            self.outcomes[id(t)] = t.finalize("preempted", said)
        raise OutOfMemory(said)
