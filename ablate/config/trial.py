"""One trial: every field a run needs, validated and frozen; its fingerprint is the run's identity. Also the
optimisation recipes and the limits that catch typing slips; architectures and objectives are checked through
their registry (config.registry)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationError, model_validator

from ablate.config import registry
from ablate.config.axes import AXIS_FIELDS
from ablate.config.data import DatasetRef, TokenizerRef
from ablate.config.errors import did_you_mean, one_of
from ablate.config.units import Budget, EvalPlan, Frozen, Horizon, Int32, Real


def _betas(value: tuple[float, float]) -> tuple[float, float]:
    if not all(0 <= b < 1 for b in value):
        raise ValueError(f"AdamW betas must each be in [0, 1), e.g. [0.9, 0.999] (got {list(value)})")
    return value


# The studies' recipe (HF Trainer defaults in the authors' code, STUDIES.md "Facts from the authors' public code"):
# fp16 with a loss scaler, AdamW betas (0.9, 0.999), 500 warm-up steps, then linear decay (over the sweep's
# `horizon` where the study planned one), no torch.compile, and no end-of-text target (the authors tokenised
# without special tokens and their collator set pad = eos to -100: no document's end was ever scored), and a Train loss
# over the last 500 steps (HF's logging_steps: the references are its last logged loss). "modern" is the project's own: precision by hardware,
# betas (0.9, 0.95), warm-up 2% of the budget, a schedule ending exactly at the budget, compile on GPU.
RECIPES: dict[str, dict[str, Any]] = {
    "modern": {},
    "studies": {"precision": "fp16", "betas": (0.9, 0.999), "warmup_steps": 500, "schedule": "linear", "compile": False,
                "eos_is_target": False, "train_loss_steps": 500},
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
            + ("" if not registry.objective(trial.objective).token_targets else  # e.g. a class, not tokens
               f", end-of-text {'scored' if trial.eos_is_target else 'not scored (input only)'}")
            + (f", train loss over the last {trial.train_loss_steps} steps" if trial.train_loss_steps else "")
            + (f"; {trial.eval.describe()}" if trial.eval.charged or trial.eval.every_steps else ""))


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
    # whether the end-of-text token each document gets (pad packing: after the text; concat: between documents; chunk:
    # none, as the studies' chunked rows) is a target of the loss; false keeps it as input only, as the studies'
    # collator did (pad = eos labelled -100)
    eos_is_target: bool = True
    # the run's Train loss: the token-weighted mean over its last this many optimizer steps (the studies' recipe: 500,
    # HF Trainer's logging_steps, whose last logged loss the references are); None: over the last 10% of the budget
    train_loss_steps: Int32 | None = Field(None, gt=0)
    dataset: DatasetRef
    tokenizer: TokenizerRef = TokenizerRef()
    budget: Budget
    eval: EvalPlan = EvalPlan()
    # the identity of the plugin code the trial runs ('name@file:<hash>'; None: ablate's own), filled in from the
    # registry (config.registry.code_of): an edited plugin is a new trial, as an edited option is
    code: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _plugin_code(cls, data: Any) -> Any:
        return registry.with_code(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _consistent(self) -> TrialConfig:
        if self.architecture not in registry.families():
            raise ValueError(registry.unknown_architecture(self.architecture))
        objective = registry.objectives().get(self.objective)
        if objective is None:
            raise ValueError(registry.unknown_objective(self.objective))
        if (unsupported := objective.unsupported(self.architecture)) is not None:
            raise ValueError(unsupported)
        if self.batch_size * self.context > MAX_MICRO_BATCH_TOKENS:
            raise ValueError(f"batch_size x context = {self.batch_size} x {self.context} = "
                             f"{self.batch_size * self.context:,} tokens per micro-batch is over the limit of "
                             f"{MAX_MICRO_BATCH_TOKENS:,}: lower batch_size (grad_accum keeps the global batch) or context")
        self.objective_settings()  # its options, validated: ValueError naming objective_options
        objective.check_trial(self)
        if self.heads is not None and self.d_model % self.heads:
            divisors = [h for h in (1, 2, 4, 8, 16, 32, 64) if self.d_model % h == 0]
            raise ValueError(
                f"heads={self.heads} does not divide d_model={self.d_model}; choose heads from {divisors} or change d_model"
            )
        if self.kv_heads is not None:
            if self.heads is None or self.heads % self.kv_heads:
                raise ValueError(f"kv_heads={self.kv_heads} must divide heads={self.heads}")
        options_cls = registry.options_model(self.architecture)
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
        cls = registry.objective(self.objective).options_model
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
        if self.code is not None:  # a plugin's: a report splits cells by it once two versions of its code ran
            out["code"] = self.code
        return out

    def flat(self) -> dict[str, Any]:
        """Every field, flattened: the axes, then the rest (nested blocks as `budget.steps`, lists as tuples). The
        fields that differ between a sweep's trials are what tells its configurations apart (varying_fields)."""
        out = self.axes()
        rest = self.model_dump(mode="json", exclude={*AXIS_FIELDS, "options", "objective_options", "code"})
        out.update(flatten(rest))
        return out

    def effective_options(self) -> dict[str, Any]:
        """The family's option defaults overlaid with this trial's options (the fingerprint keeps only the latter)."""
        return registry.options_model(self.architecture)(**self.options).model_dump(mode="json")


SWEEP_LEVEL_FIELDS = ("dataset", "tokenizer", "budget", "eval")


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config's JSON as one level: {"budget": {"steps": 100}} -> {"budget.steps": 100}; lists become tuples."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
    return out


def varying_fields(flats: list[dict[str, Any]], exclude: tuple[str, ...] = ("seed",)) -> list[str]:
    """The flattened fields whose values differ between these configurations (a field one lacks counts as None):
    every one of them tells configurations apart, so a cell of seeds must hold each fixed."""
    keys = dict.fromkeys(k for flat in flats for k in flat)
    return [k for k in keys if k not in exclude and len({repr(flat.get(k)) for flat in flats}) > 1]


GRID_FIELDS = tuple(f for f in TrialConfig.model_fields if f not in SWEEP_LEVEL_FIELDS and f != "code")


def fields_that_differ(configs: Sequence[dict[str, Any] | None], flat: Callable[[int], dict[str, Any]] | None = None,
                       skip: tuple[str, ...] = ("seed",)) -> tuple[list[str], list[dict[str, Any]]]:
    """The flattened fields that differ between runs' stored configs (`skip` aside), and each run's flattened
    fields. Flattened once per distinct config, not per run (100,000 runs are a few hundred configs): `flat(i)`
    flattens the i-th (default: the stored JSON, with the fields added since older rows were written filled in)."""
    import orjson

    distinct: dict[bytes, dict[str, Any]] = {}
    flats = []
    for i, config in enumerate(configs):
        kept = {k: v for k, v in {**_LEGACY_DEFAULTS, **(config or {})}.items() if k not in skip}
        key = orjson.dumps(kept, option=orjson.OPT_SORT_KEYS)
        if key not in distinct:
            distinct[key] = flatten(kept) if flat is None else flat(i)
        flats.append(distinct[key])
    return varying_fields(list(distinct.values()), exclude=skip), flats


# fields added after runs were recorded, at the value every earlier trial had: left out of the fingerprint there,
# so that those trials keep their identity
_LEGACY_DEFAULTS: dict[str, Any] = {"objective_options": {}, "betas": [0.9, 0.95], "warmup_steps": None, "horizon": None,
                                    "eos_is_target": True, "code": None, "train_loss_steps": None}


def trial_fingerprint(config: dict[str, Any]) -> str:
    """A trial's identity from its JSON dump (`model_dump(mode="json")`), for callers that already hold it."""
    config = {k: v for k, v in config.items() if k not in _LEGACY_DEFAULTS or v != _LEGACY_DEFAULTS[k]}
    return fingerprint(config)


def fingerprint(data: Any) -> str:
    """Stable hash of JSON-able data: independent of key order, YAML formatting and process."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


