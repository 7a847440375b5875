"""Deprecated: user-facing errors moved to `ablate.config.errors`; this path is removed after one release."""

from ablate._moved import alias

__getattr__ = alias(__name__, "ablate.config.errors")
