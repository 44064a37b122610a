"""Field types every catalog and scenario schema shares: bounded numbers, dates, dtypes, aliases and the strict base
model (an unknown key, a missing key or a value out of bounds is an error that names the field)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.catalog.ids import POOL_ID

BIG = 1e15
"""Bound of any catalog number without a tighter physical one (no figure of a chip or a model comes near it;
1e300 would overflow the arithmetic it enters)."""
Pos = Annotated[float, Field(gt=0, le=BIG)]
NonNeg = Annotated[float, Field(ge=0, le=BIG)]
PosInt = Annotated[int, Field(gt=0, le=10**15)]
NonNegInt = Annotated[int, Field(ge=0, le=10**15)]
Fraction = Annotated[float, Field(gt=0, le=1)]


def upto(bound: float, *, zero: bool = False):
    """A positive (or, with ``zero``, non-negative) number at most ``bound``: where physics bounds a catalog
    figure, a value beyond it (a typo's 1e300) is refused naming the field and the bound, before it reaches
    arithmetic that would overflow or a solver that would read it as infinite."""
    return Annotated[float, Field(ge=0, le=bound) if zero else Field(gt=0, le=bound)]


AsOf = Annotated[dt.date, Field(strict=False)]
"""A date: a YAML date or an ISO string (the only field of a catalog where a string converts)."""

USD_PER_CHIP_HOUR = upto(1e4)
"""$10,000 per chip-hour: a thousand times today's dearest accelerator."""
Dtype = Literal["fp32", "bf16", "fp16", "fp8", "int8", "fp4", "int4"]
Vendor = Literal["nvidia", "amd", "google", "aws"]
Alias = Annotated[str, Field(pattern=POOL_ID)]
"""Another name measured data uses for an entry (``h100_sxm``, ``dsr1``)."""
ENGINES = ("trtllm", "sglang", "vllm", "atom")
"""Engine ids of the bundled catalog (``catalogs/engines/``); a catalog folder may define others."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)
