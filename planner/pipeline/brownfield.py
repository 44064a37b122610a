"""A plan from a deployed fleet (``existing``): the migration the plan asks for, what it costs over the horizon
against keeping the deployed units as they are and against the from-scratch plan, and whether the limits leave
room to add before removing.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pyomo.core as pyo
from pyomo.common.collections import ComponentMap

from planner.analysis.context import fleet_cost
from planner.catalog.fleet import Fleet
from planner.catalog.scenario import ResolvedScenario
from planner.model import PlanData, build_model
from planner.model.brownfield import committed_usd, horizon_hours, keep_rate, split_start
from planner.model.build import solution_values
from planner.results import Plan
from planner.results.migration import (
    FleetState,
    HorizonCost,
    Migration,
    diff_pools,
    diff_units,
    peak_units,
    plan_state,
    steps,
)
from planner.solve import Solver

COMPARE_TIME_LIMIT_S = 30.0
"""Most seconds each comparison solve (keep the deployed units; the from-scratch plan) may take."""


def deployed_state(fleet: Fleet, demand: dict[str, float]) -> FleetState:
    """The deployed fleet as a state to diff (pools given by hand get ids ``deployed-N``)."""
    pools = [replace(p, pool_id=p.pool_id or f"deployed-{i + 1}") for i, p in enumerate(fleet.pools)]
    return FleetState(fleet.units(), pools, dict(fleet.demand) or dict(demand))


def horizon_costs(m, data: PlanData, u: dict[str, int], x: dict[int, int]) -> tuple[float, float, float]:
    """Run-rate $/h (committed included), committed $/h and one-off change dollars of units ``u`` (held in
    period 0: deployed units kept first, cheapest to keep first) and replicas ``x`` (period 0) from the deployed
    fleet."""
    fleet, hw = data.fleet, data.hardware
    t = m.T.first()
    vals = ComponentMap()
    for h in m.H:
        vals[m.u[h]] = float(u.get(h, 0))
    split_start(m, vals)
    run = committed_usd(m, t)
    change = 0.0
    for h in m.H:
        add = vals[m.u[h]]
        run += hw[h].usd_per_chip_hour * hw[h].chips_per_unit * add
        change += fleet.unit_added_usd[h] * add
    for g in m.G:
        grp, keep = m._groups[g], vals[m.bf_keep[g, t]]
        run += hw[grp.hardware].chips_per_unit * keep_rate(m, g, t) * keep
        change += fleet.unit_released_usd[grp.hardware] * (grp.count - keep)
    change += sum(m._new_cost[k] for k in m.K if any(x.get(i, 0) > 0 for i in m._new_rows[k]))
    return run, committed_usd(m, t), change


def _solve_fixed(m, solver: Solver, fix: list[tuple], time_limit_s: float) -> float | None:
    """The objective (committed reservations added) of ``m`` with the variables of ``fix`` (pairs of a variable
    and its value) fixed, or ``None`` where that is infeasible or nothing is found in time."""
    try:
        for v, val in fix:
            v.fix(val)
        r = solver.limited(time_limit_s=max(time_limit_s, 0.5), mip_gap=solver.mip_gap).solve(m)
        return float(pyo.value(m.cost)) + committed_usd(m, m.T.first()) if r.has_solution else None
    finally:
        for v, _ in fix:
            v.unfix()


def plan_migration(rs: ResolvedScenario, data: PlanData, m, solver: Solver, plan: Plan, x: dict[int, int],
                   u: dict[str, int], deadline: float, say=lambda _msg: None) -> None:
    """Set ``plan.migration``: the diff against the deployed fleet, the steps, the horizon's costs and the
    comparisons (``m``: the solved brownfield model; ``x``, ``u``: the plan's replicas and units)."""
    fleet = data.fleet
    hours = horizon_hours(m)
    run, committed, change = horizon_costs(m, data, u, x)
    left = lambda: min(COMPARE_TIME_LIMIT_S, max(deadline - time.perf_counter(), 0.5))  # noqa: E731
    say("comparing with keeping the deployed units and with the from-scratch plan")
    keep = _solve_fixed(m, solver, [(m.u[h], 0) for h in m.H] + [(m.bf_keep[g, t], m._groups[g].count)
                                                                for g in m.G for t in m.T], left())
    scratch_data = replace(data, fleet=None)
    scratch_m = build_model(scratch_data)
    r = solver.limited(time_limit_s=left(), mip_gap=solver.mip_gap).solve(scratch_m)
    scratch = scratch_hour = None
    if r.has_solution:
        _, us = solution_values(scratch_m)
        scratch_hour = fleet_cost(scratch_m, scratch_data)
        scratch = _held_as(m, solver, us, left())
    old = deployed_state(fleet, {w.name: w.requests_per_s for w in plan.workloads})
    new = plan_state(plan)
    changes = diff_pools(old, new)
    step_list = steps(old, new, changes, fleet.lead_time_days)
    _price_steps(step_list, data, m)  # the steps' $/h at what the deployed units cost, not at the price
    notes = room_notes(data, step_list) + lead_notes(fleet, old, new, changes)
    if keep is None:
        notes.append("keeping the deployed units as they are cannot serve the demand within the limits")
    plan.migration = Migration(
        source=fleet.source, start=str(fleet.start), horizon_months=fleet.horizon_months,
        lead_time_days=fleet.lead_time_days, units=diff_units(old, new), pools=changes, steps=step_list,
        cost=HorizonCost(horizon_months=fleet.horizon_months, usd_per_hour=run + change / hours,
                         run_rate_usd_per_hour=run, committed_usd_per_hour=committed, change_usd=change,
                         total_usd=(run + change / hours) * hours, keep_usd=None if keep is None else keep * hours,
                         scratch_usd=None if scratch is None else scratch * hours, scratch_usd_per_hour=scratch_hour),
        notes=notes)


def _held_as(m, solver: Solver, units: dict[str, int], time_limit_s: float) -> float | None:
    """The objective (committed reservations added) of ``m`` holding exactly ``units`` in its first period
    (deployed units kept or added as is cheapest), or ``None``."""
    from planner.model.terms import bought

    t = m.T.first()
    m.bf_held_as = pyo.Constraint(list(m.H), rule=lambda m, h: bought(m, h, t) == units.get(h, 0))
    try:
        r = solver.limited(time_limit_s=max(time_limit_s, 0.5), mip_gap=solver.mip_gap).solve(m)
        return float(pyo.value(m.cost)) + committed_usd(m, t) if r.has_solution else None
    finally:
        m.del_component(m.bf_held_as)


def _price_steps(step_list, data: PlanData, m) -> None:
    """Each step's $/h: the units held at what they cost (deployed units, cheapest to keep first, at their rates;
    the rest at the plan's price), reservations released early still paid."""
    hw = data.hardware
    t = m.T.first()
    for s in step_list:
        usd = committed_usd(m, t)
        for h, n in s.units.items():
            left = n
            for g in sorted(m.G, key=lambda g: keep_rate(m, g, t)):
                grp = m._groups[g]
                if grp.hardware != h or left <= 0:
                    continue
                k = min(left, grp.count)
                usd += hw[h].chips_per_unit * keep_rate(m, g, t) * k
                left -= k
            usd += hw[h].usd_per_unit_hour * left
        s.usd_per_hour = usd


def room_notes(data: PlanData, step_list) -> list[str]:
    """Where the limits leave no room to add before removing: what the overlap needs against each limit."""
    peak = peak_units(step_list)
    out = []
    for h, n in sorted(peak.items()):
        lim = data.hardware[h].max_units if h in data.hardware else None
        if lim is not None and n > lim:
            out.append(f"no room to add before removing: the change holds {n} {h} units at its peak, limits.max_units "
                       f"allows {lim}; raise it to {n} for the change, or migrate in waves (drain part of the old pools "
                       "first where their spare capacity allows)")
    kw = sum((data.hardware[h].kw_per_chip or 0.0) * data.hardware[h].chips_per_unit * n for h, n in peak.items())
    if data.power_kw is not None and kw > data.power_kw * (1 + 1e-9):
        out.append(f"no room to add before removing: the change draws {kw:,.0f} kW at its peak, limits.power_kw is "
                   f"{data.power_kw:,.0f} kW; {kw - data.power_kw:,.0f} kW more for the change would do, or migrate in "
                   "waves")
    chips = sum(data.hardware[h].chips_per_unit * n for h, n in peak.items())
    if data.max_chips is not None and chips > data.max_chips:
        out.append(f"no room to add before removing: the change holds {chips:,} chips at its peak, limits.max_chips "
                   f"is {data.max_chips:,}")
    return out


def lead_notes(fleet: Fleet, old: FleetState, new: FleetState, changes) -> list[str]:
    """What the deployed fleet carries while added units are on their way (``lead_time_days``)."""
    from planner.results.migration import capacity

    if not fleet.lead_time_days or not any(c.added for c in diff_units(old, new)):
        return []
    cap = capacity([(p, p.replicas) for p in old.pools])
    out = []
    for w, d in sorted(new.demand.items()):
        c = cap.get(w)
        if c is not None and c < d * (1 - 1e-9):
            out.append(f"{w}: until the added units arrive ({fleet.lead_time_days:g} days), the deployed fleet carries "
                       f"{c:,.1f} of {d:,.1f} req/s ({c / d:.0%})")
    return out
