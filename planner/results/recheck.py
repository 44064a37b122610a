""":func:`recheck`: a plan re-evaluated with ``perf/`` alone (layouts, memory, SLOs at the predicted rate, coverage,
placement, units and the limits the registry's families re-check), and what losing units leaves.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pandas as pd

from planner.catalog.scenario import ResolvedScenario, quantile_label
from planner.model.build import solution_values  # noqa: F401  (re-exported: plans are read from solved models)
from planner.model.families import FAMILIES
from planner.perf.candidates import (
    evaluate_point,
    handover_queue,
    packing_domain,
    planned_load,
    slo_terms,
    slot_queue,
)
from planner.perf.latency import pool_latency, workload_tail
from planner.perf.layout import Layout, check_layout
from planner.perf.setup import engine_options
from planner.results.extract import (
    role_loads,
)
from planner.results.schema import (
    REL_TOL,
    Check,
    Plan,
    Recheck,
)


def unit_losses(plan: Plan) -> list[tuple[str, int, dict[str, set[int]]]]:
    """Per purchase unit of the placement: (hardware, unit number, pool -> replicas that run on it). A run of
    identical units (``count``) stands for that many units with the same pattern."""
    out = []
    for up in plan.placement:
        lost: dict[str, set[int]] = defaultdict(set)
        for dom in up.domains:
            for g in dom:
                lost[g.pool].add(g.replica)
        for j in range(up.count):
            out.append((up.hardware, up.unit + j, lost))
    return out


def capacity_after_losing(plan: Plan, k: int) -> dict[str, tuple[float, list[str]]]:
    """Per workload: capacity (req/s) left after losing the ``k`` units whose individual loss hurts it most,
    and which units. Aggregated pools add up; prefill and decode pools serve the smaller of the two."""
    units = unit_losses(plan)
    out = {}
    for w in plan.workloads:
        pools = [p for p in plan.pools if p.workload == w.name]

        def cap(lost_by_pool: dict[str, int], pools=pools) -> float:
            by_role: dict[str, float] = defaultdict(float)
            for p in pools:
                by_role[p.role] += max(p.replicas - lost_by_pool.get(p.id, 0), 0) * p.predicted.requests_per_s_per_replica
            return by_role["aggregated"] + min(by_role["prefill"], by_role["decode"])

        scored = sorted(units, key=lambda u: cap({q: len(r) for q, r in u[2].items()}))
        worst = scored[:k]
        lost: dict[str, int] = defaultdict(int)
        for _, _, by_pool in worst:
            for q, r in by_pool.items():
                lost[q] += len(r)
        out[w.name] = (cap(lost), [f"{h} {u}" for h, u, _ in worst])
    return out


def _check_pool(p, rs: ResolvedScenario, loads: dict, add) -> float:
    """Re-evaluate one pool (``add(name, ok, detail)`` each check): its model and layout, engine, expert placement,
    memory, TPOT, TTFT at its load and margin; returns the requests/s it carries (0 where it cannot run)."""
    sc = rs.scenario
    hw_by_id = {h.id: h for h in rs.hardware}
    wl = {w.name: w for w in sc.workloads}
    hw = hw_by_id[p.hardware]
    w = wl[p.workload]
    lay = Layout(p.layout.tp, p.layout.ep, p.layout.pp, p.layout.attn_dp, p.layout.redundant_experts)
    model = rs.model_for(p.workload)
    if p.model and p.model != model.id:
        add(f"{p.id}: model", False, f"the pool serves {p.model}, its workload {p.workload} is served by {model.id}")
        return 0.0
    try:
        check_layout(model, lay)
        add(f"{p.id}: layout", True, f"{lay.describe()} valid for {model.id}")
    except Exception as err:  # noqa: BLE001 - reported as a failed check
        add(f"{p.id}: layout", False, str(err))
        return 0.0
    eng = next((e for e in rs.engines if e.id == p.engine), None)
    add(f"{p.id}: engine", eng is not None and eng.runs_on(hw) and eng.weight_mode(hw, p.weights_dtype) is not None,
        f"{p.engine} runs on {hw.id} and serves {p.weights_dtype} weights ({p.weights_mode})")
    # The plan is re-evaluated with exactly the factors it was solved with: the pool's engine on its hardware.
    ev = evaluate_point(
        model, hw, lay, p.batch, w, p.role, weights=p.weights_dtype, kv=p.kv_dtype,
        eff=hw.efficiency.for_engine(p.engine), kv_tier=p.kv_tier, prefix_tier=p.prefix_tier,
        spec_tokens=p.spec_tokens, tbo=p.two_batch_overlap,
        moe_imbalance=p.expert_placement.imbalance if p.expert_placement else 1.0,
        engine=p.engine, **engine_options(eng),
    )
    if p.expert_placement is not None and p.expert_placement.placement_imbalance is not None:
        ep_ = p.expert_placement
        add(f"{p.id}: expert placement", ep_.placement_imbalance <= ep_.imbalance * (1 + REL_TOL),
            f"placement imbalance {ep_.placement_imbalance:.4f} <= {ep_.imbalance:.4f} in the step time")
    if ev is None:
        add(f"{p.id}: memory", False, "the layout does not fit this memory tier")
        return 0.0
    used = ev["weight_bytes_per_chip"] + ev["kv_bytes_per_chip"] + ev["other_bytes_per_chip"]
    add(f"{p.id}: memory", used <= hw.hbm_bytes and ev["host_kv_bytes_per_chip"] <= hw.host_dram_bytes,
        f"{used / 1e9:.1f} of {hw.hbm_bytes / 1e9:.1f} GB HBM per chip")
    tail = workload_tail(w)
    meets_tpot, q_ttft = slo_terms(tail, p.role, ev["tpot_s"], ev["tpot_cv"], w.slo.tpot_s * (1 + REL_TOL))
    lam, t_cap = planned_load(pd.DataFrame([ev]), w.slo.ttft_s, sc.utilisation_cap, quantile=q_ttft,
                              nodes=(np.asarray(tail.x), np.asarray(tail.p)), cs2=tail.cs2,
                              slots=slot_queue(p.role, p.batch, tail), handover=handover_queue(p.role, p.batch, tail))
    rate = float(lam[0]) / p.margin_derate if np.isfinite(lam[0]) else 0.0
    u = loads.get((p.workload, p.role), 1.0)
    lat = pool_latency(ev, tail, u * rate, w.slo.ttft_s, w.slo.tpot_s, p.batch if p.role == "aggregated" else 0)
    if p.role != "prefill":
        add(f"{p.id}: tpot", bool(np.all(meets_tpot)),
            f"{quantile_label(tail.tpot_q)} {lat['tpot_slo'] * 1e3:.1f} ms <= {w.slo.tpot_ms:g} ms")
    if p.role != "decode":
        at_load = lat["ttft_slo"]
        add(f"{p.id}: ttft", rate > 0 and at_load <= w.slo.ttft_s * (1 + REL_TOL),
            f"{quantile_label(tail.ttft_q)} {at_load * 1e3:.0f} ms at {u:.0%} of capacity <= {w.slo.ttft_ms:g} ms "
            "(open arrivals)")
    if sc.margin is not None:
        srv = "agg" if p.role == "aggregated" else "disagg"
        want = max(1.0, hw.efficiency.error_ratio(p.engine, srv, sc.margin.quantile))
        add(f"{p.id}: margin", math.isclose(p.margin_derate, want, rel_tol=1e-9),
            f"capacity / {p.margin_derate:.3f}: measured/predicted TPOT at quantile {sc.margin.quantile:g} "
            f"of {p.hardware} {p.engine}/{srv}")
    same = math.isclose(rate * p.replicas, p.predicted.requests_per_s, rel_tol=1e-6)
    add(f"{p.id}: rate", same, f"{rate * p.replicas:.3f} req/s re-evaluated vs {p.predicted.requests_per_s:.3f} planned")
    return rate * p.replicas


def recheck(plan: Plan, rs: ResolvedScenario) -> Recheck:
    """Re-evaluate ``plan`` with ``perf/`` alone: every pool's layout is valid, fits in memory and
    meets its workload's SLOs at the predicted rate; demand and prefix working sets are covered;
    every replica sits in a purchase unit inside one scale-up domain; units, power, budget and
    cost add up."""
    sc = rs.scenario
    hw_by_id = {h.id: h for h in rs.hardware}
    checks: list[Check] = []
    capacity: dict[tuple[str, str], float] = defaultdict(float)

    def add(name: str, ok: bool, detail: str) -> None:
        checks.append(Check(name=name, ok=bool(ok), detail=detail))

    loads = role_loads(sc.workloads, plan.pools)
    for p in plan.pools:
        capacity[(p.workload, p.role)] += _check_pool(p, rs, loads, add)
    for w in sc.workloads:
        agg, pre, dec = (capacity[(w.name, r)] for r in ("aggregated", "prefill", "decode"))
        served = agg + min(pre, dec)
        add(f"{w.name}: demand", served >= w.requests_per_s * (1 - REL_TOL),
            f"{served:.2f} req/s capacity for {w.requests_per_s:g} req/s")
        ws = w.prefix_cache.working_set_gb * 1e9 if w.prefix_cache.hit_rate > 0 else 0.0
        for p in plan.pools:
            if p.workload != w.name or p.prefix_tier == "none" or ws <= 0:
                continue
            # Each pool's tier holds the prefixes of the traffic routed to it (routing by prefix family).
            need = ws * p.predicted.requests_per_s_per_replica / w.requests_per_s if w.requests_per_s > 0 else 0.0
            add(f"{p.id}: prefix cache", p.prefix_cache_bytes_per_replica >= need * (1 - REL_TOL),
                f"{p.prefix_cache_bytes_per_replica / 1e9:,.1f} GB per replica in {p.prefix_tier} for "
                f"{need / 1e9:,.1f} GB of prefixes of its traffic")
    # Placement: every group inside one domain, every replica's stage groups placed whole, units as bought.
    placed: dict[tuple[str, int], int] = defaultdict(int)
    for up in plan.placement:
        D = packing_domain(hw_by_id[up.hardware])
        for dom in up.domains:
            if sum(g.chips for g in dom) > D:
                add(f"{up.hardware} unit {up.unit}: domain", False, f"{sum(g.chips for g in dom)} chips in a {D}-chip domain")
            for g in dom:
                placed[(g.pool, g.stage)] += g.chips * up.count
    expected = {(p.id, s): p.layout.tp * p.layout.attn_dp * p.replicas for p in plan.pools for s in range(1, p.layout.pp + 1)}
    missing = [f"{k[0]} stage {k[1]}" for k in expected.keys() | placed.keys() if placed.get(k, 0) != expected.get(k, 0)]
    add("placement", not missing, "every stage group placed whole" if not missing else f"misplaced: {', '.join(missing[:5])}")
    for g in plan.units:
        hw = hw_by_id[g.hardware]
        n = sum(up.count for up in plan.placement if up.hardware == g.hardware)
        add(f"{g.hardware}: units", n <= g.count, f"{n} units hold the replicas, {g.count} bought")
        cost = g.count * hw.purchase_unit.chips_per_unit * rs.prices[g.hardware]
        add(f"{g.hardware}: cost", math.isclose(cost, g.usd_per_hour, rel_tol=1e-9), f"{g.count} x {hw.purchase_unit.chips_per_unit} chips x ${rs.prices[g.hardware]:.2f}")
        mu = next((v for k, v in sc.limits.max_units.items() if k == g.hardware or k in hw.aliases), None)
        if mu is not None:
            add(f"{g.hardware}: inventory", g.count <= mu, f"{g.count} of {mu} units")
    lim = sc.limits
    if lim.max_hardware_types is not None:
        kinds = sorted({g.hardware for g in plan.units if g.count})
        add("limits.max_hardware_types", len(kinds) <= lim.max_hardware_types,
            f"{len(kinds)} hardware kinds ({', '.join(kinds)}) of at most {lim.max_hardware_types}")
    if lim.max_pool_types_per_workload is not None:
        for w in sc.workloads:
            n = sum(1 for p in plan.pools if p.workload == w.name)
            add(f"{w.name}: pool types", n <= lim.max_pool_types_per_workload,
                f"{n} pool types of at most {lim.max_pool_types_per_workload}")
    k = sc.resilience.lose_units
    if k:
        left = capacity_after_losing(plan, k)
        for w in sc.workloads:
            cap, units = left[w.name]
            add(f"{w.name}: resilience", cap >= w.requests_per_s * (1 - REL_TOL),
                f"{cap:,.2f} req/s left after losing {', '.join(units) or 'nothing'} (lose_units {k}) for "
                f"{w.requests_per_s:g} req/s")
    total = sum(g.usd_per_hour for g in plan.units)
    add("objective", math.isclose(total, plan.objective.usd_per_hour, rel_tol=1e-9), f"${total:,.2f}/h")
    for family in FAMILIES:  # the limits the registry's families re-check on the plan's own figures
        if family.recheck is not None:
            for name, ok, detail in family.recheck(plan, rs):
                add(name, ok, detail)
    return Recheck(ok=all(c.ok for c in checks), checks=checks)

