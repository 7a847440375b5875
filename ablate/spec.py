"""Sweep specs: schema, YAML loading, grid expansion and trial fingerprints.

A sweep file names a dataset, a tokenizer, a budget, `defaults`, and a `grid` of blocks.
Each block is the product of its list-valued keys (over the defaults); `zip:` moves axes
together; `seeds:` repeats every trial of the block. Expansion yields frozen `TrialConfig`s
whose fingerprint (hash of canonical JSON) is the identity of a run.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, NamedTuple

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo,
                      field_validator, model_serializer, model_validator)

from ablate import models
from ablate.errors import SpecError, did_you_mean, one_of, show
from ablate.overrides import apply_overrides
from ablate.sources import has_splits, is_local_source, looks_like_path, special_files

MAX_TRIALS = 10_000
OBJECTIVES = ("clm", "bidirectional", "multi_token", "autoencoder", "one_step", "classification")
# Objectives that rebuild a model from its embedding, block stack and head need those parts exposed
# (ablate.models: embed / hidden_from_embeds / head / layers); None means every architecture.
OBJECTIVE_ARCHITECTURES: dict[str, tuple[str, ...] | None] = {
    "clm": None, "multi_token": None, "classification": None,
    "bidirectional": ("mixer", "llama"), "autoencoder": ("mixer", "llama"), "one_step": ("mixer", "llama"),
}
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
        raise ValueError(f"duration {text!r} must be positive")
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
        value = getattr(self, self.kind)
        if self.kind == "wall_clock" and not isinstance(value, str):
            value = f"{value:g}s"
        return f"{self.kind.replace('_', ' ')} {value} on {self.gpus}x {self.hardware}"


# ---------------------------------------------------------------- data refs


class EvalSplit(Frozen):
    split: str | None = None  # a named split of the dataset
    holdout: Whole | None = Field(None, gt=0)  # else: the last N documents of the training split
    limit: Whole | None = Field(None, gt=0)  # at most this many eval documents

    @model_validator(mode="after")
    def _one_source(self) -> EvalSplit:
        if (self.split is None) == (self.holdout is None):
            raise ValueError("give exactly one of eval.split (a named split) or eval.holdout (a document count)")
        return self


class DatasetRef(LaterFields):
    """A corpus: a hub id (with config and split), or local files (text, jsonl, parquet, arrow, a saved dataset)."""

    _added_later = ("label_field",)

    source: str = Field(min_length=1)
    config: str | None = None
    split: str = "train"
    text_field: str = "text"
    format: Literal["auto", "text", "lines", "jsonl", "parquet", "arrow", "disk", "hub"] = "auto"
    limit: Whole | None = Field(None, gt=0)
    eval: EvalSplit = EvalSplit(holdout=50)
    packing: Literal["pad", "concat"] = "pad"
    # a column of integer class labels (0 .. classes-1), one per document: for objective: classification
    label_field: str | None = None

    @property
    def from_hub(self) -> bool:
        """Whether this corpus is read from the HuggingFace hub (not a local path or an embedded corpus)."""
        return self.format == "hub" or (self.format == "auto" and not is_local_source(self.source))

    @model_validator(mode="after")
    def _one_document_per_label(self) -> DatasetRef:
        if self.label_field is not None and self.packing != "pad":
            raise ValueError("label_field needs packing: pad (one labelled document per row); concat packing "
                             "joins documents and their labels would no longer belong to a row")
        return self

class TokenizerRef(LaterFields):
    """Train a Llama-style BPE tokenizer of `vocab_size` on the corpus, or load `name` (hub id or path)."""

    _added_later = ("trained_on",)

    vocab_size: Whole | None = Field(4096, gt=0)
    name: str | None = None
    train_documents: Whole | None = Field(None, gt=0)
    # train on another corpus than the sweep's (finemath-context reuses the FineWeb tokenizer, as the study did):
    # the same tokenizer, from the same cache, as a sweep whose dataset is this one
    trained_on: DatasetRef | None = None

    @model_validator(mode="after")
    def _one_source(self) -> TokenizerRef:
        if self.name is not None and self.vocab_size not in (None, 4096):
            raise ValueError("give tokenizer.name (load) or tokenizer.vocab_size (train), not both")
        if self.name is not None and self.trained_on is not None:
            raise ValueError("give tokenizer.name (load) or tokenizer.trained_on (train on that corpus), not both")
        return self

class EvalPlan(Frozen):
    at: tuple[Real, ...] = (0.25, 0.5, 0.75)  # budget fractions with an eval (clock paused); a final eval always runs
    batches: Whole | None = Field(None, gt=0)  # cap on batches per intermediate eval; final eval uses the whole split

    @field_validator("at")
    @classmethod
    def _fractions(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        bad = [f for f in v if not 0 < f < 1]
        if bad:
            raise ValueError(f"eval.at fractions must lie strictly between 0 and 1, got {bad}")
        return tuple(sorted(set(v)))


# ---------------------------------------------------------------- trial


class MultiTokenOptions(Frozen):
    n_tokens: Whole = Field(2, ge=2, le=16, description="tokens ahead, one chained pass each")
    loss: Literal["mean", "sum"] = Field("mean", description="mean: token-weighted mean over all passes (comparable "
                                         "across n); sum: the study's sum of the passes' mean losses (n times larger)")


class OneStepOptions(Frozen):
    split: Real = Field(0.5, gt=0, lt=1, description="fraction of the window given; the rest is predicted")
    mask_layer: Whole | None = Field(None, ge=1, description="blocks before the prediction half is masked; default layers // 2")


class ClassificationOptions(Frozen):
    classes: Whole = Field(2, ge=2, le=100_000, description="number of classes; labels are 0 .. classes-1")
    pooling: Literal["mean", "last"] = Field("mean", description="mean: the average of the per-position class "
                                             "scores over the document (the MetaFormer study's head); last: the "
                                             "last token's hidden state (which, causally, has read the whole text)")
    bias: bool = Field(True, description="a bias in the class projection (the MetaFormer study code's has none)")


class NoOptions(Frozen):
    pass


OBJECTIVE_OPTIONS: dict[str, type[Frozen]] = {
    "clm": NoOptions, "bidirectional": NoOptions, "autoencoder": NoOptions,
    "multi_token": MultiTokenOptions, "one_step": OneStepOptions, "classification": ClassificationOptions,
}


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


def _betas(value: tuple[float, float]) -> tuple[float, float]:
    if not all(0 <= b < 1 for b in value):
        raise ValueError(f"AdamW betas must each be in [0, 1), e.g. [0.9, 0.999] (got {list(value)})")
    return value


# The studies' recipe (HF Trainer defaults in the authors' code, STUDIES.md "Facts from the authors' public code"):
# fp16 with a loss scaler, AdamW betas (0.9, 0.999), 500 warm-up steps, then linear decay (over the sweep's
# `horizon` where the study planned one), no torch.compile, and no end-of-text target (the authors tokenised
# without special tokens and their collator set pad = eos to -100: no document's end was ever scored). "modern" is the project's own: precision by hardware,
# betas (0.9, 0.95), warm-up 2% of the budget, a schedule ending exactly at the budget, compile on GPU.
RECIPES: dict[str, dict[str, Any]] = {
    "modern": {},
    "studies": {"precision": "fp16", "betas": (0.9, 0.999), "warmup_steps": 500, "schedule": "linear", "compile": False,
                "eos_is_target": False},
}
# one setting each: a sweep that gives one of a pair overrides the recipe's other
_EXCLUSIVE = {"warmup": "warmup_steps", "warmup_steps": "warmup"}


def with_recipe(recipe: str, values: dict[str, Any]) -> dict[str, Any]:
    """A trial's fields: the recipe's values under the sweep's own (defaults, grid, search)."""
    base = {k: v for k, v in RECIPES[recipe].items() if not any(_EXCLUSIVE.get(u) == k for u in values)}
    return {**base, **values}


def describe_recipe(trial: TrialConfig) -> str:
    """The optimisation recipe a trial runs, in one line (plan and report headers print it)."""
    warm = f"{trial.warmup_steps} warm-up steps" if trial.warmup_steps is not None else f"warm-up {trial.warmup:.0%}"
    horizon = f"over {trial.horizon.describe()}" if trial.horizon else "ending at the budget"
    b1, b2 = trial.betas
    return (f"precision {trial.precision}, AdamW betas ({b1:g}, {b2:g}), weight decay {trial.weight_decay:g}, {warm}, "
            f"{trial.schedule} schedule {horizon}, compile {'auto' if trial.compile is None else trial.compile}"
            + ("" if trial.objective == "classification" else  # its target is the class, at the end-of-text position
               f", end-of-text {'scored' if trial.eos_is_target else 'not scored (input only)'}"))


# sizes past these are typing slips (context: 1000000000), refused in `plan` rather than a MemoryError at the first batch
MAX_CONTEXT = 1 << 20  # tokens per row
MAX_BATCH = 1 << 16  # rows per micro-batch; also accumulation steps
MAX_MICRO_BATCH_TOKENS = 1 << 24  # batch_size x context


class TrialConfig(Frozen):
    """Everything one run needs. Its fingerprint is the run's identity."""

    architecture: str
    options: dict[str, Any] = Field(default_factory=dict)
    objective: str = "clm"
    objective_options: dict[str, Any] = Field(default_factory=dict)
    d_model: Int32 = Field(gt=0)
    layers: Int32 = Field(gt=0)
    heads: Int32 | None = Field(None, gt=0)
    kv_heads: Int32 | None = Field(None, gt=0)
    context: Int32 = Field(gt=1, le=MAX_CONTEXT)
    lr: Real = Field(gt=0, le=1)
    batch_size: Int32 = Field(gt=0, le=MAX_BATCH)
    grad_accum: Int32 = Field(1, gt=0, le=MAX_BATCH)
    weight_decay: Real = Field(0.0, ge=0)
    warmup: Real = Field(0.02, ge=0, lt=1)  # fraction of the schedule (the horizon, else the budget)
    warmup_steps: Int32 | None = Field(None, ge=0)  # warm-up in optimizer steps; when set, `warmup` is unused
    schedule: Literal["linear", "cosine", "wsd", "constant"] = "linear"
    horizon: Horizon | None = None  # the schedule's length; None: it ends at the budget
    betas: Annotated[tuple[Real, Real], AfterValidator(_betas)] = (0.9, 0.95)  # AdamW
    # auto: the hardware profile's (v100: fp16 with a scaler), else bf16 where the GPU has it, fp16 on other GPUs,
    # fp32 on CPU; what ran is recorded on the run row (runs.precision)
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    compile: bool | None = None  # None: on for GPU, off on CPU
    seed: Int32 = Field(0, ge=0)
    mode: Literal["train", "memory_probe"] = "train"
    on_oom: Literal["record", "shrink"] = "record"
    # whether the end-of-text token each document gets (pad packing: after the text; concat: between documents) is a
    # target of the loss; false keeps it as input only, as the studies' collator did (pad = eos labelled -100)
    eos_is_target: bool = True
    dataset: DatasetRef
    tokenizer: TokenizerRef = TokenizerRef()
    budget: Budget
    eval: EvalPlan = EvalPlan()

    @model_validator(mode="after")
    def _consistent(self) -> TrialConfig:
        if self.architecture not in models.FAMILIES:
            raise ValueError(
                f"unknown architecture {self.architecture!r}{did_you_mean(self.architecture, models.FAMILIES)}; "
                f"known: {one_of(models.FAMILIES)}"
            )
        if self.objective not in OBJECTIVES:
            raise ValueError(
                f"unknown objective {self.objective!r}{did_you_mean(self.objective, OBJECTIVES)}; known: {one_of(OBJECTIVES)}"
            )
        allowed = OBJECTIVE_ARCHITECTURES[self.objective]
        if allowed is not None and self.architecture not in allowed:
            raise ValueError(f"objective {self.objective!r} is built for architectures {one_of(allowed)}, "
                             f"not {self.architecture!r}; use one of those or objective: clm")
        if self.batch_size * self.context > MAX_MICRO_BATCH_TOKENS:
            raise ValueError(f"batch_size x context = {self.batch_size} x {self.context} = "
                             f"{self.batch_size * self.context:,} tokens per micro-batch is over the limit of "
                             f"{MAX_MICRO_BATCH_TOKENS:,}: lower batch_size (grad_accum keeps the global batch) or context")
        settings = self.objective_settings()
        if self.objective == "classification" and self.dataset.label_field is None:
            raise ValueError("objective 'classification' needs labelled documents: set dataset.label_field (the "
                             "column of integer class labels, e.g. label_field: label for the hub's imdb)")
        if self.objective == "one_step":
            mask_layer = settings.mask_layer
            if mask_layer is not None and mask_layer >= self.layers:
                raise ValueError(f"objective_options.mask_layer={mask_layer} must be below layers={self.layers}")
            if self.layers < 2:
                raise ValueError("objective 'one_step' masks the prediction half between blocks: needs layers >= 2")
        if self.heads is not None and self.d_model % self.heads:
            divisors = [h for h in (1, 2, 4, 8, 16, 32, 64) if self.d_model % h == 0]
            raise ValueError(
                f"heads={self.heads} does not divide d_model={self.d_model}; choose heads from {divisors} or change d_model"
            )
        if self.kv_heads is not None:
            if self.heads is None or self.heads % self.kv_heads:
                raise ValueError(f"kv_heads={self.kv_heads} must divide heads={self.heads}")
        options_cls = models.options_model(self.architecture)
        try:
            opts = options_cls(**self.options)
        except ValidationError as exc:
            names = list(options_cls.model_fields)
            msgs = []
            for err in exc.errors():
                key = ".".join(str(p) for p in err["loc"])
                if err["type"] == "extra_forbidden":
                    msgs.append(f"unknown {self.architecture} option '{key}'{did_you_mean(key, names)}; options: {one_of(names)}")
                else:
                    msgs.append(f"option {key}: {err['msg'].removeprefix('Value error, ')} (got {err.get('input')!r})")
            raise ValueError("; ".join(msgs)) from None
        if hasattr(opts, "check_trial"):
            opts.check_trial(self)
        return self

    def objective_settings(self) -> Any:
        """The objective's options with their defaults (validated)."""
        cls = OBJECTIVE_OPTIONS[self.objective]
        try:
            return cls(**self.objective_options)
        except ValidationError as exc:
            msgs = []
            for err in exc.errors():
                key = ".".join(str(p) for p in err["loc"])
                if err["type"] == "extra_forbidden":
                    names = list(cls.model_fields)
                    msgs.append(f"objective_options.{key}: objective {self.objective!r} has no option {key!r}"
                                f"{did_you_mean(key, names)}; options: {one_of(names) if names else 'none'}")
                else:
                    msgs.append(f"objective_options.{key}: {err['msg']} (got {err.get('input')!r})")
            raise ValueError("; ".join(msgs)) from None

    def fingerprint(self) -> str:
        return trial_fingerprint(self.model_dump(mode="json"))

    def axes(self) -> dict[str, Any]:
        """The values that vary across the studies' tables, flattened (options as options.key)."""
        out = {k: getattr(self, k) for k in AXIS_FIELDS}
        out.update({f"options.{k}": v for k, v in sorted(self.effective_options().items())})
        out.update({f"objective_options.{k}": v for k, v in sorted(self.objective_options.items())})
        return out

    def effective_options(self) -> dict[str, Any]:
        """The family's option defaults overlaid with this trial's options (the fingerprint keeps only the latter)."""
        return models.options_model(self.architecture)(**self.options).model_dump(mode="json")


AXIS_FIELDS = ("architecture", "objective", "d_model", "layers", "heads", "context", "lr", "batch_size", "seed")
SWEEP_LEVEL_FIELDS = ("dataset", "tokenizer", "budget", "eval")
GRID_FIELDS = tuple(f for f in TrialConfig.model_fields if f not in SWEEP_LEVEL_FIELDS)


# fields added after runs were recorded, at the value every earlier trial had: left out of the fingerprint there,
# so that those trials keep their identity
_LEGACY_DEFAULTS: dict[str, Any] = {"objective_options": {}, "betas": [0.9, 0.95], "warmup_steps": None, "horizon": None,
                                    "eos_is_target": True}


def trial_fingerprint(config: dict[str, Any]) -> str:
    """A trial's identity from its JSON dump (`model_dump(mode="json")`), for callers that already hold it."""
    config = {k: v for k, v in config.items() if k not in _LEGACY_DEFAULTS or v != _LEGACY_DEFAULTS[k]}
    return fingerprint(config)


def fingerprint(data: Any) -> str:
    """Stable hash of JSON-able data: independent of key order, YAML formatting and process."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- sweep


class SearchParam(Frozen):
    type: Literal["categorical", "float", "int"]
    choices: tuple[Any, ...] | None = None
    low: Real | None = None
    high: Real | None = None
    log: bool = False
    step: Real | None = Field(None, gt=0)
    when: dict[str, Any] | None = None  # conditional: only sampled when these other parameters have these values

    @model_validator(mode="after")
    def _shape(self) -> SearchParam:
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("a categorical parameter needs a non-empty 'choices' list")
        else:
            if self.low is None or self.high is None or self.low >= self.high:
                raise ValueError(f"a {self.type} parameter needs low < high (got low={self.low}, high={self.high})")
            if self.log and self.low <= 0:
                raise ValueError("a log-scale parameter needs low > 0")
        return self


class SearchBlock(Frozen):
    parameters: dict[str, SearchParam]
    sampler: Literal["tpe", "random", "grid", "cmaes"] = "tpe"
    pruner: Literal["median", "hyperband", "none"] = "median"
    n_trials: Whole = Field(20, gt=0)
    direction: Literal["minimize"] = "minimize"
    objective: Literal["final_eval_loss"] = "final_eval_loss"
    base: dict[str, Any] = Field(default_factory=dict)  # trial fields fixed for the search, over defaults

    @field_validator("parameters")
    @classmethod
    def _known_fields(cls, v: dict[str, SearchParam]) -> dict[str, SearchParam]:
        for name in v:
            if name not in GRID_FIELDS and not name.startswith("options."):
                raise ValueError(
                    f"search parameter {name!r} is not a trial field{did_you_mean(name, GRID_FIELDS)}; "
                    f"use one of {one_of(GRID_FIELDS)} or options.NAME"
                )
        return v


class TableSpec(Frozen):
    title: str | None = None
    group_by: tuple[str, ...] = ("architecture",)  # one table per distinct value of these axes
    columns: str = "d_model"  # the varying axis across a table
    where: dict[str, Any] = Field(default_factory=dict)  # only trials matching these axes


class Ordering(Frozen):
    """A published ordering the report checks on our table: runs matching `better` reach a lower test loss
    than runs matching `worse`, at each combination of the `at` axes (held equal)."""

    claim: str = Field(min_length=1)  # the study's statement, with where it is published
    better: dict[str, Any]
    worse: dict[str, Any]
    at: tuple[str, ...] = ()


class ReportBlock(Frozen):
    tables: tuple[TableSpec, ...] = (TableSpec(),)
    curves: tuple[Literal["hours", "tokens", "steps"], ...] = ("hours", "tokens")
    kind: Literal["loss", "memory"] = "loss"
    prompt: str | None = None
    orderings: tuple[Ordering, ...] = ()


class Reference(Frozen):
    """Published numbers for the trials matching `match` (axes; options as options.key)."""

    match: dict[str, Any]
    train: Real | None = None
    eval: Real | None = None
    memory_mb: Real | Literal["OOM"] | None = None
    source: str | None = None

    def matches(self, trial: TrialConfig) -> bool:
        axes = trial.axes()
        return all(_same(axes.get(k, _MISSING), v) for k, v in self.match.items())


_MISSING = object()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9)
        except (TypeError, ValueError):
            return False
    return a == b


class PairsRef(Frozen):
    """A (summary, text) pairs dataset for retrieval: hub id or local file/folder, or `ablate:tinystories-pairs`."""

    source: str = Field(min_length=1)
    summary_field: str = "summary"
    text_field: str = "text"
    split: str = "train"
    limit: Whole | None = Field(None, gt=0)


class RetrievalReference(Frozen):
    match: dict[str, Any] = Field(default_factory=dict)
    candidates: Whole = Field(gt=1)
    eval: Real


class RetrievalSettings(Frozen):
    """The retrieval model and its optimisation. Defaults: a small, quick model (input norm, width 128, 2 blocks,
    AdamW lr 1e-3 wd 0.01, cosine decay); the study sweeps give the authors' (no input norm, the embedding's
    width, 8 blocks, no final norm, HF Trainer AdamW lr 1e-4 without decay, 500 warm-up steps, linear decay)."""

    lr: Real = Field(1e-3, gt=0, le=1)
    standardize: bool = Field(True, description="z-score embeddings per feature before the retrieval model (not the "
                              "study's method: it changes the published transformer failure at c=1024)")
    d_model: Whole | None = Field(128, gt=0, description="the retrieval blocks' width; null: the embedding's own "
                                  "width, with no input projection (the authors')")
    layers: Whole = Field(2, gt=0, le=64, description="retrieval mixer blocks (the authors': 8)")
    input_norm: bool = Field(True, description="a LayerNorm on the embeddings before the model (the authors' had none: "
                             "like standardize, it evens out the embeddings' scales)")
    final_norm: bool = Field(True, description="a LayerNorm before the scoring head (the authors' had none)")
    weight_decay: Real = Field(0.01, ge=0, description="AdamW weight decay (the HF Trainer's default: 0)")
    batch_size: Whole = Field(64, gt=0, description="queries per step (the authors': 32 on TinyStories, 128 on FineWeb)")
    schedule: Literal["cosine", "linear"] = "cosine"
    warmup_steps: Whole | None = Field(None, ge=0, description="warm-up in steps; null: 5% of the training steps")


# the settings every retrieval block had before they were fields (all but lr, a field from the start): at these
# values they are left out of sweep fingerprints, so that earlier sweeps keep their identity
_RETRIEVAL_LEGACY = {name: field.default for name, field in RetrievalSettings.model_fields.items() if name != "lr"}


class RetrievalPlan(RetrievalSettings):
    """The retrieval stage after training: embed pairs with each completed run, train a retrieval model per c."""

    pairs: PairsRef
    candidates: tuple[Whole, ...] = Field((32, 128), min_length=1)
    candidates_count_query: bool = Field(False, description="c counts the query's slot: c=32 is the query and 31 "
                                         "texts (the authors' n_context, whose chance loss is ln 31 = 3.43); "
                                         "false: the query and c texts")
    index: Whole = Field(-2, description="token whose last hidden state embeds a text: -2 second-to-last, -1 last")
    position: Literal["text", "window"] = Field("text", description="where `index` counts: text: from the end of each "
                                               "text's own tokens (+ eos); window: from the end of the context window, "
                                               "each text right-padded to it with pad = eos (the authors')")
    steps: Whole | None = Field(1000, gt=0, description="retrieval-model training steps per run and c")
    epochs: Real | None = Field(None, gt=0, description="instead of steps: passes over the training pairs (the "
                                "authors': 200 on TinyStories, 50 on FineWeb)")
    reference: list[RetrievalReference] = Field(default_factory=list)

    @field_validator("candidates")
    @classmethod
    def _more_than_one(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(c < 2 for c in v):
            raise ValueError(f"candidates are counts of texts to choose among, each >= 2 (got {list(v)})")
        return v

    @field_validator("index")
    @classmethod
    def _negative(cls, v: int) -> int:
        if v >= 0:
            raise ValueError(f"index counts from the end of each text: -1 (last token) or -2 (second to last), got {v}")
        return v

    @model_validator(mode="before")
    @classmethod
    def _one_length(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("epochs") is not None:
            if data.get("steps") is not None:
                raise ValueError("give retrieval.steps or retrieval.epochs, not both")
            data = {**data, "steps": None}
        return data

    @model_validator(mode="after")
    def _query_slot(self) -> RetrievalPlan:
        if self.steps is None and self.epochs is None:
            raise ValueError("give retrieval.steps (e.g. 1000) or retrieval.epochs")
        if self.candidates_count_query and min(self.candidates) < 3:
            raise ValueError("with candidates_count_query, each c holds the query and c-1 texts: c >= 3")
        return self

    def describe(self) -> str:
        """The stage in one line (plan and the stage's table print it)."""
        width = "the embedding width" if self.d_model is None else f"width {self.d_model}"
        warm = "5% warm-up" if self.warmup_steps is None else f"{self.warmup_steps} warm-up steps"
        length = f"{self.epochs:g} epochs" if self.epochs is not None else f"{self.steps} steps"
        return (f"{self.layers} blocks at {width}, input norm {'on' if self.input_norm else 'off'}, final norm "
                f"{'on' if self.final_norm else 'off'}; AdamW lr {self.lr:g}, weight decay {self.weight_decay:g}, batch "
                f"{self.batch_size}, {self.schedule} decay after {warm}; {length} per cell; embeddings at token "
                f"{self.index} of the {self.position}{', standardized' if self.standardize else ''}; c "
                f"{'counts the query (c-1 texts)' if self.candidates_count_query else 'texts per query'}")

    def settings(self) -> RetrievalSettings:
        return RetrievalSettings(**{k: getattr(self, k) for k in RetrievalSettings.model_fields})

    def texts_per_query(self, c: int) -> int:
        """How many candidate texts a cell labelled c scores."""
        return c - 1 if self.candidates_count_query else c


class SweepSpec(Frozen):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    description: str = ""
    recipe: Literal["modern", "studies"] = "modern"  # defaults of optimisation fields under the sweep's own (RECIPES)
    dataset: DatasetRef
    tokenizer: TokenizerRef = TokenizerRef()
    budget: Budget
    eval: EvalPlan = EvalPlan()
    defaults: dict[str, Any] = Field(default_factory=dict)
    grid: list[dict[str, Any]] = Field(default_factory=lambda: [{}])
    search: SearchBlock | None = None
    report: ReportBlock = ReportBlock()
    reference: list[Reference] = Field(default_factory=list)
    retrieval: RetrievalPlan | None = None
    # what overrides changed from the file (apply_overrides), in words: plan and the report print them
    overrides: tuple[str, ...] = ()

    def fingerprint(self) -> str:
        data = self.model_dump(mode="json")
        del data["overrides"]  # a description of the changes, not one: the changed fields are in the spec
        if data["retrieval"] is None:  # sweeps without a retrieval stage keep their identity
            del data["retrieval"]
        else:  # as do those whose stage has the settings every one had before they were fields
            stage = data["retrieval"]
            for key, value in {**_RETRIEVAL_LEGACY, "candidates_count_query": False, "position": "text",
                               "epochs": None}.items():
                if key in stage and stage[key] == value:
                    del stage[key]
        if not data["report"]["orderings"]:  # as do sweeps that check no published ordering
            del data["report"]["orderings"]
        if data["recipe"] == "modern":  # and sweeps on the project's own recipe
            del data["recipe"]
        return fingerprint(data)


# ---------------------------------------------------------------- loading & expansion


def _loc(parts: tuple[Any, ...]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _pydantic_problems(exc: ValidationError, prefix: str = "", value_of: Any = None) -> list[str]:
    problems = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if p not in ("function-after",))
        where = (prefix + ("." if prefix and loc and not isinstance(loc[0], int) else "") + _loc(loc)) or "(top level)"
        if err["type"] == "extra_forbidden":
            parent = _model_at(value_of, loc[:-1]) if value_of is not None else None
            names = list(parent.model_fields) if parent is not None else []
            problems.append(f"{where}: unknown key '{loc[-1]}'{did_you_mean(str(loc[-1]), names)}; known keys: {one_of(names)}")
        elif err["type"] == "missing":
            problems.append(f"{where}: required key is missing")
        else:
            msg = err["msg"].removeprefix("Value error, ").replace(
                "Input should be a valid dictionary", "must be a mapping of key: value"
            )
            shown = err.get("input")
            said = err["type"] == "value_error" and (_show(shown) in msg or str(shown).lower() in msg)
            show = "" if isinstance(shown, dict) or said else f" (got {_show(shown)})"
            problems.append(f"{where}: {msg}{show}")
    return problems


def _model_at(model: Any, loc: tuple[Any, ...]) -> Any:
    """The pydantic model class found by following `loc` through fields of `model` (best effort)."""
    import typing

    current = model
    at_key = False  # the next part is a key of a dict-valued field (e.g. search.parameters.NAME), not a field
    for part in loc:
        if isinstance(part, int) or at_key:
            at_key = False
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return None
        ann = field.annotation
        candidates = [ann, *typing.get_args(ann)]
        for inner in list(candidates):
            candidates.extend(typing.get_args(inner))
        at_key = any(typing.get_origin(c) is dict for c in candidates)
        current = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if current is None:
            return None
    return current


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a sweep file; raises SpecError naming every problem."""
    from ablate.specfile import read_yaml

    path = Path(path)
    return parse_spec(read_yaml(path), source=str(path), base_dir=path.parent)


def parse_spec(data: Any, source: str = "<spec>", base_dir: Path | None = None) -> SweepSpec:
    if not isinstance(data, dict):
        raise SpecError([f"the top level must be a mapping with keys name, dataset, budget, grid, ... (got {type(data).__name__})"], source)
    data = dict(data)
    if base_dir is not None and isinstance(data.get("dataset"), dict):
        try:
            data["dataset"] = _resolve_local(data["dataset"], base_dir)
        except ValueError as exc:
            raise SpecError([f"dataset.{exc}"], source) from None
    retrieval = data.get("retrieval")
    if base_dir is not None and isinstance(retrieval, dict) and isinstance(retrieval.get("pairs"), dict):
        # pairs are read only by the retrieval stage, after training: a missing file is reported there
        data["retrieval"] = {**retrieval, "pairs": _resolve_local(retrieval["pairs"], base_dir, must_exist=False)}
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_pydantic_problems(exc, value_of=SweepSpec), source) from None
    problems = _check_blocks(spec) + _local_split_problems(spec)
    if problems:
        raise SpecError(problems, source)
    return spec


def _local_split_problems(spec: SweepSpec) -> list[str]:
    """An eval split named for a local source, which has none (only a save_to_disk DatasetDict folder has splits):
    refused when the spec is read, as preparing its data would refuse it."""
    refs = [("dataset", spec.dataset)]
    if spec.tokenizer.trained_on is not None:
        refs.append(("tokenizer.trained_on", spec.tokenizer.trained_on))
    problems = []
    for where, ref in refs:
        if ref.eval.split is not None and not ref.from_hub and not has_splits(ref.source):
            problems.append(f"{where}.eval.split: {ref.source} is a local source, which has no split "
                            f"{ref.eval.split!r}; hold documents out instead, e.g. eval: {{holdout: 1000}} (or "
                            "--holdout N / --param holdout=N)")
    return problems


def _resolve_local(dataset: dict[str, Any], base_dir: Path, must_exist: bool = True) -> dict[str, Any]:
    """A source naming an existing file or folder (relative to the spec file, then the working directory)
    becomes its absolute path; one that looks like a path and exists in neither is refused with the paths
    tried. Hub ids and `ablate:` names stay as written."""
    import glob

    source = dataset.get("source")
    if not isinstance(source, str) or not source or source.startswith("ablate:") or dataset.get("format") == "hub":
        return dataset
    path = Path(source).expanduser()
    tried = [path] if path.is_absolute() else [(base_dir / path).absolute(), (Path.cwd() / path).absolute()]
    tried = list(dict.fromkeys(tried))
    for candidate in tried:
        found = glob.glob(str(candidate)) if any(c in source for c in "*?[") else candidate.exists()
        if found:
            special = special_files(found if isinstance(found, list) else [candidate])
            if special:
                raise ValueError(f"source: {special[0]} is not a regular file or folder (a device, pipe or socket "
                                 "can be read without end); point dataset.source at a file or folder of .txt, "
                                 ".jsonl, .parquet or .arrow files")
            return {**dataset, "source": str(Path(os.path.normpath(candidate)))}
    if must_exist and looks_like_path(source):
        raise ValueError(f"source: no file or folder {source!r}; tried {', '.join(str(t) for t in tried)}. "
                         "Relative paths are read from the sweep file's folder, then the working directory; "
                         "a hub id is written `org/name`")
    return dataset


def _search_non_causal(spec: SweepSpec) -> list[str]:
    """Option choices of a search that no trial may use (eval would not be causal): refused before it starts."""
    search = spec.search
    if search is None:
        return []
    fixed = {**spec.defaults, **search.base}
    arch = search.parameters.get("architecture")
    names = list(arch.choices or ()) if arch is not None else [fixed.get("architecture")]
    problems = []
    for key, param in search.parameters.items():
        if not key.startswith("options.") or param.type != "categorical":
            continue
        for name in names:
            if not isinstance(name, str) or name not in models.FAMILIES:
                continue
            options_cls = models.options_model(name)
            for choice in param.choices or ():
                try:
                    opts = options_cls(**{**(fixed.get("options") or {}), key.removeprefix("options."): choice})
                except (ValidationError, TypeError):
                    continue  # another problem, reported when a trial is sampled
                reason = opts.non_causal_reason() if hasattr(opts, "non_causal_reason") else None
                if reason:
                    problems.append(f"search.parameters.{key}: choice {choice!r} for {name}: {reason}")
    return problems


def _check_blocks(spec: SweepSpec) -> list[str]:
    problems = _search_non_causal(spec)
    if not spec.grid:
        problems.append("grid: an empty list expands to 0 trials; give at least one block, e.g. "
                        "grid: [{d_model: [256, 512]}], or leave grid out to run the defaults as one trial")
    for where, block in [("defaults", spec.defaults)] + [(f"grid[{i}]", b) for i, b in enumerate(spec.grid)]:
        if not isinstance(block, dict):
            problems.append(f"{where}: must be a mapping of trial fields (got {_show(block)})")
            continue
        for key, value in block.items():
            if where != "defaults" and key in ("zip", "seeds"):
                continue
            if key in SWEEP_LEVEL_FIELDS:
                problems.append(f"{where}.{key}: '{key}' is set once per sweep at the top level, not in {where}")
            elif key not in GRID_FIELDS:
                problems.append(f"{where}: unknown key '{key}'{did_you_mean(key, GRID_FIELDS + ('zip', 'seeds'))}; trial fields are {one_of(GRID_FIELDS)}")
            elif key == "options" and not isinstance(value, dict):
                problems.append(f"{where}.options: must be a mapping of option: value (got {_show(value)})")
        if where == "defaults":
            continue
        given = set(spec.defaults) | set(block) | set(block.get("zip") or {})
        if {"warmup", "warmup_steps"} <= given:
            problems.append(f"{where}: give warmup (a fraction of the schedule) or warmup_steps, not both")
        for key, values in _axes_of(block) if isinstance(block.get("options", {}), dict) else ():
            if values == []:
                problems.append(f"{where}.{key}: an empty list expands to 0 trials; give at least one value, "
                                f"or leave {key} out to use the default")
        if "zip" in block:
            z = block["zip"]
            if not isinstance(z, dict) or not z or not all(isinstance(v, list) for v in z.values()):
                problems.append(f"{where}.zip: must map each axis to a list, e.g. zip: {{d_model: [256, 512], batch_size: [32, 16]}}")
            elif len({len(v) for v in z.values()}) != 1:
                lens = {k: len(v) for k, v in z.items()}
                problems.append(f"{where}.zip: lists that move together must have equal lengths (got {lens})")
            elif not next(iter(z.values())):
                problems.append(f"{where}.zip: empty lists expand to 0 trials; give each axis at least one value")
            else:
                for key in z:
                    if key not in GRID_FIELDS:
                        problems.append(f"{where}.zip: unknown key '{key}'{did_you_mean(key, GRID_FIELDS)}")
                    if key in block:
                        problems.append(f"{where}.zip.{key}: '{key}' is also set outside zip in the same block")
        if "seeds" in block:
            s = block["seeds"]
            ok = (isinstance(s, int) and not isinstance(s, bool) and s > 0) or (
                isinstance(s, list) and s and all(isinstance(x, int) and not isinstance(x, bool) for x in s)
                and len(set(s)) == len(s)
            )
            if s == []:
                problems.append(f"{where}.seeds: an empty list expands to 0 trials; give a count (seeds: 3) "
                                "or a list of distinct seeds")
            elif not ok:
                problems.append(f"{where}.seeds: must be a positive count or a list of distinct integer seeds (got {_show(s)})")
    return problems


def _axes_of(block: dict[str, Any]) -> list[tuple[str, list[Any]]]:
    """(key, values) per axis of a block; option axes are keyed 'options.NAME'."""
    axes: list[tuple[str, list[Any]]] = []
    for key, value in block.items():
        if key in ("zip", "seeds"):
            continue
        if key == "options":
            for opt, ov in value.items():
                axes.append((f"options.{opt}", ov if isinstance(ov, list) else [ov]))
        else:
            axes.append((key, value if isinstance(value, list) else [value]))
    return axes


def count_trials(spec: SweepSpec) -> int:
    total = 0
    for block in spec.grid:
        n = math.prod(len(v) for _, v in _axes_of(block))
        if "zip" in block:
            n *= len(next(iter(block["zip"].values())))
        seeds = block.get("seeds")
        n *= seeds if isinstance(seeds, int) else len(seeds) if seeds else 1
        total += n
    return total


def expand_grid(spec: SweepSpec, source: str = "<spec>", max_trials: int = MAX_TRIALS) -> list[TrialConfig]:
    """All trials of the sweep, in grid order, duplicates (same fingerprint) removed."""
    n = count_trials(spec)
    if n == 0:
        raise SpecError(["grid: expands to 0 trials; give every axis at least one value"], source)
    if n > max_trials:
        raise SpecError(
            [f"grid: expands to {n:,} trials, over the limit of {max_trials:,}; narrow the grid or pass --max-trials {n}"],
            source,
        )
    trials: list[TrialConfig] = []
    seen: set[str] = set()
    problems: list[str] = []
    sweep_level = {k: getattr(spec, k) for k in SWEEP_LEVEL_FIELDS}
    for i, block in enumerate(spec.grid):
        axes = _axes_of(block)
        zipped = block.get("zip") or {}
        zip_rows = [dict(zip(zipped, row)) for row in zip(*zipped.values())] if zipped else [{}]
        seeds = block.get("seeds")
        seed_list = list(range(seeds)) if isinstance(seeds, int) else list(seeds) if seeds else [None]
        for combo in itertools.product(*(v for _, v in axes)):
            for zrow in zip_rows:
                for seed in seed_list:
                    values = {**{k: v for k, v in spec.defaults.items() if k != "options"}}
                    options = dict(spec.defaults.get("options") or {})
                    for key, value in list(zip((k for k, _ in axes), combo)) + list(zrow.items()):
                        if key.startswith("options."):
                            options[key.removeprefix("options.")] = value
                        else:
                            values[key] = value
                    if seed is not None:
                        values["seed"] = seed
                    values["options"] = options
                    origin = {k: f"grid[{i}].{k}" if (k in block or k in zipped) else f"defaults.{k}" for k in values}
                    values = with_recipe(spec.recipe, values)
                    origin.update({k: f"recipe {spec.recipe}: {k}" for k in values if k not in origin})
                    try:
                        trial = TrialConfig(**values, **sweep_level)
                    except ValidationError as exc:
                        label = ", ".join(f"{k}={str(values[k])[:24]}" for k in ("architecture", "d_model", "heads")
                                          if k in values)
                        for err in exc.errors():
                            key = str(err["loc"][0]) if err["loc"] else _field_named_by(err["msg"])
                            where = origin.get(key, f"grid[{i}]") + "".join(
                                f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"][1:]
                            )
                            if err["type"] == "missing":
                                msg = f"required trial field '{key}' is set neither in defaults nor in the block"
                                where = f"grid[{i}]"
                            else:
                                msg = err["msg"].removeprefix("Value error, ")
                                inp = err.get("input")
                                if not isinstance(inp, dict) and err["type"] != "value_error":
                                    msg += f" (got {_show(inp)})"
                            problems.append(f"{where}: {msg} [trial {label}]")
                        continue
                    fp = trial.fingerprint()
                    if fp not in seen:
                        seen.add(fp)
                        trials.append(trial)
    if problems:
        raise SpecError(list(dict.fromkeys(problems)), source)
    for j, ref in enumerate(spec.reference):
        if not any(ref.matches(t) for t in trials):
            problems.append(f"reference[{j}].match: {_show(ref.match)} matches no trial of the grid; "
                            "check the axis names and values")
    problems += _check_report_axes(spec, trials)
    if problems:
        raise SpecError(problems, source)
    return trials


def report_axes(spec: SweepSpec, trials: list[TrialConfig]) -> set[str]:
    """The axis names reports can group, filter and order by: those of TrialConfig.axes() for these trials,
    and for a search the options its parameters (or its architecture choices) can bring in."""
    known = set(AXIS_FIELDS)
    for trial in trials:
        known.update(trial.axes())
    if spec.search is not None:
        known.update(n for n in spec.search.parameters if n.startswith(("options.", "objective_options.")))
        arch = spec.search.parameters.get("architecture")
        for name in (arch.choices or ()) if arch is not None else ():
            cls = models.options_model(name) if isinstance(name, str) and name in models.FAMILIES else None
            known.update(f"options.{k}" for k in getattr(cls, "model_fields", {}))
    return known


def _check_report_axes(spec: SweepSpec, trials: list[TrialConfig]) -> list[str]:
    """Unknown axis names in report tables and orderings: a typo there would silently match nothing."""
    known = report_axes(spec, trials)
    named: list[tuple[str, str]] = []
    for i, table in enumerate(spec.report.tables):
        named += [(f"report.tables[{i}].group_by", n) for n in table.group_by]
        named += [(f"report.tables[{i}].columns", table.columns)]
        named += [(f"report.tables[{i}].where", n) for n in table.where]
    for j, order in enumerate(spec.report.orderings):
        for part in ("better", "worse"):
            named += [(f"report.orderings[{j}].{part}", n) for n in getattr(order, part)]
        named += [(f"report.orderings[{j}].at", n) for n in order.at]
    return [f"{where}: '{name}' is not an axis of this sweep's trials{did_you_mean(name, known)}; axes: {one_of(known)}"
            for where, name in named if name not in known]


def _field_named_by(message: str) -> str:
    """The trial field a whole-trial validation message is about (for its key path)."""
    message = message.removeprefix("Value error, ")
    for prefix, field in (("objective_options", "objective_options"), ("objective ", "objective"), ("heads=", "heads"), ("kv_heads=", "kv_heads"), ("unknown architecture", "architecture"),
                          ("unknown objective", "objective"), ("unknown ", "options"), ("option ", "options")):
        if message.startswith(prefix):
            return field
    return ""


def load_trials(path: str | Path, max_trials: int = MAX_TRIALS,
                overrides: dict[str, Any] | None = None) -> tuple[SweepSpec, list[TrialConfig]]:
    """The sweep file's spec and trials, with `overrides` (see `apply_overrides`) applied first."""
    overrides = {k: v for k, v in (overrides or {}).items() if v not in (None, "")}
    spec = load_spec(path) if not overrides else override_spec(path, overrides)
    return spec, expand_grid(spec, source=str(path), max_trials=max_trials)


def override_spec(path: str | Path, overrides: dict[str, Any]) -> SweepSpec:
    """`load_spec` with `apply_overrides`: the same checks, on the changed contents."""
    from ablate.specfile import read_yaml

    path = Path(path)
    data = read_yaml(path)
    if not isinstance(data, dict):
        return parse_spec(data, source=str(path), base_dir=path.parent)  # its own error
    return parse_spec(apply_overrides(data, overrides), source=f"{path} with {overrides}", base_dir=path.parent)


def reference_for(spec: SweepSpec, trial: TrialConfig) -> Reference | None:
    """The most specific reference matching a trial (most match keys wins)."""
    matching = [r for r in spec.reference if r.matches(trial)]
    return max(matching, key=lambda r: len(r.match)) if matching else None
