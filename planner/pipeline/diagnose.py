"""What to say when there is no plan: candidates that meet no SLO or fit nowhere, limits that are short (the
elastic model), a solver that stopped at a limit or without one.
"""

from __future__ import annotations

import numpy as np

from planner.catalog.scenario import ResolvedScenario
from planner.errors import InfeasibleError, PlannerError, SolverLimitError
from planner.model import PlanData, build_model
from planner.model.families import (
    shortfalls,
)
from planner.options import PlanOptions
from planner.perf.candidates import (
    CandidatePool,
    CandidateTable,
    roles_for,
)
from planner.perf.layout import describe_layout
from planner.solve import Solver

LIMITS = ("maxTimeLimit", "iterationLimit", "objectiveLimit", "interrupted")
"""Solver terminations that are a limit reached (exit 3); any other stop without a plan is an error (exit 1)."""


def no_plan(res, limit_message: str) -> None:
    """Raise for a solve that returned no plan: exit 3 only where a limit was really reached."""
    if res.termination in LIMITS:
        raise SolverLimitError(limit_message)
    raise PlannerError(f"the solver stopped without a plan and without reaching a limit ({res.termination}); the "
                       "scenario or catalog may hold numbers too large or too small to solve: check them, or write "
                       "the model with --lp and report it")


def diagnose_candidates(rs: ResolvedScenario, pool: CandidatePool, table: CandidateTable) -> None:
    """Raise :class:`InfeasibleError` when some workload has no serving option at all, naming the
    limit (memory, TPOT, TTFT) and how far the best option is from it."""
    roles = roles_for(rs.scenario.serving)
    for w in rs.scenario.workloads:
        rows = table.rows[table.rows["workload"] == w.name] if not table.rows.empty else table.rows
        have = set(rows["role"].astype(str)) if len(rows) else set()
        if "aggregated" in have or _paired(rows, rs):
            continue
        where = f"workload '{w.name}'"
        if {"prefill", "decode"} <= have:  # both roles, but never on one engine and vendor
            raise InfeasibleError(f"{where}: prefill and decode meet their SLOs only on different engines or vendors "
                                  f"({_classes(rows, rs, 'prefill')} prefill, {_classes(rows, rs, 'decode')} decode), "
                                  "and no engine hands KV to another; allow aggregated serving or relax the SLOs")
        hw = ", ".join(h.id for h in rs.hardware)
        allr = pool.rows[pool.rows["workload"] == w.name] if not pool.rows.empty else pool.rows
        if allr.empty:
            wm = rs.model_for(w.name)
            served = [f for f in rs.weights_for(wm) for h in rs.hardware for e in rs.engines
                      if e.runs_on(h) and wm.weights_source(f, h.vendor, e) is not None]
            if not served and not rs.scenario.self_quantise:
                raise InfeasibleError(
                    f"{where}: no checkpoint of {wm.id} in the allowed weight formats "
                    f"({', '.join(rs.weights_for(wm))}) is published for {hw}, and no engine quantises to them on "
                    f"load; allow the native format ({wm.weights_dtype}) or one with a published checkpoint, or set "
                    "self_quantise: true (you provide the checkpoint)")
            raise InfeasibleError(
                f"{where}: no layout of {wm.id} fits in memory on {hw} (weights "
                f"{', '.join(rs.weights_for(wm))}, KV {', '.join(rs.scenario.kv_cache)}, up to the largest layout); "
                "allow more hardware, a smaller weight format or a shorter context"
            )
        needs = [r for r in roles if r != "prefill"]
        gen = allr[allr["role"].isin(needs)]
        best_tpot = gen.loc[gen["tpot_s"].idxmin()] if len(gen) else None
        if best_tpot is not None and best_tpot["tpot_s"] > w.slo.tpot_s:
            raise InfeasibleError(
                f"{where}: slo.tpot_ms {w.slo.tpot_ms:g} is below every layout's TPOT; the fastest is "
                f"{best_tpot['tpot_s'] * 1e3:.1f} ms ({_describe(best_tpot)}); relax slo.tpot_ms to at least "
                f"{np.ceil(best_tpot['tpot_s'] * 1e4) / 10:g}"
            )
        first = allr[allr["role"].isin([r for r in roles if r != "decode"])]
        first = first[(first["role"] == "prefill") | (first["tpot_s"] <= w.slo.tpot_s)]
        if len(first):
            b = first.loc[first["ttft_base_s"].idxmin()]
            raise InfeasibleError(
                f"{where}: slo.ttft_ms {w.slo.ttft_ms:g} is below every layout's TTFT at this TPOT, even idle; the fastest "
                f"is {b['ttft_base_s'] * 1e3:.0f} ms ({_describe(b)}); relax slo.ttft_ms to above "
                f"{np.ceil(b['ttft_base_s'] * 1e3):g}"
            )
        raise InfeasibleError(f"{where}: no serving option meets both SLOs; relax slo.ttft_ms or slo.tpot_ms")


def _classes(rows, rs: ResolvedScenario, role: str) -> str:
    vendor = {h.id: h.vendor for h in rs.hardware}
    mine = rows[rows["role"].astype(str) == role]
    return "/".join(sorted({f"{e} on {vendor[h]}" for e, h in zip(mine["engine"].astype(str), mine["hardware"].astype(str),
                                                                  strict=True)}))


def _paired(rows, rs: ResolvedScenario) -> bool:
    """Whether some engine and vendor has both prefill and decode rows (the pairing the MILP requires)."""
    if not len(rows):
        return False
    vendor = {h.id: h.vendor for h in rs.hardware}
    by: dict[str, set] = {}
    for role, e, h in zip(rows["role"].astype(str), rows["engine"].astype(str), rows["hardware"].astype(str),
                          strict=True):
        by.setdefault(f"{e}@{vendor[h]}", set()).add(role)
    return any({"prefill", "decode"} <= r for r in by.values())


def _describe(r) -> str:
    return (
        f"{r['role']} on {r['hardware']} with {r['engine']}, {describe_layout(r['tp'], r['ep'], r['pp'], r['attn_dp'], r['redundant'])}, "
        f"batch {int(r['batch'])}, {r['weights_dtype']} weights"
    )


def diagnose_limits(data: PlanData, opts: PlanOptions) -> str:
    """Elastic relaxation: every limit gets a priced slack; the cheapest way back to feasibility says
    which limits are short and by how much."""
    m = build_model(data, elastic=True)
    res = Solver(time_limit_s=opts.time_limit_s, mip_gap=1e-6).solve(m)
    if not res.has_solution:
        return "no plan meets the demand within the limits, and the elastic relaxation found none either"
    parts = shortfalls(m)
    if not parts:
        return "no plan meets the demand within the limits (the relaxation found no single limit to blame)"
    return "infeasible: " + "; ".join(parts)

