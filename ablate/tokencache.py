"""Deprecated: the token cache's location and check moved to `ablate.data.tokencache`; this path is removed after
one release."""

from ablate._moved import alias

__getattr__ = alias(__name__, "ablate.data.tokencache")
