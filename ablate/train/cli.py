"""The trainer's command line: `python -m ablate.train --run-id N --db URL` claims the run, trains its trial and
records it (this is also what torchrun launches, one process per GPU)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ablate import store
from ablate.config import TrialConfig
from ablate.plugins import stored
from ablate.config.errors import AblateError, one_line
from ablate.config.launch import LaunchOptions, flag, launch_options
from ablate.train.state import Dist, TrainerSettings
from ablate.train.loop import train, whole_log
from ablate.config.settings import environment


def _init_dist() -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 and "RANK" not in os.environ:  # a plain process; torchrun sets RANK, for one process too
        return Dist()
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    # the loop's per-step decisions go over gloo as host values, beside NCCL's device tensors (on CPU too: one path)
    return Dist(rank=rank, world=world, local_rank=local, control=dist.new_group(backend="gloo"), distributed=True)


def parser() -> argparse.ArgumentParser:
    """The trainer's flags: what runner.trainer_command writes from a LaunchOptions, and --config for a trial by hand."""
    p = argparse.ArgumentParser(prog="python -m ablate.train", description="train one run to its budget and record it")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--run-id", type=int, help="train this run of the results DB")
    src.add_argument("--run-ids", type=_ids, help="train these runs of the results DB as one fused group "
                     "(comma-separated; ablate/train/fused.py)")
    src.add_argument("--config", help="a trial config as JSON (or @file.json); nothing is recorded without --run-id")
    p.add_argument("--db", default=None, help="results database URL (default: $ABLATE_DB_URL or results/ablate.db)")
    p.add_argument("--launch", default=None, help="the worker's LaunchOptions as JSON (what the runner passes; "
                   "the flags below are for a trainer started by hand, and it beats them)")
    p.add_argument("--artifacts", default=str(environment().artifacts))
    p.add_argument("--checkpoint-every", type=float, default=None,
                   help="seconds between checkpoints (default: a tenth of the run's expected length, 30 s to 10 min)")
    p.add_argument("--memory-cap-mb", type=float, default=None, help="treat peak memory above this as OOM")
    p.add_argument("--no-resume", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--device", default=None)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: every core)")
    return p


def _ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"run ids are integers separated by commas, e.g. 3,4,5 (got {text!r})") from None
    if len(set(ids)) != len(ids) or not ids:
        raise argparse.ArgumentTypeError(f"each run once (got {text!r})")
    return ids


def launch_of(args: argparse.Namespace) -> LaunchOptions:
    """The runner's `--launch`, or a LaunchOptions of the hand flags; a bad value names the field."""
    if args.launch is not None:
        return launch_options(json.loads(args.launch), where="the trainer's launch options: ")
    return launch_options(dict(artifacts=args.artifacts, checkpoint_every=args.checkpoint_every,
                               memory_cap_mb=args.memory_cap_mb, threads=args.threads, quiet=args.quiet),
                          flag)


class Unfailing:
    """stdout or stderr whose writes never raise: the run's log may sit on a full disk, and a line lost there must
    not fail a run that trained (`print` raising OSError at the end once turned a completed run into a failed one)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except (OSError, ValueError):  # ENOSPC, EIO, or a closed stream
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not isinstance(sys.stderr, Unfailing):
        sys.stdout, sys.stderr = Unfailing(sys.stdout), Unfailing(sys.stderr)
    if args.run_ids is not None:
        return main_group(args)
    dist_ = _init_dist()
    engine = claimant = None
    try:
        db_id = None
        if args.run_id is not None:
            engine = store.connect(args.db)
            run = store.get_run(engine, args.run_id)
            db_id = store.database_id(engine)
            claimant = _claim(engine, run, dist_)  # first: a trial that cannot be read fails under our claim
            trial = TrialConfig.model_validate(run.config)
        else:
            text = Path(args.config[1:]).read_text() if args.config.startswith("@") else args.config
            trial = TrialConfig.model_validate(json.loads(text))
        trial = stored.ensure(trial)  # exactly the plugin code the trial was registered with
        settings = TrainerSettings.launched(launch_of(args), db_url=args.db, run_id=args.run_id,
                                            resume=not args.no_resume, device=args.device, claimant=claimant,
                                            db_id=db_id)
        outcome = train(trial, settings, dist_)
        if dist_.distributed:  # no rank tears gloo/NCCL down while another still writes its end (SIGABRT at exit)
            dist.barrier()
        if dist_.is_main:
            print(json.dumps({k: v for k, v in outcome.items() if k not in ("notes", "finished_at")}, default=str))
        return 0 if outcome["status"] in ("completed", "oom", "diverged") else 3
    except Exception as exc:  # noqa: BLE001 - recorded on the run row (under our claim): no run stays `running`
        if not isinstance(exc, AblateError):
            traceback.print_exception(exc, file=sys.stderr)  # the whole of it in the log; one line on the row
        message = one_line(exc, whole_log())
        if engine is not None and claimant is not None and dist_.is_main:
            try:
                store.update_run(engine, args.run_id, claimant=claimant, status="failed", error=store.redact(message),
                              pid=None, finished_at=store.utcnow())
            except Exception:  # noqa: BLE001, S110 - the database itself may be the problem (full disk)
                pass
        print(f"error: {store.redact(message)}", file=sys.stderr)
        return 2 if isinstance(exc, AblateError) else 1
    finally:
        if dist_.distributed and dist.is_initialized():
            dist.destroy_process_group()


def main_group(args: argparse.Namespace) -> int:
    """`--run-ids`: the runs as one fused group, each under the runner's claim; 0 when every run has its outcome,
    SPLIT_EXIT when the group ran out of memory (each member checkpointed, to be trained again in smaller groups)."""
    from ablate.train.fused import SPLIT_EXIT, OutOfMemory, train_group

    engine = store.connect(args.db)
    claimant = environment().claimant
    db_id = store.database_id(engine)
    trials, settings = [], []
    try:
        for run_id in args.run_ids:
            run = store.get_run(engine, run_id)
            if claimant is None or run.claimed_by != claimant:
                raise AblateError(f"run {run_id} is claimed by {run.claimed_by}, not by the runner that started this "
                                  "fused group (ABLATE_CLAIMANT): a group is started by its runner only")
            trials.append(stored.ensure(TrialConfig.model_validate(run.config)))
            settings.append(TrainerSettings.launched(launch_of(args), db_url=args.db, run_id=run_id,
                                                     resume=not args.no_resume, device=args.device,
                                                     claimant=claimant, db_id=db_id))
        outcomes = train_group(trials, settings)
    except OutOfMemory as exc:
        print(f"error: {exc}", file=sys.stderr)
        return SPLIT_EXIT
    except Exception as exc:  # noqa: BLE001 - recorded on every member's row still ours: none stays `running`
        if not isinstance(exc, AblateError):
            traceback.print_exception(exc, file=sys.stderr)
        message = store.redact(one_line(exc, whole_log()))
        for run_id in args.run_ids:
            try:
                if store.get_run(engine, run_id).status == "running":  # not a member that has its outcome
                    store.update_run(engine, run_id, claimant=claimant, status="failed", error=message, pid=None,
                                     finished_at=store.utcnow())
            except Exception:  # noqa: BLE001, S110 - the database itself may be the problem
                pass
        print(f"error: {message}", file=sys.stderr)
        return 2 if isinstance(exc, AblateError) else 1
    for run_id, outcome in zip(args.run_ids, outcomes):
        print(json.dumps({"run_id": run_id, **{k: v for k, v in outcome.items() if k not in ("notes", "finished_at")}},
                         default=str))
    return 0 if all(o["status"] in ("completed", "oom", "diverged") for o in outcomes) else 3


def _claim(engine: Any, run: store.Run, dist_: Dist) -> str | None:
    """The claim this trainer runs under: the runner's (ABLATE_CLAIMANT), checked, or, started by hand, its own."""
    claimant = environment().claimant
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
                          f"for it, or for its heartbeat to be {store.stale_seconds():.0f} s old if that process died")
    return claimant

