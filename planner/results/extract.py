"""Solution -> :class:`~planner.results.schema.Plan`: pools with their predicted figures, router shares and
queueing at the planned load, and replicas packed into purchase units. After :func:`extract` nothing touches
Pyomo again.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from planner.catalog.scenario import ResolvedScenario
from planner.model.build import solution_values  # noqa: F401  (re-exported: plans are read from solved models)
from planner.model.data import PlanData
from planner.perf.candidates import packing_domain
from planner.perf.layout import describe_layout
from planner.results.schema import (
    ExpertPlacementOut,
    LayoutOut,
    MemoryPerChip,
    Objective,
    PlacedGroup,
    Plan,
    Pool,
    Predicted,
    SolverInfo,
    UnitGroup,
    UnitPlacement,
    WorkloadOut,
)
from planner.solve import SolveResult
from planner.units import HOUR_S, MTOK


def _expert_out(rs: ResolvedScenario, r) -> ExpertPlacementOut | None:
    moe = rs.model_for(str(r["workload"])).architecture.moe
    if moe is None or int(r["ep"]) <= 1:
        return None
    gpus = int(r["tp"]) * int(r["attn_dp"])
    red = int(r.get("redundant", 0))
    return ExpertPlacementOut(imbalance=float(r.get("moe_imbalance", 1.0)), redundant_experts=red, gpus=gpus,
                              slots_per_gpu=(moe.experts + red) // gpus)


def _pool_of(rs: ResolvedScenario, r, n: int, pid: str) -> Pool:
    """The pool of ``n`` replicas of candidate row ``r`` (its id ``pid``), its cost apportioned later."""
    sc = rs.scenario
    hw_by_id = {h.id: h for h in rs.hardware}
    w = next(w for w in sc.workloads if w.name == r["workload"])
    role = str(r["role"])
    rate = float(r["requests_per_s"])
    I = w.input_tokens * (1.0 - (w.prefix_cache.hit_rate if str(r["prefix_tier"]) != "none" else 0.0))
    hw = hw_by_id[str(r["hardware"])]
    spec_n = int(r["spec"]) if role != "prefill" else 0
    model = rs.model_for(w.name)
    return Pool(
        id=pid,
        role=role,
        workload=w.name,
        model=model.id,
        hardware=str(r["hardware"]),
        engine=str(r["engine"]),
        factors=str(r["factors"]),
        unvalidated=unvalidated(hw),
        physics=physics_path(hw),
        replicas=n,
        chips_per_replica=int(r["chips"]),
        slots_per_replica=float(r["slots"]),
        layout=LayoutOut(tp=int(r["tp"]), ep=int(r["ep"]), pp=int(r["pp"]), attn_dp=int(r["attn_dp"]),
                         redundant_experts=int(r.get("redundant", 0)),
                         notation=describe_layout(r["tp"], r["ep"], r["pp"], r["attn_dp"], r.get("redundant", 0))),
        scale_out=bool(r["scale_out"]),
        batch=int(r["batch"]),
        spec_tokens=spec_n,
        spec_method=model.speculative.method if spec_n and model.speculative else None,
        tokens_per_step=float(_tokens_per_step(model, hw, str(r["engine"]), spec_n)),
        two_batch_overlap=bool(int(r["tbo"])),
        weights_dtype=str(r["weights_dtype"]),
        weights_mode=str(r["weights_mode"]),
        kv_dtype=str(r["kv_dtype"]),
        kv_tier=str(r["kv_tier"]),
        prefix_tier=str(r["prefix_tier"]),
        prefix_cache_bytes_per_replica=float(r["prefix_bytes_per_replica"]),
        bound=str(r["bound"]),
        margin_derate=float(r.get("margin_derate", 1.0)),
        input_share=float(r["input_share"]),
        usd_per_hour=0.0,
        predicted=Predicted(
            ttft_s=float(r["ttft_s"]),
            tpot_s=float(r["tpot_s"]),
            requests_per_s=rate * n,
            input_tokens_per_s=rate * n * I if role != "decode" else 0.0,
            output_tokens_per_s=rate * n * w.output_tokens if role != "prefill" else 0.0,
            requests_per_s_per_replica=rate,
            ttft_at_capacity_s=float(r["ttft_s"]),
        ),
        memory_per_chip_bytes=MemoryPerChip(
            weights=float(r["weight_bytes_per_chip"]),
            kv=float(r["kv_bytes_per_chip"]),
            other=float(r["other_bytes_per_chip"]),
            capacity=float(r["hbm_bytes_per_chip"]),
            free=float(r["hbm_bytes_per_chip"] - r["weight_bytes_per_chip"] - r["kv_bytes_per_chip"] - r["other_bytes_per_chip"]),
            host_kv=float(r["host_kv_bytes_per_chip"]),
        ),
        expert_placement=_expert_out(rs, r),
    )


def extract(rs: ResolvedScenario, data: PlanData, x: dict[int, int], u: dict[str, int], solve: SolveResult) -> Plan:
    """Plan from integer replicas per candidate row and units per hardware."""
    sc = rs.scenario
    rows = data.rows
    hw_by_id = {h.id: h for h in rs.hardware}
    pools: list[Pool] = []
    queue: dict = {}
    order = sorted(x.items(), key=lambda kv: (str(rows.loc[kv[0], "workload"]), str(rows.loc[kv[0], "role"]), kv[0]))
    ids = pool_ids(rs, rows, [i for i, _ in order])
    for i, n in order:
        r = rows.loc[i]
        pools.append(_pool_of(rs, r, n, ids[i]))
        queue[ids[i]] = r
    _apply_load(sc.workloads, pools, queue)
    _router_shares(pools)
    placement, needed = pack(pools, {h: hw_by_id[h] for h in u})
    assumptions = list(data.notes)
    for h, k in needed.items():
        if k > u.get(h, 0):
            assumptions.append(f"{h}: placing the replicas took {k} units where the MILP counted {u.get(h, 0)}; the plan buys {k}")
            u[h] = k
    units = []
    for h, k in u.items():
        if k <= 0:
            continue
        hd = data.hardware[h]
        used = sum(p.chips_per_replica * p.replicas for p in pools if p.hardware == h)
        units.append(
            UnitGroup(
                hardware=h,
                kind=hd.unit_kind,
                count=k,
                chips=k * hd.chips_per_unit,
                chips_used=used,
                usd_per_hour=k * hd.usd_per_unit_hour,
                kw=None if hd.kw_per_chip is None else k * hd.chips_per_unit * hd.kw_per_chip,
            )
        )
    usd = sum(g.usd_per_hour for g in units)
    # Apportion each hardware's cost to its pools by the unit capacity they occupy (idle share pro rata).
    for g in units:
        mine = [p for p in pools if p.hardware == g.hardware]
        slots = sum(p.slots_per_replica * p.replicas for p in mine)
        for p in mine:
            p.usd_per_hour = g.usd_per_hour * p.slots_per_replica * p.replicas / slots if slots else 0.0
    objective = _objective(sc.workloads, pools, usd)
    workloads = [_workload_out(w, pools, rs.model_for(w.name).id) for w in sc.workloads]
    status = solve.status if solve.status in ("optimal", "feasible") else "feasible"
    return Plan(
        scenario={"name": sc.name, "model": rs.model.id, "models": [m.id for m in rs.models],
                  "path": str(rs.path) if rs.path else None},
        status=status,
        objective=objective,
        solver=SolverInfo(
            status=solve.status,
            termination=solve.termination,
            mip_gap=solve.mip_gap,
            wall_s=solve.wall_s,
            mip_gap_target=0.0,
            time_limit_s=0.0,
        ),
        units=units,
        pools=pools,
        workloads=workloads,
        placement=placement,
        assumptions=assumptions,
    )


def pool_ids(rs: ResolvedScenario, rows, order: list[int]) -> dict[int, str]:
    """Each used row's pool id, ``WORKLOAD-ROLE-N``. From a deployed fleet, a pool that is kept (the same
    identity: :func:`planner.catalog.fleet.pool_key`) keeps its deployed id, so a declarative apply updates it in
    place; the others take the next numbers no deployed pool holds."""
    from planner.perf.candidates import pool_keys

    fleet = rs.fleet
    out: dict[int, str] = {}
    taken: set[str] = set()
    if fleet is not None:
        keys = pool_keys(rows.loc[order]) if order else []
        free = [p for p in fleet.pools if p.pool_id]
        taken = {p.pool_id for p in fleet.pools if p.pool_id}
        for i, k in zip(order, keys, strict=True):
            match = next((p for p in free if p.key == k or p.key == (*k[:-1], "")), None)
            if match is not None:
                free.remove(match)
                out[i] = match.pool_id
    counts: dict[tuple[str, str], int] = {}
    for i in order:
        if i in out:
            continue
        w, role = str(rows.loc[i, "workload"]), str(rows.loc[i, "role"])
        n = counts.get((w, role), 0) + 1
        while f"{w}-{role}-{n}" in taken or f"{w}-{role}-{n}" in out.values():
            n += 1
        counts[(w, role)] = n
        out[i] = f"{w}-{role}-{n}"
    return out


TERM_NAMES = {"moe": "fused MoE layers", "all_reduce": "decode all-reduces",
              "exchange": "decode expert exchanges (dispatch and combine)", "attention": "decode attention"}


def _and(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) < 2 else f"{', '.join(names[:-1])} and {names[-1]}"


def physics_path(hw) -> str:
    """Which physics prices a pool on ``hw`` (see :attr:`Pool.physics`)."""
    kf = hw.efficiency.kernels
    if kf is None or not kf.compose:
        own = hw.efficiency.kernel_factors
        parts = ([f"{', '.join(own)} from {kf.system}'s own kernel curves"] if own and kf is not None else []) + (
            [f"{_and([TERM_NAMES[t] for t in kf.terms])} timed by {kf.system}'s own kernel curves"]
            if kf is not None and kf.terms else [])
        return "datasheet roofline with fitted factors" + (f" ({'; '.join(parts)})" if parts else "")
    return f"kernel curves ({kf.system}'s own kernels)"


def unvalidated(hw) -> str | None:
    """``unvalidated: factors transferred from X`` for hardware without measured rows of its own."""
    eff = hw.efficiency
    if eff.fitted_rows > 0:
        return None
    src = eff.transferred_from or "other hardware"
    n = sum(eff.engine_rows.values())
    if n:
        names = sorted({f for fs in eff.free_factors.values() for f in fs})
        return (f"unvalidated: factors transferred from {src}, {', '.join(names) or 'nothing'} anchored on {n} "
                f"measured row{'s' if n != 1 else ''} of {hw.id} (too few for a fit of its own)")
    return f"unvalidated: factors transferred from {src} (no measured rows for {hw.id})"


def _tokens_per_step(model, hw, engine: str, spec: int) -> float:
    if spec <= 0:
        return 1.0
    from planner.perf.roofline import Setup

    s = Setup.make(model, hw, eff=hw.efficiency.for_engine(engine), spec_tokens=float(spec), engine=engine)
    return float(np.asarray(s.tokens_per_step))


def role_loads(workloads, pools: list[Pool]) -> dict[tuple[str, str], float]:
    """Utilisation of each (workload, role) pool set under the plan's demand: traffic goes to aggregated
    and disaggregated capacity in proportion to their size, and each pool of a role carries its share of
    the role's traffic in proportion to its capacity."""
    out: dict[tuple[str, str], float] = {}
    for w in workloads:
        agg, pre, dec = served_requests(pools, w.name)
        dis = min(pre, dec)
        total = agg + dis
        if total <= 0:
            continue
        for role, cap, routed in (("aggregated", agg, w.requests_per_s * agg / total),
                                  ("prefill", pre, w.requests_per_s * dis / total),
                                  ("decode", dec, w.requests_per_s * dis / total)):
            if cap > 0:
                out[(w.name, role)] = min(routed / cap, 1.0)
    return out


def _router_shares(pools: list[Pool]) -> None:
    """Each pool's share of its workload's requests of its role, in proportion to capacity (all pools of a
    role run at the same utilisation that way)."""
    tot: dict[tuple[str, str], float] = defaultdict(float)
    for p in pools:
        tot[(p.workload, p.role)] += p.predicted.requests_per_s
    for p in pools:
        t = tot[(p.workload, p.role)]
        p.router_share = p.predicted.requests_per_s / t if t > 0 else 0.0


def _apply_load(workloads, pools: list[Pool], queue: dict) -> None:
    """Set each pool's utilisation and its latency at that load (the candidate row's TTFT is at capacity): TTFT
    at the SLO's quantile, and p50/p90/p99 of TTFT, TPOT and ITL (``perf/latency.py``)."""
    from planner.perf.latency import pool_latency, workload_tail
    from planner.results.schema import Latency, Percentiles

    loads = role_loads(workloads, pools)
    by_name = {w.name: w for w in workloads}
    for p in pools:
        u = loads.get((p.workload, p.role), 1.0)
        p.predicted.utilisation = u
        w = by_name[p.workload]
        lam = u * p.predicted.requests_per_s_per_replica
        lat = pool_latency(queue[p.id], workload_tail(w), lam, w.slo.ttft_s, w.slo.tpot_s,
                           p.batch if p.role == "aggregated" else 0, p.batch if p.role == "decode" else 0)
        first = p.role != "decode"
        p.predicted.latency = Latency(
            ttft=_pct(lat["ttft_p"]) if first else Percentiles(), ttft_mean_s=lat["ttft_mean"] if first else 0.0,
            tpot=_pct(lat["tpot_p"]), tpot_slo_s=lat["tpot_slo"], itl=_pct(lat["itl_p"]),
            ttft_attainment=lat["ttft_ok"],
            tpot_attainment=lat["tpot_ok"] if p.role != "prefill" else 1.0,
            ttft_base_s=float(queue[p.id]["ttft_base_s"]), prefill_work_s=float(queue[p.id]["queue_work_s"]),
            prefill_servers=float(queue[p.id]["queue_servers"]), tpot_cv=float(queue[p.id]["tpot_cv"]),
            chunk_share=float(queue[p.id]["chunk_share"]))
        if p.role != "decode":
            p.predicted.ttft_s = lat["ttft_slo"]


def _pct(v):
    from planner.results.schema import Percentiles

    return Percentiles(p50=v[0], p90=v[1], p99=v[2])


def attainment(pools: list[Pool], workload: str) -> tuple[float, float, float]:
    """(TTFT, TPOT, both) attainment of a workload's requests: its pools weighted by the traffic each carries;
    a disaggregated request meets TTFT at a prefill pool and TPOT at a decode pool, drawn by their shares."""
    mine = [p for p in pools if p.workload == workload]

    def weighted(role, attr):
        tot = sum(p.predicted.requests_per_s * p.predicted.utilisation for p in mine if p.role == role)
        val = sum(p.predicted.requests_per_s * p.predicted.utilisation * getattr(p.predicted.latency, attr)
                  for p in mine if p.role == role)
        return tot, (val / tot if tot > 0 else 1.0)

    n_agg, a_ttft = weighted("aggregated", "ttft_attainment")
    _, a_tpot = weighted("aggregated", "tpot_attainment")
    n_pre, d_ttft = weighted("prefill", "ttft_attainment")
    _, d_slot = weighted("decode", "ttft_attainment")  # the hand-over finds a decode slot free at once
    d_ttft *= d_slot
    _, d_tpot = weighted("decode", "tpot_attainment")
    both_agg = 0.0
    tot = sum(p.predicted.requests_per_s * p.predicted.utilisation for p in mine if p.role == "aggregated")
    if tot > 0:
        both_agg = sum(p.predicted.requests_per_s * p.predicted.utilisation * p.predicted.latency.ttft_attainment
                       * p.predicted.latency.tpot_attainment for p in mine if p.role == "aggregated") / tot
    n = n_agg + n_pre
    if n <= 0:
        return 1.0, 1.0, 1.0
    f = n_agg / n
    return (f * a_ttft + (1 - f) * d_ttft, f * a_tpot + (1 - f) * d_tpot, f * both_agg + (1 - f) * d_ttft * d_tpot)


def _objective(workloads, pools: list[Pool], usd: float) -> Objective:
    tin = sum(w.requests_per_s * w.input_tokens for w in workloads)
    tout = sum(w.requests_per_s * w.output_tokens for w in workloads)
    cin = sum(p.usd_per_hour * p.input_share for p in pools)
    cout = usd - cin
    per = HOUR_S / MTOK
    return Objective(
        usd_per_hour=usd,
        usd_per_mtok=usd / ((tin + tout) * per),
        usd_per_mtok_input=cin / (tin * per) if tin else 0.0,
        usd_per_mtok_output=cout / (tout * per) if tout else 0.0,
    )


def served_requests(pools: list[Pool], workload: str) -> tuple[float, float, float]:
    """(aggregated, prefill, decode) request capacity of a workload's pools."""
    tot = {"aggregated": 0.0, "prefill": 0.0, "decode": 0.0}
    for p in pools:
        if p.workload == workload:
            tot[p.role] += p.predicted.requests_per_s
    return tot["aggregated"], tot["prefill"], tot["decode"]


def _workload_out(w, pools: list[Pool], model: str) -> WorkloadOut:
    mine = [p for p in pools if p.workload == w.name]
    agg, pre, dec = served_requests(pools, w.name)
    ttft = max([p.predicted.ttft_s for p in mine if p.role != "decode"], default=0.0)
    tpot = max([p.predicted.latency.tpot_slo_s or p.predicted.tpot_s for p in mine if p.role != "prefill"], default=0.0)
    a_ttft, a_tpot, both = attainment(pools, w.name)
    roles = {p.role for p in mine}
    serving = "aggregated" if roles == {"aggregated"} else "disaggregated" if "aggregated" not in roles else "mixed"
    ws = w.prefix_cache.working_set_gb * 1e9 if w.prefix_cache.hit_rate > 0 else 0.0
    raw = defaultdict(float)
    for p in mine:
        raw[p.role] += p.predicted.requests_per_s * p.margin_derate
    derated = any(p.margin_derate != 1.0 for p in mine)
    return WorkloadOut(
        name=w.name,
        model=model,
        requests_per_s=w.requests_per_s,
        served_requests_per_s=agg + min(pre, dec),
        served_at_prediction_rps=raw["aggregated"] + min(raw["prefill"], raw["decode"]) if derated else None,
        input_tokens=w.input_tokens,
        output_tokens=w.output_tokens,
        ttft_s=ttft,
        tpot_s=tpot,
        slo_ttft_s=w.slo.ttft_s,
        slo_tpot_s=w.slo.tpot_s,
        slo_ttft_quantile=w.slo.ttft_q,
        slo_tpot_quantile=w.slo.tpot_q,
        slo_goodput=w.slo.goodput,
        input_spread=w.input_spread,
        output_spread=w.output_spread,
        ttft_attainment=a_ttft,
        tpot_attainment=a_tpot,
        goodput=both,
        serving=serving,
        prefix_working_set_bytes=ws,
        prefix_capacity_bytes=sum(p.prefix_cache_bytes_per_replica * p.replicas for p in mine if p.prefix_tier != "none"),
    )


def pack(pools: list[Pool], hardware: dict) -> tuple[list[UnitPlacement], dict[str, int]]:
    """Place every replica's stage groups (``tp * attn_dp`` chips each) into packing domains, first fit by
    decreasing size, then domains into purchase units. Returns the map, runs of identical units compressed
    into one entry each, and the units it needs.

    Linear in the number of group kinds, not of replicas: identical groups are placed by count (a fleet of
    a million replicas packs in microseconds), domains are kept as patterns with multiplicities.
    """
    out: list[UnitPlacement] = []
    needed: dict[str, int] = {}
    for h, hw in hardware.items():
        D = packing_domain(hw)
        per_unit = hw.purchase_unit.chips_per_unit // D
        kinds: list[tuple[int, str, int, int]] = []  # (group chips, pool, stage, count)
        for p in pools:
            if p.hardware == h and p.replicas > 0:
                g = p.layout.tp * p.layout.attn_dp
                kinds += [(g, p.id, st, p.replicas) for st in range(1, p.layout.pp + 1)]
        kinds.sort(key=lambda t: -t[0])
        # Domain patterns: [groups: tuple of (pool, stage, chips, n), free chips, count of such domains]
        pats: list[list] = []
        for g, pid, st, n in kinds:
            if g > D:
                k = math.ceil(g / D)
                for j in range(k):
                    c = min(D, g - j * D)
                    pats.append([((pid, st, c, 1),), D - c, n])
                continue
            left = n
            i = 0
            while left > 0 and i < len(pats):
                groups, free, cnt = pats[i]
                take = free // g
                if take <= 0:
                    i += 1
                    continue
                full = min(cnt, left // take)
                part = left - full * take if full < cnt else 0
                new = []
                if full:
                    new.append([groups + ((pid, st, g, take),), free - take * g, full])
                if part:
                    new.append([groups + ((pid, st, g, part),), free - part * g, 1])
                rest = cnt - full - (1 if part else 0)
                if rest:
                    new.append([groups, free, rest])
                left -= full * take + part
                pats[i:i + 1] = new
                i += len(new) - (1 if rest else 0)
            if left > 0:
                per = D // g
                full, part = divmod(left, per)
                if full:
                    pats.append([((pid, st, g, per),), D - per * g, full])
                if part:
                    pats.append([((pid, st, g, part),), D - part * g, 1])
        domains_total = sum(c for _, _, c in pats)
        n_units = math.ceil(domains_total / per_unit) if domains_total else 0
        needed[h] = n_units
        out += _units_of(h, pats, per_unit)
    return out, needed


def _units_of(h: str, pats: list[list], per_unit: int) -> list[UnitPlacement]:
    """Group domain patterns (with multiplicities) into purchase units of ``per_unit`` domains, runs of
    identical units compressed; replica numbers follow placement order per (pool, stage)."""
    counter: dict[tuple[str, int], int] = defaultdict(int)
    out: list[UnitPlacement] = []
    unit_no = 1
    buf: list[tuple] = []  # domain patterns (groups) of the unit being filled

    def groups_of(doms: list[tuple], times: int) -> list[list[PlacedGroup]]:
        """Domains of one unit (first of ``times`` identical ones), advancing the replica counters."""
        per: dict[tuple[str, int], int] = defaultdict(int)
        res = []
        for groups in doms:
            dom = []
            for pid, st, c, n in groups:
                for _ in range(n):
                    dom.append(PlacedGroup(pool=pid, replica=counter[(pid, st)] + per[(pid, st)] + 1, stage=st, chips=c))
                    per[(pid, st)] += 1
            res.append(dom)
        for key, n in per.items():
            counter[key] += n * times
        return res

    for groups, _free, cnt in pats:
        left = cnt
        while left > 0:
            if buf:
                take = min(per_unit - len(buf), left)
                buf += [groups] * take
                left -= take
                if len(buf) == per_unit:
                    out.append(UnitPlacement(hardware=h, unit=unit_no, count=1, domains=groups_of(buf, 1)))
                    unit_no += 1
                    buf = []
                continue
            whole = left // per_unit
            if whole:
                out.append(UnitPlacement(hardware=h, unit=unit_no, count=whole, domains=groups_of([groups] * per_unit, whole)))
                unit_no += whole
                left -= whole * per_unit
            if left:
                buf = [groups] * left
                left = 0
    if buf:
        out.append(UnitPlacement(hardware=h, unit=unit_no, count=1, domains=groups_of(buf, 1)))
    return out

