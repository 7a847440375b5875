"""Loading a sweep file: the bounded YAML reader's data, overrides applied, validated into a SweepSpec with every
problem named by its key path; then expanded into trials."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from ablate.config import registry
from ablate.config.errors import AblateError, SpecError, did_you_mean, one_of, show as _show
from ablate.config.grid import MAX_TRIALS, axes_of, expand_grid
from ablate.config.overrides import apply_overrides, describe_overrides
from ablate.config.sources import has_splits, looks_like_path, special_files
from ablate.config.sweep import SweepSpec
from ablate.config.trial import GRID_FIELDS, SWEEP_LEVEL_FIELDS, TrialConfig
from ablate.config.yamlfile import read_yaml

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
    path = Path(path)
    return parse_spec(read_yaml(path), source=str(path), base_dir=path.parent)


def parse_spec(data: Any, source: str = "<spec>", base_dir: Path | None = None) -> SweepSpec:
    if not isinstance(data, dict):
        raise SpecError([f"the top level must be a mapping with keys name, dataset, budget, grid, ... (got {type(data).__name__})"], source)
    data = dict(data)
    _load_plugins(data.get("plugins"), source, base_dir)
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


def _load_plugins(refs: Any, source: str, base_dir: Path | None) -> None:
    """The sweep's plugins, registered before its grid names their architectures; a problem names the plugin."""
    if refs is None:
        return
    if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
        raise SpecError([f"plugins: must be a list of plugin files or modules, e.g. plugins: [./my_mixer.py, "
                         f"mypkg.models] (got {_show(refs)})"], source)
    import importlib

    try:
        importlib.import_module(f"{registry.PLUGINS}.load").load_plugins(refs, base_dir)
    except AblateError as exc:
        raise SpecError([str(exc)], source) from None


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
            if not isinstance(name, str) or name not in registry.families():
                continue
            options_cls = registry.options_model(name)
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
    problems = _search_non_causal(spec) + _adaptive_problems(spec)
    if not spec.grid:
        problems.append("grid: an empty list expands to 0 trials; give at least one block, e.g. "
                        "grid: [{d_model: [256, 512]}], or leave grid out to run the defaults as one trial")
    for where, block in [("defaults", spec.defaults)] + [(f"grid[{i}]", b) for i, b in enumerate(spec.grid)]:
        if not isinstance(block, dict):
            problems.append(f"{where}: must be a mapping of trial fields (got {_show(block)})")
            continue
        for key, value in block.items():
            if key in ("zip", "seeds"):
                if where == "defaults":  # a block's own keys: "did you mean 'seeds'?" would name the same word
                    what = "repeats its block's trials" if key == "seeds" else "moves its block's axes together"
                    problems.append(f"defaults.{key}: '{key}' {what}, so it goes in each grid block, not in defaults")
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
        for key, values in axes_of(block) if isinstance(block.get("options", {}), dict) else ():
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



def _adaptive_problems(spec: SweepSpec) -> list[str]:
    """An adaptive sweep races the report's orderings and sets the seeds itself."""
    if spec.adaptive is None:
        return []
    problems = []
    if spec.adaptive.mode == "claims" and not spec.report.orderings:
        problems.append("adaptive: races the claims of report.orderings, and this sweep has none; add report.orderings "
                        "(a claim with its better and worse sides), race the cells for the lowest (adaptive.mode: "
                        "best), or remove adaptive")
    if spec.search is not None:
        problems.append("adaptive: a search samples its own trials; race the claims of a grid sweep, or remove adaptive")
    for where, block in [("defaults", spec.defaults)] + [(f"grid[{i}]", b) for i, b in enumerate(spec.grid)]:
        for key in ("seed", "seeds"):
            if isinstance(block, dict) and key in block:
                problems.append(f"{where}.{key}: an adaptive sweep sets the seeds itself (adaptive.seeds: "
                                f"{spec.adaptive.seeds.min} to {spec.adaptive.seeds.max} per cell); remove {key}")
    return problems


def load_trials(path: str | Path, max_trials: int = MAX_TRIALS,
                overrides: dict[str, Any] | None = None) -> tuple[SweepSpec, list[TrialConfig]]:
    """The sweep file's spec and trials, with `overrides` (see `apply_overrides`) applied first."""
    overrides = {k: v for k, v in (overrides or {}).items() if v not in (None, "", [], ())}
    spec = load_spec(path) if not overrides else override_spec(path, overrides)
    return spec, expand_grid(spec, source=str(path), max_trials=max_trials)


def override_spec(path: str | Path, overrides: dict[str, Any]) -> SweepSpec:
    """`load_spec` with `apply_overrides`: the same checks, on the changed contents."""
    path = Path(path)
    data = read_yaml(path)
    if not isinstance(data, dict):
        return parse_spec(data, source=str(path), base_dir=path.parent)  # its own error
    return parse_spec(apply_overrides(data, overrides), source=f"{path} with {describe_overrides(overrides)}",
                      base_dir=path.parent)


