"""What a user writes, validated and frozen, torch-free; imports nothing of ablate outside this folder.

    errors.py     user-facing errors and the "did you mean" helpers every layer uses
    units.py      frozen models, checked numbers, durations and counts, Budget, Horizon, EvalPlan, hardware
    data.py       DatasetRef, TokenizerRef, PairsRef: what a trial reads
    registry.py   the architecture and objective tables, name -> the modules that know it (ablate.models and
                  ablate.objectives register the built-ins there)
    trial.py      TrialConfig and its fingerprint, recipes
    launch.py     LaunchOptions: how a worker starts trainers (not a trial's identity), carried whole to them
    fusion.py     fused groups: which trials may train together in one process, and why a trial may not
    sweep.py      SweepSpec and its blocks: search, report, reference, retrieval
    grid.py       grid expansion into trials
    load.py       load_spec / parse_spec / load_trials: a sweep file, with overrides, validated
    yamlfile.py   the bounded YAML reader; overrides.py: --budget/--source/--param changes; dotted.py: KEY=VALUE
                  overrides of any field; sources.py: paths
"""

from __future__ import annotations

import importlib
from typing import Any

# names are found in their module on first use, so that `import ablate.config.errors` (every layer's) stays
# cheap and loads no pydantic model
_HOMES = {
    **dict.fromkeys(['DatasetRef', 'EvalSplit', 'PairsRef', 'TokenizerRef'], 'data'),
    **dict.fromkeys(['AblateError', 'SpecError'], 'errors'),
    **dict.fromkeys(['MAX_TRIALS', 'count_trials', 'expand_grid', 'report_axes'], 'grid'),
    **dict.fromkeys(['load_spec', 'load_trials', 'override_spec', 'parse_spec'], 'load'),
    **dict.fromkeys(['Ordering', 'Reference', 'ReportBlock', 'RetrievalPlan', 'RetrievalSettings', 'SearchBlock', 'SearchParam', 'SweepSpec', 'TableSpec', 'reference_for'], 'sweep'),
    'AXIS_FIELDS': 'axes',
    'LaunchOptions': 'launch',
    **dict.fromkeys(['GRID_FIELDS', 'RECIPES', 'SWEEP_LEVEL_FIELDS', 'TrialConfig', 'describe_recipe', 'fingerprint', 'trial_fingerprint', 'with_recipe'], 'trial'),
    **dict.fromkeys(['Budget', 'EvalPlan', 'HARDWARE_PROFILES', 'Horizon', 'parse_count', 'parse_duration'], 'units'),
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'ablate.config' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"ablate.config.{home}"), name)
    globals()[name] = value
    return value
