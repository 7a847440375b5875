"""Deprecated: the results database moved to `ablate.store`; this path is removed after one release."""

from ablate._moved import alias

__getattr__ = alias(__name__, "ablate.store", "ablate.store.schema", "ablate.store.engine", "ablate.store.migrate",
                    "ablate.store.register", "ablate.store.claims")
