"""The constraint families of the deployment MILP, each written once over the period index, and their
registry.

A family is one :class:`Family` entry: the scenario path that asks for it, the mutable parameter a sweep or the
analysis changes, its ``define_*`` (adds nothing where the scenario does not ask for it), the elastic slack that
says by how much it is short (:func:`shortfalls`, the infeasibility diagnosis), how the analysis relaxes it
(:func:`limit_relaxations`) and its label in plan.md. :func:`planner.model.build.build_model` defines every
family in :data:`FAMILIES` in order; the diagnosis and the binding-constraint analysis iterate the same list.
Adding a family is an entry here, its ``define_*`` and a test.

Indices: ``R`` candidate rows, ``H`` hardware, ``W`` workloads, ``T`` periods (one without a traffic profile).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyomo.core as pyo

from planner.model.brownfield import define_brownfield, start_brownfield
from planner.model.data import chip_power_kw
from planner.model.terms import coef, fleet_kw, fleet_usd_per_hour, held, served, stream, unit_loss, usable


@dataclass(frozen=True)
class Relaxation:
    """One way the analysis relaxes a limit: the parameter it raises, to what, and the row of plan.md it gives."""
    family: str
    target: str | None
    value: float


@dataclass(frozen=True)
class Family:
    name: str
    """The model component the family adds (and the registry key)."""
    define: Callable
    """``define(m)``: adds the family's variables and constraints to ``m`` where the scenario asks for it; returns
    ``False`` where it does not (the family is then not in ``m._defined``)."""
    label: str
    """What plan.md and the progress lines call it."""
    path: str | None = None
    """The scenario field that asks for it (``None``: every plan has it)."""
    parameter: str | None = None
    """Its mutable parameter in the model (indexed by ``target`` where the family has several), which sweeps set
    and the analysis raises."""
    slack: str | None = None
    """The variable an elastic model (``build_model(elastic=True)``) relaxes the limit with."""
    shortage: Callable | None = None
    """``shortage(m)``: the slack over the limit (dimensionless, so a kW and a unit short weigh alike), the
    elastic objective's first term."""
    shortfall: Callable | None = None
    """``shortfall(m) -> list[str]``: on a solved elastic model, one line per limit its slack had to relax."""
    relax: Callable | None = None
    """``relax(data, plan) -> list[Relaxation]``: the relaxations the analysis prices (a limit within one unit of
    binding)."""
    binding: Callable | None = None
    """``binding(data, plan, relaxation, worth, saved) -> (name, detail) | None``: the binding-constraint row of
    plan.md for a priced relaxation (``worth``: what it saves, in words; ``saved``: $/h, ``None`` unknown), or for
    none (``relaxation`` ``None``: the limit is set but was not worth a re-solve); ``None``: no row."""
    sweepable: bool = False
    """Whether ``planner sweep --vary`` may vary its parameter in place (a re-solve, no rebuild)."""
    start: Callable | None = None
    """``start(m, replicas, vals)``: set the family's own variables in the start ``vals`` (a ``ComponentMap``
    holding the held units ``u``) to match replicas ``replicas(i, t)`` (:func:`planner.model.bounds.greedy_start`)."""
    recheck: Callable | None = None
    """``recheck(plan, rs) -> list[(name, ok, detail)]``: the plan's own figures against the scenario's limit, for
    the re-check by the performance model alone (:func:`planner.results.recheck`), without the MILP."""


# ---------------------------------------------------------------------------------------------
# Core families: every plan has them


def define_demand_coverage(m) -> None:
    """Each workload's traffic in each period is served, by aggregated pools, disaggregated pools or both (in
    units of ``rate_unit`` requests/s)."""
    m.demand_coverage = pyo.Constraint(m.W, m.T, rule=lambda m, w, t: m.s_agg[w, t] + m.s_dis[w, t] >= m.demand[w, t] / m._unit)


def define_rate_matching(m) -> None:
    """Aggregated pools carry what they are assigned; a disaggregated stream needs as much prefill capacity as
    decode capacity (every request passes through both pools)."""

    def rule(role):
        def f(m, w, t):
            s = stream(m, w, role, t)
            return pyo.Constraint.Skip if s.fixed else served(m, w, role, t) >= s
        return f

    m.aggregated_capacity = pyo.Constraint(m.W, m.T, rule=rule("aggregated"))
    m.prefill_capacity = pyo.Constraint(m.W, m.T, rule=rule("prefill"))
    m.decode_capacity = pyo.Constraint(m.W, m.T, rule=rule("decode"))


def define_unit_packing(m) -> None:
    """Replicas fit in whole purchase units: the chips of capacity they occupy in a period (their TP x EP groups
    rounded to what a scale-up domain can hold, see ``perf.candidates.slots_per_replica``) do not exceed the chips
    of the units usable in it."""
    slots = coef(m, "slots")

    def rule(m, h, t):
        rows = m._rows_of.get(("hw", h), [])
        return sum(slots[i] * m.x[i, t] for i in rows) <= m._data.hardware[h].chips_per_unit * usable(m, h, t)

    m.unit_packing = pyo.Constraint(m.H, m.T, rule=rule)


def define_prefix_cache_capacity(m) -> None:
    """Each pool that reuses cached prefixes holds the prefixes of the traffic routed to it: prefixes are routed
    by family, so a replica planned for a share ``rate / demand`` of a workload's traffic holds that share of its
    working set in its own tier (free HBM, host DRAM or flash), ``pcap / working_set >= rate / demand[t]`` per
    replica and period (both sides dimensionless); capacity in one pool's tier never serves another pool's
    traffic.

    The condition is one row's alone, so it is a bound, not a constraint: ``x[r, t] <= 0`` where it fails, set by
    :func:`apply_prefix_capacity` from the parameters as they stand whenever the model is checked or handed to the
    solver (the model's declared ``refresh``, :mod:`planner.solve.structure`), so a change of demand or working set
    is followed."""
    m._prefix_rows = {w: np.asarray(m._rows_of.get(("prefix", w), []), dtype=int) for w in m.W}
    m._prefix_ok = np.ones((len(m._arr["rate"]), len(m.T)), dtype=bool)
    apply_prefix_capacity(m)


def prefix_rows_hold(m, w: str, rows: np.ndarray, t=0) -> np.ndarray:
    """Whether one replica of each of ``rows`` (of workload ``w``) holds its share of ``w``'s prefix working set in
    period ``t`` at the demand and working set the model's parameters hold now (rows that reuse no prefixes do)."""
    a = m._arr
    ws, demand = pyo.value(m.working_set_gb[w]), pyo.value(m.demand[w, t])
    if ws <= 0 or not len(rows):
        return np.ones(len(rows), dtype=bool)
    return ~a["prefix"][rows] | (a["pcap"][rows] / 1e9 / ws >= a["rate"][rows] / max(demand, 1e-30) * (1 - 1e-9))


def _prefix_verdicts(m, w: str, rows: np.ndarray, t) -> tuple[np.ndarray, np.ndarray]:
    ok = prefix_rows_hold(m, w, rows, t)
    return ok, ok != m._prefix_ok[rows, t]


def prefix_bounds_move(m, w: str) -> bool:
    """Whether the demand and working set the parameters hold now change which of ``w``'s rows may be used in
    some period (the prefix-capacity bounds last applied): where not, a change of ``w``'s working set leaves the
    model as it was (it enters no other constraint)."""
    rows = getattr(m, "_prefix_rows", {}).get(w)
    if rows is None or not len(rows):
        return False
    return any(bool(_prefix_verdicts(m, w, rows, t)[1].any()) for t in m.T)


def apply_prefix_capacity(m) -> None:
    """Set the prefix-capacity bounds of :func:`define_prefix_cache_capacity` from the parameters as they stand:
    upper bound 0 on the replicas of a row that cannot hold its share in a period, none on the others (only the
    rows whose verdict changed are touched)."""
    for w, rows in getattr(m, "_prefix_rows", {}).items():
        for t in m.T:
            ok, moved = _prefix_verdicts(m, w, rows, t)
            for i, good in zip(rows[moved].tolist(), ok[moved].tolist(), strict=True):
                m.x[i, t].setub(None if good else 0)
            m._prefix_ok[rows, t] = ok


# ---------------------------------------------------------------------------------------------
# Limits: each where the scenario sets it


def define_inventory(m) -> None:
    """At most ``limits.max_units`` purchase units per hardware that has a limit, in every period (a mutable
    parameter; to leave a hardware out altogether, fix its ``u`` to 0)."""
    hw = m._data.hardware
    if m._elastic:
        m.extra_units = pyo.Var(m.H, within=pyo.NonNegativeReals)

    def rule(m, h, t):
        if hw[h].max_units is None:
            return pyo.Constraint.Skip
        extra = m.extra_units[h] if m._elastic else 0
        return held(m, h, t) <= m.max_units[h] + extra

    m.inventory = pyo.Constraint(m.H, m.T, rule=rule)


def _short_units(m) -> list[str]:
    out = []
    for h, hd in m._data.hardware.items():
        if hd.max_units is not None and pyo.value(m.extra_units[h]) > 1e-6:
            need = max(int(round(pyo.value(held(m, h, t)))) for t in m.T)
            out.append(f"limits.max_units.{h}: needs {need} {hd.unit_kind}s, {hd.max_units} allowed (short by "
                       f"{need - hd.max_units})")
    return out


def _relax_units(data, plan) -> list[Relaxation]:
    out = []
    for h, hd in data.hardware.items():
        if hd.max_units is not None and _units_of(plan, h) >= hd.max_units:
            out.append(Relaxation("inventory", h, max(hd.max_units + 1, int(np.ceil(hd.max_units * (1 + RELAX))))))
    return out


def _bind_units(data, plan, r: Relaxation | None, worth: str, saved: float | None) -> tuple[str, str] | None:
    if r is None:
        return None
    hd = data.hardware[r.target]
    return (f"limits.max_units.{r.target}",
            f"{_units_of(plan, r.target)} of {hd.max_units} {hd.unit_kind}s of {r.target}; allowing {r.value:g} {worth}")


def limit_per_period(m, name: str, lhs, limit, slack: str) -> None:
    """Constraint ``name``: ``lhs(m, t) <= limit`` in every period, where an elastic model adds the non-negative
    slack variable ``slack`` to the limit (what the diagnosis reads)."""
    if m._elastic:
        setattr(m, slack, pyo.Var(within=pyo.NonNegativeReals))
    extra = getattr(m, slack) if m._elastic else 0
    setattr(m, name, pyo.Constraint(m.T, rule=lambda m, t: lhs(m, t) <= limit + extra))


def define_power(m) -> bool | None:
    """All-in power of the units held in each period within ``limits.power_kw``."""
    if m._data.power_kw is None:
        return False
    limit_per_period(m, "power", fleet_kw, m.power_limit_kw, "extra_kw")


def _short_power(m) -> list[str]:
    d = m._data
    if pyo.value(m.extra_kw) <= 1e-6:
        return []
    need = max(pyo.value(fleet_kw(m, t)) for t in m.T)
    return [f"limits.power_kw: serving the demand needs {need:,.1f} kW, the limit is {d.power_kw:,.1f} kW "
            f"(short by {need - d.power_kw:,.1f} kW)"]


def _relax_power(data, plan) -> list[Relaxation]:
    if data.power_kw is None:
        return []
    kw = sum(g.kw or 0.0 for g in plan.units)
    # With more than one unit's worth of slack, more power cannot change the plan.
    unit_kw = max((hd.kw_per_chip or 0.0) * hd.chips_per_unit for hd in data.hardware.values())
    return [Relaxation("power", None, data.power_kw * (1 + RELAX))] if kw + unit_kw > data.power_kw else []


def _bind_power(data, plan, r: Relaxation | None, worth: str, saved: float | None) -> tuple[str, str] | None:
    kw = sum(g.kw or 0.0 for g in plan.units)
    if data.power_kw is None or not ((saved and saved > 1e-6 * plan.objective.usd_per_hour) or kw > data.power_kw * 0.98):
        return None
    return "limits.power_kw", f"uses {kw:,.0f} of {data.power_kw:,.0f} kW; {RELAX:.0%} more power {worth}"


def define_budget(m) -> bool | None:
    """Dollars per hour of each period's units within ``limits.budget_usd_per_hour``."""
    if m._data.budget_usd_per_hour is None:
        return False
    limit_per_period(m, "budget", fleet_usd_per_hour, m.budget_usd_per_hour, "extra_usd")


def _short_budget(m) -> list[str]:
    d = m._data
    if pyo.value(m.extra_usd) <= 1e-6:
        return []
    cost = max(pyo.value(fleet_usd_per_hour(m, t)) for t in m.T)
    return [f"limits.budget_usd_per_hour: the cheapest fleet within the other limits costs ${cost:,.2f}/h, the budget "
            f"is ${d.budget_usd_per_hour:,.2f}/h (short by ${cost - d.budget_usd_per_hour:,.2f}/h)"]


def _bind_budget(data, plan, r: Relaxation | None, worth: str, saved: float | None) -> tuple[str, str] | None:
    cost, budget = plan.objective.usd_per_hour, data.budget_usd_per_hour
    if budget is None or cost <= budget * 0.98:
        return None
    return "limits.budget_usd_per_hour", f"${cost:,.2f} of ${budget:,.2f}/h"


def define_resilience(m) -> bool | None:
    """N+k: with ``k = lose_units``, for every workload ``w``, role ``r``, hardware ``h`` it uses in period ``t``
    (``y[w,r,h,t] = 1``; ``capacity[w,r,h,t] <= M y``)::

        capacity[w, r, t] - k * L[w, r, h] * y[w, r, h, t] >= stream[w, r, t]

    where ``L`` (:func:`unit_loss`) bounds what one unit of ``h`` carries. Losing ``k`` units of one hardware takes
    at most ``k L``; losing units of several takes at most ``k`` times the largest ``L``; so every loss of ``k``
    units leaves each role's stream (aggregated, or prefill and decode) served, in every period."""
    k = m._data.lose_units
    if not k:
        return False
    a = m._arr
    keys = []
    for (kind, *rest), rows in m._rows_of.items():
        if kind != "role":
            continue
        w, role = rest
        for h in sorted({a["hardware"][i] for i in rows}):
            keys.append((w, role, h))
    m.RES = pyo.Set(initialize=keys, dimen=3, ordered=True, doc="(workload, role, hardware) that may lose a unit")
    m.uses = pyo.Var(m.RES, m.T, within=pyo.Binary, doc="the role of the workload runs on the hardware in the period")
    m._loss = {key: unit_loss(m, *key) for key in keys}
    rate = coef(m, "rate")
    on_hw = {(w, role, h): [i for i in m._rows_of[("role", w, role)] if a["hardware"][i] == h] for w, role, h in keys}

    def use(m, w, role, h, t):
        big = 1e6 + 10.0 * k * m._loss[(w, role, h)]  # rate units: demand is at most ~1000 of them (rate_unit)
        return sum(rate[i] * m.x[i, t] for i in on_hw[(w, role, h)]) <= big * m.uses[w, role, h, t]

    def survive(m, w, role, h, t):
        return served(m, w, role, t) - k * m._loss[(w, role, h)] * m.uses[w, role, h, t] >= stream(m, w, role, t)

    m.uses_link = pyo.Constraint(m.RES, m.T, rule=use)
    m.resilience = pyo.Constraint(m.RES, m.T, rule=survive)


def _start_resilience(m, replicas, vals) -> None:
    a = m._arr
    for (w, role, h) in m.RES:
        rows = m._rows_of[("role", w, role)]
        for t in m.T:
            vals[m.uses[w, role, h, t]] = float(any(replicas(i, t) > 0 and a["hardware"][i] == h for i in rows))


def pd_class_rows(m) -> dict[str, dict[str, list[int]]]:
    """Per workload whose prefill and decode rows span more than one pairing class (``engine@vendor/kv``,
    :func:`planner.model.data.pd_classes`): its prefill and decode rows by class."""
    a = m._arr
    out = {}
    for w in m.W:
        by: dict[str, list[int]] = {}
        for role in ("prefill", "decode"):
            for i in m._rows_of.get(("role", w, role), []):
                by.setdefault(a["pd_class"][i], []).append(i)
        if len(by) > 1:
            out[w] = by
    return out


def define_pd_pairing(m) -> bool | None:
    """Prefill and decode pools of a workload pair on one engine, vendor and KV format (one class ``k``):
    ``p[w, k]`` binary, ``x[r, t] <= X_r p[w, k(r)]`` for its prefill and decode rows and ``sum_k p[w, k] <= 1``. No
    engine hands KV to another engine's decode, nor across vendors (shared/reference/engine-rules.md section 4), and
    the decode side reads the blocks in the format the prefill side wrote them; within one class both sides share
    the engine's transfer backends. ``X_r`` as for pool types."""
    classes = pd_class_rows(m)
    m._pd_classes = classes
    if not classes:
        return False
    d, a = m._data, m._arr
    rate = a["rate"] / m._unit
    top = {w: max(pyo.value(m.demand[w, t]) for t in m.T) for w in m.W}
    keys = [(w, k) for w, by in classes.items() for k in by]
    of = {i: (w, k) for w, by in classes.items() for k, rows in by.items() for i in rows}
    m.PD = pyo.Set(initialize=keys, dimen=2, ordered=True, doc="(workload, engine@vendor/kv) pairing classes")
    m.pd_class = pyo.Var(m.PD, within=pyo.Binary, doc="the workload's prefill and decode run in this class")

    def link(m, i, t):
        w = a["workload"][i]
        need = top[w] / m._unit * (d.lose_units + 1) / max(rate[i], 1e-12)
        return m.x[i, t] <= (10.0 * np.ceil(need) + 10.0) * m.pd_class[of[i]]

    m.pd_link = pyo.Constraint(sorted(of), m.T, rule=link)
    m.pd_pairing = pyo.Constraint(list(classes), rule=lambda m, w: sum(m.pd_class[w, k] for k in classes[w]) <= 1)
    m.pd_link.deactivate()  # lazy: switched on where a solution breaks the pairing (:func:`pairing_on_demand`)
    m.pd_pairing.deactivate()


def pairing_on_demand(m) -> bool:
    """The lazy form of :func:`define_pd_pairing` (its constraints start switched off: where the pairing does not
    bind, as on most fleets, its binaries would only slow the search, 0.8 s to 11 s on the 10-workload fleet):
    with the solution loaded in ``m``, switch them on where some workload's prefill and decode run in more than one
    class, and say whether it did. The solver then solves again (:meth:`planner.solve.Solver.solve`)."""
    if m.pd_pairing.active:
        return False
    for by in m._pd_classes.values():
        used = [k for k, rows in by.items() if any((m.x[i, t].value or 0.0) > 0.5 for i in rows for t in m.T)]
        if len(used) > 1:
            m.pd_link.activate()
            m.pd_pairing.activate()
            return True
    return False


def _start_pd_pairing(m, replicas, vals) -> None:
    for (w, k) in m.PD:
        vals[m.pd_class[w, k]] = float(any(replicas(i, t) > 0 for i in m._pd_classes[w][k] for t in m.T))


def _recheck_pd(plan, rs) -> list[tuple[str, bool, str]]:
    vendor = {h.id: h.vendor for h in rs.hardware}
    out = []
    for w in plan.workloads:
        pools = [p for p in plan.pools if p.workload == w.name and p.role in ("prefill", "decode")]
        if not pools:
            continue
        classes = sorted({f"{p.engine}@{vendor[p.hardware]}/{p.kv_dtype}" for p in pools})
        out.append((f"{w.name}: prefill/decode pairing", len(classes) == 1,
                    f"prefill and decode on {', '.join(classes)} (one engine and vendor hands KV to itself, in one "
                    "format)"))
    return out


def define_hardware_types(m) -> bool | None:
    """``sum_h v[h] <= max_hardware_types`` with ``held(h, t) <= U v[h]`` in every period (``v`` binary: hardware
    ``h`` is bought at all); ``U`` is the hardware's unit limit, else 10^7 units."""
    d = m._data
    if d.max_hardware_types is None:
        return False
    m.hw_used = pyo.Var(m.H, within=pyo.Binary, doc="hardware bought at all")
    m.hw_used_link = pyo.Constraint(
        m.H, m.T, rule=lambda m, h, t: held(m, h, t) <= (d.hardware[h].max_units or 10**7) * m.hw_used[h])
    m.hardware_types = pyo.Constraint(expr=sum(m.hw_used[h] for h in m.H) <= d.max_hardware_types)


def _start_hardware_types(m, replicas, vals) -> None:
    for h in m.H:
        vals[m.hw_used[h]] = float(vals.get(m.u[h], 0.0) > 0)


def define_pool_types(m) -> bool | None:
    """``sum_{r of w} z[r] <= max_pool_types_per_workload`` with ``x[r, t] <= X_r z[r]`` in every period (``z``
    binary: row ``r``, a pool type, is used at all); each pool type used costs ``pool_type_usd_per_hour`` in the
    objective. ``X_r`` is ten times the replicas row ``r`` needs to carry its workload's largest period demand,
    ``k + 1`` times over with ``resilience.lose_units = k``."""
    d = m._data
    if d.max_pool_types_per_workload is None and not d.pool_type_usd_per_hour:
        return False
    a = m._arr
    rate = a["rate"] / m._unit
    m.row_used = pyo.Var(m.R, within=pyo.Binary, doc="candidate row (pool type) used")
    top = {w: max(pyo.value(m.demand[w, t]) for t in m.T) for w in m.W}

    def link(m, i, t):
        need = top[a["workload"][i]] / m._unit * (d.lose_units + 1) / max(rate[i], 1e-12)
        return m.x[i, t] <= (10.0 * np.ceil(need) + 10.0) * m.row_used[i]

    m.row_used_link = pyo.Constraint(m.R, m.T, rule=link)
    if d.max_pool_types_per_workload is not None:
        rows_of_w: dict[str, list[int]] = {}
        for i in m.R:
            rows_of_w.setdefault(a["workload"][i], []).append(i)
        m.pool_types = pyo.Constraint(
            m.W, rule=lambda m, w: sum(m.row_used[i] for i in rows_of_w.get(w, [])) <= d.max_pool_types_per_workload)


def _start_pool_types(m, replicas, vals) -> None:
    for i in m.R:
        vals[m.row_used[i]] = float(any(replicas(i, t) > 0 for t in m.T))


def define_racks(m) -> bool | None:
    """Datacenter racks of a fixed power envelope (``limits.racks``: ``count`` racks of ``kw_per_rack`` each).
    A purchase unit sits in racks of its own hardware; ``n_h = floor(kw_per_rack / kW per unit)`` units of ``h``
    share a rack, and a unit that draws more than a rack holds is ruled out (``u = 0``)::

        racks[h, t] >= held(h, t) / n_h          (racks[h, t] integer)
        sum_h racks[h, t] <= count               (every period)"""
    lim = m._data.racks
    if lim is None:
        return False
    hw = m._data.hardware
    per_rack = {}
    for h in m.H:
        kw = (hw[h].kw_per_chip or 0.0) * hw[h].chips_per_unit
        per_rack[h] = math.floor(lim.kw_per_rack / kw * (1 + 1e-12)) if kw > 0 else 10**6
    m._units_per_rack = per_rack
    m.racks_used = pyo.Var(m.H, m.T, within=pyo.NonNegativeIntegers, doc="racks holding the hardware's units")
    m.rack_count = pyo.Param(mutable=True, initialize=lim.count)
    if m._elastic:
        m.extra_racks = pyo.Var(within=pyo.NonNegativeReals)

    def fill(m, h, t):
        if not per_rack[h]:
            return held(m, h, t) <= 0
        return per_rack[h] * m.racks_used[h, t] >= held(m, h, t)

    m.rack_fill = pyo.Constraint(m.H, m.T, rule=fill)
    extra = m.extra_racks if m._elastic else 0
    m.racks = pyo.Constraint(m.T, rule=lambda m, t: sum(m.racks_used[h, t] for h in m.H) <= m.rack_count + extra)


def _start_racks(m, replicas, vals) -> None:
    for h in m.H:
        per = m._units_per_rack[h]
        for t in m.T:
            vals[m.racks_used[h, t]] = float(math.ceil(vals.get(m.u[h], 0.0) / per - 1e-9)) if per else 0.0


def _short_racks(m) -> list[str]:
    if pyo.value(m.extra_racks) <= 1e-6:
        return []
    lim = m._data.racks
    need = max(int(round(sum(pyo.value(m.racks_used[h, t]) for h in m.H))) for t in m.T)
    return [f"limits.racks.count: serving the demand needs {need} racks of {lim.kw_per_rack:g} kW, {lim.count} "
            f"allowed (short by {need - lim.count})"]


def _relax_racks(data, plan) -> list[Relaxation]:
    lim = data.racks
    if lim is None:
        return []
    used = racks_of(data, plan)
    return [Relaxation("racks", None, max(lim.count + 1, int(np.ceil(lim.count * (1 + RELAX)))))] if used >= lim.count else []


def _bind_racks(data, plan, r: Relaxation | None, worth: str, saved: float | None) -> tuple[str, str] | None:
    if r is None:
        return None
    lim = data.racks
    return ("limits.racks.count", f"{racks_of(data, plan)} of {lim.count} racks of {lim.kw_per_rack:g} kW; allowing "
            f"{r.value:g} {worth}")


def racks_of(data, plan) -> int:
    """Racks of ``data.racks``'s envelope the plan's units fill."""
    out = 0
    for g in plan.units:
        hd = data.hardware[g.hardware]
        kw = (hd.kw_per_chip or 0.0) * hd.chips_per_unit
        per = math.floor(data.racks.kw_per_rack / kw * (1 + 1e-12)) if kw > 0 else 10**6
        out += math.ceil(g.count / per) if per else 10**6
    return out


def _fleet_kw(plan, rs) -> float:
    hw = {h.id: h for h in rs.hardware}
    return sum(g.chips * (chip_power_kw(hw[g.hardware])[0] or 0.0) for g in plan.units)


def _recheck_power(plan, rs) -> list[tuple[str, bool, str]]:
    lim = rs.scenario.limits.power_kw
    if lim is None:
        return []
    kw = _fleet_kw(plan, rs)
    return [("power", kw <= lim * (1 + RECHECK_TOL), f"{kw:,.0f} of {lim:,.0f} kW")]


def _recheck_budget(plan, rs) -> list[tuple[str, bool, str]]:
    lim = rs.scenario.limits.budget_usd_per_hour
    if lim is None:
        return []
    total = sum(g.usd_per_hour for g in plan.units)
    return [("budget", total <= lim * (1 + RECHECK_TOL), f"${total:,.2f} of ${lim:,.2f}/h")]


def _recheck_racks(plan, rs) -> list[tuple[str, bool, str]]:
    lim = rs.scenario.limits.racks
    if lim is None:
        return []
    hw = {h.id: h for h in rs.hardware}
    used, worst = 0, []
    for g in plan.units:
        kw = (chip_power_kw(hw[g.hardware])[0] or 0.0) * g.chips / max(g.count, 1)
        per = math.floor(lim.kw_per_rack / kw * (1 + 1e-12)) if kw > 0 else 10**6
        if not per and g.count:
            worst.append(f"a {g.hardware} unit draws {kw:,.1f} kW")
        used += math.ceil(g.count / per) if per else 0
    ok = used <= lim.count and not worst
    return [("racks", ok, f"{used} of {lim.count} racks of {lim.kw_per_rack:g} kW" + (f"; {'; '.join(worst)}" if worst else ""))]


RECHECK_TOL = 1e-6
"""Relative tolerance of the re-check's limit comparisons (the solver's feasibility tolerance)."""


def define_chip_quota(m) -> bool | None:
    """At most ``limits.max_chips`` accelerators held in each period, every hardware together (a GPU quota)::

        sum_h chips_per_unit[h] held(h, t) <= max_chips"""
    d = m._data
    if d.max_chips is None:
        return False
    m.chip_quota_limit = pyo.Param(mutable=True, initialize=d.max_chips)
    limit_per_period(m, "chip_quota", lambda m, t: sum(d.hardware[h].chips_per_unit * held(m, h, t) for h in m.H),
                     m.chip_quota_limit, "extra_chips")


def _chips_of(plan) -> int:
    return sum(g.chips for g in plan.units)


def _short_chips(m) -> list[str]:
    if pyo.value(m.extra_chips) <= 1e-6:
        return []
    hw = m._data.hardware
    need = max(int(round(sum(hw[h].chips_per_unit * pyo.value(held(m, h, t)) for h in m.H))) for t in m.T)
    lim = m._data.max_chips
    return [f"limits.max_chips: serving the demand needs {need:,} chips, {lim:,} allowed (short by {need - lim:,})"]


def _relax_chips(data, plan) -> list[Relaxation]:
    lim = data.max_chips
    if lim is None:
        return []
    # with less than the smallest unit's chips free, the quota binds
    smallest = min(hd.chips_per_unit for hd in data.hardware.values())
    if _chips_of(plan) + smallest <= lim:
        return []
    return [Relaxation("chip_quota", None, max(lim + smallest, int(np.ceil(lim * (1 + RELAX)))))]


def _bind_chips(data, plan, r: Relaxation | None, worth: str, saved: float | None) -> tuple[str, str] | None:
    if r is None:
        return None
    return "limits.max_chips", f"{_chips_of(plan):,} of {data.max_chips:,} chips; allowing {r.value:,g} {worth}"


def _recheck_chips(plan, rs) -> list[tuple[str, bool, str]]:
    lim = rs.scenario.limits.max_chips
    if lim is None:
        return []
    return [("limits.max_chips", _chips_of(plan) <= lim, f"{_chips_of(plan):,} of {lim:,} chips")]


def _units_of(plan, h: str) -> int:
    return sum(g.count for g in plan.units if g.hardware == h)


RELAX = 0.10
"""How far the analysis relaxes each input (10%)."""

FAMILIES: tuple[Family, ...] = (
    Family("demand_coverage", define_demand_coverage, "demand"),
    Family("rate_matching", define_rate_matching, "prefill and decode capacity"),
    Family("unit_packing", define_unit_packing, "whole purchase units"),
    Family("inventory", define_inventory, "units per hardware", path="limits.max_units", parameter="max_units",
           slack="extra_units", shortage=lambda m: sum(
               m.extra_units[h] / max(1, m._data.hardware[h].max_units or 1) for h in m.H),
           shortfall=_short_units, relax=_relax_units, binding=_bind_units, sweepable=True),
    Family("power", define_power, "power", path="limits.power_kw", parameter="power_limit_kw",
           slack="extra_kw", shortage=lambda m: m.extra_kw / m.power_limit_kw,
           shortfall=_short_power, relax=_relax_power, binding=_bind_power, sweepable=True, recheck=_recheck_power),
    Family("budget", define_budget, "budget", path="limits.budget_usd_per_hour", parameter="budget_usd_per_hour",
           slack="extra_usd", shortage=lambda m: m.extra_usd / m.budget_usd_per_hour,
           shortfall=_short_budget, binding=_bind_budget, sweepable=True, recheck=_recheck_budget),
    Family("prefix_cache_capacity", define_prefix_cache_capacity, "prefix cache capacity",
           path="workloads[].prefix_cache.working_set_gb", parameter="working_set_gb", sweepable=True),
    Family("racks", define_racks, "racks", path="limits.racks", parameter="rack_count",
           slack="extra_racks", shortage=lambda m: m.extra_racks / max(1, m._data.racks.count),
           shortfall=_short_racks, relax=_relax_racks, binding=_bind_racks, recheck=_recheck_racks,
           start=_start_racks),
    Family("chip_quota", define_chip_quota, "accelerators in the fleet", path="limits.max_chips",
           parameter="chip_quota_limit", slack="extra_chips", shortage=lambda m: m.extra_chips / m.chip_quota_limit,
           shortfall=_short_chips, relax=_relax_chips, binding=_bind_chips, recheck=_recheck_chips),
    Family("pd_pairing", define_pd_pairing, "prefill and decode on one engine and vendor", start=_start_pd_pairing,
           recheck=_recheck_pd),
    Family("resilience", define_resilience, "N+k headroom", path="resilience.lose_units", start=_start_resilience),
    Family("hardware_types", define_hardware_types, "hardware types", path="limits.max_hardware_types",
           start=_start_hardware_types),
    Family("pool_types", define_pool_types, "pool types per workload", path="limits.max_pool_types_per_workload",
           start=_start_pool_types),
    Family("brownfield", define_brownfield, "the deployed fleet and what changing it costs", path="existing",
           start=start_brownfield),
)
"""Every constraint family, in the order the builder defines them."""

BY_NAME = {f.name: f for f in FAMILIES}


def start_indicators(m, replicas, vals) -> None:
    """Each family's own variables in the start ``vals``, matched to replicas ``replicas(i, t)`` and the held units
    ``vals`` holds (families the model lacks are skipped)."""
    for f in FAMILIES:
        if f.start is not None and f.name in m._defined:
            f.start(m, replicas, vals)


def _slack_in(m, f: Family) -> bool:
    return f.slack is not None and hasattr(m, f.slack)


def shortfalls(m) -> list[str]:
    """On a solved elastic model: each limit whose slack had to relax, and by how much."""
    return [line for f in FAMILIES if _slack_in(m, f) and f.shortfall is not None for line in f.shortfall(m)]


def elastic_shortage(m):
    """The elastic objective's first term: the limits' slack, each over its limit."""
    return sum(f.shortage(m) for f in FAMILIES if _slack_in(m, f))


def limit_relaxations(data, plan) -> list[Relaxation]:
    """The limits' relaxations the analysis prices, family by family."""
    return [r for f in FAMILIES if f.relax is not None for r in f.relax(data, plan)]


def relaxed_parameter(m, r: Relaxation):
    """The model's parameter a relaxation raises."""
    p = getattr(m, BY_NAME[r.family].parameter)
    return p[r.target] if r.target is not None else p
