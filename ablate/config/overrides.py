"""Overrides: what a run may change in a sweep file without editing it (`--budget`, `--source`, `--gpus`, ...,
any field as `KEY=VALUE` (dotted.py), or a deployment run's parameters), applied to the file's contents before
they are parsed, so that an overridden sweep goes through exactly the checks of a written one."""

from __future__ import annotations

import copy
import hashlib
import re
from pathlib import Path
from typing import Any

from ablate.config.dotted import ECHO, assign, lookup, parse_assignment, same, value_text
from ablate.config.errors import SpecError, did_you_mean
from ablate.config.sources import has_splits, is_local_source, looks_like_path
from ablate.config.sweep import NAME_MAX

# what a run may change unedited; `set`: dotted KEY=VALUE assignments of any field
OVERRIDES = ("budget", "source", "holdout", "vocab_size", "gpus", "hardware", "name", "set")
DEFAULT_HOLDOUT = 1000  # documents held out for eval when a source override has no split to evaluate on


def _times(value: Any, factor: int) -> Any:
    """A grad_accum value (or a list of them) times `factor`; anything else is left for validation to refuse."""
    if isinstance(value, list):
        return [_times(v, factor) for v in value]
    return value * factor if isinstance(value, int) and not isinstance(value, bool) else value


def _bounded(name: str) -> str:
    """An automatic name within NAME_MAX: past it, cut, with a hash of the whole name (still one name per change)."""
    if len(name) <= NAME_MAX:
        return name
    return f"{name[:NAME_MAX - 9].rstrip('-_')}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9_-]+", "-", text.lower()).strip("-")[:40] or "x"


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A sweep file's contents with `overrides` applied: `budget` ("10m" wall clock, or "steps=200",
    "tokens=50M", "flops=1e15"; hardware and gpus stay), `source` (dataset.source: a local source where the spec
    evaluates on a named split gets a holdout instead, since local files have no splits), `holdout` (eval on the
    last N documents), `vocab_size` (train a BPE of that size), `gpus` (GPUs per trial: the global batch is kept by
    scaling grad_accum where the counts divide), `hardware` (the profile / work pool), `name`, and `set`: any field,
    as dotted `KEY=VALUE` assignments (`defaults.lr=1e-3`), applied first, as an edit of the file. Other trials are
    another experiment: without a `name`, the sweep is named after the changes (smoke-budget-10m), so it never
    mixes with the file's own sweep; what changed, and how it differs from the study, is listed in the spec's
    `overrides` (printed by plan and the report)."""
    unknown = sorted(k for k, v in overrides.items() if v is not None and k not in OVERRIDES)
    if unknown:
        raise SpecError([f"override {k!r}: not one of {', '.join(OVERRIDES)}{did_you_mean(k, OVERRIDES)}"
                         for k in unknown], "<overrides>")
    data = copy.deepcopy(data)
    suffix: list[str] = []
    notes: list[str] = []
    named = _override_fields(data, overrides.get("set") or (), suffix, notes)
    budget = overrides.get("budget")
    if budget is not None:
        kind, _, amount = str(budget).strip().rpartition("=")
        kind = kind.strip() or "wall_clock"
        if kind not in ("wall_clock", "tokens", "steps", "flops"):
            raise SpecError([f"override budget {budget!r}: the kind must be wall_clock, tokens, steps or flops, e.g. "
                             "budget=10m or budget=steps=200"], "<overrides>")
        kept = {k: v for k, v in (data.get("budget") or {}).items() if k in ("hardware", "gpus")}
        value: Any = int(amount) if kind == "steps" and amount.strip().isdigit() else amount.strip()
        before, data["budget"] = data.get("budget"), {**kept, kind: value}
        if not same(before, data["budget"]):  # the file's own budget: the same sweep, not renamed
            suffix.append(f"budget-{'' if kind == 'wall_clock' else kind + '-'}{_slug(amount)}")
            notes.append(f"budget: {kind.replace('_', ' ')} {value} (override)")
    _override_data(data, overrides, suffix, notes)
    vocab = overrides.get("vocab_size")
    if vocab is not None:
        tokenizer = {k: v for k, v in (data.get("tokenizer") or {}).items() if k != "name"}
        data["tokenizer"] = {**tokenizer, "vocab_size": vocab}
        suffix.append(f"vocab-{_slug(str(vocab))}")
        notes.append(f"tokenizer: a BPE of {vocab} tokens trained on the corpus (override)")
    _override_hardware(data, overrides, suffix, notes)
    if overrides.get("name"):
        data["name"] = overrides["name"]
    elif suffix and isinstance(data.get("name"), str) and not named:
        data["name"] = _bounded("-".join([data["name"], *suffix]))
    if notes:
        data["overrides"] = notes
    return data


def describe_overrides(overrides: dict[str, Any]) -> str:
    """The overrides as a command line gives them (`--budget 10m defaults.lr=1e-3`): where a problem came from."""
    sets = overrides.get("set") or ()
    flags = [f"--{k.replace('_', '-')} {v}" for k, v in overrides.items() if k != "set" and v not in (None, "")]
    said = " ".join(flags + ([sets] if isinstance(sets, str) else list(sets)))
    return said if len(said) <= ECHO else said[:ECHO - 3] + "..."  # an error's first line, not the whole argument


def _override_fields(data: dict[str, Any], assignments: Any, suffix: list[str], notes: list[str]) -> bool:
    """`set`: each `KEY=VALUE` (a string, or a list of them) set in `data`, the caller's copy; whether one of them
    was the sweep's `name` (which then names it, as `name` does)."""
    named = False
    for text in [assignments] if isinstance(assignments, str) else assignments:
        key, value = parse_assignment(text)
        unchanged = same(lookup(data, key), value)  # the file's own value: the same sweep, not renamed
        assign(data, key, value)
        named = named or key == "name"
        if key != "name" and not unchanged:
            suffix.append(_slug(f"{key}={value_text(value)}"))
            notes.append(f"{key}: {value_text(value)} (override)")
    return named


def _override_data(data: dict[str, Any], overrides: dict[str, Any], suffix: list[str], notes: list[str]) -> None:
    """`source` and `holdout`: the corpus, and what the sweep evaluates on (`data` is the caller's copy)."""
    source, holdout = overrides.get("source"), overrides.get("holdout")
    dataset = data.get("dataset")
    if not isinstance(dataset, dict) or (source is None and holdout is None):
        return  # (a dataset that is not a mapping is refused, by name, when the spec is parsed)
    evaluation = dataset.get("eval") if isinstance(dataset.get("eval"), dict) else {}
    if source is not None:
        dataset["source"] = str(source)
        suffix.append(f"data-{_slug(Path(str(source)).name.split('.')[0])}")
        notes.append(f"dataset.source: {source} (override)")
        is_local = is_local_source(str(source)) or looks_like_path(str(source))
        if is_local and evaluation.get("split") is not None and holdout is None and not has_splits(str(source)):
            holdout = int(evaluation.get("limit") or DEFAULT_HOLDOUT)
            notes.append(f"dataset.eval: the spec's eval split {evaluation['split']!r} does not exist in a local "
                         f"source: the last {holdout} documents of {source} are held out instead (--holdout N to "
                         "choose)")
    if holdout is None:
        return
    if isinstance(holdout, bool) or not str(holdout).strip().isdigit() or int(holdout) <= 0:
        raise SpecError([f"override holdout {holdout!r}: a positive number of documents, e.g. holdout=1000"],
                        "<overrides>")
    dataset["eval"] = {k: v for k, v in evaluation.items() if k not in ("split", "holdout")} | {"holdout": int(holdout)}
    if overrides.get("holdout") is not None:
        suffix.append(f"holdout-{int(holdout)}")
        notes.append(f"dataset.eval: the last {int(holdout)} documents held out (override)")


def _override_hardware(data: dict[str, Any], overrides: dict[str, Any], suffix: list[str], notes: list[str]) -> None:
    """`gpus` and `hardware`: where each trial runs. The study's own setting is kept in the notes, so the report
    can say that these runs were not on the study's hardware."""
    gpus, hardware = overrides.get("gpus"), overrides.get("hardware")
    budget = data.get("budget")
    if (gpus is None and hardware is None) or not isinstance(budget, dict):
        return
    study = f"{budget.get('gpus', 1)}x {budget.get('hardware', 'cpu')}"
    if hardware is not None:
        budget["hardware"] = str(hardware)
        suffix.append(f"hw-{_slug(str(hardware))}")
    if gpus is not None:
        if isinstance(gpus, bool) or not str(gpus).strip().isdigit() or int(gpus) <= 0:
            raise SpecError([f"override gpus {gpus!r}: a positive number of GPUs per trial, e.g. gpus=1"], "<overrides>")
        old, new = budget.get("gpus", 1), int(gpus)
        if isinstance(old, bool) or not isinstance(old, int) or old <= 0:
            return  # the file's own budget.gpus is refused, by name, when the spec is parsed
        budget["gpus"] = new
        suffix.append(f"gpus-{new}")
        if old != new:
            notes.append(_keep_global_batch(data, old, new))
    notes.append(f"hardware: {budget.get('gpus', 1)}x {budget.get('hardware', 'cpu')} per trial, not the study's "
                 f"{study} (override): wall-clock budgets buy other amounts of training there")


def _keep_global_batch(data: dict[str, Any], old: int, new: int) -> str:
    """Scale grad_accum by old/new GPUs, so each optimizer step sees the study's global batch."""
    if old % new:
        return (f"gpus: {old} -> {new} per trial; grad_accum is kept, so the global batch changes by {new}/{old} "
                "(the counts do not divide)")
    factor = old // new
    data["defaults"] = defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):  # refused, by name, when the spec is parsed
        return f"gpus: {old} -> {new} per trial"
    defaults["grad_accum"] = _times(defaults.get("grad_accum", 1), factor)  # what every block inherits
    for block in [b for b in data.get("grid") or [] if isinstance(b, dict)]:
        for where in (block, block.get("zip")):
            if isinstance(where, dict) and "grad_accum" in where:
                where["grad_accum"] = _times(where["grad_accum"], factor)
    base = (data.get("search") or {}).get("base") if isinstance(data.get("search"), dict) else None
    if isinstance(base, dict) and "grad_accum" in base:
        base["grad_accum"] = _times(base["grad_accum"], factor)
    return (f"gpus: {old} -> {new} per trial; grad_accum x{factor}, so each optimizer step still sees the study's "
            "global batch")
