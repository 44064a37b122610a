"""The deployment MILP (Pyomo), one ``define_*`` function per constraint family.

Decisions
    ``x[r]``  integer replicas of candidate row ``r`` (each row belongs to one workload, role and
              hardware);
    ``u[h]``  integer purchase units (8-GPU nodes, NVL72 racks, TPU slices) of hardware ``h``;
    ``s_agg[w]``, ``s_dis[w]`` requests/s of workload ``w`` served by aggregated and by
              disaggregated pools, in units of ``rate_unit`` requests/s.

Objective: dollars per hour of the purchase units, plus ``EPSILON`` times the dollars of the chips
replicas occupy (among fleets of equal price, the one with no idle replicas).

Inputs that sweeps change are mutable parameters (demand, prices, limits, working sets), so a sweep
builds once and re-solves. With ``elastic=True`` every limit (power, budget, units per hardware) gets
a priced slack variable; the solution then says which limit is short and by how much.
"""

from __future__ import annotations

import numpy as np
import pyomo.core as pyo

from planner.model.data import PlanData, row_arrays

EPSILON = 1e-6
ELASTIC_WEIGHT = 1e6


def build_model(data: PlanData, *, elastic: bool = False) -> pyo.ConcreteModel:
    m = pyo.ConcreteModel(name="deployment")
    m._data = data
    m._arr = row_arrays(data)
    m._unit = rate_unit(data)
    m._elastic = elastic
    define_sets(m, data)
    define_parameters(m, data)
    define_variables(m, data)
    define_demand_coverage(m)
    define_rate_matching(m)
    define_unit_packing(m)
    define_inventory(m)
    define_power(m)
    define_budget(m)
    define_prefix_cache_capacity(m)
    define_resilience(m)
    define_simplicity(m)
    define_objective(m)
    define_workload_blocks(m)
    return m


def rate_unit(data: PlanData) -> float:
    """Requests/s per unit of the demand and capacity terms: a power of ten that brings the largest demand to
    between 100 and 1000 units, so no coefficient of the MILP nears the solver's infinity (HiGHS reads values
    of 1e20 and above as infinite) or its feasibility tolerance, whatever the scenario's scale: a demand of
    1e-6 req/s is as well posed as one of 1e6 (the scenario bounds the spread between workloads,
    ``MIN_DEMAND_SHARE``)."""
    top = max((w.requests_per_s for w in data.workloads.values()), default=1.0)
    return float(10.0 ** (int(np.floor(np.log10(max(top, 1e-300)))) - 3))


def define_sets(m, data: PlanData) -> None:
    m.R = pyo.Set(initialize=range(len(data.rows)), ordered=True, doc="candidate rows")
    m.H = pyo.Set(initialize=list(data.hardware), ordered=True, doc="hardware systems")
    m.W = pyo.Set(initialize=list(data.workloads), ordered=True, doc="workloads")
    a = m._arr
    m._rows_of = {}
    for i in range(len(data.rows)):
        m._rows_of.setdefault(("role", a["workload"][i], a["role"][i]), []).append(i)
        m._rows_of.setdefault(("hw", a["hardware"][i]), []).append(i)
        if a["prefix"][i]:
            m._rows_of.setdefault(("prefix", a["workload"][i]), []).append(i)


def define_parameters(m, data: PlanData) -> None:
    hw, wl = data.hardware, data.workloads
    m.demand = pyo.Param(m.W, mutable=True, initialize={w: wl[w].requests_per_s for w in m.W}, doc="requests/s")
    m.working_set_gb = pyo.Param(m.W, mutable=True, initialize={w: wl[w].working_set_bytes / 1e9 for w in m.W})
    m.usd_per_chip_hour = pyo.Param(m.H, mutable=True, initialize={h: hw[h].usd_per_chip_hour for h in m.H})
    big = 10**9
    m.max_units = pyo.Param(
        m.H, mutable=True, initialize={h: big if hw[h].max_units is None else hw[h].max_units for h in m.H}
    )
    m.power_limit_kw = pyo.Param(mutable=True, initialize=data.power_kw if data.power_kw is not None else 1e12)
    m.budget_usd_per_hour = pyo.Param(
        mutable=True, initialize=data.budget_usd_per_hour if data.budget_usd_per_hour is not None else 1e12
    )


def define_variables(m, data: PlanData) -> None:
    m.x = pyo.Var(m.R, within=pyo.NonNegativeIntegers, doc="replicas per candidate row")
    m.u = pyo.Var(m.H, within=pyo.NonNegativeIntegers, doc="purchase units per hardware")
    define_streams(m, data, m.W)
    if m._elastic:
        m.extra_units = pyo.Var(m.H, within=pyo.NonNegativeReals)
        m.extra_kw = pyo.Var(within=pyo.NonNegativeReals)
        m.extra_usd = pyo.Var(within=pyo.NonNegativeReals)


def define_streams(m, data: PlanData, *index) -> None:
    """``s_agg`` and ``s_dis`` over ``index`` (workloads, or workloads x periods): requests/s served by
    aggregated and by disaggregated pools; fixed at 0 where the candidate table has no row of that kind."""
    m.s_agg = pyo.Var(*index, within=pyo.NonNegativeReals, doc="requests/s served by aggregated pools")
    m.s_dis = pyo.Var(*index, within=pyo.NonNegativeReals, doc="requests/s served by disaggregated pools")
    if "aggregated" not in data.roles:
        for k in m.s_agg:
            m.s_agg[k].fix(0)
    if "prefill" not in data.roles or "decode" not in data.roles:
        for k in m.s_dis:
            m.s_dis[k].fix(0)


def _coef(m, name: str) -> list[float]:
    """A row array as Python floats (rates in rate units): Pyomo builds expressions from them several times
    faster than from NumPy scalars, which go through NumPy's ufunc dispatch on every product."""
    cache = getattr(m, "_coefs", None)
    if cache is None:
        cache = m._coefs = {}
    if name not in cache:
        arr = m._arr["rate"] / m._unit if name == "rate" else m._arr[name]
        cache[name] = [float(v) for v in arr]
    return cache[name]


def _served(m, w, role):
    rate = _coef(m, "rate")
    return sum(rate[i] * m.x[i] for i in m._rows_of.get(("role", w, role), []))


def define_demand_coverage(m) -> None:
    """Each workload's traffic is served, by aggregated pools, disaggregated pools or both (in units of
    ``rate_unit`` requests/s)."""

    def rule(m, w):
        return m.s_agg[w] + m.s_dis[w] >= m.demand[w] / m._unit

    m.demand_coverage = pyo.Constraint(m.W, rule=rule)


def define_rate_matching(m) -> None:
    """Aggregated pools carry what they are assigned; a disaggregated stream needs as much prefill
    capacity as decode capacity (every request passes through both pools)."""

    def agg(m, w):
        if m.s_agg[w].fixed:
            return pyo.Constraint.Skip
        return _served(m, w, "aggregated") >= m.s_agg[w]

    def pre(m, w):
        if m.s_dis[w].fixed:
            return pyo.Constraint.Skip
        return _served(m, w, "prefill") >= m.s_dis[w]

    def dec(m, w):
        if m.s_dis[w].fixed:
            return pyo.Constraint.Skip
        return _served(m, w, "decode") >= m.s_dis[w]

    m.aggregated_capacity = pyo.Constraint(m.W, rule=agg)
    m.prefill_capacity = pyo.Constraint(m.W, rule=pre)
    m.decode_capacity = pyo.Constraint(m.W, rule=dec)


def define_unit_packing(m) -> None:
    """Replicas fit in whole purchase units: the chips of capacity they occupy (their TP x EP groups
    rounded to what a scale-up domain can hold, see ``perf.candidates.slots_per_replica``) do not
    exceed the chips of the units bought."""
    slots = _coef(m, "slots")

    def rule(m, h):
        rows = m._rows_of.get(("hw", h), [])
        return sum(slots[i] * m.x[i] for i in rows) <= m._data.hardware[h].chips_per_unit * m.u[h]

    m.unit_packing = pyo.Constraint(m.H, rule=rule)


def define_inventory(m) -> None:
    """At most ``limits.max_units`` purchase units per hardware that has a limit (a mutable parameter;
    to leave a hardware out altogether, fix its ``u`` to 0)."""

    def rule(m, h):
        if m._data.hardware[h].max_units is None:
            return pyo.Constraint.Skip
        extra = m.extra_units[h] if m._elastic else 0
        return m.u[h] <= m.max_units[h] + extra

    m.inventory = pyo.Constraint(m.H, rule=rule)


def fleet_kw(m):
    hw = m._data.hardware
    return sum((hw[h].kw_per_chip or 0.0) * hw[h].chips_per_unit * m.u[h] for h in m.H)


def fleet_usd_per_hour(m):
    return sum(m.usd_per_chip_hour[h] * m._data.hardware[h].chips_per_unit * m.u[h] for h in m.H)


def define_power(m) -> None:
    """All-in power of the units bought within ``limits.power_kw``."""
    if m._data.power_kw is None:
        return
    extra = m.extra_kw if m._elastic else 0
    m.power = pyo.Constraint(expr=fleet_kw(m) <= m.power_limit_kw + extra)


def define_budget(m) -> None:
    """Dollars per hour within ``limits.budget_usd_per_hour``."""
    if m._data.budget_usd_per_hour is None:
        return
    extra = m.extra_usd if m._elastic else 0
    m.budget = pyo.Constraint(expr=fleet_usd_per_hour(m) <= m.budget_usd_per_hour + extra)


def define_prefix_cache_capacity(m) -> None:
    """Each pool that reuses cached prefixes holds the prefixes of the traffic routed to it: prefixes are
    routed by family, so a replica planned for a share ``rate / demand`` of a workload's traffic holds that
    share of its working set in its own tier (free HBM, host DRAM or flash), ``pcap / working_set >= rate /
    demand`` per replica (both sides dimensionless); capacity in one pool's tier never serves another pool's
    traffic.

    The condition is one row's alone, so it is a bound, not a constraint: ``x[r] <= 0`` where it fails, set by
    :func:`apply_prefix_capacity` from the parameters as they stand whenever the model is checked or handed to
    the solver (``m._refresh``), so a change of demand or working set is followed. Written as the equivalent
    constraint ``(pcap / working_set - rate / demand) x[r] >= 0`` it cost Pyomo an expression with mutable
    coefficients per row to build, load and scan for changes on every re-solve."""
    a = m._arr
    m._prefix_rows = {w: np.asarray(m._rows_of.get(("prefix", w), []), dtype=int) for w in m.W}
    m._prefix_ok = np.ones(len(a["rate"]), dtype=bool)
    m._refresh = apply_prefix_capacity
    apply_prefix_capacity(m)


def prefix_rows_hold(m, w: str, rows: np.ndarray) -> np.ndarray:
    """Whether one replica of each of ``rows`` (of workload ``w``) holds its share of ``w``'s prefix working
    set at the demand and working set the model's parameters hold now (rows that reuse no prefixes do)."""
    a = m._arr
    ws, demand = pyo.value(m.working_set_gb[w]), pyo.value(m.demand[w])
    if ws <= 0 or not len(rows):
        return np.ones(len(rows), dtype=bool)
    return ~a["prefix"][rows] | (a["pcap"][rows] / 1e9 / ws >= a["rate"][rows] / max(demand, 1e-30) * (1 - 1e-9))


def prefix_bounds_move(m, w: str) -> bool:
    """Whether the demand and working set the parameters hold now change which of ``w``'s rows may be used
    (the prefix-capacity bounds last applied): where not, a change of ``w``'s working set leaves the model as it
    was (it enters no other constraint)."""
    rows = getattr(m, "_prefix_rows", {}).get(w)
    if rows is None or not len(rows):
        return False
    return bool(_prefix_verdicts(m, w, rows)[1].any())


def _prefix_verdicts(m, w: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of ``w``'s prefix ``rows``: whether each holds its share now, and whether that differs from the bound
    last applied."""
    ok = prefix_rows_hold(m, w, rows)
    return ok, ok != m._prefix_ok[rows]


def apply_prefix_capacity(m) -> None:
    """Set the prefix-capacity bounds of :func:`define_prefix_cache_capacity` from the parameters as they
    stand: upper bound 0 on the replicas of a row that cannot hold its share, none on the others (only the
    rows whose verdict changed are touched)."""
    for w, rows in getattr(m, "_prefix_rows", {}).items():
        ok, moved = _prefix_verdicts(m, w, rows)
        for i, good in zip(rows[moved].tolist(), ok[moved].tolist(), strict=True):
            m.x[i].setub(None if good else 0)
        m._prefix_ok[rows] = ok


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


def define_resilience(m) -> None:
    """N+k: with ``k = lose_units``, for every workload ``w``, role ``r`` and hardware ``h`` it uses
    (``y[w,r,h] = 1``; ``capacity[w,r,h] <= M y``)::

        capacity[w, r] - k * L[w, r, h] * y[w, r, h] >= stream[w, r]

    where ``L`` (:func:`unit_loss`) bounds what one unit of ``h`` carries. Losing ``k`` units of one
    hardware takes at most ``k L``; losing units of several takes at most ``k`` times the largest ``L``;
    so every loss of ``k`` units leaves each role's stream (aggregated, or prefill and decode) served."""
    k = m._data.lose_units
    if not k:
        return
    a = m._arr
    keys = []
    for (kind, *rest), rows in m._rows_of.items():
        if kind != "role":
            continue
        w, role = rest
        for h in sorted({a["hardware"][i] for i in rows}):
            keys.append((w, role, h))
    m.RES = pyo.Set(initialize=keys, dimen=3, ordered=True, doc="(workload, role, hardware) that may lose a unit")
    m.uses = pyo.Var(m.RES, within=pyo.Binary, doc="the role of the workload runs on the hardware")
    m._loss = {key: unit_loss(m, *key) for key in keys}

    def cap(w, role, h):
        rate = _coef(m, "rate")
        return sum(rate[i] * m.x[i] for i in m._rows_of[("role", w, role)] if a["hardware"][i] == h)

    def use(m, w, role, h):
        big = 1e6 + 10.0 * k * m._loss[(w, role, h)]  # rate units: demand is at most ~1000 of them (rate_unit)
        return cap(w, role, h) <= big * m.uses[w, role, h]

    def survive(m, w, role, h):
        stream = m.s_agg[w] if role == "aggregated" else m.s_dis[w]
        return _served(m, w, role) - k * m._loss[(w, role, h)] * m.uses[w, role, h] >= stream

    m.uses_link = pyo.Constraint(m.RES, rule=use)
    m.resilience = pyo.Constraint(m.RES, rule=survive)


def define_simplicity(m) -> None:
    """Operational simplicity (each part only where the scenario asks for it):

    - ``sum_h v[h] <= max_hardware_types`` with ``u[h] <= U v[h]`` (``v`` binary: hardware ``h`` is bought);
    - ``sum_{r of w} z[r] <= max_pool_types_per_workload`` with ``x[r] <= X_r z[r]`` (``z`` binary: row ``r``,
      a pool type, is used); each used pool type costs ``pool_type_usd_per_hour`` in the objective.

    ``U`` is the hardware's unit limit (else 10^7 units); ``X_r`` is ten times the replicas row ``r`` needs
    to carry its workload's whole demand, ``k + 1`` times over with ``resilience.lose_units = k``."""
    d = m._data
    if d.max_hardware_types is not None:
        m.hw_used = pyo.Var(m.H, within=pyo.Binary, doc="hardware bought at all")
        m.hw_used_link = pyo.Constraint(
            m.H, rule=lambda m, h: m.u[h] <= (d.hardware[h].max_units or 10**7) * m.hw_used[h])
        m.hardware_types = pyo.Constraint(expr=sum(m.hw_used[h] for h in m.H) <= d.max_hardware_types)
    if d.max_pool_types_per_workload is None and not d.pool_type_usd_per_hour:
        return
    a = m._arr
    rate = a["rate"] / m._unit
    m.row_used = pyo.Var(m.R, within=pyo.Binary, doc="candidate row (pool type) used")

    def link(m, i):
        need = pyo.value(m.demand[a["workload"][i]]) / m._unit * (d.lose_units + 1) / max(rate[i], 1e-12)
        return m.x[i] <= (10.0 * np.ceil(need) + 10.0) * m.row_used[i]

    m.row_used_link = pyo.Constraint(m.R, rule=link)
    if d.max_pool_types_per_workload is not None:
        def per_workload(m, w):
            rows = [i for (kind, *rest), rs in m._rows_of.items() if kind == "role" and rest[0] == w for i in rs]
            return sum(m.row_used[i] for i in rows) <= d.max_pool_types_per_workload

        m.pool_types = pyo.Constraint(m.W, rule=per_workload)


def define_workload_blocks(m) -> None:
    """Declare the workloads as the model's blocks for :mod:`planner.block_floors`: workload ``w``'s variables
    (its rows' replicas and pool-type indicators, its streams, its N+k indicators) and its cost, the dollars of the
    chips its replicas occupy at the prices the parameters hold now, ``chip_w = sum_{r of w} p_h(r) slots_r x_r``.

    Workloads share only the purchase units, so the least ``chip_w`` that ``w``'s own rows allow is a floor every
    plan meets. And every plan's objective is at least ``sum_w chip_w`` (unit packing: ``p_h chips_per_unit u_h
    >= p_h sum_{r on h} slots_r x_r``; the tie-break and pool-type costs are not negative), which gives each
    ``chip_w`` a ceiling below a known plan's cost (``_objective_covers_blocks``). An elastic model's objective
    weighs the limits' slack first, so it declares only the floors.

    Each workload is also a cover (``_block_covers``, for :mod:`planner.block_master`): its demand-coverage row
    over its streams, the aggregated stream with its one capacity row, the disaggregated one with its prefill and
    decode rows. The module checks on the rows that nothing else (N+k, pool types) touches the workload."""
    a = m._arr
    rows_of: dict[str, list[int]] = {}
    for i in m.R:
        rows_of.setdefault(a["workload"][i], []).append(i)
    extra: dict[str, list] = {w: [m.s_agg[w], m.s_dis[w]] for w in m.W}
    if hasattr(m, "uses"):
        for key in m.RES:
            extra[key[0]].append(m.uses[key])
    row_used = getattr(m, "row_used", None)
    slots, hw = _coef(m, "slots"), a["hardware"]

    def blocks():
        price = {h: float(pyo.value(m.usd_per_chip_hour[h])) for h in m.H}
        out = []
        for w in m.W:
            rows = rows_of.get(w, [])
            variables = [m.x[i] for i in rows] + extra[w]
            coefs = [price[hw[i]] * slots[i] for i in rows] + [0.0] * len(extra[w])
            if row_used is not None:
                variables += [row_used[i] for i in rows]
                coefs += [0.0] * len(rows)
            out.append((variables, coefs))
        return out

    m._blocks = blocks
    m._objective_covers_blocks = not m._elastic

    def covers():
        out = []
        for w in m.W:
            streams = []
            for s, stages in ((m.s_agg[w], [m.aggregated_capacity]), (m.s_dis[w], [m.prefill_capacity, m.decode_capacity])):
                rows = [c[w] for c in stages if w in c and c[w].active]
                if rows:
                    streams.append((s, rows))
            out.append((m.demand_coverage[w], streams))
        return out

    m._block_covers = covers


def define_objective(m) -> None:
    m.cost = pyo.Objective(expr=objective_expr(m), sense=pyo.minimize)


def objective_expr(m):
    """The objective at the prices the model's parameters hold now. The fleet's dollars follow the price
    parameters; the tie-break's coefficients are numbers (one per candidate row: as mutable coefficients Pyomo
    re-evaluated and re-sent every one of them before each re-solve), so :func:`update_parameters` rebuilds the
    objective where a price changes."""
    hw, slots = m._arr["hardware"], _coef(m, "slots")
    price = {h: float(pyo.value(m.usd_per_chip_hour[h])) for h in m.H}
    chip_usd = sum(EPSILON * slots[i] * price[hw[i]] * m.x[i] for i in m.R)
    cost = fleet_usd_per_hour(m) + chip_usd
    if hasattr(m, "row_used") and m._data.pool_type_usd_per_hour:
        cost = cost + m._data.pool_type_usd_per_hour * sum(m.row_used[i] for i in m.R)
    if m._elastic:
        hw = m._data.hardware
        short = sum(m.extra_units[h] / max(1, hw[h].max_units or 1) for h in m.H)
        if m._data.power_kw is not None:
            short += m.extra_kw / m.power_limit_kw
        if m._data.budget_usd_per_hour is not None:
            short += m.extra_usd / m.budget_usd_per_hour
        cost = ELASTIC_WEIGHT * short + cost / 1e6
    return cost


def update_parameters(m: pyo.ConcreteModel, data: PlanData) -> None:
    """Set every mutable parameter of a built model from ``data`` (same rows, hardware and
    workloads; the structure must match): demand, prefix working sets, prices, unit limits, power
    and budget. A persistent solver then re-solves without a rebuild. The candidate rows were pruned for a
    range of working set per request/s (``CandidatePool.shares``; a sweep passes the range of its points):
    demand or working sets that leave it may need rows the pruning dropped, so build from a pool evaluated
    for them."""
    for w in m.W:
        wd = data.workloads[w]
        m.demand[w] = wd.requests_per_s
        m.working_set_gb[w] = wd.working_set_bytes / 1e9
    repriced = False
    for h in m.H:
        hd = data.hardware[h]
        repriced |= pyo.value(m.usd_per_chip_hour[h]) != hd.usd_per_chip_hour
        m.usd_per_chip_hour[h] = hd.usd_per_chip_hour
        m.max_units[h] = 10**9 if hd.max_units is None else hd.max_units
    if repriced:
        m.cost.set_value(objective_expr(m))  # the tie-break's coefficients are numbers (see objective_expr)
    m.power_limit_kw = data.power_kw if data.power_kw is not None else 1e12
    m.budget_usd_per_hour = data.budget_usd_per_hour if data.budget_usd_per_hour is not None else 1e12
