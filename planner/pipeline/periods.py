"""A traffic profile planned over its periods with price tiers, each period's fleet re-checked, and the day's cost.
"""

from __future__ import annotations

import pyomo.core as pyo

from planner.catalog.fleet import HOURS_PER_MONTH
from planner.catalog.scenario import ResolvedScenario
from planner.errors import InfeasibleError, PlanCheckError, PlannerError
from planner.model import build_model, prepare
from planner.model.bounds import held_start
from planner.model.build import period_values
from planner.model.data import Tier, over_periods
from planner.pipeline.diagnose import no_plan
from planner.results import (
    DayCost,
    GrowthCost,
    PeriodOut,
    PeriodUnits,
    Plan,
    extract,
    recheck,
)
from planner.solve import Solver
from planner.units import HOUR_S, MTOK


def price_tiers(rs: ResolvedScenario) -> dict[str, Tier]:
    """Reserved (the plan's price), on-demand and spot per hardware: the scenario's ``price_tiers``, else the
    catalog's ``price.on_demand`` / ``price.spot``; a tier neither gives is not offered."""
    out = {}
    over = rs.scenario.price_tiers
    for hw in rs.hardware:
        sc_t = next((v for k, v in over.items() if k == hw.id or k in hw.aliases), None)
        od = sc_t.on_demand if sc_t and sc_t.on_demand else (hw.price.on_demand if hw.price else None)
        sp = sc_t.spot if sc_t and sc_t.spot else (hw.price.spot if hw.price else None)
        out[hw.id] = Tier(od.usd_per_chip_hour if od else None, sp.usd_per_chip_hour if sp else None,
                          sp.preemption_rate if sp else 0.0)
    return out


def plan_periods(rs: ResolvedScenario, data, table, plan: Plan, time_limit_s: float, mip_gap: float,
                 peak: tuple[dict[int, int], dict[str, int]] | None = None) -> None:
    """Plan a traffic profile over its periods with price tiers: the plan's own model (every constraint family,
    N+k and pool-type limits included) over the profile's periods; every period's fleet is extracted and
    re-checked like a plan of that period's demand, its worst units lost where the scenario asks for N+k. The
    peak plan held all day (its units held, its replicas in every period) is handed to the solver as its first
    incumbent where it is feasible."""
    sc = rs.scenario
    T = max(len(w.profile) for w in sc.workloads if w.profile is not None)
    demand = {w.name: list(w.profile) if w.profile is not None else [w.requests_per_s] * T for w in sc.workloads}
    m, res, out = solve_periods(rs, data, table, demand, 24.0, False, time_limit_s, mip_gap, peak, "traffic profile")
    plan.periods = out
    plan.periods_solver = {"status": res.status, "mip_gap": res.mip_gap, "wall_s": res.wall_s,
                           "rows": len(data.rows), "periods": T}
    plan.usd_per_day = sum(p.usd_per_hour for p in out) * 24.0 / T
    plan.flat_peak_usd_per_day = plan.objective.usd_per_hour * 24.0
    plan.day = day_cost(plan, rs, T)
    _refuse_failed(out, "period")


def _refuse_failed(out, what: str) -> None:
    if not all(p.recheck_ok for p in out):
        bad = [p.period for p in out if not p.recheck_ok]
        raise PlanCheckError(f"the fleet of {what}(s) {bad[:5]} fails its re-check by the performance model; no plan written")


def solve_periods(rs: ResolvedScenario, data, table, demand: dict[str, list[float]], horizon_h: float, invest: bool,
                  time_limit_s: float, mip_gap: float, peak, what: str):
    """The plan's model over the periods of ``demand`` with the price tiers, solved from the peak plan held
    throughout; each period's fleet extracted and re-checked (:class:`PeriodOut`)."""
    m = build_model(over_periods(data, demand, price_tiers(rs), horizon_h, invest))
    start = held_start(m, *peak) if peak is not None else None
    res = Solver(time_limit_s=time_limit_s, mip_gap=mip_gap).solve(m, start=start)
    if res.status == "infeasible":
        raise InfeasibleError(f"the {what} cannot be served in some period within the limits "
                              "(the peak plan can: check limits.max_units against the tiers)")
    if not res.has_solution:
        no_plan(res, f"no plan for the {what} within --time-limit ({res.termination})")
    out = []
    for t, (x, u, usd) in enumerate(period_values(m)):
        req = {w: demand[w][t] for w in demand}
        ok = _recheck_period(rs, data, table, x, u, req, res)
        cap = {}
        for w in demand:
            by: dict[str, float] = {}
            for i, n in x.items():
                r = data.rows.loc[i]
                if str(r["workload"]) == w:
                    by[str(r["role"])] = by.get(str(r["role"]), 0.0) + float(r["requests_per_s"]) * n
            cap[w] = by.get("aggregated", 0.0) + min(by.get("prefill", 0.0), by.get("decode", 0.0))
        new = {h: int(round(pyo.value(m.ub[h, t]))) for h in m.H} if invest and t > 0 else {}
        units = [PeriodUnits(hardware=h, chips_per_unit=data.hardware[h].chips_per_unit, reserved=a, on_demand=b, spot=c,
                             bought=new.get(h, int(round(pyo.value(m.u[h]))) if invest and t == 0 else 0))
                 for h, (a, b, c) in u.items() if a + b + c]
        out.append(PeriodOut(period=t, requests_per_s=req, capacity_rps=cap, units=units, usd_per_hour=usd, recheck_ok=ok))
    return m, res, out


def plan_months(rs: ResolvedScenario, data, table, plan: Plan, time_limit_s: float, mip_gap: float,
                peak: tuple[dict[int, int], dict[str, int]] | None = None) -> None:
    """Plan growth over months (``workloads[].months``): units reserved at the plan's price at the start of any
    month and held to the horizon's end (``ub``), or rented on demand month by month (the on-demand tier), every
    month's fleet re-checked at that month's demand; the cost over the horizon against reserving the peak fleet
    from the first month."""
    sc = rs.scenario
    M = max(len(w.months) for w in sc.workloads if w.months is not None)
    demand = {w.name: list(w.months) if w.months is not None else [w.requests_per_s] * M for w in sc.workloads}
    m, res, out = solve_periods(rs, data, table, demand, M * HOURS_PER_MONTH, True, time_limit_s, mip_gap, peak,
                                "monthly demand")
    plan.months = out
    hours = HOURS_PER_MONTH
    wl = {w.name: w for w in sc.workloads}
    tokens = sum(req * (wl[w].input_tokens + wl[w].output_tokens) * hours * 3600 for p in out
                 for w, req in p.requests_per_s.items())
    usd = sum(p.usd_per_hour for p in out) * hours
    flat = plan.objective.usd_per_hour
    if hasattr(m, "bf_keep"):
        from planner.model.brownfield import change_usd, horizon_hours

        usd += float(pyo.value(change_usd(m))) * horizon_hours(m)
        if plan.migration is not None and plan.migration.cost is not None:
            flat = plan.migration.cost.usd_per_hour
    plan.growth = GrowthCost(months=M, usd_total=usd, usd_per_hour=usd / (M * hours), tokens=tokens,
                             usd_per_mtok=usd / tokens * MTOK if tokens else 0.0,
                             peak_reserved_usd_total=flat * M * hours,
                             status=res.status, mip_gap=res.mip_gap, wall_s=res.wall_s)
    _refuse_failed(out, "month")


def day_cost(plan: Plan, rs: ResolvedScenario, periods: int) -> DayCost:
    """The day of a profile plan: its cost over the tokens each period's demand carries."""
    period_s = 24 * HOUR_S / periods
    wl = {w.name: w for w in rs.scenario.workloads}
    tokens = out_tokens = 0.0
    for p in plan.periods or []:
        for w, req in p.requests_per_s.items():
            tokens += req * (wl[w].input_tokens + wl[w].output_tokens) * period_s
            out_tokens += req * wl[w].output_tokens * period_s
    usd = plan.usd_per_day or 0.0
    return DayCost(usd_per_day=usd, tokens_per_day=tokens, output_tokens_per_day=out_tokens,
                   usd_per_mtok=usd / tokens * MTOK if tokens else 0.0,
                   usd_per_mtok_output=usd / out_tokens * MTOK if out_tokens else 0.0,
                   peak_usd_per_hour=plan.objective.usd_per_hour, peak_usd_per_mtok=plan.objective.usd_per_mtok)


def _recheck_period(rs: ResolvedScenario, data, table, x, u, req: dict[str, float], res) -> bool:
    """The period's fleet as a plan of that period's demand, re-checked by the performance model alone."""
    from dataclasses import replace as dc_replace

    if not x:
        return all(v <= 0 for v in req.values())
    sc = rs.scenario
    # a period without traffic for a workload re-checks it at 0 req/s (model_copy skips the schema's "> 0": the
    # period's fleet owes that workload nothing)
    wls = [w.model_copy(update={"requests_per_s": max(req[w.name], 0.0), "profile": None, "months": None})
           for w in sc.workloads]
    rs_t = dc_replace(rs, scenario=sc.model_copy(update={"workloads": wls}))
    data_t = prepare(rs_t, table)
    total = {h: a + b + c for h, (a, b, c) in u.items()}
    try:
        plan_t = extract(rs_t, data_t, x, total, res)
    except PlannerError:  # a period whose fleet cannot even be laid out fails its check
        return False
    return recheck(plan_t, rs_t).ok

