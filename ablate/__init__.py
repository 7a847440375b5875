"""ablate: declarative ablation sweeps for small language-model architectures, with a results database.

`ablate.architecture` and `ablate.objective` register your own (ablate/config/registration.py); importing `ablate` stays
light: they load on first use.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "architecture", "objective"]


def __getattr__(name: str) -> Any:
    if name in ("architecture", "objective"):
        from ablate.config import registration

        return getattr(registration, name)
    raise AttributeError(f"module 'ablate' has no attribute {name!r}")
