"""The lookup every command makes first: a sweep by its name, with one error for a name that is not there."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from ablate.config.errors import AblateError, did_you_mean
from ablate.store.schema import Sweep


def sweep_named(engine: sa.Engine, name: str, *columns: Any) -> Any:
    """The row of the sweep named `name` (`columns` of it, default every one), or an AblateError that suggests the
    closest name and lists the sweeps there are (a typo is an error, never an empty result)."""
    with engine.connect() as conn:
        row = conn.execute(sa.select(*(columns or (Sweep,))).where(Sweep.name == name)).first()
        if row is None:
            known = conn.execute(sa.select(Sweep.name).order_by(Sweep.name)).scalars().all()
            raise AblateError(f"no sweep named {name!r} in the results DB{did_you_mean(name, known)}; known: "
                              + (", ".join(known) or "none yet (`ablate sweep run SPEC` registers and trains one)"))
    return row
