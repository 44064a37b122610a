"""The brownfield family of the deployment MILP: a plan that starts from a deployed fleet
(:class:`planner.catalog.fleet.Fleet`) keeps what is deployed unless a change pays for itself over the horizon.

Variables (only where the scenario names a fleet)::

    keep[g]   integer, 0..count_g: deployed units of group g (one hardware and commitment) kept
    add[h]    integer: units of hardware h added, at the plan's price
    new[k]    binary: pool identity k (workload, role, hardware, engine, layout, weight format) that is not
              deployed is used at all (x[r, t] <= X_r new[k] for its rows r)

    u[h] <= sum_{g of h} keep[g] + add[h]

(an inequality: keeping and adding cost, so the optimum holds it with equality; as an equality HiGHS 1.x's
presolve, given a MIP start and the cost caps of :func:`planner.model.bounds.cost_caps`, reported the start as
optimal at a wrong objective.)

Dollars per hour over the horizon (:func:`fleet_usd`, in the place of ``price_h chips_h u_h``)::

    sum_h p_h c_h add[h] + sum_g c_g (committed_g count_g + keeprate_g keep[g])

where a reservation's remaining term is paid whether the unit is kept or not (``committed``) and a kept unit
costs its running cost (owned), its rate (on-demand) or, past its term, the renewal price (reserved). The
changes are one-off dollars spread over the horizon's hours ``H`` (:func:`change_usd`)::

    (sum_h A_h add[h] + sum_g R_g (count_g - keep[g]) + sum_k C_k new[k]) / H

``C_k`` is the reconfiguration cost for a new layout of a workload that is deployed, the re-engine cost where
its engine is new to the workload; pools of a workload with no deployed pool cost nothing to create.
"""

from __future__ import annotations

import numpy as np
import pyomo.core as pyo

from planner.perf.candidates import pool_keys


def define_brownfield(m) -> bool | None:
    fleet = m._data.fleet
    if fleet is None:
        return False
    groups = [g for g in fleet.groups if g.hardware in m.H]
    m._groups = groups
    m.G = pyo.Set(initialize=range(len(groups)), ordered=True, doc="deployed unit groups")
    m.bf_keep = pyo.Var(m.G, within=pyo.NonNegativeIntegers, bounds=lambda m, g: (0, groups[g].count),
                        doc="deployed units kept")
    m.bf_add = pyo.Var(m.H, within=pyo.NonNegativeIntegers, doc="units added")
    m.bf_units = pyo.Constraint(m.H, rule=lambda m, h: m.u[h] <= sum(
        m.bf_keep[g] for g in m.G if groups[g].hardware == h) + m.bf_add[h])
    costs, rows_of = change_classes(m)
    m._new_cost = costs
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


def fleet_usd(m, committed: bool = True):
    """Dollars per hour of the held units of a brownfield model: units added at the plan's price, deployed
    units at what keeping them costs, and (``committed``) a reservation's remaining term whether kept or not."""
    hw = m._data.hardware
    out = sum(m.usd_per_chip_hour[h] * hw[h].chips_per_unit * m.bf_add[h] for h in m.H)
    for g in m.G:
        grp = m._groups[g]
        cpu = hw[grp.hardware].chips_per_unit
        out = out + cpu * grp.keep_usd_per_chip_hour() * m.bf_keep[g]
    return out + (committed_usd(m._data) if committed else 0.0)


def committed_usd(data) -> float:
    """Dollars per hour the deployed fleet's reservations cost over the horizon whether kept or not."""
    hw = data.hardware
    return sum(hw[g.hardware].chips_per_unit * g.committed_usd_per_chip_hour() * g.count
               for g in data.fleet.groups if g.hardware in hw)


def change_usd(m):
    """The changes' one-off dollars spread over the horizon's hours."""
    fleet = m._data.fleet
    out = sum(fleet.unit_added_usd[h] * m.bf_add[h] for h in m.H)
    for g in m.G:
        grp = m._groups[g]
        out = out + fleet.unit_released_usd[grp.hardware] * (grp.count - m.bf_keep[g])
    out = out + sum(m._new_cost[k] * m.bf_new[k] for k in m.K)
    return out / fleet.horizon_h


def start_brownfield(m, replicas, vals) -> None:
    """Keep the cheapest deployed units to keep first, up to the units the start holds; add the rest; mark the
    new pool identities the start uses."""
    order = sorted(m.G, key=lambda g: m._groups[g].keep_usd_per_chip_hour())
    left = {h: round(vals.get(m.u[h], 0.0)) for h in m.H}
    for g in order:
        h = m._groups[g].hardware
        n = min(left[h], m._groups[g].count)
        vals[m.bf_keep[g]] = float(n)
        left[h] -= n
    for h in m.H:
        vals[m.bf_add[h]] = float(left[h])
    _, rows_of = change_classes(m)
    for k in m.K:
        vals[m.bf_new[k]] = float(any(replicas(i, t) > 0 for i in rows_of[k] for t in m.T))


def deployed_units(m, h: str) -> int:
    """Deployed units of ``h`` (0 in a model without a fleet)."""
    fleet = m._data.fleet
    return 0 if fleet is None else fleet.units().get(h, 0)
