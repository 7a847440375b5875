"""Before a sweep with plugin architectures is registered: the contract's fast part (the builder runs, the output
has the right shape, eval-mode logits are causal and rows independent) once per (family, options, objective), at
tiny sizes. A model that fails is refused with the failing property, the first leaking position and the option
values, and nothing is written. Built-in families are held to the whole contract by the project's own tests."""

from __future__ import annotations

import json
from typing import Any

from ablate.config import registry
from ablate.config.errors import AblateError


def refuse_broken_plugins(trials: list[Any]) -> None:
    """An AblateError naming every plugin family of `trials` that fails the contract's fast part."""
    cases = {}
    for trial in trials:
        family = registry.families().get(trial.architecture)
        if family is not None and family.source.identity is not None:
            cases.setdefault((trial.architecture, json.dumps(trial.options, sort_keys=True), trial.objective), trial)
    if not cases:
        return
    from ablate.plugins.check import check_trial, small_trial  # torch: only for sweeps with plugin families

    problems = []
    for (name, options, objective), trial in cases.items():
        sizes = {"heads": trial.heads, "d_model": 8 * trial.heads} if trial.heads else {}
        try:
            small = small_trial(name, trial.options, objective, **sizes)
        except AblateError:  # options that need the trial's own sizes: its sizes, on a short context
            small = trial.model_copy(update={"context": min(trial.context, 16), "batch_size": 2})
        failed = [f for f in check_trial(small, fast=True) if f.ok is False]
        if failed:
            said = "; ".join(f"{f.name}: {f.detail}" for f in failed)
            problems.append(f"architecture {name!r} with options {options} (objective {objective}): {said}")
    if problems:
        raise AblateError("refused before anything was registered, the plugin's model breaks the contract: "
                          + " | ".join(problems) + ". Run `ablate check NAME --plugin PATH --options JSON` for "
                          "the whole contract")
