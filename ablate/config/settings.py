"""Every ABLATE_* environment variable in one place: its type, default and meaning, read and checked together.

Nothing else in ablate reads `os.environ` for an ABLATE_* setting: it asks `environment()`. The environment is parsed
once per distinct set of ABLATE_* values (a process whose environment does not change parses it once; a test or a
forked trainer that changes it gets the new values), and a bad value is refused with the variable's name and
what it should be, wherever it is first read.

A plain pydantic model rather than pydantic-settings: the latter costs ~90 ms of imports in every torch-free
command (`ablate plan`, `ablate sql`) for a prefix and a mapping we write here in a few lines.

Variables that are not settings but messages between ablate's own processes (ABLATE_CLAIMANT, ABLATE_RUNNER_PID,
ABLATE_RUN_LOG: a runner tells its trainer who it is and where its output goes) are declared here too, so that one list names every variable ablate reads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ablate.config.errors import AblateError

PREFIX = "ABLATE_"


class Settings(BaseModel):
    """The ABLATE_* environment, typed. Field `x` is variable ABLATE_X; an empty value counts as unset."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    # where results go
    db_url: str | None = Field(None, description="results database URL or SQLite path (--db beats it)")
    read_url: str | None = Field(None, description="the read-only PostgreSQL login `ablate sql` uses")
    artifacts: Path = Field(Path("results/artifacts"), description="checkpoints, logs and reports (--artifacts beats it)")
    code_version: str | None = Field(None, description="the code version stamped into a container image at build time")
    # how runs are started and watched (every host of a sweep must agree on the timings)
    worker_host: str | None = Field(None, max_length=100, description="the name this machine goes by in a cluster's "
                                    "pools (its workers, their trials' errors, its trial queue); default its hostname "
                                    "(`ablate worker --host` beats it)")
    gpus_per_trial: int = Field(1, ge=1, description="GPUs each trial gets on `ablate worker` (--gpus-per-trial beats it)")
    trials_per_gpu: int = Field(1, ge=1, le=64, description="trainers sharing one GPU (`ablate worker` and `ablate sweep "
                                "run --trials-per-gpu` set it for their trainers): each caps its memory at its share of "
                                "the GPU, and where the node runs MPS takes its share of the SMs")
    # 0: never; unset or 1 (True): where no GPU is visible; "always": where GPUs are visible too (the node check)
    warm_trainer: bool | Literal["always"] = Field(
        True, description="0: every trainer starts cold; always: forked on GPU hosts too (unset or 1: only where no GPU is visible)")
    heartbeat_seconds: float = Field(10.0, gt=0, description="how often a running trial says it is alive")
    flush_seconds: float = Field(30.0, gt=0, description="how often a trainer writes its new metric points and latest "
                                 "step to the results DB (and at every checkpoint and eval)")
    stale_seconds: float = Field(90.0, gt=0, description="silence after which a running trial counts as dead")
    cancel_grace_seconds: float = Field(120.0, gt=0, description="how long a stopped trainer may take before it is killed")
    stop_grace_seconds: float = Field(5.0, gt=0, description="how long a trainer told to stop during start-up (before its first step) may take before it records the stop itself and ends")
    # the Prefect side
    fork_server: bool = Field(True, description="0: `sweep run`'s local Prefect server starts in a fresh interpreter "
                              "(unset or 1: as a fork of the command, on Linux, when it runs one thread)")
    dispatch_poll_seconds: float = Field(5.0, gt=0, description="how often a sweep flow looks at its trials' flow runs")
    api_outage_seconds: float = Field(900.0, gt=0, description="how long a sweep flow rides out a Prefect API outage")
    deploy_wait: float = Field(120.0, ge=0, description="seconds `ablate deploy` waits for the Prefect API")
    zombie_seconds: float = Field(0.0, ge=0, description="silence after which Prefect marks a trial's flow run crashed "
                                  "(0: three heartbeats, at least 540 s)")
    # `ablate sql` limits, checked where they are used (the flag beats them; its messages name both)
    sql_timeout: str | None = Field(None, description="`ablate sql`: seconds before a query is stopped (default 30; 0: no limit)")
    sql_max_rows: str | None = Field(None, description="`ablate sql`: rows a result may have (default 10,000; 0: no limit)")
    sql_max_bytes: str | None = Field(None, description="`ablate sql`: bytes a result may have (default 64 MiB; 0: no limit)")
    # `ablate ui`
    ui_token: str | None = Field(None, description="`ablate ui`: the token a dashboard bound beyond 127.0.0.1 requires "
                                 "(--token beats it; never printed)")
    # between ablate's own processes, not for users to set
    claimant: str | None = Field(None, description="the claim a runner started this trainer under")
    runner_pid: int | None = Field(None, description="the runner process that started this trainer")
    run_log: str | None = Field(None, description="the log the runner sends this trainer's output to")

    @field_validator("warm_trainer", mode="before")
    @classmethod
    def _only_zero_disables(cls, value: Any) -> Any:
        """0: False (never); "always": "always" (GPU hosts too); anything else: True (only where no GPU is seen)."""
        if not isinstance(value, str):
            return value
        value = value.strip()
        return "always" if value.lower() == "always" else value != "0"

    @field_validator("runner_pid", mode="before")
    @classmethod
    def _pid_or_nothing(cls, value: Any) -> Any:
        if isinstance(value, str):  # anything but a pid (a hand-started trainer's leftover) means no runner
            return int(value) if value.strip().isdigit() else None
        return value


def variable(field: str) -> str:
    """The environment variable of a settings field: `db_url` -> `ABLATE_DB_URL`."""
    return PREFIX + field.upper()


def environment() -> Settings:
    """The ABLATE_* environment as Settings (parsed once per distinct set of values)."""
    snapshot = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(PREFIX) and v.strip()))
    known = _cache.get(snapshot)
    if known is None:
        if len(_cache) > 64:  # a long test session changing the environment many times
            _cache.clear()
        known = _cache[snapshot] = _parse(dict(snapshot))
    return known


_cache: dict[tuple[tuple[str, str], ...], Settings] = {}


def _parse(environ: dict[str, str]) -> Settings:
    values = {name: environ[variable(name)] for name in Settings.model_fields if variable(name) in environ}
    try:
        return Settings(**values)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            name = variable(str(err["loc"][0]))
            problems.append(f"{name}={environ[name]!r}: {err['msg'].lower()} "
                            f"({Settings.model_fields[str(err['loc'][0])].description})")
        raise AblateError("bad environment: " + "; ".join(problems) + ". Fix or unset it") from None


def describe() -> list[tuple[str, str, str]]:
    """(variable, default, meaning) for every setting: what docs/environment.md's table and `ablate --help` list."""
    return [(variable(name), "" if f.default is None else str(f.default), f.description or "")
            for name, f in Settings.model_fields.items()]
