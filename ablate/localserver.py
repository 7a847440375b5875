"""Deprecated: the local Prefect server moved to `ablate.runner.localserver`; this path is removed after one release."""

from ablate._moved import alias

__getattr__ = alias(__name__, "ablate.runner.localserver")
