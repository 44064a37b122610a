"""The deployment MILP (Pyomo): one model over a period index, built from the constraint families of
:mod:`planner.model.families`.

Decisions
    ``x[r, t]``  integer replicas of candidate row ``r`` (each row belongs to one workload, role and hardware)
                 in period ``t``;
    ``u[h]``     integer purchase units (8-GPU nodes, NVL72 racks, TPU slices) of hardware ``h`` held over the
                 whole horizon, at the plan's price;
    ``uo[h, t]``, ``us[h, t]``  on-demand and spot units bought for period ``t`` (only where ``h`` has such a tier);
    ``ub[h, t]`` units bought (reserved) at the start of investment period ``t > 0`` (months of growth), held from
                 then on;
    ``s_agg[w, t]``, ``s_dis[w, t]``  requests/s of workload ``w`` served by aggregated and by disaggregated pools
                 in period ``t``, in units of ``rate_unit`` requests/s.

A scenario without a traffic profile is one period (``T = {0}``) and has no tiers: ``u`` is the fleet.

Objective: the horizon's mean dollars per hour (each period's units at their prices, weighed by the period's share
of the horizon), plus ``EPSILON`` times the dollars of the chips replicas occupy (among fleets of equal price, the
one with no idle replicas), plus what the families add (pool types' operating cost).

Inputs that sweeps change are mutable parameters (demand, prices, limits, working sets), so a sweep builds once
and re-solves. With ``elastic=True`` every limit gets a priced slack variable; the solution then says which limit
is short and by how much (:func:`planner.model.families.shortfalls`).
"""

from __future__ import annotations

import pyomo.core as pyo

from planner.model.bounds import greedy_start
from planner.model.brownfield import change_usd, declare_kept
from planner.model.data import PlanData, periods_of, row_arrays
from planner.model.families import FAMILIES, apply_prefix_capacity, elastic_shortage, pairing_on_demand
from planner.model.terms import (
    ELASTIC_WEIGHT,
    EPSILON,
    NO_LIMIT,
    bought,
    coef,
    fleet_usd_per_hour,
    rate_unit,
    weighted,
)
from planner.solve.structure import Structure, declare

__all__ = ["EPSILON", "build_model", "objective_expr", "period_values", "rate_unit", "update_parameters"]


def build_model(data: PlanData, *, elastic: bool = False) -> pyo.ConcreteModel:
    m = pyo.ConcreteModel(name="deployment")
    m._data = data
    m._arr = row_arrays(data)
    m._unit = rate_unit(data)
    m._elastic = elastic
    m._coefs = {}
    m._periods = periods_of(data)
    define_sets(m, data)
    define_parameters(m, data)
    define_variables(m, data)
    m._defined = set()
    for family in FAMILIES:
        if family.define(m) is not False:
            m._defined.add(family.name)
    m.cost = pyo.Objective(expr=objective_expr(m), sense=pyo.minimize)
    blocks, covers = define_workload_blocks(m)
    declare(m, Structure(blocks=blocks, covers=covers, objective_covers_blocks=blocks is not None and not elastic,
                         refresh=lambda: apply_prefix_capacity(m),
                         lazy=(lambda: pairing_on_demand(m)) if "pd_pairing" in m._defined else None,
                         restart=lambda: greedy_start(m, check=False)))
    return m


def define_sets(m, data: PlanData) -> None:
    m.R = pyo.Set(initialize=range(len(data.rows)), ordered=True, doc="candidate rows")
    m.H = pyo.Set(initialize=list(data.hardware), ordered=True, doc="hardware systems")
    m.W = pyo.Set(initialize=list(data.workloads), ordered=True, doc="workloads")
    m.T = pyo.Set(initialize=range(m._periods.count), ordered=True, doc="periods")
    m._tiered_on_demand = [h for h in data.hardware if h in data.tiers and data.tiers[h].on_demand is not None]
    m._tiered_spot = [h for h in data.hardware if h in data.tiers and data.tiers[h].spot is not None]
    a = m._arr
    m._rows_of = {}
    for i in range(len(data.rows)):
        m._rows_of.setdefault(("role", a["workload"][i], a["role"][i]), []).append(i)
        m._rows_of.setdefault(("hw", a["hardware"][i]), []).append(i)
        if a["prefix"][i]:
            m._rows_of.setdefault(("prefix", a["workload"][i]), []).append(i)


def define_parameters(m, data: PlanData) -> None:
    hw, wl, per = data.hardware, data.workloads, m._periods
    m.demand = pyo.Param(m.W, m.T, mutable=True, initialize={(w, t): per.demand[w][t] for w in m.W for t in m.T},
                         doc="requests/s")
    m.working_set_gb = pyo.Param(m.W, mutable=True, initialize={w: wl[w].working_set_bytes / 1e9 for w in m.W})
    m.usd_per_chip_hour = pyo.Param(m.H, mutable=True, initialize={h: hw[h].usd_per_chip_hour for h in m.H})
    m.max_units = pyo.Param(
        m.H, mutable=True, initialize={h: 10**9 if hw[h].max_units is None else hw[h].max_units for h in m.H})
    m.power_limit_kw = pyo.Param(mutable=True, initialize=data.power_kw if data.power_kw is not None else NO_LIMIT)
    m.budget_usd_per_hour = pyo.Param(
        mutable=True, initialize=data.budget_usd_per_hour if data.budget_usd_per_hour is not None else NO_LIMIT)


def define_variables(m, data: PlanData) -> None:
    m.x = pyo.Var(m.R, m.T, within=pyo.NonNegativeIntegers, doc="replicas per candidate row and period")
    m.u = pyo.Var(m.H, within=pyo.NonNegativeIntegers, doc="purchase units per hardware, held over the horizon")
    if m._tiered_on_demand:
        m.uo = pyo.Var(m._tiered_on_demand, m.T, within=pyo.NonNegativeIntegers, doc="on-demand units per period")
    if m._tiered_spot:
        m.us = pyo.Var(m._tiered_spot, m.T, within=pyo.NonNegativeIntegers, doc="spot units per period")
    declare_kept(m)
    if m._periods.invest:
        m.TB = pyo.Set(initialize=[t for t in m.T if t > 0], ordered=True, doc="periods units may be bought at")
        m.ub = pyo.Var(m.H, m.TB, within=pyo.NonNegativeIntegers,
                       doc="units bought at the start of a period, held to the horizon's end")
    m.s_agg = pyo.Var(m.W, m.T, within=pyo.NonNegativeReals, doc="requests/s served by aggregated pools")
    m.s_dis = pyo.Var(m.W, m.T, within=pyo.NonNegativeReals, doc="requests/s served by disaggregated pools")
    if "aggregated" not in data.roles:
        for k in m.s_agg:
            m.s_agg[k].fix(0)
    if "prefill" not in data.roles or "decode" not in data.roles:
        for k in m.s_dis:
            m.s_dis[k].fix(0)


def objective_expr(m):
    """The objective at the prices the model's parameters hold now. The fleet's dollars follow the price
    parameters; the tie-break's coefficients are numbers (one per candidate row and period: as mutable
    coefficients Pyomo re-evaluated and re-sent every one of them before each re-solve), so
    :func:`update_parameters` rebuilds the objective where a price changes."""
    hw, slots = m._arr["hardware"], coef(m, "slots")
    price = {h: float(pyo.value(m.usd_per_chip_hour[h])) for h in m.H}
    weights = m._periods.weights
    fleet = sum(weighted(weights[t], fleet_usd_per_hour(m, t, committed=False)) for t in m.T)
    chip_usd = sum(weighted(weights[t], sum(EPSILON * slots[i] * price[hw[i]] * m.x[i, t] for i in m.R)) for t in m.T)
    cost = fleet + chip_usd
    if hasattr(m, "row_used") and m._data.pool_type_usd_per_hour:
        cost = cost + m._data.pool_type_usd_per_hour * sum(m.row_used[i] for i in m.R)
    if hasattr(m, "bf_keep"):
        cost = cost + change_usd(m)
    if m._elastic:
        cost = ELASTIC_WEIGHT * elastic_shortage(m) + cost / 1e6
    return cost


def define_workload_blocks(m):
    """Declare the workloads as the model's blocks for :mod:`planner.solve.floors` (a single period without
    tiers): workload ``w``'s variables (its rows' replicas and pool-type indicators, its streams, its N+k
    indicators) and its cost, the dollars of the chips its replicas occupy at the prices the parameters hold now,
    ``chip_w = sum_{r of w} p_h(r) slots_r x_r``.

    Workloads share only the purchase units, so the least ``chip_w`` that ``w``'s own rows allow is a floor every
    plan meets. And every plan's objective is at least ``sum_w chip_w`` (unit packing: ``p_h chips_per_unit u_h
    >= p_h sum_{r on h} slots_r x_r``; the tie-break and pool-type costs are not negative), which gives each
    ``chip_w`` a ceiling below a known plan's cost (``Structure.objective_covers_blocks``). An elastic model's objective
    weighs the limits' slack first, so it declares only the floors.

    Each workload is also a cover (``Structure.covers``, for :mod:`planner.solve.master`): its demand-coverage row
    over its streams, the aggregated stream with its one capacity row, the disaggregated one with its prefill and
    decode rows. The module checks on the rows that nothing else (N+k, pool types) touches the workload.

    Over several periods, or with per-period tiers, workloads share the held units across periods and no block is
    declared; nor from a deployed fleet (kept units cost less than the price the floors read)."""
    if len(m.T) != 1 or m._tiered_on_demand or m._tiered_spot or m._data.fleet is not None or m._periods.invest:
        return None, None
    t = next(iter(m.T))
    a = m._arr
    rows_of: dict[str, list[int]] = {}
    for i in m.R:
        rows_of.setdefault(a["workload"][i], []).append(i)
    extra: dict[str, list] = {w: [m.s_agg[w, t], m.s_dis[w, t]] for w in m.W}
    if hasattr(m, "uses"):
        for key in m.RES:
            extra[key[0]].append(m.uses[(*key, t)])
    if hasattr(m, "pd_class"):
        for key in m.PD:
            extra[key[0]].append(m.pd_class[key])
    row_used = getattr(m, "row_used", None)
    slots, hw = coef(m, "slots"), a["hardware"]

    def blocks():
        price = {h: float(pyo.value(m.usd_per_chip_hour[h])) for h in m.H}
        out = []
        for w in m.W:
            rows = rows_of.get(w, [])
            variables = [m.x[i, t] for i in rows] + extra[w]
            coefs = [price[hw[i]] * slots[i] for i in rows] + [0.0] * len(extra[w])
            if row_used is not None:
                variables += [row_used[i] for i in rows]
                coefs += [0.0] * len(rows)
            out.append((variables, coefs))
        return out

    def covers():
        out = []
        for w in m.W:
            streams = []
            for s, stages in ((m.s_agg[w, t], [m.aggregated_capacity]), (m.s_dis[w, t], [m.prefill_capacity, m.decode_capacity])):
                rows = [c[w, t] for c in stages if (w, t) in c and c[w, t].active]
                if rows:
                    streams.append((s, rows))
            out.append((m.demand_coverage[w, t], streams))
        return out

    return blocks, covers


def update_parameters(m: pyo.ConcreteModel, data: PlanData) -> None:
    """Set every mutable parameter of a built model from ``data`` (same rows, hardware, workloads and periods;
    the structure must match): demand, prefix working sets, prices, unit limits, power and budget. A persistent
    solver then re-solves without a rebuild. The candidate rows were pruned for a range of working set per
    request/s (``CandidatePool.shares``; a sweep passes the range of its points): demand or working sets that
    leave it may need rows the pruning dropped, so build from a pool evaluated for them."""
    per = periods_of(data)
    for w in m.W:
        for t in m.T:
            m.demand[w, t] = per.demand[w][t]
        m.working_set_gb[w] = data.workloads[w].working_set_bytes / 1e9
    repriced = False
    for h in m.H:
        hd = data.hardware[h]
        repriced |= pyo.value(m.usd_per_chip_hour[h]) != hd.usd_per_chip_hour
        m.usd_per_chip_hour[h] = hd.usd_per_chip_hour
        m.max_units[h] = 10**9 if hd.max_units is None else hd.max_units
    if repriced:
        m.cost.set_value(objective_expr(m))  # the tie-break's coefficients are numbers (see objective_expr)
    m.power_limit_kw = data.power_kw if data.power_kw is not None else NO_LIMIT
    m.budget_usd_per_hour = data.budget_usd_per_hour if data.budget_usd_per_hour is not None else NO_LIMIT


def solution_values(m, t=0) -> tuple[dict[int, int], dict[str, int]]:
    """Integer replicas per row in period ``t`` and units held per hardware in it (deployed units kept and
    units added alike), from a solved model."""
    x = {int(i): int(round(pyo.value(m.x[i, t]))) for i in m.R if (pyo.value(m.x[i, t]) or 0) > 0.5}
    u = {h: int(round(pyo.value(bought(m, h, t)) or 0)) for h in m.H}
    return x, u


def period_values(m) -> list[tuple[dict[int, int], dict[str, tuple[int, int, int]], float]]:
    """Per period: replicas per row, (held, on-demand, spot) units per hardware, and $/h."""
    out = []
    for t in m.T:
        x, _ = solution_values(m, t)
        u = {h: (int(round(pyo.value(bought(m, h, t)) or 0)),
                 int(round(pyo.value(m.uo[h, t]) or 0)) if h in m._tiered_on_demand else 0,
                 int(round(pyo.value(m.us[h, t]) or 0)) if h in m._tiered_spot else 0) for h in m.H}
        out.append((x, u, float(pyo.value(fleet_usd_per_hour(m, t)))))
    return out
