"""Incumbents and cost bounds for the deployment MILP (:mod:`planner.model.build`).

HiGHS proves a plan optimal faster when its integer variables are bounded and it starts from a good
plan. Both come from one fact: a plan of cost ``C`` that is known to be feasible caps what the optimum
can buy, ``u[h] <= floor(C / unit price of h)`` and ``x[r] <= floor(chips of those units / slots of r)``
(the objective is the fleet's dollars plus non-negative tie-break and pool-type terms, so the optimum's
fleet costs at most ``C``). The bounds never cut off an optimum; they are valid

- for the model itself, once a feasible plan is in hand (:func:`greedy_start`: each workload served by
  its cheapest row or prefill/decode pair, checked against every constraint of the model);
- for a changed model where a known plan is still feasible (the base plan after a looser SLO, a higher
  limit, a constraint dropped), so its cost caps the new optimum. :func:`solve_from` checks that the plan
  is feasible in the model as it is before it bounds anything: less demand, for one, is not always a
  relaxation (a prefix-caching replica then carries a larger share of the traffic and must hold a larger
  share of the prefixes).

They are not valid where a change can make the optimum dearer (a hardware excluded, more demand), so they
are applied for one solve and lifted again (:func:`cost_bounds`).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np
import pyomo.core as pyo
from pyomo.common.collections import ComponentMap

from planner.model.brownfield import deployed_units
from planner.model.families import prefix_rows_hold, start_indicators
from planner.solve.structure import structure_of

FEASIBILITY_TOL = 1e-6


def refresh(m) -> None:
    """Bring bounds the model derives from its parameters (its declared :attr:`Structure.refresh`, e.g. the
    prefix-capacity bounds) up to date after a parameter changed."""
    fn = structure_of(m).refresh
    if fn is not None:
        fn()


def snapshot(m) -> ComponentMap:
    """Every variable's current value (a solved model's solution) as a MIP start."""
    return ComponentMap((v, v.value if v.value is not None else 0.0) for v in m.component_data_objects(pyo.Var))


def objective_at(m, values: ComponentMap) -> float:
    """The active objective at ``values`` (variables missing from ``values`` count as 0)."""
    with _assigned(m, values):
        return float(pyo.value(next(m.component_data_objects(pyo.Objective, active=True))))


def is_feasible(m, values: ComponentMap, tol: float = FEASIBILITY_TOL) -> bool:
    """Whether ``values`` meet every active constraint and variable bound (relative tolerance ``tol``) and are
    whole where the variable is integer."""
    refresh(m)
    for v in m.component_data_objects(pyo.Var):
        x = values.get(v, 0.0) if not v.fixed else v.value
        if x is None:
            return False
        if (v.lb is not None and x < v.lb - tol) or (v.ub is not None and x > v.ub + tol):
            return False
        if v.is_integer() and abs(x - round(x)) > tol:
            return False
    with _assigned(m, values):
        for c in m.component_data_objects(pyo.Constraint, active=True):
            body = pyo.value(c.body)
            scale = tol * max(1.0, abs(body))
            if (c.has_lb() and body < pyo.value(c.lower) - scale) or (c.has_ub() and body > pyo.value(c.upper) + scale):
                return False
    return True


@contextmanager
def _assigned(m, values: ComponentMap):
    free = [v for v in m.component_data_objects(pyo.Var) if not v.fixed]
    old = [v.value for v in free]
    try:
        for v in free:
            v.set_value(values.get(v, 0.0), skip_validation=True)
        yield
    finally:
        for v, x in zip(free, old, strict=True):
            v.set_value(x, skip_validation=True)


def cost_caps(m, cost: float | None) -> ComponentMap:
    """Upper bounds on the units and replicas implied by a feasible plan of objective ``cost`` (see the module
    docstring); empty where ``cost`` is unknown. The objective is the horizon's mean $/h, so the held units cost
    at most ``cost`` and a period's per-period units at most ``cost`` over the period's weight. Only bounds
    tighter than the variables' own, and never below a variable's lower bound."""
    caps = ComponentMap()
    if cost is None or not math.isfinite(cost):
        return caps
    data, a = m._data, m._arr
    weights = m._periods.weights

    def most(price: float | None, weight: float = 1.0) -> int | None:
        return math.floor(cost / (price * weight) * (1 + 1e-9)) if price else None

    units: dict[tuple[str, int], int | None] = {}
    for h in m.H:
        cpu = data.hardware[h].chips_per_unit
        held = most(pyo.value(m.usd_per_chip_hour[h]) * cpu)
        if held is not None:
            _tighten(m.u[h], held, caps)
            held += deployed_units(m, h)  # deployed units kept may cost less than the price
        tier = data.tiers.get(h)
        for t in m.T:
            total = held
            for name, price in (("uo", tier.on_demand if tier else None), ("us", tier.spot if tier else None)):
                if price is None or not hasattr(m, name) or (h, t) not in getattr(m, name):
                    continue
                cap = most(price * cpu, weights[t])
                _tighten(getattr(m, name)[h, t], cap, caps)
                total = None if total is None else total + cap
            units[h, t] = total if not hasattr(m, "ub") else None  # units bought later are not capped here
    slots = a["slots"]
    for i in m.R:
        h = a["hardware"][i]
        for t in m.T:
            if units[h, t] is not None:
                _tighten(m.x[i, t], math.floor(units[h, t] * data.hardware[h].chips_per_unit / slots[i] * (1 + 1e-9)), caps)
    return caps


@contextmanager
def cost_bounds(m, cost: float | None):
    """:func:`cost_caps` set on the Pyomo variables for the solves inside the ``with``; the variables' own
    bounds come back after it."""
    caps = cost_caps(m, cost)
    old = ComponentMap((v, v.ub) for v in caps)
    try:
        for v, ub in caps.items():
            v.setub(ub)
        yield
    finally:
        for v, ub in old.items():
            v.setub(ub)


def _tighten(v, ub: int, caps: ComponentMap) -> None:
    if v.fixed or (v.ub is not None and v.ub <= ub):
        return
    caps[v] = max(ub, v.lb or 0)


def greedy_start(m, base: ComponentMap | None = None, redo=None, *, check: bool = True) -> ComponentMap | None:
    """A plan to start from, or ``None``: in each period, each workload served whole by the option (an aggregated
    row, or a prefill and a decode row) with the fewest chips of capacity per request/s, replicas rounded up, units
    held over the horizon to hold the largest period's replicas (no per-period tier bought), every indicator set
    to match. With ``base`` (a plan of this model, usually one that a change has made infeasible) only the
    workloads in ``redo`` are served that way; the others keep their replicas and streams from ``base`` (a repair:
    close to ``base``, so close to the new optimum). With ``check`` it is kept only if it meets every constraint
    of the model (limits, N+k, prefix capacity, pool-type caps can rule it out); without, the caller checks
    (:func:`solve_from` does, on HiGHS's copy of the model)."""
    a, unit, data = m._arr, m._unit, m._data
    rate = a["rate"] / unit
    price = {h: pyo.value(m.usd_per_chip_hour[h]) for h in m.H}
    periods = list(m.T)
    x = np.zeros((len(rate), len(periods)))
    vals = ComponentMap()
    lose = data.lose_units
    redo = set(m.W) if base is None or redo is None else set(redo)
    if base is not None:
        wl = a["workload"]
        for i in m.R:
            if wl[i] not in redo:
                for t in periods:
                    x[i, t] = round(base.get(m.x[i, t], 0.0))
    for w in m.W:
        for t in periods:
            if w not in redo:
                vals[m.s_agg[w, t]] = base.get(m.s_agg[w, t], 0.0)
                vals[m.s_dis[w, t]] = base.get(m.s_dis[w, t], 0.0)
                continue
            if not _serve_greedily(m, w, t, rate, price, lose, x, vals):
                return None
    slots = a["slots"]
    for i in m.R:
        for t in periods:
            vals[m.x[i, t]] = float(x[i, t])
    for h in m.H:
        rows = m._rows_of.get(("hw", h), [])
        used = max((sum(slots[i] * x[i, t] for i in rows) for t in periods), default=0.0)
        vals[m.u[h]] = float(math.ceil(used / data.hardware[h].chips_per_unit - 1e-9))
    start_indicators(m, lambda i, t: x[i, t], vals)
    return vals if not check or is_feasible(m, vals) else None


def _serve_greedily(m, w, t, rate, price, lose, x, vals) -> bool:
    """Serve ``w``'s demand in period ``t`` whole by its cheapest option (into ``x`` and ``vals``); ``False`` where
    it has none."""
    a = m._arr
    demand = pyo.value(m.demand[w, t]) / m._unit
    best = {role: _cheapest_row(m, w, role, rate, price, t) for role in ("aggregated", "prefill", "decode")}
    classes = getattr(m, "_pd_classes", {}).get(w)
    if classes:  # prefill and decode of one pairing class (:func:`planner.model.families.define_pd_pairing`)
        best["prefill"], best["decode"] = _cheapest_pair(m, w, rate, price, t, classes)

    def replicas(i):
        # N+k: what is left after losing k units (each carrying at most ``_loss`` of the role) still serves the
        # demand (:func:`planner.model.families.define_resilience`)
        need = demand + lose * m._loss.get((w, a["role"][i], a["hardware"][i]), 0.0) if lose else demand
        return math.ceil(need / max(rate[i], 1e-30))

    opts = []
    if best["aggregated"] is not None and not m.s_agg[w, t].fixed:
        i = best["aggregated"]
        opts.append((replicas(i) * a["slots"][i] * price[a["hardware"][i]], [i], "agg"))
    if best["prefill"] is not None and best["decode"] is not None and not m.s_dis[w, t].fixed:
        pair = [best["prefill"], best["decode"]]
        opts.append((sum(replicas(i) * a["slots"][i] * price[a["hardware"][i]] for i in pair), pair, "dis"))
    if not opts:
        return False
    _, rows, kind = min(opts, key=lambda o: o[0])
    for i in rows:
        x[i, t] = max(x[i, t], replicas(i))
    vals[m.s_agg[w, t]] = demand if kind == "agg" else 0.0
    vals[m.s_dis[w, t]] = demand if kind == "dis" else 0.0
    return True


def held_start(m, x: dict[int, int], u: dict[str, int]) -> ComponentMap:
    """A plan of one period (replicas ``x``, units ``u``; the peak's, say) held in every period of ``m``: its units
    held over the horizon, its replicas in every period, each period's streams routed over them
    (:func:`route_streams`). Feasible wherever the plan is feasible at each period's demand: the peak plan at the
    peak demand is, where less demand leaves each prefix-caching replica's share within what it holds."""
    vals = ComponentMap()
    for h in m.H:
        vals[m.u[h]] = float(u.get(h, 0))
    for i in m.R:
        for t in m.T:
            vals[m.x[i, t]] = float(x.get(i, 0))
    route_streams(m, vals)
    start_indicators(m, lambda i, t: x.get(i, 0), vals)
    return vals


def route_streams(m, start: ComponentMap) -> None:
    """Set ``start``'s streams from its replicas at ``m``'s rates: in each period, each workload's demand to its
    aggregated pools as far as they carry it, the rest to its disaggregated ones (a solution mapped from another
    model carries that model's streams, which ``m``'s rates may not carry)."""
    rate = m._arr["rate"] / m._unit
    for w in m.W:
        rows = m._rows_of.get(("role", w, "aggregated"), [])
        for t in m.T:
            carried = sum(rate[i] * start.get(m.x[i, t], 0.0) for i in rows)
            need = pyo.value(m.demand[w, t]) / m._unit
            agg = 0.0 if m.s_agg[w, t].fixed else min(carried, need)
            if not m.s_agg[w, t].fixed:
                start[m.s_agg[w, t]] = agg
            if not m.s_dis[w, t].fixed:
                start[m.s_dis[w, t]] = max(need - agg, 0.0)


def solve_from(solver, m, starts, *, heuristics: bool = True, loaded: bool = False):
    """Solve ``m`` with ``solver`` from the first of ``starts`` (assignments, or callables that make one; a
    single assignment or ``None`` also do) that is a feasible plan of ``m`` as the model stands: then it is the
    first incumbent and its cost bounds the units and replicas, and with ``heuristics=False`` (the first start is
    known to be good: a solved plan's) HiGHS spends no time searching for other incumbents. A later start (the
    fallback where the first no longer fits: a plan repaired greedily, a greedy plan) is feasible but not good,
    so HiGHS searches with its heuristics from it whatever ``heuristics`` says. Without a feasible start, a plain
    solve. Feasibility is checked on HiGHS's copy of the model (:meth:`Solver.start_objective`). ``loaded``: the
    caller has just loaded ``m`` into ``solver`` (:meth:`Solver.load`)."""
    if starts is None or isinstance(starts, ComponentMap):
        starts = [starts]
    if not loaded:
        solver.load(m)
    for k, start in enumerate(starts):
        if callable(start):
            start = start()
        cost = solver.start_objective(start) if start is not None else None
        if cost is not None:
            search = heuristics or k > 0
            return solver.limited(time_limit_s=solver.time_limit_s, mip_gap=solver.mip_gap, heuristics=search).solve(
                m, start, caps=cost_caps(m, cost), loaded=True, cutoff=cost)
    return solver.solve(m, loaded=True)


def _cheapest_pair(m, w, rate, price, t, classes) -> tuple[int | None, int | None]:
    """The prefill and decode rows of one pairing class with the fewest dollars of chip capacity per request/s of
    the two together (``None, None`` where no class has both)."""
    a = m._arr
    best, pair = np.inf, (None, None)
    for rows in classes.values():
        allowed = set(rows)
        pre = _cheapest_row(m, w, "prefill", rate, price, t, allowed)
        dec = _cheapest_row(m, w, "decode", rate, price, t, allowed)
        if pre is None or dec is None:
            continue
        cost = sum(a["slots"][i] * price[a["hardware"][i]] / max(rate[i], 1e-30) for i in (pre, dec))
        if cost < best:
            best, pair = cost, (pre, dec)
    return pair


def _cheapest_row(m, w, role, rate, price, t=0, allowed: set | None = None) -> int | None:
    """The row of ``(w, role)`` with the fewest dollars of chip capacity per request/s; a prefix-caching row
    only where one replica can hold its share of the working set in period ``t``."""
    a = m._arr
    shut = {h for h in m.H if m.u[h].fixed and not m.u[h].value}  # hardware left out (a runner-up's re-solve)
    rows = np.asarray(m._rows_of.get(("role", w, role), []), dtype=int)
    rows = [i for i in rows[prefix_rows_hold(m, w, rows, t)].tolist()
            if a["hardware"][i] not in shut and (allowed is None or i in allowed)]
    if not rows:
        return None
    return min(rows, key=lambda i: a["slots"][i] * price[a["hardware"][i]] / max(rate[i], 1e-30))

