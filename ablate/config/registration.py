"""`ablate.architecture` and `ablate.objective`: the public way to register a family or an objective, beside the
registry it fills (the zoo, the objectives and every plugin register through it; it imports nothing above config/).

    class Options(BaseModel):
        kernel: int = 4

    @ablate.architecture("shift-mixer", options=Options, description="masked mixer with a token shift")
    def build(trial, vocab_size):            # input_ids (B, T) -> logits (B, T, V)
        ...

A plugin's Options are refused extra keys and frozen like every family's. Without a closed-form `param_count`,
planning counts parameters by building the model on the meta device (no memory; it imports torch).

The built-ins use the lazy form: `options` and `build` as import paths of a torch-free options module (Options,
param_count, inter_token_params, mixing_flops_per_token: models/contract.py's FamilyOptions) and of a model module
(build), so that planning a built-in never imports torch. An installed package can do the same (see
examples/plugins/shiftmix-package), so that `ablate plan` on any sweep never imports torch for its sake. Registrations are recorded with the source that
made them (config/identity.py's LOADING tells which plugin file is being read; otherwise the builder's module).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any

from pydantic import BaseModel, ConfigDict

from ablate.config import registry
from ablate.config.errors import AblateError
from ablate.config.identity import LOADING, module_source
from ablate.config.registry import BUILTIN, Family, ObjectiveEntry, Source


def architecture(name: str, *, options: Any, description: str = "", build: Any = None,
                 param_count: Callable[[Any, int], int] | None = None,
                 inter_token_params: Callable[[Any], int | None] | None = None,
                 mixing_flops_per_token: Callable[[Any], float] | None = None,
                 train_mode_causal: bool = True, train_mode_note: str = "") -> Any:
    """Register a family: used as a decorator of `build(trial, vocab_size) -> nn.Module`, or with `build=`.

    options: a pydantic model of the family's options (`trial.options` validates against it). param_count(trial,
    vocab_size): the closed form, if you have one. inter_token_params(trial): the parameters that mix tokens
    (recorded per run; unknown if not given). mixing_flops_per_token(trial): token-mixing FLOPs per token that
    are not parameter multiplies, as attention's scores (the FLOPs estimate adds them; 0 if not given).
    train_mode_causal=False: the model reads later tokens in train mode by design (routing, as mixture-of-depths'
    top-k), said in train_mode_note; the contract then holds it to eval-mode causality only."""
    _check_name("architecture", name)
    if isinstance(options, str) and isinstance(build, str):  # the lazy form: import paths
        registry.add_family(Family(name, build, options, description, _path_source(options)))
        return build

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        given = {"param_count": param_count, "inter_token_params": inter_token_params,
                 "mixing_flops_per_token": mixing_flops_per_token}
        declared = {} if train_mode_causal else {"TRAIN_MODE_CAUSAL": False, "TRAIN_MODE_NOTE": train_mode_note or
                                                 "not causal in train mode by design (train_mode_causal=False)"}
        counts = SimpleNamespace(Options=_strict(options, "architecture", name), **declared,
                                 **{key: f for key, f in given.items() if f is not None})  # Family's defaults
        model = SimpleNamespace(**vars(counts), build=fn)
        registry.add_family(Family(name, model, counts, description or _first_line(fn), _source(fn)))
        return fn

    return register if build is None else register(build)


def objective(name: str, *, options: Any = None, architectures: Iterable[str] | None = None, description: str = "",
              build: Any = None, loss: Callable[[Any], Any] | None = None, count: Callable[[Any], Any] | None = None,
              next_token: bool = False, unmasked: bool = False, token_targets: bool = True, **declared: Any) -> Any:
    """Register an objective: used as a decorator of `build(trial, vocab_size) -> nn.Module`, or with `build=`.

    loss(trial) -> (model, input_ids, labels) -> (loss sum, counted targets); default (None): next-token loss.
    count(trial) -> labels -> number of targets; default (None): next-token targets (objectives/base.py). architectures: the families it is
    built for (default every one). next_token: logits at t predict token t + 1 (reports sample from it).
    unmasked: it may use a family's unmasked option. `declared`: check_trial, passes, param_counts (see
    ablate/objectives/__init__.py)."""
    _check_name("objective", name)
    if isinstance(options, str) and isinstance(build, str):  # the lazy form: import paths
        registry.add_objective(ObjectiveEntry(name, build, options, description, _path_source(options)))
        return build
    unknown = set(declared) - {"check_trial", "passes", "param_counts"}
    if unknown:
        raise AblateError(f"ablate.objective({name!r}): unknown keyword {sorted(unknown)[0]!r}; besides the named "
                          "ones it takes check_trial, passes and param_counts")

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        knowledge = SimpleNamespace(
            Options=_strict(options, "objective", name), UNMASKED=unmasked, TOKEN_TARGETS=token_targets,
            NEXT_TOKEN=next_token, ARCHITECTURES=tuple(architectures) if architectures is not None else None,
            **declared)
        module = SimpleNamespace(build=fn, loss=loss, count=count)
        registry.add_objective(ObjectiveEntry(name, module, knowledge, description or _first_line(fn),
                                              _source(fn)))
        return fn

    return register if build is None else register(build)


def _check_name(kind: str, name: Any) -> None:
    import re

    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
        raise AblateError(f"ablate.{kind}({name!r}): a name is 1-64 letters, digits, '-', '_' or '.', "
                          "starting with a letter or digit")


def _strict(options: Any, kind: str, name: str) -> type[BaseModel]:
    """The plugin's Options, frozen and refusing extra keys as every built-in's are (a subclass if it is not)."""
    if options is None:
        options = BaseModel
    if not (isinstance(options, type) and issubclass(options, BaseModel)):
        raise AblateError(f"ablate.{kind}({name!r}, options=...): options must be a pydantic BaseModel class "
                          f"(got {options!r}); e.g. class Options(BaseModel): kernel: int = 4")
    config = options.model_config
    if config.get("extra") == "forbid" and config.get("frozen"):
        return options
    return type(options.__name__, (options,), {"model_config": ConfigDict(**{**config, "extra": "forbid",
                                                                               "frozen": True}),
                                                "__module__": options.__module__})


def _source(fn: Any) -> Source:
    loading = LOADING.get()
    if loading is not None:
        return loading
    return module_source(sys.modules.get(getattr(fn, "__module__", ""), None))


def _path_source(path: str) -> Source:
    """The source of a lazy registration: ablate's own modules are the built-ins; a package's are its own."""
    top = path.split(".")[0]
    if top == "ablate":
        return BUILTIN
    return LOADING.get() or module_source(sys.modules.get(top) or importlib.import_module(top))


def _first_line(fn: Any) -> str:
    return ((getattr(fn, "__doc__", None) or "").strip().splitlines() or [""])[0]
