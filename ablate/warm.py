"""Deprecated: the warm helper moved to `ablate.runner.warm`; this path is removed after one release."""

from ablate._moved import alias

__getattr__ = alias(__name__, "ablate.runner.warm")
