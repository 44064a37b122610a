"""Traffic over the day with price tiers: one MILP over ``T`` periods of equal length.

Reserved units ``ur[h]`` are held all day at the reserved price; on-demand ``uo[h,t]`` and spot
``us[h,t]`` units are bought per period at their tiers' prices (where the hardware or the scenario has
them); replicas ``x[r,t]`` are chosen per period from the same candidate rows as the single-period model::

    min  sum_t (24 / T) sum_h cpu[h] (p_res[h] ur[h] + p_od[h] uo[h,t] + p_spot[h] us[h,t])   [$ per day]
    s.t. s_agg[w,t] + s_dis[w,t] >= demand[w,t]                                        (coverage)
         sum_{agg(w)} q_r x[r,t] >= s_agg[w,t];  prefill, decode >= s_dis[w,t]            (rate matching)
         sum_{r on h} slots_r x[r,t] <= cpu[h] (ur[h] + uo[h,t] + (1 - preempt[h]) us[h,t])  (packing)
         ur[h] + uo[h,t] + us[h,t] <= max_units[h]                                       (inventory)
         power and budget per period; prefix capacity per row and period

With a flat profile and no tiers it is the single-period model (every period the same).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyomo.core as pyo

from planner.model.build import EPSILON, define_streams, rate_unit
from planner.model.data import PlanData, row_arrays


@dataclass(frozen=True)
class Tiers:
    reserved: float
    """USD per chip-hour of capacity held all day."""
    on_demand: float | None = None
    spot: float | None = None
    preemption: float = 0.0


def build_periods_model(data: PlanData, demand: dict[str, list[float]], tiers: dict[str, Tiers]) -> pyo.ConcreteModel:
    T = len(next(iter(demand.values())))
    m = pyo.ConcreteModel(name="deployment-periods")
    m._data = data
    a = row_arrays(data)
    m._arr = a
    m._unit = unit = rate_unit(data)  # the workloads' requests_per_s are the profiles' peaks
    m.R = pyo.Set(initialize=range(len(data.rows)), ordered=True)
    m.H = pyo.Set(initialize=list(data.hardware), ordered=True)
    m.W = pyo.Set(initialize=list(data.workloads), ordered=True)
    m.T = pyo.Set(initialize=range(T), ordered=True)
    rows_of: dict = {}
    for i in range(len(data.rows)):
        rows_of.setdefault(("role", a["workload"][i], a["role"][i]), []).append(i)
        rows_of.setdefault(("hw", a["hardware"][i]), []).append(i)
    m._rows_of = rows_of
    hw = data.hardware
    m.x = pyo.Var(m.R, m.T, within=pyo.NonNegativeIntegers)
    m.ur = pyo.Var(m.H, within=pyo.NonNegativeIntegers, doc="reserved units, all day")
    m.uo = pyo.Var(m.H, m.T, within=pyo.NonNegativeIntegers, doc="on-demand units per period")
    m.us = pyo.Var(m.H, m.T, within=pyo.NonNegativeIntegers, doc="spot units per period")
    for h in m.H:
        for t in m.T:
            if tiers[h].on_demand is None:
                m.uo[h, t].fix(0)
            if tiers[h].spot is None:
                m.us[h, t].fix(0)
    define_streams(m, data, m.W, m.T)
    rate = a["rate"] / unit
    slots = a["slots"]

    def served(w, role, t):
        return sum(rate[i] * m.x[i, t] for i in rows_of.get(("role", w, role), []))

    m.coverage = pyo.Constraint(m.W, m.T, rule=lambda m, w, t: m.s_agg[w, t] + m.s_dis[w, t] >= demand[w][t] / unit)

    def agg(m, w, t):
        return pyo.Constraint.Skip if m.s_agg[w, t].fixed else served(w, "aggregated", t) >= m.s_agg[w, t]

    def pre(m, w, t):
        return pyo.Constraint.Skip if m.s_dis[w, t].fixed else served(w, "prefill", t) >= m.s_dis[w, t]

    def dec(m, w, t):
        return pyo.Constraint.Skip if m.s_dis[w, t].fixed else served(w, "decode", t) >= m.s_dis[w, t]

    m.aggregated_capacity = pyo.Constraint(m.W, m.T, rule=agg)
    m.prefill_capacity = pyo.Constraint(m.W, m.T, rule=pre)
    m.decode_capacity = pyo.Constraint(m.W, m.T, rule=dec)

    def packing(m, h, t):
        held = m.ur[h] + m.uo[h, t] + (1.0 - tiers[h].preemption) * m.us[h, t]
        return sum(slots[i] * m.x[i, t] for i in rows_of.get(("hw", h), [])) <= hw[h].chips_per_unit * held

    m.unit_packing = pyo.Constraint(m.H, m.T, rule=packing)

    def inventory(m, h, t):
        if hw[h].max_units is None:
            return pyo.Constraint.Skip
        return m.ur[h] + m.uo[h, t] + m.us[h, t] <= hw[h].max_units

    m.inventory = pyo.Constraint(m.H, m.T, rule=inventory)

    def usd_per_hour(t):
        return sum(hw[h].chips_per_unit * (tiers[h].reserved * m.ur[h] + (tiers[h].on_demand or 0.0) * m.uo[h, t]
                                           + (tiers[h].spot or 0.0) * m.us[h, t]) for h in m.H)

    m._usd_per_hour = usd_per_hour
    if data.power_kw is not None:
        m.power = pyo.Constraint(m.T, rule=lambda m, t: sum(
            (hw[h].kw_per_chip or 0.0) * hw[h].chips_per_unit * (m.ur[h] + m.uo[h, t] + m.us[h, t]) for h in m.H)
            <= data.power_kw)
    if data.budget_usd_per_hour is not None:
        m.budget = pyo.Constraint(m.T, rule=lambda m, t: usd_per_hour(t) <= data.budget_usd_per_hour)
    prefix_rows = [i for i in range(len(data.rows)) if a["prefix"][i]]
    if prefix_rows:
        def prefix(m, i, t):
            w = a["workload"][i]
            ws = data.workloads[w].working_set_bytes
            d = demand[w][t]
            if ws <= 0 or d <= 0:
                return pyo.Constraint.Skip
            return (a["pcap"][i] / ws - a["rate"][i] / d) * m.x[i, t] >= 0

        m.prefix_cache_capacity = pyo.Constraint(prefix_rows, m.T, rule=prefix)
    hours = 24.0 / T
    tie = sum(EPSILON * slots[i] * tiers[a["hardware"][i]].reserved * m.x[i, t] for i in m.R for t in m.T)
    m.cost = pyo.Objective(expr=sum(hours * usd_per_hour(t) for t in m.T) + tie, sense=pyo.minimize)
    return m


def period_values(m) -> list[tuple[dict[int, int], dict[str, tuple[int, int, int]], float]]:
    """Per period: replicas per row, (reserved, on-demand, spot) units per hardware, and $/h."""
    out = []
    for t in m.T:
        x = {int(i): int(round(pyo.value(m.x[i, t]))) for i in m.R if (pyo.value(m.x[i, t]) or 0) > 0.5}
        u = {h: (int(round(pyo.value(m.ur[h]) or 0)), int(round(pyo.value(m.uo[h, t]) or 0)),
                 int(round(pyo.value(m.us[h, t]) or 0))) for h in m.H}
        out.append((x, u, float(pyo.value(m._usd_per_hour(t)))))
    return out


def peak_period(demand: dict[str, list[float]]) -> int:
    """The period with the most requests (summed over workloads)."""
    return int(np.argmax(np.sum([v for v in demand.values()], axis=0)))
