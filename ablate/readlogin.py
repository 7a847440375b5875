"""Deprecated: the read-only login moved to `ablate.store.readlogin`; this path is removed after one release."""

from ablate._moved import alias

__getattr__ = alias(__name__, "ablate.store.readlogin")
