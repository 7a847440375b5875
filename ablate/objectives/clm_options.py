"""Causal language modelling's knowledge, torch-free: no options, every family, the family's own sizes."""

from __future__ import annotations

from ablate.config.units import Frozen

NEXT_TOKEN = True  # its logits at t predict token t + 1: a report samples completions from it


class Options(Frozen):
    """No options: objective_options stays empty."""
