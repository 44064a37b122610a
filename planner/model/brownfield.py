"""The brownfield family of the deployment MILP: a plan that starts from a deployed fleet
(:class:`planner.catalog.fleet.Fleet`) keeps what is deployed unless a change pays for itself over the horizon.

Variables (only where the scenario names a fleet)::

    keep[g, t]  integer, 0..count_g: deployed units of group g (one hardware and commitment) kept in period t;
                the same in every period of a day's profile, never more than the period before over months
                (a released unit is gone)
    new[k]      binary: pool identity k (workload, role, hardware, engine, layout, weight format) that is not
                deployed is used at all (x[r, t] <= X_r new[k] for its rows r)

and ``u[h]`` is then the units *added* (at the plan's price), so the units held in period ``t`` are
``u[h] (+ ub[h, s <= t] over months) + sum_{g of h} keep[g, t]`` (:func:`planner.model.terms.bought`).

Dollars per hour of period ``t`` (:func:`fleet_usd`, in the place of ``price_h chips_h u_h``)::

    sum_h p_h c_h u[h] + sum_g c_g (r_g f_gt count_g + k_gt keep[g, t])

``f_gt`` is the share of period ``t`` the reservation covers (paid whether the unit is kept or not): over
months, the part of month ``t`` before ``until``; in a plan of one period (or a day's profile), the share of the
horizon before ``until``. A kept unit costs ``k_gt``: past its term (``1 - f_gt``) the renewal price; an on-demand
unit its rate; an owned one its running cost. The changes are one-off dollars spread over the horizon's hours
``H`` (:func:`change_usd`)::

    (sum_h A_h (u[h] + sum_t ub[h, t]) + sum_g R_g (count_g - keep[g, last]) + sum_k C_k new[k]) / H

``C_k`` is the reconfiguration cost for a new layout of a workload that is deployed, the re-engine cost where
its engine is new to the workload; pools of a workload with no deployed pool cost nothing to create.
"""

from __future__ import annotations

import numpy as np
import pyomo.core as pyo

from planner.catalog.fleet import months_between
from planner.perf.candidates import pool_keys


def declare_kept(m) -> None:
    """The deployed units kept, ``keep[g, t]``: declared with the model's other variables (every family that
    counts the units held, :func:`planner.model.terms.bought`, counts them)."""
    fleet = m._data.fleet
    if fleet is None:
        return
    groups = [g for g in fleet.groups if g.hardware in m.H]
    m._groups = groups
    m._term = {(g, t): term_share(m, grp, t) for g, grp in enumerate(groups) for t in m.T}
    m.G = pyo.Set(initialize=range(len(groups)), ordered=True, doc="deployed unit groups")
    m.bf_keep = pyo.Var(m.G, m.T, within=pyo.NonNegativeIntegers, bounds=lambda m, g, t: (0, groups[g].count),
                        doc="deployed units kept in the period")


def define_brownfield(m) -> bool | None:
    """Kept units released for good, the new pool identities a change pays for (see the module docstring)."""
    fleet = m._data.fleet
    if fleet is None:
        return False
    steps = [(g, t) for g in m.G for t in m.T if t > 0]
    for h in fleet.keep_only:  # deployed hardware the scenario does not list: kept or released, not added to
        if h in m.H:
            m.u[h].fix(0)
            for t in getattr(m, "TB", []):
                m.ub[h, t].fix(0)
    if m._periods.invest:
        m.bf_keep_order = pyo.Constraint(steps, rule=lambda m, g, t: m.bf_keep[g, t] <= m.bf_keep[g, t - 1])
        lead = lead_months(fleet)
        if lead:  # units ordered at the start arrive after the lead time: none added before it
            for h in m.H:
                m.u[h].fix(0)
                for t in m.TB:
                    if t < lead:
                        m.ub[h, t].fix(0)
    else:
        m.bf_keep_order = pyo.Constraint(steps, rule=lambda m, g, t: m.bf_keep[g, t] == m.bf_keep[g, 0])
    costs, rows_of = change_classes(m)
    m._new_cost, m._new_rows = costs, rows_of
    m.K = pyo.Set(initialize=sorted(costs), ordered=True, doc="pool identities that are a change")
    m.bf_new = pyo.Var(m.K, within=pyo.Binary, doc="a new pool identity is used")
    a = m._arr
    rate = a["rate"] / m._unit
    top = {w: max(pyo.value(m.demand[w, t]) for t in m.T) for w in m.W}
    pairs = [(i, k) for k in costs for i in rows_of[k]]

    def link(m, i, k, t):
        need = top[a["workload"][i]] / m._unit * (m._data.lose_units + 1) / max(rate[i], 1e-12)
        return m.x[i, t] <= (10.0 * np.ceil(need) + 10.0) * m.bf_new[k]

    m.bf_new_link = pyo.Constraint([(i, k, t) for i, k in pairs for t in m.T], rule=link)


def lead_months(fleet) -> int:
    """Whole months before hardware ordered at the plan's start arrives (``change_costs.lead_time_days``)."""
    import math

    return math.ceil(fleet.lead_time_days / (365.0 / 12.0) - 1e-9) if fleet.lead_time_days else 0


def term_share(m, grp, t) -> float:
    """Share of period ``t`` a group's commitment pays for whether its units are kept or not."""
    if grp.commitment != "reserved":
        return 0.0
    if not m._periods.invest:
        return grp.committed_share
    fleet = m._data.fleet
    if grp.until is None:
        return 1.0
    return min(max(months_between(fleet.start, grp.until) - t, 0.0), 1.0)


def keep_rate(m, g: int, t) -> float:
    """$/chip-hour of keeping a unit of group ``g`` in period ``t`` beyond what its commitment pays anyway."""
    grp = m._groups[g]
    if grp.commitment == "reserved":
        return (1.0 - m._term[g, t]) * grp.renew_usd_per_chip_hour
    return grp.usd_per_chip_hour


def kept(m, h: str, t):
    """Deployed units of ``h`` kept in period ``t`` (0 without a fleet)."""
    if not hasattr(m, "bf_keep"):
        return 0
    return sum(m.bf_keep[g, t] for g in m.G if m._groups[g].hardware == h)


def change_classes(m) -> tuple[dict[int, float], dict[int, list[int]]]:
    """The pool identities among the candidate rows that are a change (not deployed, of a deployed workload),
    numbered, with what each costs, and the rows of each."""
    fleet = m._data.fleet
    deployed = fleet.keys()
    engines: dict[str, set[str]] = {}
    for p in fleet.pools:
        if p.replicas > 0:
            engines.setdefault(p.workload, set()).add(p.engine)
    ids: dict[tuple, int] = {}
    costs: dict[int, float] = {}
    rows_of: dict[int, list[int]] = {}
    for i, key in enumerate(pool_keys(m._data.rows)):
        if key in deployed or (*key[:-1], "") in deployed or key[0] not in engines:
            continue
        k = ids.setdefault(key, len(ids))
        costs[k] = fleet.pool_reconfigured_usd if key[3] in engines[key[0]] else fleet.pool_reengined_usd
        rows_of.setdefault(k, []).append(i)
    return {k: c for k, c in costs.items() if c > 0}, rows_of


def fleet_usd(m, t, committed: bool = True):
    """Dollars per hour of period ``t``'s deployed units kept, at what keeping them costs, and (``committed``)
    the reservations paid whether kept or not. The added units are priced by the caller."""
    hw = m._data.hardware
    out = 0
    for g in m.G:
        grp = m._groups[g]
        out = out + hw[grp.hardware].chips_per_unit * keep_rate(m, g, t) * m.bf_keep[g, t]
    return out + (committed_usd(m, t) if committed else 0.0)


def committed_usd(m, t) -> float:
    """Dollars per hour of period ``t`` the deployed fleet's reservations cost whether kept or not."""
    hw = m._data.hardware
    return sum(hw[m._groups[g].hardware].chips_per_unit * m._term[g, t] * m._groups[g].usd_per_chip_hour
               * m._groups[g].count for g in m.G)


def horizon_hours(m) -> float:
    """Hours the changes are spread over: the months planned, else the scenario's horizon."""
    return m._periods.horizon_h if m._periods.invest else m._data.fleet.horizon_h


def change_usd(m):
    """The changes' one-off dollars spread over the horizon's hours."""
    fleet = m._data.fleet
    last = m.T.last()
    out = sum(fleet.unit_added_usd[h] * m.u[h] for h in m.H)
    if hasattr(m, "ub"):
        out = out + sum(fleet.unit_added_usd[h] * m.ub[h, t] for h in m.H for t in m.TB)
    for g in m.G:
        grp = m._groups[g]
        out = out + fleet.unit_released_usd[grp.hardware] * (grp.count - m.bf_keep[g, last])
    out = out + sum(m._new_cost[k] * m.bf_new[k] for k in m.K)
    return out / horizon_hours(m)


def split_start(m, vals) -> None:
    """A start's units held (``vals[u[h]]``: every unit the start needs) split into deployed units kept (cheapest
    to keep first, the same in every period) and units added (the rest, in ``u``)."""
    for h in m.H:
        left = round(vals.get(m.u[h], 0.0))
        for g in sorted((g for g in m.G if m._groups[g].hardware == h), key=lambda g: keep_rate(m, g, m.T.first())):
            n = min(left, m._groups[g].count)
            for t in m.T:
                vals[m.bf_keep[g, t]] = float(n)
            left -= n
        vals[m.u[h]] = float(left)


def start_brownfield(m, replicas, vals) -> None:
    """The start's units split (:func:`split_start`) and the new pool identities its replicas use marked."""
    split_start(m, vals)
    for k in m.K:
        vals[m.bf_new[k]] = float(any(replicas(i, t) > 0 for i in m._new_rows[k] for t in m.T))


def deployed_units(m, h: str) -> int:
    """Deployed units of ``h`` (0 in a model without a fleet)."""
    fleet = m._data.fleet
    return 0 if fleet is None else fleet.units().get(h, 0)
