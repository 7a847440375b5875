"""A sweep: the top-level spec and its blocks (search, report, reference numbers, the retrieval stage)."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ablate.config.adaptive import AdaptiveBlock
from ablate.config.data import DatasetRef, PairsRef, TokenizerRef
from ablate.config.errors import did_you_mean, one_of
from ablate.config.fusion import FuseMode
from ablate.config.trial import GRID_FIELDS, TrialConfig, fingerprint
from ablate.config.units import X_KINDS, Budget, EvalPlan, Frozen, LaterFields, Real, Whole, parse_at

NAME_MAX = 200  # characters of a sweep name, on every engine (sweeps.name is VARCHAR(200))

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


class Ordering(LaterFields):
    """A published ordering the report checks on our table: runs matching `better` reach a lower test loss
    than runs matching `worse`, at each combination of the `at` axes (held equal). With a smallest effect of
    interest (`sesoi`, here or the report's), a claim can also end "equivalent within ±sesoi".

    A parity claim (`matches: {...}, within: 0.02` in place of `worse`, as the studies claim one-step parity) says
    the sides are equal within ±within nats: it holds when two one-sided tests show so, and is reversed when they
    differ. It is kept as `worse` = the matched side, `sesoi` = within, `parity` = true."""

    _added_later = ("sesoi", "parity")

    claim: str = Field(min_length=1)  # the study's statement, with where it is published
    better: dict[str, Any]
    worse: dict[str, Any]
    at: tuple[str, ...] = ()
    sesoi: float | None = Field(default=None, gt=0, allow_inf_nan=False)  # nats; None: the report's
    parity: bool | None = None  # true: a parity claim (`matches`/`within`)

    @model_validator(mode="before")
    @classmethod
    def _parity(cls, data: Any) -> Any:
        if not isinstance(data, dict) or ("matches" not in data and "within" not in data):
            return data
        if "matches" not in data:
            raise ValueError("`within` goes with `matches` (a parity claim); an ordering's smallest effect of "
                             "interest is `sesoi`")
        if "worse" in data:
            raise ValueError("give `worse` (an ordering) or `matches` (a parity claim), not both")
        if "within" not in data:
            raise ValueError("`matches` needs `within`: the nats within which the two sides count as equal, e.g. "
                             "within: 0.02")
        if "sesoi" in data:
            raise ValueError("a parity claim's `within` is its smallest effect of interest: leave out `sesoi`")
        rest = {k: v for k, v in data.items() if k not in ("matches", "within")}
        return {**rest, "worse": data["matches"], "sesoi": data["within"], "parity": True}


# report fields that change how runs are read or described, never which runs exist
READING_ONLY = ("min_steps", "at", "group", "reference_tokenizer")


class ReportBlock(LaterFields):
    _added_later = ("sesoi",)

    tables: tuple[TableSpec, ...] = (TableSpec(),)
    # the figures' x axes: the x kinds of `at` and the dashboard (seconds are drawn in hours, minutes or seconds)
    curves: tuple[Literal[X_KINDS], ...] = ("seconds", "tokens")
    kind: Literal["loss", "memory"] = "loss"
    prompt: str | None = None
    orderings: tuple[Ordering, ...] = ()
    # how the runs are read, not what they are (not in the sweep's fingerprint: READING_ONLY)
    # a run with fewer optimizer steps is too short to compare (near the uniform guess): flagged, no verdict
    min_steps: int = Field(default=50, ge=0)
    # read every run at an equal budget of another kind, on its curve: {flops: 1e15}, {tokens: 50M}, {seconds: 600}
    at: dict[Literal[X_KINDS], Real | str] | None = None
    # one table (and figure) whose columns are these axes' combinations, every other axis averaged
    group: tuple[str, ...] | None = Field(default=None, min_length=1)
    # the tokenizer behind the `reference:` numbers, in words: printed under every table that shows them
    reference_tokenizer: str | None = None
    # the smallest effect of interest, in nats, of every ordering that names none: a claim whose effect is shown
    # within ±sesoi (two one-sided tests) is "equivalent"; without one, a small effect is only "not significant"
    sesoi: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    def sesoi_of(self, order: Ordering) -> float | None:
        return order.sesoi if order.sesoi is not None else self.sesoi

    @field_validator("curves", mode="before")
    @classmethod
    def _seconds_were_hours(cls, value: Any) -> Any:
        """`hours`, the x axis's name before it was one with the dashboard's: a stored sweep still reads."""
        if isinstance(value, (list, tuple)):
            return tuple("seconds" if v == "hours" else v for v in value)
        return value

    @field_validator("at")
    @classmethod
    def _one_budget(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        parse_at(value)  # exactly one kind, a positive amount: the message shows the form
        return value


class Reference(Frozen):
    """Published numbers for the trials matching `match` (axes; options as options.key)."""

    match: dict[str, Any]
    train: Real | None = None
    eval: Real | None = None
    memory_mb: Real | Literal["OOM"] | None = None
    source: str | None = None

    def matches(self, trial: TrialConfig) -> bool:
        return self.matches_axes(trial.axes())

    def matches_axes(self, axes: dict[str, Any]) -> bool:
        """`matches` on a trial's axes already computed (a report's 100,000 runs)."""
        return all(same_value(axes.get(k, _MISSING), v) for k, v in self.match.items())


_MISSING = object()


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9)
        except (TypeError, ValueError):
            return False
    return a == b



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
    eval_every: Whole | None = Field(None, gt=0, description="evaluate the held-out pairs every N retrieval steps (the "
                                     "authors' eval_steps: 4000 on TinyStories, 2000 on FineWeb) and at the end; the "
                                     "table gives the best and the final; null: at the end only")
    reference: list[RetrievalReference] = Field(default_factory=list, description="published held-out losses: the "
                                                "best evaluation during training (the authors' peak)")

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
        evals = f"evaluated every {self.eval_every} steps and at the end" if self.eval_every else "evaluated at the end"
        return (f"{self.layers} blocks at {width}, input norm {'on' if self.input_norm else 'off'}, final norm "
                f"{'on' if self.final_norm else 'off'}; AdamW lr {self.lr:g}, weight decay {self.weight_decay:g}, batch "
                f"{self.batch_size}, {self.schedule} decay after {warm}; {length} per cell, {evals}; embeddings at token "
                f"{self.index} of the {self.position}{', standardized' if self.standardize else ''}; c "
                f"{'counts the query (c-1 texts)' if self.candidates_count_query else 'texts per query'}")

    def settings(self) -> RetrievalSettings:
        return RetrievalSettings(**{k: getattr(self, k) for k in RetrievalSettings.model_fields})

    def texts_per_query(self, c: int) -> int:
        """How many candidate texts a cell labelled c scores."""
        return c - 1 if self.candidates_count_query else c


STUDIES_EVAL = {"at": (), "every_steps": 4000, "charged": True}  # the eval plan under `recipe: studies`


class SweepSpec(Frozen):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", max_length=NAME_MAX)
    description: str = ""
    recipe: Literal["modern", "studies"] = "modern"  # defaults of optimisation fields under the sweep's own (RECIPES)
    dataset: DatasetRef
    tokenizer: TokenizerRef = TokenizerRef()
    budget: Budget
    eval: EvalPlan = EvalPlan()
    defaults: dict[str, Any] = Field(default_factory=dict)
    grid: list[dict[str, Any]] = Field(default_factory=lambda: [{}])
    search: SearchBlock | None = None
    adaptive: AdaptiveBlock | None = None  # the claims decide the seeds (ablate/config/adaptive.py)
    report: ReportBlock = ReportBlock()
    reference: list[Reference] = Field(default_factory=list)
    retrieval: RetrievalPlan | None = None
    # plugin files (relative to the sweep file) and modules, loaded before the grid is read (ablate/plugins/load.py)
    plugins: list[str] = Field(default_factory=list)
    # what overrides changed from the file (apply_overrides), in words: plan and the report print them
    overrides: tuple[str, ...] = ()
    # how a runner may train the trials: in fused groups (ablate/config/fusion.py); never part of the sweep's
    # identity (a member equals its solo run), `--fuse` on `ablate sweep run` overrides it
    fuse: FuseMode = "off"

    @model_validator(mode="before")
    @classmethod
    def _studies_defaults(cls, data: Any) -> Any:
        """Under `recipe: studies`, what the sweep leaves unsaid is the studies': a trained tokenizer of style llama,
        and evals as the authors' HF Trainer ran them, the whole eval split every 4,000 steps on the budget clock
        (eval_steps=4000, evaluation_strategy='steps' in every CLM trainer, e.g. blbadger/maskedmixers
        mixer_lm/mixer_trainer.py@2270414:368; their 12 h included those evals), none at budget fractions."""
        if isinstance(data, dict) and data.get("recipe") == "studies":
            tokenizer = data.get("tokenizer") or {}
            if isinstance(tokenizer, dict) and tokenizer.get("name") is None and tokenizer.get("style") is None:
                data = {**data, "tokenizer": {**tokenizer, "style": "llama"}}
            evals = data.get("eval") or {}
            if isinstance(evals, dict):
                data = {**data, "eval": {**STUDIES_EVAL, **evals}}
        return data

    def fingerprint(self) -> str:
        data = self.model_dump(mode="json")
        del data["overrides"]  # a description of the changes, not one: the changed fields are in the spec
        del data["fuse"]  # how the runs train, not what they learn
        if not data["plugins"]:  # sweeps of built-ins keep their identity (the trials carry each plugin's code)
            del data["plugins"]
        if data["adaptive"] is None:  # as do sweeps that race no claims
            del data["adaptive"]
        if data["retrieval"] is None:  # sweeps without a retrieval stage keep their identity
            del data["retrieval"]
        else:  # as do those whose stage has the settings every one had before they were fields
            stage = data["retrieval"]
            for key, value in {**_RETRIEVAL_LEGACY, "candidates_count_query": False, "position": "text",
                               "epochs": None, "eval_every": None}.items():
                if key in stage and stage[key] == value:
                    del stage[key]
        for key in READING_ONLY:  # how a report reads the runs is not the sweep's identity
            data["report"].pop(key, None)
        # spelled as before the x kinds had one name (seconds were `hours`): a sweep keeps its identity
        data["report"]["curves"] = ["hours" if x == "seconds" else x for x in data["report"]["curves"]]
        if not data["report"]["orderings"]:  # as do sweeps that check no published ordering
            del data["report"]["orderings"]
        if data["recipe"] == "modern":  # and sweeps on the project's own recipe
            del data["recipe"]
        return fingerprint(data)



def reference_for(spec: SweepSpec, trial: TrialConfig) -> Reference | None:
    """The most specific reference matching a trial (most match keys wins)."""
    matching = [r for r in spec.reference if r.matches(trial)]
    return max(matching, key=lambda r: len(r.match)) if matching else None
