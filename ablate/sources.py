"""Deprecated: dataset source paths moved to `ablate.config.sources`; this path is removed after one release."""

from ablate._moved import alias

__getattr__ = alias(__name__, "ablate.config.sources")
