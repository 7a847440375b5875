"""Deprecated: the bounded YAML reader moved to `ablate.config.yamlfile`; this path is removed after one release."""

from ablate._moved import alias

__getattr__ = alias(__name__, "ablate.config.yamlfile")
