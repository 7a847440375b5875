"""Units of a sweep file: frozen models, checked numbers, durations and counts, budgets, schedule horizons,
eval plans and the hardware profiles the studies ran on."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, NamedTuple

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator,
                      model_serializer, model_validator)

from ablate.config.errors import show

# GPU classes the studies ran on; any other name is a Prefect work pool of the user's.
class HardwareProfile(NamedTuple):
    memory_gb: float  # enforced as a memory cap on a larger GPU, so the study's out-of-memory cells reproduce
    bf16: bool  # whether `precision: auto` may pick bf16 (V100s have no bf16 tensor cores: fp16 with a scaler)
    device: str  # how torch names such a device (a substring of torch.cuda.get_device_name)


HARDWARE_PROFILES: dict[str, HardwareProfile] = {
    "cpu": HardwareProfile(0, False, "cpu"),
    "rtx3060": HardwareProfile(12, True, "3060"),
    "v100": HardwareProfile(16, False, "V100"),  # the studies' 4x V100 node: 16 GB each
    "a100": HardwareProfile(80, True, "A100"),
    "h100": HardwareProfile(80, True, "H100"),
    "h200": HardwareProfile(141, True, "H200"),
}
HARDWARE_MEMORY_GB: dict[str, float] = {name: p.memory_gb for name, p in HARDWARE_PROFILES.items()}


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LaterFields(Frozen):
    """A model that gained optional fields after specs were stored: unset (None), they are left out of its dumps,
    so every fingerprint computed from those dumps stays what it was."""

    _added_later: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _without_unset_later_fields(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        for name in self._added_later:
            if data.get(name) is None:
                data.pop(name, None)
        return data



# ---------------------------------------------------------------- numbers

INT32_MAX = 2**31 - 1  # the runs table keeps trial integers (d_model, seed, ...) in 32-bit INTEGER columns


def _whole_number(value: Any) -> Any:
    """Refuse what pydantic's lax mode would turn into an int: true/false (-> 1/0) and quoted text ('128')."""
    if isinstance(value, bool):
        raise ValueError(f"must be a whole number, not {str(value).lower()}")
    if isinstance(value, str):
        raise ValueError(f"must be a whole number, not the text {_show(value)}; write it without quotes")
    return value


def _fits_int32(value: int) -> int:
    if not -INT32_MAX - 1 <= value <= INT32_MAX:
        raise ValueError(f"{_show(value)} is too large: the results database stores it as a 32-bit integer, "
                         f"at most {INT32_MAX} (2**31 - 1)")
    return value


def _real_number(value: Any) -> Any:
    """Refuse true/false, which pydantic's lax mode reads as 1.0/0.0."""
    if isinstance(value, bool):
        raise ValueError(f"must be a number, not {str(value).lower()}")
    return value


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number, not {value}")
    return value


Whole = Annotated[int, BeforeValidator(_whole_number)]
Int32 = Annotated[int, BeforeValidator(_whole_number), AfterValidator(_fits_int32)]  # a column of the runs table
Real = Annotated[float, BeforeValidator(_real_number), AfterValidator(_finite)]


_show = show


# ---------------------------------------------------------------- budget

_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)d)?\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s)?\s*$")
_SI = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "B": 1e9, "T": 1e12, "P": 1e15}


MAX_DURATION = 365 * 86400.0  # seconds: a duration past this is a typo (or an attack), not a budget


def parse_duration(text: str | int | float) -> float:
    """'12h', '2h15m', '90s', '1.5h' or a number of seconds -> seconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = _as_float(text)
    else:
        match = _DURATION.match(str(text))
        if not match or not any(match.groups()):
            raise ValueError(f"{text!r} is not a duration; write e.g. '12h', '2h15m', '45m' or '20s'")
        d, h, m, s = (float(g) if g else 0.0 for g in match.groups())
        seconds = d * 86400 + h * 3600 + m * 60 + s
    if not math.isfinite(seconds):
        raise ValueError(f"duration {_show(text)} is not a finite number of seconds; write e.g. '12h' or 3600")
    if seconds <= 0:
        raise ValueError(f"duration {_show(text)} must be positive")
    if seconds > MAX_DURATION:
        raise ValueError(f"duration {_show(text)} is over a year ({MAX_DURATION / 86400:g}d), more than any run here "
                         "can be given; write e.g. '12h' or '7d'")
    return seconds


def parse_count(text: str | int | float) -> float:
    """'100M', '1.5B', '2e18' or a number -> a number."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = _as_float(text)
    else:
        match = re.match(r"^\s*([0-9.eE+-]+)\s*([kKMGBTP]?)\s*$", str(text))
        try:
            value = float(match.group(1)) * _SI[match.group(2)] if match else math.nan
        except ValueError:
            value = math.nan
        if math.isnan(value):
            raise ValueError(f"{_show(text)} is not a count; write e.g. 1000000, '100M' or '2e18'")
    if not math.isfinite(value):
        raise ValueError(f"count {_show(text)} is not a finite number; write e.g. 1000000, '100M' or '2e18'")
    if value <= 0:
        raise ValueError(f"count {text!r} must be positive")
    return value


def _as_float(number: int | float) -> float:
    try:
        return float(number)
    except OverflowError:  # an int beyond float range, e.g. 10**400
        return math.inf


class Budget(Frozen):
    """How long each trial trains: exactly one of wall_clock, tokens, steps, flops."""

    wall_clock: str | int | float | None = None  # '12h', '2h15m', or a number of seconds
    tokens: int | str | None = None
    steps: Int32 | None = None  # the runs table counts steps in a 32-bit column
    flops: float | str | None = None
    hardware: str = "cpu"
    gpus: Whole = Field(1, ge=1, le=64)

    @field_validator("wall_clock", "tokens", "steps", "flops", mode="before")
    @classmethod
    def _amount(cls, value: Any, info: ValidationInfo) -> Any:
        """A positive, finite amount (NaN, infinities, true/false refused here, under the field's name)."""
        if value is None or (info.field_name == "steps" and isinstance(value, str)):
            return value  # steps: Int32 refuses text itself
        if isinstance(value, bool):
            raise ValueError(f"must be an amount, not {str(value).lower()}; e.g. wall_clock: 12h, tokens: 100M, steps: 1000")
        (parse_duration if info.field_name == "wall_clock" else parse_count)(value)
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> Budget:
        given = [k for k in ("wall_clock", "tokens", "steps", "flops") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of wall_clock, tokens, steps, flops (got {given or 'none'}); e.g. wall_clock: 12h"
            )
        if not re.match(r"^[a-z0-9][a-z0-9_-]*$", self.hardware):
            raise ValueError(f"hardware {self.hardware!r} must be a lowercase name like 'rtx3060', 'v100' or 'cpu'")
        return self

    @property
    def kind(self) -> Literal["wall_clock", "tokens", "steps", "flops"]:
        for k in ("wall_clock", "tokens", "steps", "flops"):
            if getattr(self, k) is not None:
                return k  # type: ignore[return-value]
        raise AssertionError("validated budget has a kind")

    @property
    def amount(self) -> float:
        """Seconds, tokens, steps or FLOPs, by kind."""
        if self.kind == "wall_clock":
            return parse_duration(self.wall_clock)  # type: ignore[arg-type]
        if self.kind == "steps":
            return float(self.steps)  # type: ignore[arg-type]
        return parse_count(getattr(self, self.kind))

    def describe(self) -> str:
        """`tokens 20k on 1x cpu`: counts as people write them (every digit kept), durations as written."""
        value = getattr(self, self.kind)
        if self.kind == "wall_clock" and not isinstance(value, str):
            value = f"{value:g}s"
        elif self.kind in ("tokens", "flops"):
            value = short_count(parse_count(value), exact=True)
        return f"{self.kind.replace('_', ' ')} {value} on {self.gpus}x {self.hardware}"



class EvalPlan(LaterFields):
    at: tuple[Real, ...] = (0.25, 0.5, 0.75)  # budget fractions with an eval; a final eval always runs
    batches: Whole | None = Field(None, gt=0)  # cap on batches per intermediate eval; final eval uses the whole split
    # an eval every this many optimizer steps as well (HF's eval_steps: the studies' recipe sets 4000)
    every_steps: Whole | None = Field(None, gt=0)
    # intermediate evals run on the budget clock (measured: the clock runs through them, as the studies' HF Trainer's
    # wall clock did); None/false: the clock pauses for them. Their time is metered apart either way.
    charged: bool | None = None

    _added_later = ("every_steps", "charged")

    def describe(self) -> str:
        """When the intermediate evals run and whether they cost budget (plan and report headers print it)."""
        when = [f"at {', '.join(f'{f:.0%}' for f in self.at)} of the budget"] if self.at else []
        when += [f"every {self.every_steps} steps"] if self.every_steps else []
        size = "the whole eval split" if self.batches is None else f"{self.batches} batches"
        if not when:
            return "one eval at the end (the whole eval split)"
        clock = ("on the budget clock (charged: the clock runs through them)" if self.charged
                 else "off the budget clock (paused)")
        return f"evals {' and '.join(when)} on {size}, {clock}; a final eval at the end"

    @field_validator("at")
    @classmethod
    def _fractions(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        bad = [f for f in v if not 0 < f < 1]
        if bad:
            raise ValueError(f"eval.at fractions must lie strictly between 0 and 1, got {bad}")
        return tuple(sorted(set(v)))



class Horizon(Frozen):
    """How long the learning-rate schedule runs, independent of the budget: exactly one of steps, tokens, epochs.

    The studies' HF Trainer decayed linearly to 0 over the planned steps or epochs, and a wall clock (or a
    human) stopped the run wherever it was; without a horizon the schedule ends exactly at the budget."""

    steps: Int32 | None = Field(None, gt=0)
    tokens: int | str | None = None
    epochs: Real | None = Field(None, gt=0)

    @field_validator("tokens", mode="before")
    @classmethod
    def _count(cls, value: Any) -> Any:
        if value is not None:
            if isinstance(value, bool):
                raise ValueError("must be a token count such as 2B, not a boolean")
            parse_count(value)
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> Horizon:
        given = [k for k in ("steps", "tokens", "epochs") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of steps, tokens, epochs (got {given or 'none'}); e.g. horizon: {{steps: 200000}}")
        return self

    def describe(self) -> str:
        kind = next(k for k in ("steps", "tokens", "epochs") if getattr(self, k) is not None)
        value = getattr(self, kind)
        return f"{value:g} {kind}" if isinstance(value, float) else f"{value} {kind}"



# ---------------------------------------------------------------- equal budgets (report.at, ablate report --at)

X_KINDS = ("steps", "tokens", "seconds", "flops")  # a loss curve's x and an equal budget's kind: one set of names for
# the dashboard, the report's figures (report.curves) and `at`


@dataclass(frozen=True)
class At:
    """An equal budget to read every run at, on its own curve: `amount` of `kind` (flops, tokens, seconds, steps)."""

    kind: str
    amount: float

    def text(self) -> str:
        amount = f"{self.amount:g} s" if self.kind == "seconds" else short_count(self.amount, exact=True)
        return f"{self.kind} = {amount}"


def short_count(value: float, exact: bool = False) -> str:
    """A count as people write it, and as parse_count reads it back: 950, 200k, 1.2M, 19M, 3B, 1.6T, 1.2e18;
    `exact`: every digit of the value kept (a budget the user wrote), else two significant figures."""
    if value < 1e3:
        return f"{value:g}" if exact else f"{value:.3g}".replace("e+0", "e").replace("e+", "e")
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if scale <= value < 1e15:
            q = value / scale
            return f"{q:g}{suffix}" if exact else (f"{q:.2g}" if q < 10 else f"{q:.0f}") + suffix
    return f"{value:g}".replace("e+", "e") if exact else f"{value:.2g}".replace("e+", "e")


def parse_at(value: str | dict[str, Any] | At | None) -> At | None:
    """'tokens=50M', 'flops=1e15', 'seconds=10m' (or {flops: 1e15} from a report block) as an At; a ValueError
    that shows the form otherwise."""
    if value is None or isinstance(value, At):
        return value
    if isinstance(value, dict):
        if len(value) != 1:
            raise ValueError(f"give exactly one of {', '.join(X_KINDS)}, e.g. {{flops: 1e15}} (got {dict(value)})")
        ((kind, amount),) = value.items()
    else:
        kind, sep, amount = str(value).partition("=")
        if not sep:
            raise ValueError(f"{value!r}: write KIND=AMOUNT, e.g. tokens=50M, flops=1e15 or seconds=10m")
    kind = str(kind).strip()
    if kind not in X_KINDS:
        raise ValueError(f"{kind!r}: the kind must be one of {', '.join(X_KINDS)}, e.g. tokens=50M")
    number = parse_duration(amount) if kind == "seconds" else parse_count(amount)
    return At(kind, number)
