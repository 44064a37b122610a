"""A re-plan against the fleet that is deployed: the diff (units added and released per hardware; pools kept,
resized, retuned, reconfigured, re-engined, new or removed, with replicas before and after), the ordered steps
that take one fleet to the other without dropping capacity below demand, and the horizon's costs.

The steps add before they remove: units are provisioned first, new pools started (prefill before decode before
aggregated: a decode pool must exist before prefill hands it KV, and traffic is routed only once both are up),
traffic is routed to the new shares, retuned pools are restarted one replica at a time, old pools are drained
(prefill first, so no new request enters a pool about to go, then decode once its requests finish) and the
units they leave are released last. Each step states the units held, their $/h and each workload's capacity
against its demand.

``planner diff PLAN_A PLAN_B`` gives the same diff and steps for any two plans (:func:`plan_state`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict

from planner.catalog.fleet import DeployedPool

PoolStatus = Literal["kept", "resized", "retuned", "reconfigured", "re-engined", "new", "removed"]
ROLE_ORDER = {"prefill": 0, "decode": 1, "aggregated": 2}


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class UnitChange(_M):
    hardware: str
    before: int
    after: int
    added: int
    released: int


class PoolChange(_M):
    workload: str
    role: str
    hardware: str
    engine: str
    layout: str
    weights_dtype: str
    status: PoolStatus
    replicas_before: int
    replicas_after: int
    pool: str | None = None
    """The pool's id in the new plan (``None``: removed)."""
    old_pool: str | None = None
    """Its id in the deployed fleet (``None``: new)."""


class Step(_M):
    step: int
    action: str
    detail: str
    units: dict[str, int]
    """Units held per hardware during (after) the step."""
    usd_per_hour: float
    """What the units held cost per hour during the step (reservations released early are still paid)."""
    capacity_rps: dict[str, float]
    """Each workload's requests/s the pools up after the step carry (aggregated plus the lesser of prefill and
    decode); a workload whose deployed pools' rates are unknown is left out."""
    demand_rps: dict[str, float]
    ok: bool
    """Every workload's capacity at least its demand (the old fleet's demand before traffic is routed, the new
    demand after)."""


class HorizonCost(_M):
    horizon_months: float
    usd_per_hour: float
    """The plan's mean $/h over the horizon: units kept and added at what they cost, reservations paid whether
    kept or not, and the changes' one-off dollars spread over the horizon."""
    run_rate_usd_per_hour: float
    """The fleet's $/h once the change is done (what is paid per hour, changes left out)."""
    committed_usd_per_hour: float
    """Part of it paid whether the deployed units are kept or not (reservations' remaining terms)."""
    change_usd: float
    """One-off dollars of the change (units added and released, pools reconfigured or re-engined)."""
    total_usd: float
    """Over the horizon: ``usd_per_hour`` times its hours."""
    keep_usd: float | None = None
    """Over the horizon, keeping the deployed units as they are (no unit added or released, pools re-laid where
    that pays); ``None`` where they cannot serve the demand."""
    scratch_usd: float | None = None
    """Over the horizon, the from-scratch plan's units (the best plan ignoring the deployed fleet) with their
    change cost."""
    scratch_usd_per_hour: float | None = None
    """The from-scratch plan's $/h at the plan's prices (what a greenfield plan of this scenario says)."""


class Migration(_M):
    source: str
    start: str
    horizon_months: float
    lead_time_days: float = 0.0
    units: list[UnitChange]
    pools: list[PoolChange]
    steps: list[Step]
    cost: HorizonCost | None = None
    notes: list[str] = []


@dataclass
class FleetState:
    units: dict[str, int]
    pools: list[DeployedPool]
    demand: dict[str, float] = field(default_factory=dict)
    unit_usd: dict[str, float] = field(default_factory=dict)
    """$/h of one unit of each hardware (the steps' $/h at the plans' prices; a re-plan from a deployed fleet
    prices its steps again at what the deployed units cost)."""


def plan_state(plan) -> FleetState:
    """A plan's fleet (:class:`planner.results.Plan`) as a state to diff."""
    pools = [DeployedPool(p.workload, p.role, p.hardware, p.engine, p.layout.tp, p.layout.ep, p.layout.pp,
                          p.layout.attn_dp, p.weights_dtype, p.replicas, p.id, p.predicted.requests_per_s_per_replica,
                          (p.batch, p.kv_dtype, p.kv_tier, p.prefix_tier, p.spec_tokens), p.layout.notation)
             for p in plan.pools]
    units = {g.hardware: g.count for g in plan.units}
    usd = {g.hardware: g.usd_per_hour / max(g.count, 1) for g in plan.units}
    return FleetState(units, pools, {w.name: w.requests_per_s for w in plan.workloads}, usd)


def diff_units(old: FleetState, new: FleetState) -> list[UnitChange]:
    out = []
    for h in sorted(set(old.units) | set(new.units)):
        a, b = old.units.get(h, 0), new.units.get(h, 0)
        if a or b:
            out.append(UnitChange(hardware=h, before=a, after=b, added=max(b - a, 0), released=max(a - b, 0)))
    return out


def diff_pools(old: FleetState, new: FleetState) -> list[PoolChange]:
    """Each new pool matched to a deployed pool of its identity (workload, role, hardware, engine, layout; a
    deployed pool given without a weight format matches any), and each deployed pool left unmatched, removed."""
    left = list(old.pools)
    engines: dict[tuple[str, str], set[str]] = {}
    deployed_workloads = {p.workload for p in old.pools if p.replicas}
    for p in old.pools:
        engines.setdefault((p.workload, p.role), set()).add(p.engine)
    out = []
    for p in sorted(new.pools, key=_order):
        match = next((q for q in left if q.key[:-1] == p.key[:-1] and q.weights_dtype in ("", p.weights_dtype)), None)
        if match is not None:
            left.remove(match)
            status = "kept" if match.replicas == p.replicas else "resized"
            if match.tune is not None and p.tune is not None and match.tune != p.tune:
                status = "retuned"
        elif p.workload not in deployed_workloads:
            status = "new"
        elif p.engine in engines.get((p.workload, p.role), set()) or \
                any(p.engine in e for (w, _), e in engines.items() if w == p.workload):
            status = "reconfigured"
        else:
            status = "re-engined"
        out.append(_change(p, status, match.replicas if match else 0, p.replicas, p.pool_id,
                           match.pool_id if match else None))
    for q in left:
        if q.replicas:
            out.append(_change(q, "removed", q.replicas, 0, None, q.pool_id or None))
    return out


def _order(p: DeployedPool):
    return (p.workload, ROLE_ORDER.get(p.role, 3), p.hardware, p.pool_id)


def _change(p: DeployedPool, status: str, before: int, after: int, pool, old_pool) -> PoolChange:
    return PoolChange(workload=p.workload, role=p.role, hardware=p.hardware, engine=p.engine, layout=p.layout,
                      weights_dtype=p.weights_dtype, status=status, replicas_before=before, replicas_after=after,
                      pool=pool, old_pool=old_pool)


def capacity(pools: list[tuple[DeployedPool, int]]) -> dict[str, float]:
    """Requests/s per workload of pools up (each with its replicas): aggregated plus the lesser of prefill and
    decode; a workload with a pool of unknown rate is left out."""
    by: dict[str, dict[str, float]] = {}
    unknown = set()
    for p, n in pools:
        if n <= 0:
            continue
        if p.requests_per_s_per_replica is None:
            unknown.add(p.workload)
            continue
        d = by.setdefault(p.workload, {})
        d[p.role] = d.get(p.role, 0.0) + p.requests_per_s_per_replica * n
    return {w: d.get("aggregated", 0.0) + min(d.get("prefill", 0.0), d.get("decode", 0.0))
            for w, d in by.items() if w not in unknown}


def steps(old: FleetState, new: FleetState, changes: list[PoolChange], lead_time_days: float = 0.0) -> list[Step]:
    """The ordered steps from ``old`` to ``new`` (see the module docstring)."""
    new_by_id = {p.pool_id: p for p in new.pools}
    up: dict[tuple, tuple[DeployedPool, int]] = {("old", p.pool_id): (p, p.replicas) for p in old.pools}
    units = dict(old.units)
    out: list[Step] = []
    demand_before = dict(old.demand) or dict(new.demand)
    routed = False

    def usd() -> float:
        return sum(n * new.unit_usd.get(h, old.unit_usd.get(h, 0.0)) for h, n in units.items())

    def record(action: str, detail: str) -> None:
        cap = capacity(list(up.values()))
        dem = new.demand if routed else {w: demand_before.get(w, new.demand.get(w, 0.0)) for w in new.demand}
        ok = all(cap.get(w, float("inf")) >= d * (1 - 1e-9) for w, d in dem.items())
        out.append(Step(step=len(out) + 1, action=action, detail=detail, units={h: n for h, n in units.items() if n},
                        usd_per_hour=usd(), capacity_rps=cap, demand_rps=dict(dem), ok=ok))

    def key(c: PoolChange) -> tuple:
        return ("old", c.old_pool) if c.old_pool is not None else ("new", c.pool)

    adds = [(h, new.units.get(h, 0) - units.get(h, 0)) for h in sorted(new.units) if new.units.get(h, 0) > units.get(h, 0)]
    if adds:
        for h, n in adds:
            units[h] = units.get(h, 0) + n
        wait = f"; they take traffic after the {lead_time_days:g}-day lead time" if lead_time_days else ""
        record("provision units", ", ".join(f"{n} x {h}" for h, n in adds) + wait)
    for role in ("prefill", "decode", "aggregated"):
        mine = [c for c in changes if c.role == role and c.replicas_after > c.replicas_before]
        if not mine:
            continue
        for c in mine:
            up[key(c)] = (new_by_id[c.pool], c.replicas_after)
        record(f"start {role} pools", "; ".join(
            f"{c.pool} ({c.hardware}, {c.engine}, {c.layout}): {c.replicas_before} -> {c.replicas_after} replicas, "
            f"{c.status}" for c in mine))
    routed = True
    record("route traffic", "router weights to the new plan's shares (each pool's router_share); prefixes "
           "re-routed by family")
    for c in changes:
        if c.status == "retuned":
            record("restart retuned pool", f"{c.pool}: new launch flags, one replica at a time (capacity drops by one "
                   "replica while it restarts)")
    for role in ("prefill", "decode", "aggregated"):
        mine = [c for c in changes if c.role == role and c.replicas_after < c.replicas_before]
        if not mine:
            continue
        for c in mine:
            if c.replicas_after:
                up[key(c)] = (new_by_id[c.pool], c.replicas_after)
            else:
                up.pop(key(c), None)
        record(f"drain {role} pools", "; ".join(
            f"{c.old_pool or c.pool}: {c.replicas_before} -> {c.replicas_after} replicas "
            f"({'drain, then remove' if not c.replicas_after else 'drain the surplus replicas'})" for c in mine))
    drops = [(h, units.get(h, 0) - new.units.get(h, 0)) for h in sorted(units) if units.get(h, 0) > new.units.get(h, 0)]
    if drops:
        for h, n in drops:
            units[h] -= n
        record("release units", ", ".join(f"{n} x {h}" for h, n in drops) + " (after their pools have drained)")
    return out


def diff_plans(a, b) -> tuple[list[UnitChange], list[PoolChange], list[Step]]:
    """The diff and steps from plan ``a``'s fleet to plan ``b``'s (two :class:`planner.results.Plan`)."""
    old, new = plan_state(a), plan_state(b)
    changes = diff_pools(old, new)
    return diff_units(old, new), changes, steps(old, new, changes)


def peak_units(step_list: list[Step]) -> dict[str, int]:
    """Most units of each hardware held at once during the change."""
    out: dict[str, int] = {}
    for s in step_list:
        for h, n in s.units.items():
            out[h] = max(out.get(h, 0), n)
    return out
