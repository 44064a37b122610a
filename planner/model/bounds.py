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

from planner.model.build import prefix_rows_hold

FEASIBILITY_TOL = 1e-6


def refresh(m) -> None:
    """Bring bounds the model derives from its parameters (``m._refresh``, e.g. the prefix-capacity bounds) up
    to date after a parameter changed."""
    fn = getattr(m, "_refresh", None)
    if fn is not None:
        fn(m)


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
    """Upper bounds on ``u`` and ``x`` implied by a feasible plan of objective ``cost`` (see the module
    docstring); empty where ``cost`` is unknown. Only bounds tighter than the variables' own, and never below
    a variable's lower bound."""
    caps = ComponentMap()
    if cost is None or not math.isfinite(cost):
        return caps
    data, a = m._data, m._arr
    units = {}
    for h in m.H:
        price = pyo.value(m.usd_per_chip_hour[h]) * data.hardware[h].chips_per_unit
        units[h] = math.floor(cost / price * (1 + 1e-9)) if price > 0 else None
    for h, cap in units.items():
        if cap is not None:
            _tighten(m.u[h], cap, caps)
    slots = a["slots"]
    for i in m.R:
        h = a["hardware"][i]
        if units[h] is not None:
            _tighten(m.x[i], math.floor(units[h] * data.hardware[h].chips_per_unit / slots[i] * (1 + 1e-9)), caps)
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
    """A plan to start from, or ``None``: each workload served whole by the option (an aggregated row, or a
    prefill and a decode row) with the fewest chips of capacity per request/s, replicas rounded up, units
    rounded up to hold them, every indicator set to match. With ``base`` (a plan of this model, usually one that
    a change has made infeasible) only the workloads in ``redo`` are served that way; the others keep their
    replicas and streams from ``base`` (a repair: close to ``base``, so close to the new optimum). With
    ``check`` it is kept only if it meets every constraint of the model (limits, N+k, prefix capacity, pool-type
    caps can rule it out); without, the caller checks (:func:`solve_from` does, on HiGHS's copy of the model)."""
    a, unit, data = m._arr, m._unit, m._data
    rate = a["rate"] / unit
    price = {h: pyo.value(m.usd_per_chip_hour[h]) for h in m.H}
    x = np.zeros(len(rate))
    vals = ComponentMap()
    lose = data.lose_units
    redo = set(m.W) if base is None or redo is None else set(redo)
    if base is not None:
        wl = a["workload"]
        for i in m.R:
            if wl[i] not in redo:
                x[i] = round(base.get(m.x[i], 0.0))
    for w in m.W:
        if w not in redo:
            vals[m.s_agg[w]] = base.get(m.s_agg[w], 0.0)
            vals[m.s_dis[w]] = base.get(m.s_dis[w], 0.0)
            continue
        demand = pyo.value(m.demand[w]) / unit
        best = {role: _cheapest_row(m, w, role, rate, price) for role in ("aggregated", "prefill", "decode")}

        def replicas(i, demand=demand, w=w):
            # N+k: what is left after losing k units (each carrying at most ``_loss`` of the role) still serves
            # the demand (:func:`planner.model.build.define_resilience`)
            need = demand + lose * m._loss.get((w, a["role"][i], a["hardware"][i]), 0.0) if lose else demand
            return math.ceil(need / max(rate[i], 1e-30))

        opts = []
        if best["aggregated"] is not None and not m.s_agg[w].fixed:
            i = best["aggregated"]
            opts.append((replicas(i) * a["slots"][i] * price[a["hardware"][i]], [i], "agg"))
        if best["prefill"] is not None and best["decode"] is not None and not m.s_dis[w].fixed:
            pair = [best["prefill"], best["decode"]]
            opts.append((sum(replicas(i) * a["slots"][i] * price[a["hardware"][i]] for i in pair), pair, "dis"))
        if not opts:
            return None
        _, rows, kind = min(opts, key=lambda o: o[0])
        for i in rows:
            x[i] = max(x[i], replicas(i))
        vals[m.s_agg[w]] = demand if kind == "agg" else 0.0
        vals[m.s_dis[w]] = demand if kind == "dis" else 0.0
    slots = a["slots"]
    for i in m.R:
        vals[m.x[i]] = float(x[i])
    for h in m.H:
        used = sum(slots[i] * x[i] for i in m._rows_of.get(("hw", h), []))
        vals[m.u[h]] = float(math.ceil(used / data.hardware[h].chips_per_unit - 1e-9))
    if hasattr(m, "uses"):
        for (w, role, h) in m.RES:
            vals[m.uses[w, role, h]] = float(any(x[i] > 0 and a["hardware"][i] == h for i in m._rows_of[("role", w, role)]))
    if hasattr(m, "hw_used"):
        for h in m.H:
            vals[m.hw_used[h]] = float(vals[m.u[h]] > 0)
    if hasattr(m, "row_used"):
        for i in m.R:
            vals[m.row_used[i]] = float(x[i] > 0)
    return vals if not check or is_feasible(m, vals) else None


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


def _cheapest_row(m, w, role, rate, price) -> int | None:
    """The row of ``(w, role)`` with the fewest dollars of chip capacity per request/s; a prefix-caching row
    only where one replica can hold its share of the working set."""
    a = m._arr
    shut = {h for h in m.H if m.u[h].fixed and not m.u[h].value}  # hardware left out (a runner-up's re-solve)
    rows = np.asarray(m._rows_of.get(("role", w, role), []), dtype=int)
    rows = [i for i in rows[prefix_rows_hold(m, w, rows)].tolist() if a["hardware"][i] not in shut]
    if not rows:
        return None
    return min(rows, key=lambda i: a["slots"][i] * price[a["hardware"][i]] / max(rate[i], 1e-30))

