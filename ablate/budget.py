"""Deprecated: moved to `ablate.train.budget`; this path is removed after one release."""

from ablate._moved import alias

__getattr__ = alias(__name__, "ablate.train.budget")
