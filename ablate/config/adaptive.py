"""The `adaptive:` block of a sweep: the report's claims decide how many seeds each cell runs.

    adaptive: {seeds: {min: 2, max: 10}}      # step 1, alpha 0.05, Pocock-type spending, futility on

The sweep first runs `min` seeds of every cell; after each round every claim of `report.orderings` is tested with
a group-sequential test (ablate/results/race.py), and only the cells of undecided claims get `step` more seeds, up
to `max` (or until `max_gpu_hours` of training is spent). The grid gives no `seed`/`seeds`: the race sets them.

    adaptive: {mode: best, seeds: {min: 2, max: 10}}   # which cell is lowest

A best-of-k race needs no orderings: after each round every cell is tested against the cell of lowest mean so far;
cells significantly worse stop getting seeds, the others go on until one is left or `max` is reached.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from ablate.config.units import Frozen, Real, Whole


class SeedRange(Frozen):
    min: Whole = Field(2, ge=2, description="seeds a side of every cell in the first round (a test needs 2)")
    max: Whole = Field(10, ge=2, description="the most seeds any cell runs")

    @model_validator(mode="after")
    def _ordered(self) -> SeedRange:
        if self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}; give min <= max, e.g. {{min: 2, max: 10}}")
        return self


class AdaptiveBlock(Frozen):
    # claims: race report.orderings; best: which cell is lowest (each against the lowest mean so far, F-race style)
    mode: Literal["claims", "best"] = "claims"
    seeds: SeedRange = SeedRange()
    step: Whole = Field(1, ge=1, description="seeds added a round to the cells of undecided claims")
    alpha: Real = Field(0.05, description="the family-wise error of the claims' verdicts, in (0, 0.5)")
    spending: Literal["pocock", "obrien-fleming"] = "pocock"
    futility: bool = True  # stop a claim that cannot reach its boundary by max seeds (conditional power < 10%)
    max_gpu_hours: Real | None = Field(None, gt=0, description="stop adding rounds once the sweep's trials have "
                                       "trained this long in all (their wall-clock seconds times their GPUs)")

    @field_validator("alpha")
    @classmethod
    def _alpha(cls, value: float) -> float:
        if not 0 < value < 0.5:
            raise ValueError(f"alpha {value:g} must lie in (0, 0.5), e.g. 0.05")
        return value
