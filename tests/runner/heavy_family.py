"""A plugin family whose build() would import a heavy library (transformers' Llama modelling), for
tests/runner/test_warm.py: its `preload()` is what the warm helper loads before it forks the family's first trainer.
The model and options are tests/plugins/leaky.py's."""

from __future__ import annotations

from tests.plugins.leaky import Options, build  # noqa: F401


def preload() -> None:
    import transformers.models.llama.modeling_llama  # noqa: F401
