"""Deprecated: spec overrides moved to `ablate.config.overrides`; this path is removed after one release."""

from ablate._moved import alias

__getattr__ = alias(__name__, "ablate.config.overrides")
