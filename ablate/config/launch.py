"""LaunchOptions: how a worker starts trainers, one object from the edge where it is read to the trainer.

Not part of any trial's identity. Built once where the settings enter (`ablate sweep run` / `ablate search run`
from their flags, the `sweep` and `search` flows from their parameters), then carried whole across each process
boundary: the sweep flow hands it to every `trial` flow run as one parameter (`launch`, JSON on a cluster), and
the runner hands its trainer's part to `python -m ablate.train` as one argument (`--launch JSON`).

The `sweep` and `search` flows keep one parameter per field (FLOW_FIELDS): a deployment's parameters merge with a
run's `--param` one top-level name at a time, so `--param checkpoint_every=2` must not replace the `db_url` and
`artifacts` that `ablate deploy` stored.
"""

from __future__ import annotations

from pathlib import Path
from collections.abc import Callable
from typing import Any

from pydantic import Field, ValidationError, field_validator

from ablate.config.errors import AblateError
from ablate.config.units import Frozen

# the fields a user sets on the `sweep` and `search` flows (and `ablate sweep/search run`'s flags), one by one
FLOW_FIELDS = ("db_url", "artifacts", "checkpoint_every", "memory_cap_mb", "threads")
# what the trainer reads from it; the database URL travels in the environment (ABLATE_DB_URL), never in argv
# where `ps` shows its password
TRAINER_FIELDS = ("artifacts", "checkpoint_every", "memory_cap_mb", "threads", "quiet")


class LaunchOptions(Frozen):
    """How this worker starts trainers: where results go, checkpoint spacing, a memory cap, threads, GPUs, output."""

    db_url: str | None = None
    artifacts: Path = Path("results/artifacts")
    # seconds of wall time between checkpoints; None: the trainer's default, proportional to the budget
    checkpoint_every: float | None = Field(None, gt=0)
    memory_cap_mb: float | None = Field(None, gt=0)  # treat peak memory above this as OOM
    threads: int | None = Field(None, ge=1)  # torch intra-op threads per trainer process; None: every core
    quiet: bool = True  # no progress bar in the trainer's log
    gpu_ids: tuple[int, ...] | None = None  # CUDA_VISIBLE_DEVICES for this trial; None: inherit
    extra_env: dict[str, str] = Field(default_factory=dict)
    # fork single-process trainers from this process's warm helper where it applies (warm.enabled); worth it
    # only for a process that runs several trials: its start costs about what one cold trainer's imports do
    warm: bool = True

    @field_validator("checkpoint_every", "memory_cap_mb", "threads", mode="before")
    @classmethod
    def _zero_is_unset(cls, value: Any) -> Any:
        """0 (a flag's `--threads 0`): the default, as it always was."""
        return None if value == 0 else value

    def but(self, **changes: Any) -> LaunchOptions:
        """A copy with these fields changed, validated like the original (a str `artifacts` becomes a Path)."""
        return LaunchOptions.model_validate(self.model_dump() | changes)

    def flow_fields(self) -> dict[str, Any]:
        """FLOW_FIELDS as JSON values: the `sweep` or `search` flow's parameters that rebuild these options."""
        return self.model_dump(mode="json", include=set(FLOW_FIELDS))

    def for_trial_flow(self) -> dict[str, Any]:
        """The `launch` parameter of a deployment's `trial` flow run (JSON): no GPU pinning (its worker chooses) and
        a cold start (it runs alone in its flow-run process, where a warm helper would cost more than it saves)."""
        return self.but(gpu_ids=None, warm=False).model_dump(mode="json")

    def for_trainer(self) -> str:
        """The argument of the trainer's `--launch`: TRAINER_FIELDS as JSON."""
        return self.model_dump_json(include=set(TRAINER_FIELDS))


def flag(field: str) -> str:
    """A field as the command-line flag that sets it: checkpoint_every -> --checkpoint-every."""
    return "--" + field.replace("_", "-")


def launch_options(fields: dict[str, Any], name: Callable[[str], str] = str, where: str = "") -> LaunchOptions:
    """LaunchOptions of these fields as they entered (flags, flow parameters, the trainer's `--launch`), or one
    AblateError naming each bad field as its reader calls it (`name`: a flag, a parameter), what is wrong and the
    value given, after `where` they came from."""
    try:
        return LaunchOptions(**fields)
    except ValidationError as exc:
        said = "; ".join(f"{name(str(e['loc'][0]))}: {e['msg']} (got {e.get('input')!r})" for e in exc.errors())
        raise AblateError(f"{where}{said}") from None
