"""Deprecated: sweep specs moved to `ablate.config`; this path is removed after one release."""

from ablate._moved import alias

__getattr__ = alias(__name__, "ablate.config.trial", "ablate.config.units", "ablate.config.data", "ablate.config.sweep",
                    "ablate.config.grid", "ablate.config.load", "ablate.config.overrides", "ablate.config.errors")
