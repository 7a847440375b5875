"""ablate: declarative ablation sweeps for small language-model architectures, with a results database.

`ablate.architecture` and `ablate.objective` register your own (ablate/config/registration.py); `ablate.sweep(SPEC)`
plans, runs, reads and reports a sweep from Python (ablate/cli/api.py). Importing `ablate` stays light: they load on
first use.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "architecture", "objective", "sweep"]


def __getattr__(name: str) -> Any:
    if name in ("architecture", "objective"):
        from ablate.config import registration

        return getattr(registration, name)
    if name in ("sweep", "Sweep"):
        from ablate.cli import api  # the Python door beside the command line, loaded on first use

        return getattr(api, name)
    raise AttributeError(f"module 'ablate' has no attribute {name!r}")
