"""Terms the constraint families of the deployment MILP share: the rate unit, row coefficients, the capacity a
role is served with, the units held in a period and what they draw and cost. Every term is indexed by period
``t`` (a scenario without a traffic profile has the one period 0)."""

from __future__ import annotations

import numpy as np

EPSILON = 1e-6
"""Weight of the tie-break term (dollars of the chips replicas occupy) against the fleet's dollars."""
ELASTIC_WEIGHT = 1e6
"""Weight of the limits' slack in an elastic model's objective (the fleet's dollars are scaled by 1e-6)."""
NO_LIMIT = 1e12
"""Value of a limit's parameter where the scenario sets none (the family then adds no constraint)."""


def rate_unit(data) -> float:
    """Requests/s per unit of the demand and capacity terms: a power of ten that brings the largest demand to
    between 100 and 1000 units, so no coefficient of the MILP nears the solver's infinity (HiGHS reads values
    of 1e20 and above as infinite) or its feasibility tolerance, whatever the scenario's scale: a demand of
    1e-6 req/s is as well posed as one of 1e6 (the scenario bounds the spread between workloads,
    ``MIN_DEMAND_SHARE``)."""
    top = max((w.requests_per_s for w in data.workloads.values()), default=1.0)
    return float(10.0 ** (int(np.floor(np.log10(max(top, 1e-300)))) - 3))


def coef(m, name: str) -> list[float]:
    """A row array as Python floats (rates in rate units): Pyomo builds expressions from them several times
    faster than from NumPy scalars, which go through NumPy's ufunc dispatch on every product."""
    cache = m._coefs
    if name not in cache:
        arr = m._arr["rate"] / m._unit if name == "rate" else m._arr[name]
        cache[name] = [float(v) for v in arr]
    return cache[name]


def served(m, w: str, role: str, t):
    """Requests/s (rate units) the replicas of ``w``'s ``role`` rows carry in period ``t``."""
    rate = coef(m, "rate")
    return sum(rate[i] * m.x[i, t] for i in m._rows_of.get(("role", w, role), []))


def stream(m, w: str, role: str, t):
    """The stream ``role`` of ``w`` serves in period ``t``: the aggregated one, or the disaggregated one that
    passes through both prefill and decode."""
    return m.s_agg[w, t] if role == "aggregated" else m.s_dis[w, t]


def bought(m, h: str, t):
    """Units of ``h`` held in period ``t`` for the horizon: those bought at the plan's price (over investment
    periods, also those bought at the start of a period up to ``t``) and the deployed units kept in ``t``."""
    out = m.u[h]
    if hasattr(m, "ub"):
        out = out + sum(m.ub[h, s] for s in m.TB if s <= t)
    if hasattr(m, "bf_keep"):
        from planner.model.brownfield import kept

        out = out + kept(m, h, t)
    return out


def held(m, h: str, t):
    """Units of ``h`` bought for period ``t``: those held over the horizon and those bought per period."""
    out = bought(m, h, t)
    if h in m._tiered_on_demand:
        out = out + m.uo[h, t]
    if h in m._tiered_spot:
        out = out + m.us[h, t]
    return out


def usable(m, h: str, t):
    """Units of ``h`` whose chips replicas can count on in period ``t`` (spot units less their preemption)."""
    out = bought(m, h, t)
    if h in m._tiered_on_demand:
        out = out + m.uo[h, t]
    if h in m._tiered_spot:
        out = out + (1.0 - m._data.tiers[h].preemption) * m.us[h, t]
    return out


def fleet_kw(m, t):
    """All-in kW of the units held in period ``t``."""
    hw = m._data.hardware
    return sum((hw[h].kw_per_chip or 0.0) * hw[h].chips_per_unit * held(m, h, t) for h in m.H)


def fleet_usd_per_hour(m, t, committed: bool = True):
    """Dollars per hour of the units held in period ``t``: the held units at the plan's price (a mutable
    parameter), the per-period ones at their tiers'. From a deployed fleet, the deployed units kept at what they
    cost (:func:`planner.model.brownfield.fleet_usd`), with the reservations paid whether kept or not unless
    ``committed`` is false (the objective leaves that constant out: HiGHS's MIP start and cutoff are read
    without the objective's offset)."""
    hw, tiers = m._data.hardware, m._data.tiers
    out = sum(m.usd_per_chip_hour[h] * hw[h].chips_per_unit * m.u[h] for h in m.H)
    if hasattr(m, "bf_keep"):
        from planner.model.brownfield import fleet_usd

        out = out + fleet_usd(m, t, committed)
    if hasattr(m, "ub"):
        out = out + sum(m.usd_per_chip_hour[h] * hw[h].chips_per_unit * m.ub[h, s] for h in m.H for s in m.TB if s <= t)
    for h in m._tiered_on_demand:
        out = out + tiers[h].on_demand * hw[h].chips_per_unit * m.uo[h, t]
    for h in m._tiered_spot:
        out = out + tiers[h].spot * hw[h].chips_per_unit * m.us[h, t]
    return out


def weighted(weight: float, expr):
    """``weight * expr``, leaving ``expr`` as it is where the weight is 1 (a single period)."""
    return expr if weight == 1.0 else weight * expr


def unit_loss(m, w: str, role: str, h: str) -> float:
    """Most requests/s (in rate units) of ``(w, role)`` one purchase unit of ``h`` can carry, so the most one
    lost unit takes away: the unit's chips at the densest candidate row's requests/s per chip, or, for a
    replica larger than a unit, two whole replicas (a unit may hold the ends of two)."""
    a = m._arr
    cpu = m._data.hardware[h].chips_per_unit
    best = 0.0
    for i in m._rows_of.get(("role", w, role), []):
        if a["hardware"][i] != h:
            continue
        rate, slots = a["rate"][i] / m._unit, float(a["slots"][i])
        best = max(best, cpu * rate / slots if slots <= cpu else 2.0 * rate)
    return best
