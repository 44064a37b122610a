"""Plan a deployment end to end: candidates -> MILP -> solve -> plan, re-check, binding constraints
with what relaxing each is worth, the runner-up, or a computed diagnosis when nothing is feasible.

This is the library behind ``planner plan``; the CLI only parses flags and writes files.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyomo.core as pyo
from pyomo.common.collections import ComponentMap

from planner.catalog.scenario import ResolvedScenario, with_engine
from planner.catalog.writer import atomic_write_with
from planner.errors import InfeasibleError, PlanCheckError, PlannerError, SolverLimitError
from planner.model import PlanData, build_model, prepare
from planner.model.bounds import greedy_start, held_start, route_streams, snapshot, solve_from
from planner.model.build import EPSILON, period_values, solution_values
from planner.model.data import Tier, drop_unpowered, over_periods
from planner.model.families import (
    BY_NAME,
    FAMILIES,
    RELAX,
    Relaxation,
    limit_relaxations,
    prefix_bounds_move,
    relaxed_parameter,
    shortfalls,
)
from planner.perf.candidates import (
    CandidatePool,
    CandidateTable,
    evaluate_candidates,
    prefix_shares,
    roles_for,
    scenario_slos,
    select_candidates,
)
from planner.perf.layout import describe_layout
from planner.results import (
    SCHEMA_VERSION,
    Binding,
    DayCost,
    PeriodOut,
    PeriodUnits,
    Plan,
    ResilienceOut,
    RunnerUp,
    capacity_after_losing,
    extract,
    recheck,
    software_versions,
)
from planner.solve import DEFAULT_MIP_GAP, DEFAULT_TIME_LIMIT_S, Solver, SolveResult
from planner.units import HOUR_S, MTOK

SENSITIVITY_TIME_LIMIT_S = 5.0
MAX_ANALYSIS_JOBS = 4
"""At most this many analysis processes by default (each holds a copy of the model and the candidate pool)."""
PRESTART_MIN_WORKLOADS = 3
"""By default, a scenario of this many workloads starts its analysis workers while its candidates are evaluated."""
CANDIDATE_WORKER_MIN_WORKLOADS = 6
"""Without the analysis, by default a scenario of this many workloads starts one worker for its candidates alone:
they take ~0.35-0.45 s per workload on one core, and the worker's ~0.7 s start-up pays from about 2 s of them
(multi-workload.yaml, 3 workloads: 2.4 s wall either way, 0.6 s more CPU with one)."""
PARALLEL_MIN_SOLVE_S = 0.5
"""By default the analysis runs on several processes only where the plan's own solve took this long: each
question costs about one such solve, so below it a process start-up costs more than it saves."""
STARTED_MIN_SOLVE_S = 0.2
"""Workers started ahead (their start-up paid) are used where the plan's own solve took this long: below it,
handing them the plan costs more than the re-solves they would take (three-models.yaml: a 0.06 s solve, 0.4 s
of analysis)."""


@dataclass
class PlanOptions:
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    mip_gap: float = DEFAULT_MIP_GAP
    engine: str | None = None
    analysis: bool = True
    """Price the binding constraints and find the runner-up (extra solves)."""
    lp_path: str | None = None
    """Also write the MILP in LP format here (readable names), before solving."""
    expert_time_limit_s: float = 3.0
    """Time limit of each expert-placement MILP (MoE pools with expert parallelism)."""
    solver_threads: int | None = None
    """HiGHS threads per solve (None: HiGHS's default; sweeps on a Dask cluster use one per worker)."""
    expert_mip_gap: float = 1e-3
    """Relative gap on the imbalance at which expert placement stops: 0.1% of the expert part of a step,
    far below the performance model's own error (the search otherwise spends its whole budget for nothing)."""
    prefix_shares: dict[str, tuple[float, float]] | None = None
    """Per workload, the range of prefix working set per request/s (bytes per req/s) the plan's models may be
    given, which candidate pruning must answer for (None: the scenario's own, widened for the analysis; a
    sweep that varies demand or working sets sets the range of its points)."""
    jobs: int | None = None
    """Processes that re-solve the analysis's questions (1: this one; None: one per core up to
    :data:`MAX_ANALYSIS_JOBS`, where the plan's own solve took at least :data:`PARALLEL_MIN_SOLVE_S`, so that
    a plan of a few seconds pays no process start-up). Workers started ahead (:func:`prestart_workers`) also
    evaluate part of the candidates."""


@dataclass
class Planned:
    plan: Plan
    table: CandidateTable
    data: PlanData
    timings: dict[str, float] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    """Extra files of the plan (name -> text): expert placement maps."""


def input_hash(rs: ResolvedScenario, engine: str | None = None) -> str:
    """Content hash of everything a plan depends on: the scenario, the model and hardware entries
    (datasheet, price and fitted efficiency) and the plan schema version."""
    doc = {
        "schema": SCHEMA_VERSION,
        "scenario": rs.scenario.model_dump(mode="json"),
        "engine": engine,
        "model": rs.model.model_dump(mode="json"),
        **({"models": [m.model_dump(mode="json") for m in rs.models]} if len(rs.models) > 1 else {}),
        "hardware": [h.model_dump(mode="json") for h in rs.hardware],
        "prices": rs.prices,
        "expert_load": None if rs.expert_load is None else hashlib.sha256(np.round(rs.expert_load, 12).tobytes()).hexdigest(),
    }
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def relaxed_slos(slos: dict[str, tuple[float, float]], workload: str, k: int) -> dict[str, tuple[float, float]]:
    """``slos`` with ``workload``'s TTFT (``k = 0``) or TPOT (``k = 1``) limit ``RELAX`` looser."""
    out = dict(slos)
    lim = list(out[workload])
    lim[k] *= 1 + RELAX
    out[workload] = tuple(lim)
    return out


def slo_levels(slos: dict[str, tuple[float, float]], analysis: bool) -> list[dict[str, tuple[float, float]]]:
    """The SLO sets a plan's candidate pool must answer exactly: the scenario's, and with the analysis each
    workload's TPOT and TTFT ``RELAX`` looser (what :func:`binding_constraints` prices)."""
    return [slos] + ([relaxed_slos(slos, w, k) for w in slos for k in (1, 0)] if analysis else [])


def analysis_shares(rs: ResolvedScenario, opts: PlanOptions) -> dict[str, tuple[float, float]]:
    """Prefix working set per request/s each workload's model may be given (candidate pruning keeps what that
    range needs): ``opts.prefix_shares`` where the caller set it (a sweep over demand or working sets), else
    the scenario's own, widened by the analysis's relaxations (``RELAX`` less demand raises it, a ``RELAX``
    smaller working set lowers it)."""
    if opts.prefix_shares is not None:
        return opts.prefix_shares
    if not opts.analysis:
        return prefix_shares(rs.scenario.workloads)
    return prefix_shares(rs.scenario.workloads, low=1 - RELAX, high=1 / (1 - RELAX))


def make_plan(rs: ResolvedScenario, opts: PlanOptions | None = None,
              progress: Callable[[str], None] | None = None) -> Planned:
    """Plan ``rs``: candidates, the MILP, the analysis, expert placement and the re-check. ``progress`` is told
    each stage as it starts (a line of text: the CLI shows it on a terminal, so a fleet's minute-long plan says
    what it is doing)."""
    opts = opts or PlanOptions()
    workers = prestart_workers(rs, opts)
    try:
        return _make_plan(rs, opts, progress, workers)
    finally:
        if workers is not None:
            workers.close()


def _make_plan(rs: ResolvedScenario, opts: PlanOptions, progress: Callable[[str], None] | None, workers) -> Planned:
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    if opts.engine is not None:
        rs = with_engine(rs, opts.engine)
    engine = opts.engine or rs.scenario.engine
    digest = input_hash(rs, engine)
    rs, notes = drop_unpowered(rs)
    slos = scenario_slos(rs.scenario.workloads)
    say(f"evaluating candidates for {len(rs.scenario.workloads)} workload(s) on {len(rs.hardware)} hardware")
    pool = _evaluate(workers, rs, engine, slo_levels(slos, opts.analysis), analysis_shares(rs, opts))
    table = select_candidates(pool, slos)
    t1 = time.perf_counter()
    diagnose_candidates(rs, pool, table)
    data = prepare(rs, table)
    data.notes[:0] = notes
    model = build_model(data)
    if opts.lp_path is not None:
        import pyomo.environ  # noqa: F401  (registers Pyomo's file writers; the rest of the planner needs only pyomo.core)

        atomic_write_with(Path(opts.lp_path),
                          lambda tmp: model.write(tmp, io_options={"symbolic_solver_labels": True}))
    t2 = time.perf_counter()
    solver = Solver(time_limit_s=opts.time_limit_s, mip_gap=opts.mip_gap)
    say(f"solving the MILP over {len(table.rows):,} candidate rows")
    res = solve_from(solver, model, greedy_start(model, check=False))  # heuristics on: a greedy start is far from optimal
    if res.status == "infeasible":
        raise InfeasibleError(diagnose_limits(data, opts))
    if not res.has_solution:
        _no_plan(res, f"no feasible plan found within --time-limit {opts.time_limit_s:g} s ({res.termination}); "
                 "raise --time-limit or loosen --mip-gap")
    deadline = t2 + opts.time_limit_s  # --time-limit bounds every solve of the command together
    x, u = solution_values(model)
    base = snapshot(model)
    x = fewest_replicas(model, x, u, max(deadline - time.perf_counter(), 0.0), solver)
    plan = extract(rs, data, x, u, res)
    plan.scenario["input_hash"] = digest
    plan.scenario["engine"] = engine
    plan.software = software_versions()
    if data.pool_type_usd_per_hour:
        plan.assumptions.append(
            f"{len(plan.pools)} pool types at ${data.pool_type_usd_per_hour:,.2f}/h each of operating cost "
            f"(limits.pool_type_usd_per_hour: weighed in the choice, not in the fleet's $/h)")
    plan.solver.mip_gap_target = opts.mip_gap
    plan.solver.time_limit_s = opts.time_limit_s
    plan.solver.candidates_s = t1 - t0
    plan.solver.build_s = t2 - t1
    plan.solver.candidates = {"evaluated": table.evaluated, "kept": len(table.rows), **{f"dropped_{k}": v for k, v in table.dropped.items()}}
    t3 = time.perf_counter()
    ctx = None
    answers: dict[Question, Answer] = {}
    if opts.analysis:
        ctx = _Ctx(rs, pool, data, model, solver, res, plan, opts, deadline, base, say=say)
        qs = questions(ctx)
        jobs = analysis_jobs(opts, len(qs), res.wall_s, 0 if workers is None else workers.count)
        answers, cut = answer_questions(ctx, qs, jobs, workers)
        plan.runner_up = next((a.runner_up for q, a in answers.items() if q.kind == "runner_up"), None)
        plan.binding_constraints = binding_constraints(ctx, qs, answers)
        if cut:
            # keep what was found before the time ran out
            rest = "the rest" if plan.runner_up is not None or not any(q.kind == "runner_up" for q in qs) \
                else "the rest and the runner-up"
            plan.assumptions.append(
                f"analysis not completed: --time-limit {opts.time_limit_s:g} s was spent after {len(answers)} of "
                f"{len(qs)} re-solves (the binding constraints they priced are listed), before {rest}; "
                "raise --time-limit to get them")
    if data.lose_units:
        say(f"analysis: what surviving the loss of {data.lose_units} unit(s) costs")
        left = capacity_after_losing(plan, data.lose_units)
        without = next((a for q, a in answers.items() if q.kind == "resilience"), None)
        plan.resilience = ResilienceOut(
            lose_units=data.lose_units, capacity_after_worst_loss_rps={w: c for w, (c, _) in left.items()},
            worst_units={w: u for w, (_, u) in left.items()},
            headroom_usd_per_hour=None if without is None or without.cost is None else max(plan.objective.usd_per_hour - without.cost, 0.0))
    if any(w.profile is not None for w in rs.scenario.workloads):
        say("planning the fleet for every period of the traffic profile")
        plan_periods(rs, data, table, plan, max(deadline - time.perf_counter(), 1.0), opts.mip_gap, (x, u))
    say("placing experts and re-checking the plan")
    files = place_pool_experts(rs, plan, opts.expert_time_limit_s, opts.expert_mip_gap)
    plan.assumptions += list(rs.notes) + assumptions(rs, engine)
    plan.sources = sources(rs)
    plan.recheck = recheck(plan, rs)
    if not plan.recheck.ok:
        bad = [c for c in plan.recheck.checks if not c.ok]
        raise PlanCheckError(
            f"the chosen plan fails {len(bad)} of {len(plan.recheck.checks)} re-checks by the performance model "
            f"(first: {bad[0].name}: {bad[0].detail}); no plan written"
        )
    t4 = time.perf_counter()
    timings = {"candidates_s": t1 - t0, "build_s": t2 - t1, "solve_s": res.wall_s, "analysis_s": t4 - t3, "total_s": t4 - t0}
    return Planned(plan, table, data, timings, files)


def _evaluate(workers, rs: ResolvedScenario, engine, levels, shares) -> CandidatePool:
    """The candidate pool, evaluated here and, where workers were started ahead, on one of them as well."""
    if workers is None:
        return evaluate_candidates(rs, engine, levels, shares)
    from planner.analysis_workers import evaluate_beside

    return evaluate_beside(workers, rs, engine, levels, shares)


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
    m = build_model(over_periods(data, demand, price_tiers(rs)))
    start = held_start(m, *peak) if peak is not None else None
    res = Solver(time_limit_s=time_limit_s, mip_gap=mip_gap).solve(m, start=start)
    if res.status == "infeasible":
        raise InfeasibleError("the traffic profile cannot be served in some period within the limits "
                              "(the peak plan can: check limits.max_units against the tiers)")
    if not res.has_solution:
        _no_plan(res, f"no plan for the traffic profile within --time-limit ({res.termination})")
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
        units = [PeriodUnits(hardware=h, chips_per_unit=data.hardware[h].chips_per_unit, reserved=a, on_demand=b, spot=c)
                 for h, (a, b, c) in u.items() if a + b + c]
        out.append(PeriodOut(period=t, requests_per_s=req, capacity_rps=cap, units=units, usd_per_hour=usd, recheck_ok=ok))
    plan.periods = out
    plan.periods_solver = {"status": res.status, "mip_gap": res.mip_gap, "wall_s": res.wall_s,
                           "rows": len(data.rows), "periods": T}
    plan.usd_per_day = sum(p.usd_per_hour for p in out) * 24.0 / T
    plan.flat_peak_usd_per_day = plan.objective.usd_per_hour * 24.0
    plan.day = day_cost(plan, rs, T)
    if not all(p.recheck_ok for p in out):
        bad = [p.period for p in out if not p.recheck_ok]
        raise PlanCheckError(f"the fleet of period(s) {bad[:5]} fails its re-check by the performance model; no plan written")


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


LIMITS = ("maxTimeLimit", "iterationLimit", "objectiveLimit", "interrupted")
"""Solver terminations that are a limit reached (exit 3); any other stop without a plan is an error (exit 1)."""


def _no_plan(res, limit_message: str) -> None:
    """Raise for a solve that returned no plan: exit 3 only where a limit was really reached."""
    if res.termination in LIMITS:
        raise SolverLimitError(limit_message)
    raise PlannerError(f"the solver stopped without a plan and without reaching a limit ({res.termination}); the "
                       "scenario or catalog may hold numbers too large or too small to solve: check them, or write "
                       "the model with --lp and report it")


def _recheck_period(rs: ResolvedScenario, data, table, x, u, req: dict[str, float], res) -> bool:
    """The period's fleet as a plan of that period's demand, re-checked by the performance model alone."""
    from dataclasses import replace as dc_replace

    if not x:
        return all(v <= 0 for v in req.values())
    sc = rs.scenario
    # a period without traffic for a workload re-checks it at 0 req/s (model_copy skips the schema's "> 0": the
    # period's fleet owes that workload nothing)
    wls = [w.model_copy(update={"requests_per_s": max(req[w.name], 0.0), "profile": None}) for w in sc.workloads]
    rs_t = dc_replace(rs, scenario=sc.model_copy(update={"workloads": wls}))
    data_t = prepare(rs_t, table)
    total = {h: a + b + c for h, (a, b, c) in u.items()}
    try:
        plan_t = extract(rs_t, data_t, x, total, res)
    except PlannerError:  # a period whose fleet cannot even be laid out fails its check
        return False
    return recheck(plan_t, rs_t).ok


def fewest_replicas(model, x: dict[int, int], u: dict[str, int], time_limit_s: float,
                    solver: Solver | None = None) -> dict[int, int]:
    """Among plans of the optimal fleet, the one whose replicas occupy the fewest chips: a second solve with
    the purchase units fixed at the optimum (the cost's tie-break term is below the solver's gap tolerance,
    so the first solve may leave idle replicas in units it has to buy anyway), and, where pool types are priced
    (``pool_type_usd_per_hour``), no more pool types than the optimum uses. Keeps ``x`` if that solve finds
    nothing better."""
    m = model
    a = m._arr
    if time_limit_s < 0.05:
        return x  # the time limit is spent: keep the optimal plan as found
    used = sum(a["slots"][i] * n for i, n in x.items())
    for h in m.H:
        m.u[h].fix(u[h])
    m.cost.deactivate()
    slots = [float(v) for v in a["slots"]]  # Python floats: Pyomo builds from them far faster than from NumPy's
    m.chips_used = pyo.Objective(expr=sum(slots[i] * m.x[i, t] for i in m.R for t in m.T), sense=pyo.minimize)
    if hasattr(m, "row_used") and m._data.pool_type_usd_per_hour:
        # Pool types are priced in the cost: fewer chips must not be bought with more pool types.
        m.types_cap = pyo.Constraint(expr=sum(m.row_used[i] for i in m.R) <= len(x))  # x: the rows in use
    try:
        limit = min(time_limit_s, SENSITIVITY_TIME_LIMIT_S)
        sv = solver.limited(time_limit_s=limit, mip_gap=1e-6) if solver else Solver(time_limit_s=limit, mip_gap=1e-6)
        r = sv.solve(m)
        if r.has_solution:
            x2, _ = solution_values(m)
            if sum(a["slots"][i] * n for i, n in x2.items()) < used - 1e-9:
                return x2
        return x
    finally:
        m.del_component(m.chips_used)
        if hasattr(m, "types_cap"):
            m.del_component(m.types_cap)
        m.cost.activate()
        for h in m.H:
            m.u[h].unfix()


def place_pool_experts(rs: ResolvedScenario, plan, time_limit_s: float, mip_gap: float = 1e-3) -> dict[str, str]:
    """Run the expert-placement MILP for every expert-parallel pool (one per distinct stage size and
    redundancy) and attach its map file; the candidate rows priced the step time with the faster
    heuristic placement the MILP starts from, so the MILP's imbalance is never above it."""
    from planner.experts import LayeredPlacement, place_experts, placement_map
    from planner.perf.params import model_stats

    several = len(rs.models) > 1
    files: dict[str, str] = {}
    done: dict[tuple[str, int, int], tuple[str, object]] = {}
    for p in plan.pools:
        ep_ = p.expert_placement
        if ep_ is None:
            continue
        model = rs.model_for(p.workload)
        key = (model.id, ep_.gpus, ep_.redundant_experts)
        if key not in done:
            load = rs.expert_load_for(model)
            load = load if load is not None else np.ones(model.architecture.moe.experts)
            r = place_experts(load, ep_.gpus, ep_.redundant_experts, time_limit_s=time_limit_s, mip_gap=mip_gap)
            name = f"experts-{model.id + '-' if several else ''}ep{ep_.gpus}-r{ep_.redundant_experts}.json"
            doc = placement_map(LayeredPlacement([0], [r], True), model_id=model.id,
                                moe_layers=model_stats(model).moe_layers)
            files[name] = json.dumps(doc) + "\n"
            done[key] = (name, r)
        name, r = done[key]
        ep_.map_file = name
        ep_.placement_imbalance = float(r.imbalance)
        ep_.greedy_imbalance = float(r.greedy_imbalance)
        ep_.mip_gap = float(r.solver["mip_gap"])
    return files


# ---------------------------------------------------------------------------------------------
# Diagnosis


def diagnose_candidates(rs: ResolvedScenario, pool: CandidatePool, table: CandidateTable) -> None:
    """Raise :class:`InfeasibleError` when some workload has no serving option at all, naming the
    limit (memory, TPOT, TTFT) and how far the best option is from it."""
    roles = roles_for(rs.scenario.serving)
    for w in rs.scenario.workloads:
        rows = table.rows[table.rows["workload"] == w.name] if not table.rows.empty else table.rows
        have = set(rows["role"].astype(str)) if len(rows) else set()
        if "aggregated" in have or {"prefill", "decode"} <= have:
            continue
        where = f"workload '{w.name}'"
        hw = ", ".join(h.id for h in rs.hardware)
        allr = pool.rows[pool.rows["workload"] == w.name] if not pool.rows.empty else pool.rows
        if allr.empty:
            wm = rs.model_for(w.name)
            raise InfeasibleError(
                f"{where}: no layout of {wm.id} fits in memory on {hw} (weights "
                f"{', '.join(rs.weights_for(wm))}, KV {', '.join(rs.scenario.kv_cache)}, up to the largest layout); "
                "allow more hardware, a smaller weight format or a shorter context"
            )
        needs = [r for r in roles if r != "prefill"]
        gen = allr[allr["role"].isin(needs)]
        best_tpot = gen.loc[gen["tpot_s"].idxmin()] if len(gen) else None
        if best_tpot is not None and best_tpot["tpot_s"] > w.slo.tpot_ms / 1e3:
            raise InfeasibleError(
                f"{where}: slo.tpot_ms {w.slo.tpot_ms:g} is below every layout's TPOT; the fastest is "
                f"{best_tpot['tpot_s'] * 1e3:.1f} ms ({_describe(best_tpot)}); relax slo.tpot_ms to at least "
                f"{np.ceil(best_tpot['tpot_s'] * 1e4) / 10:g}"
            )
        first = allr[allr["role"].isin([r for r in roles if r != "decode"])]
        first = first[(first["role"] == "prefill") | (first["tpot_s"] <= w.slo.tpot_ms / 1e3)]
        if len(first):
            b = first.loc[first["ttft_base_s"].idxmin()]
            raise InfeasibleError(
                f"{where}: slo.ttft_ms {w.slo.ttft_ms:g} is below every layout's TTFT at this TPOT, even idle; the fastest "
                f"is {b['ttft_base_s'] * 1e3:.0f} ms ({_describe(b)}); relax slo.ttft_ms to above "
                f"{np.ceil(b['ttft_base_s'] * 1e3):g}"
            )
        raise InfeasibleError(f"{where}: no serving option meets both SLOs; relax slo.ttft_ms or slo.tpot_ms")


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


# ---------------------------------------------------------------------------------------------
# Analysis: binding constraints and the runner-up


class OutOfTime(Exception):
    """The command's --time-limit is spent: the analysis stops (the plan itself is complete)."""


@dataclass
class _Ctx:
    rs: ResolvedScenario
    pool: CandidatePool
    data: PlanData
    model: pyo.ConcreteModel
    solver: Solver
    res: SolveResult
    plan: Plan
    opts: PlanOptions
    deadline: float = float("inf")
    base: ComponentMap | None = None
    """The plan's solution (every variable of the model), the start of the re-solves of relaxations."""
    proven: bool = True
    """Whether the last re-solve proved its optimum (else a saving found is a lower bound)."""
    say: Callable[[str], None] = lambda _msg: None
    """Told what the analysis re-solves next (see :func:`make_plan`'s ``progress``)."""
    found: tuple | None = None
    """The last :meth:`cost_relaxed` re-solve's model, solution and fleet $/h (``None``: it found no plan)."""
    solved: dict = field(default_factory=dict)
    """What each model :meth:`cost_relaxed` re-solved came to (fleet $/h, proven, :attr:`found`), by its digest
    (:meth:`Solver.digest`): a question whose model is one already re-solved is answered without a re-solve (a
    workload's TPOT question where the TTFT and working-set relaxations asked together with it change nothing)."""

    @property
    def cost(self) -> float:
        return self.plan.objective.usd_per_hour

    def resolve_with(self, param, value, workload: str | None = None, moves: Callable[[], bool] | None = None) -> float | None:
        """Fleet $/h with one mutable parameter changed (then restored); each change the analysis makes (less
        demand, a smaller working set, a higher limit) relaxes the model. ``workload``: the one the parameter is
        of, re-served from scratch in the start where the change leaves the plan infeasible (less demand gives
        each prefix-caching replica a larger share of the prefixes to hold). ``moves``: asked with the parameter
        changed, whether the model changes at all; where not, the plan's cost is the answer (no re-solve)."""
        old = pyo.value(param)
        param.set_value(value)
        try:
            if moves is not None and not moves():
                self.proven = True
                return self.cost
            r = self.solve_relaxed(workload)
            self.proven = r.status == "optimal"
            return _fleet_cost(self.model, self.data) if r.has_solution else None
        finally:
            param.set_value(old)

    def solve_relaxed(self, workload: str | None = None) -> SolveResult:
        """Re-solve the plan's model after a change that relaxes it: where the plan stays feasible it is the
        first incumbent and its cost bounds the units and replicas (:func:`planner.model.bounds.solve_from`);
        else the plan with ``workload`` re-served greedily is."""
        starts = [self.base]
        if workload is not None and self.base is not None:
            starts.append(lambda: greedy_start(self.model, self.base, {workload}, check=False))
        return solve_from(self._quick(), self.model, starts, heuristics=False)

    def _quick(self, *, fresh: bool = False) -> Solver:
        """A solver for one analysis re-solve within what is left of the time limit: the main solve's persistent
        instance (only the changes reach HiGHS) for the plan's own model, a fresh one (``fresh``) for another."""
        left = self.deadline - time.perf_counter()
        if left < 0.05:
            raise OutOfTime
        limit, gap = min(left, SENSITIVITY_TIME_LIMIT_S), max(self.opts.mip_gap, 1e-4)
        if fresh:
            return Solver(time_limit_s=limit, mip_gap=gap)
        return self.solver.limited(time_limit_s=limit, mip_gap=gap)

    def admits_cheaper(self, workload: str, slo: tuple[float, float]) -> bool:
        """Whether a looser SLO admits a row cheaper per request/s than the dearest pool of that
        workload and role in the plan (if not, re-solving cannot pay off and is skipped)."""
        slos = dict(scenario_slos(self.rs.scenario.workloads))
        slos[workload] = slo
        r = select_candidates(CandidatePool(self.pool.rows[self.pool.rows["workload"] == workload], 0, 0,
                                            self.pool.utilisation_cap), slos, prune=False).rows
        for p in self.plan.pools:
            if p.workload != workload:
                continue
            per = p.usd_per_hour / max(p.predicted.requests_per_s, 1e-12)
            cand = r[r["role"] == p.role]
            if len(cand) and (cand["usd_per_rps"] < per * (1 - 1e-9)).any():
                return True
        return False

    def cost_relaxed(self, workload: str, which: tuple[str, ...] = (), working_set_gb: float | None = None,
                     known: tuple | None = None) -> float | None:
        """Fleet $/h with ``workload``'s SLOs named in ``which`` (``tpot``, ``ttft``) ``RELAX`` looser, and with its
        prefix working set ``working_set_gb`` where given: candidates re-selected from the pool at those SLOs, a
        model built on them and re-solved from the plan. ``known``: a proven optimum (model, solution, fleet $/h;
        :attr:`found`) of a relaxation of this question: where it is a plan of this question's model too, it is
        that model's optimum, without a re-solve."""
        slos = scenario_slos(self.rs.scenario.workloads)
        for k in which:
            slos = relaxed_slos(slos, workload, 1 if k == "tpot" else 0)
        table = select_candidates(self.pool, slos)
        if table.rows.empty:
            return None
        mine = self.data.rows
        same = len(table.rows) == len(mine) and all(
            np.array_equal(table.rows[c].to_numpy(), mine[c].to_numpy()) for c in ("pool_row", "requests_per_s"))
        if same:
            # the looser SLOs admit no row and raise no rate: the plan's own model, with the working set changed
            if working_set_gb is None:
                self.proven = True
                return self.cost
            m = self.model
            return self.resolve_with(m.working_set_gb[workload], working_set_gb, workload,
                                     moves=lambda: prefix_bounds_move(m, workload))
        # Looser SLOs only relax the plan: its rows are admitted with at least their rate, so it bounds the cost
        # and, mapped onto the new rows, is the first incumbent. A plan row the looser level's pruning drops (a
        # row it admits dominates it at the new rates) is put back, so that the plan maps; so is a row of the known
        # optimum of a relaxation (``known``), so that it maps where this level admits its rows.
        used = pool_rows_used(self.model, self.base) if self.base is not None else set()
        if known is not None:
            used |= pool_rows_used(*known[:2])
        missing = used - set(table.rows["pool_row"].to_numpy())
        if missing:
            full = select_candidates(self.pool, slos, prune=False).rows
            table = CandidateTable(pd.concat([table.rows, full[full["pool_row"].isin(missing)]], ignore_index=True),
                                   table.dropped, table.evaluated)
        data = prepare(self.rs, table)
        m = build_model(data)
        if working_set_gb is not None:
            m.working_set_gb[workload] = working_set_gb  # a smaller working set only relaxes: the plan stays feasible
        solver = self._quick(fresh=True)
        solver.load(m)
        digest = solver.digest()
        if digest in self.solved:
            cost, self.proven, self.found = self.solved[digest]
            return cost
        if known is not None:
            old, values, cost = known
            start = solution_on(old, values, m)
            if start is not None:
                route_streams(m, start)
            if start is not None and solver.start_objective(start) is not None:
                self.proven = True  # optimal for a relaxation of this model, and a plan of it
                return cost
        r = solve_from(solver, m, [self._base_on(m), lambda: greedy_start(m, check=False)], heuristics=False,
                       loaded=True)
        self.proven = r.status == "optimal"
        self.found = (m, snapshot(m), _fleet_cost(m, data)) if r.has_solution else None
        cost = _fleet_cost(m, data) if r.has_solution else None
        self.solved[digest] = (cost, self.proven, self.found)
        return cost

    def base_rows(self) -> list[int]:
        """Rows of the plan's model that the plan uses."""
        if self.base is None:
            return []
        m = self.model
        return [i for i in m.R if any(self.base[m.x[i, t]] > 0.5 for t in m.T)]

    def _base_on(self, m) -> ComponentMap | None:
        """The plan's solution on the model ``m`` of another candidate table of the same pool (rows matched by
        their pool position), or ``None`` where a row of the plan is not in it."""
        if self.base is None:
            return None
        return solution_on(self.model, self.base, m)


def pool_rows_used(m, values: ComponentMap) -> set[int]:
    """The pool positions of the rows of model ``m`` that its solution ``values`` uses."""
    pos = m._data.rows["pool_row"].to_numpy()
    return {int(pos[i]) for i in m.R if any(values[m.x[i, t]] > 0.5 for t in m.T)}


def solution_on(old, values: ComponentMap, m) -> ComponentMap | None:
    """A solution ``values`` of model ``old`` on the model ``m`` of another candidate table of the same pool (rows
    matched by their pool position), or ``None`` where a row it uses is not in ``m``."""
    where = {int(p): j for j, p in enumerate(m._data.rows["pool_row"].to_numpy())}
    pos = old._data.rows["pool_row"].to_numpy()
    start = ComponentMap()
    for i, t in old.x:
        n = values[old.x[i, t]]
        if n > 0.5:
            j = where.get(int(pos[i]))
            if j is None:
                return None
            start[m.x[j, t]] = n
    for mine in m.component_objects(pyo.Var, descend_into=False):  # units, streams and the families' indicators
        theirs = old.component(mine.local_name)
        if mine.local_name in ("x", "row_used") or theirs is None:
            continue
        for k in mine:
            if k in theirs:
                start[mine[k]] = values[theirs[k]]
    if hasattr(m, "row_used"):
        for i in m.R:
            start[m.row_used[i]] = float(any(start.get(m.x[i, t], 0.0) > 0.5 for t in m.T))
    return start


def _fleet_cost(m, data: PlanData) -> float:
    return float(sum(round(pyo.value(m.u[h])) * data.hardware[h].usd_per_unit_hour for h in m.H))


def _fleet_floor(r: SolveResult, data: PlanData, usd: float) -> float | None:
    """A lower bound on the fleet $/h of the optimum of a solve that stopped short of it: the objective's bound
    less the tie-break term (at most ``EPSILON`` times the fleet's dollars: replicas occupy no more chips than
    the units hold). ``None`` where the solve proved its optimum, has no bound, or pool types are priced."""
    if r.status == "optimal" or r.bound is None or data.pool_type_usd_per_hour:
        return None
    return min(usd, r.bound / (1 + EPSILON))


def _saved(base: float, new: float | None) -> float | None:
    if new is None:
        return None
    return max(base - new, 0.0)


@dataclass(frozen=True)
class Question:
    """One re-solve of the analysis: what is relaxed and how far. Plain data, so that a worker process can be
    handed it (:mod:`planner.analysis_workers`)."""

    kind: str
    """``runner_up`` (``target``: the hardware left out), ``limit`` (``which``: the constraint family, ``target``:
    its index where it has one, ``value``: the raised limit; :func:`planner.model.families.limit_relaxations`),
    ``slo`` (``target``: the workload, ``which``: ``tpot`` or ``ttft``), ``demand`` or ``prefix`` (``target``:
    the workload), ``resilience`` (the N+k rows dropped); ``together`` (``members``: one workload's SLO and prefix
    questions, answered by one re-solve where it proves none of them saves anything, see :func:`together`)."""
    target: str | None = None
    which: str | None = None
    value: float | None = None
    """The relaxed parameter's value: kW, units, requests/s or GB of prefixes."""
    members: tuple[Question, ...] = ()

    @property
    def label(self) -> str:
        """What the progress line says while it is re-solved."""
        if self.kind == "limit":
            return f"{BY_NAME[self.which].path} relaxed to {self.value:g}" + (f" ({self.target})" if self.target else "")
        return {
            "runner_up": f"the cheapest plan without {self.target}",
            "slo": f"{self.target}'s {(self.which or '').upper()} {RELAX:.0%} looser",
            "demand": f"{self.target}'s demand {RELAX:.0%} lower",
            "prefix": f"{self.target}'s prefix working set {RELAX:.0%} smaller",
            "resilience": "the plan without its N+k headroom",
            "together": " and ".join(m.label if k == 0 else m.label.removeprefix(f"{self.target}'s ")
                                     for k, m in enumerate(self.members)),
        }[self.kind]


@dataclass(frozen=True)
class Answer:
    """What a question's re-solve found: the fleet $/h of the relaxed optimum (``None``: no plan within the
    limit) and whether it is proven; the runner-up's description for that question; for a ``together`` question,
    its members' answers (``parts``) and whether the time limit stopped it before every member was answered
    (``cut``)."""

    cost: float | None
    proven: bool
    runner_up: RunnerUp | None = None
    parts: tuple[tuple[Question, Answer], ...] = ()
    cut: bool = False


TOGETHER_KINDS = ("slo", "prefix")
"""The questions :func:`together` asks as one where a workload has several: nearly always they save nothing."""


def together(qs: list[Question]) -> list[Question]:
    """``qs`` with each workload's SLO and prefix questions (where it has two or more) made one ``together``
    question, at the place of the first of them.

    The looser SLOs and the smaller working set together relax the plan's model at least as much as each of them
    alone (each admits its rows, at no lower rate, and the working set enters nothing else), so where one re-solve
    with all of them proves that the plan stays cheapest, it proves it for each: one re-solve answers them all.
    Only where that re-solve finds a saving (or cannot prove there is none) is each asked alone, one re-solve
    more than asking them alone from the start. On the fleets of ``bench/bench_fleet.py`` these questions saved
    nothing but once in 13 workloads (the 3- and 10-workload fleets; docs/formulation.md section 4)."""
    groups: dict[str, list[Question]] = {}
    for q in qs:
        if q.kind in TOGETHER_KINDS:
            groups.setdefault(q.target, []).append(q)
    out, placed = [], set()
    for q in qs:
        members = groups.get(q.target, []) if q.kind in TOGETHER_KINDS else []
        if len(members) < 2:
            out.append(q)
        elif q.target not in placed:
            placed.add(q.target)
            out.append(Question("together", q.target, members=tuple(members)))
    return out


def _ask_together(ctx: _Ctx, q: Question) -> Answer:
    """The answers to ``q``'s members: each the plan's cost where one re-solve with every relaxation of them at once
    proves no saving, else each re-solved alone (see :func:`together`)."""
    which = tuple(m.which for m in q.members if m.kind == "slo")
    working_set = next((m.value for m in q.members if m.kind == "prefix"), None)
    ctx.found = None
    cost = ctx.cost_relaxed(q.target, which, working_set)
    if cost is not None and ctx.proven and cost >= ctx.cost * (1 - 1e-9):
        return Answer(ctx.cost, True, parts=tuple((m, Answer(ctx.cost, True)) for m in q.members))
    # A saving: the optimum found together answers, without a re-solve, each SLO question it is a plan for.
    known = ctx.found if ctx.proven else None
    parts = []
    try:
        for m in q.members:
            parts.append((m, ask(ctx, m, known)))
    except OutOfTime:
        return Answer(None, False, parts=tuple(parts), cut=True)
    return Answer(None, True, parts=tuple(parts))


def questions(ctx: _Ctx) -> list[Question]:
    """The analysis's re-solves, in the order they are asked: the runner-up (one solve that answers a question of
    its own), the fleet-wide limits within one unit of binding, then each workload's looser SLOs (where a newly
    admitted row is cheaper per request than the plan's pools), lower demand and smaller prefix working set, the
    dearest workload first (where the time limit cuts the analysis short, what is priced is what weighs most),
    and last what N+k headroom costs."""
    plan, data, sc = ctx.plan, ctx.data, ctx.rs.scenario
    out: list[Question] = []
    if plan.units:
        out.append(Question("runner_up", max(plan.units, key=lambda g: g.usd_per_hour).hardware))
    out += [Question("limit", r.target, r.family, value=r.value) for r in limit_relaxations(data, plan)]
    slos = scenario_slos(sc.workloads)
    spend = _spend(plan)
    for w in sorted(sc.workloads, key=lambda w: -spend.get(w.name, 0.0)):
        for which, k in (("tpot", 1), ("ttft", 0)):
            if ctx.admits_cheaper(w.name, relaxed_slos(slos, w.name, k)[w.name]):
                out.append(Question("slo", w.name, which))
        out.append(Question("demand", w.name, value=w.requests_per_s * (1 - RELAX)))
        wo = next(o for o in plan.workloads if o.name == w.name)
        if wo.prefix_working_set_bytes > 0 and wo.prefix_capacity_bytes > 0:
            out.append(Question("prefix", w.name, value=wo.prefix_working_set_bytes / 1e9 * (1 - RELAX)))
    if data.lose_units and hasattr(ctx.model, "resilience"):
        out.append(Question("resilience"))
    return out


def ask(ctx: _Ctx, q: Question, known: tuple | None = None) -> Answer:
    """Re-solve one question on ``ctx``'s model (raises :class:`OutOfTime` where the time limit is spent);
    ``known``: see :meth:`_Ctx.cost_relaxed`."""
    m = ctx.model
    ctx.proven = True
    if q.kind == "runner_up":
        return Answer(None, True, runner_up(ctx, q.target))
    if q.kind == "together":
        return _ask_together(ctx, q)
    if q.kind == "limit":
        cost = ctx.resolve_with(relaxed_parameter(m, Relaxation(q.which, q.target, q.value)), q.value)
    elif q.kind == "slo":
        cost = ctx.cost_relaxed(q.target, (q.which,), known=known)
    elif q.kind == "demand":
        cost = ctx.resolve_with(m.demand[q.target, 0], q.value, q.target)
    elif q.kind == "prefix":
        cost = ctx.resolve_with(m.working_set_gb[q.target], q.value, q.target,
                                moves=lambda: prefix_bounds_move(m, q.target))
    elif q.kind == "resilience":
        cost = _without_resilience(ctx)
    else:
        raise ValueError(f"unknown analysis question {q.kind!r}")
    return Answer(cost, ctx.proven)


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def prestart_workers(rs: ResolvedScenario, opts: PlanOptions):
    """Workers started before the candidates (:class:`planner.analysis_workers.Workers`): one evaluates part of the
    candidate pool as soon as it has started up, and the analysis will likely use them all: ``--jobs`` above 1, or
    by default a scenario of at least :data:`PRESTART_MIN_WORKLOADS` workloads on a machine of several cores (a
    fleet's plan; one that solves fast after all stops them unused, at ~0.7 s of CPU each on the other cores).
    Without the analysis, one for the candidates (``--jobs`` above 1, or by default
    :data:`CANDIDATE_WORKER_MIN_WORKLOADS` workloads). ``None`` where none are."""
    many = len(rs.scenario.workloads) >= (PRESTART_MIN_WORKLOADS if opts.analysis else CANDIDATE_WORKER_MIN_WORKLOADS)
    if opts.jobs is not None:
        n = opts.jobs - 1
    elif many:
        n = min(available_cores(), MAX_ANALYSIS_JOBS) - 1
    else:
        n = 0
    if not opts.analysis:
        n = min(n, 1)
    if n < 1:
        return None
    from planner.analysis_workers import Workers

    return Workers(n)


def analysis_jobs(opts: PlanOptions, questions: int, solve_s: float, started: int = 0) -> int:
    """Processes for ``questions`` re-solves after a plan solve of ``solve_s`` seconds (see ``PlanOptions.jobs``),
    ``started`` workers having been started ahead (their start-up is paid: from ``STARTED_MIN_SOLVE_S`` they are
    used all the same)."""
    if questions < 2:
        return 1
    if opts.jobs is not None:
        return max(1, min(opts.jobs, questions))
    if solve_s < PARALLEL_MIN_SOLVE_S:
        return min(1 + started, questions) if solve_s >= STARTED_MIN_SOLVE_S else 1
    return max(1, min(available_cores(), MAX_ANALYSIS_JOBS, questions))


def answer_questions(ctx: _Ctx, qs: list[Question], jobs: int = 1, workers=None) -> tuple[dict[Question, Answer], bool]:
    """Each question's answer, and whether the time limit stopped the analysis before every one was answered.
    With ``jobs`` > 1 the questions are re-solved on that many processes
    (:func:`planner.analysis_workers.answer_in_workers`; ``workers``: those started ahead, see
    :func:`prestart_workers`): each is independent of the others (every re-solve starts from the plan), so the
    answers are those of one process, found sooner."""
    tasks = together(qs)
    if jobs > 1 and len(tasks) > 1:
        from planner.analysis_workers import answer_in_workers

        got, cut = answer_in_workers(ctx, tasks, jobs, workers)
    else:
        got, cut = answer_here(ctx, tasks)
    answers: dict[Question, Answer] = {}
    for q, a in got.items():
        if q.kind == "together":
            answers.update(a.parts)
            cut = cut or a.cut
        else:
            answers[q] = a
    return answers, cut


def answer_here(ctx: _Ctx, qs: list[Question]) -> tuple[dict[Question, Answer], bool]:
    """:func:`answer_questions` on this process alone, questions as they are (a ``together`` one answered as one)."""
    answers: dict[Question, Answer] = {}
    for q in qs:
        ctx.say(f"analysis: {q.label}")
        try:
            answers[q] = ask(ctx, q)
        except OutOfTime:
            return answers, True
    return answers, False


def _units_of(plan: Plan, h: str) -> int:
    return next((g.count for g in plan.units if g.hardware == h), 0)


def _spend(plan: Plan) -> dict[str, float]:
    """$/h of each workload's pools."""
    spend: dict[str, float] = {}
    for p in plan.pools:
        spend[p.workload] = spend.get(p.workload, 0.0) + p.usd_per_hour
    return spend


def binding_constraints(ctx: _Ctx, qs: list[Question], answers: dict[Question, Answer]) -> list[Binding]:
    """Each constraint family that limits the plan, with the $/h a 10% relaxation saves: the ``answers`` to the
    questions ``qs`` (:func:`questions`), in the order asked; a question the time limit left unanswered is left
    out, never read as a saving of $0. Largest saving first."""
    out: list[Binding] = []
    plan, data, sc = ctx.plan, ctx.data, ctx.rs.scenario
    base = ctx.cost
    slos = scenario_slos(sc.workloads)
    by_name = {w.name: w for w in sc.workloads}

    def saves(proven: bool) -> str:
        return "saves" if proven else "saves at least"

    for f in FAMILIES:  # the limits, family by family: each relaxation priced, or the limit alone where none was
        if f.binding is None:
            continue
        asked = [q for q in qs if q.kind == "limit" and q.which == f.name]
        priced = [(Relaxation(f.name, q.target, q.value), answers[q]) for q in asked if q in answers]
        rows = [(r, _saved(base, a.cost), a.proven) for r, a in priced] if asked else [(None, 0.0, True)]
        for r, s, proven in rows:
            row = f.binding(data, plan, r, f"{saves(proven)} ${s or 0:,.2f}/h", s)
            if row is not None:
                out.append(Binding(name=row[0], detail=row[1], usd_per_hour_saved=s, saving_proven=proven))
    for q in qs:
        a = answers.get(q)
        if a is None or q.kind in ("runner_up", "resilience", "limit"):
            continue
        s, proven = _saved(base, a.cost), a.proven
        if q.kind == "demand":
            w = by_name[q.target]
            worth = f"{saves(proven)} ${s:,.2f}/h" if s is not None else "was not re-solved within the time limit"
            out.append(Binding(
                name=f"demand.{w.name}",
                detail=f"{w.name}: {w.requests_per_s:g} req/s to serve; {RELAX:.0%} less traffic {worth}",
                usd_per_hour_saved=s, saving_proven=proven or s is None,
            ))
        elif s and s > 1e-6 * base:  # an SLO or the prefix working set: listed where it saves
            wo = next(o for o in plan.workloads if o.name == q.target)
            if q.kind == "slo":
                k, reached = (1, wo.tpot_s) if q.which == "tpot" else (0, wo.ttft_s)
                detail = (f"{q.target}: {q.which.upper()} {reached * 1e3:,.1f} ms against a {slos[q.target][k] * 1e3:,.0f} ms "
                          f"target; {RELAX:.0%} looser {saves(proven)} ${s:,.2f}/h")
                name = f"slo.{q.which}.{q.target}"
            else:
                detail = (f"{q.target}: {wo.prefix_working_set_bytes / 1e9:,.0f} GB of prefixes held; {RELAX:.0%} smaller "
                          f"{saves(proven)} ${s:,.2f}/h")
                name = f"prefix_cache.{q.target}"
            out.append(Binding(name=name, detail=detail, usd_per_hour_saved=s, saving_proven=proven))
    idle = [(g, g.chips - g.chips_used) for g in plan.units if g.chips > g.chips_used]
    if idle:
        usd = sum(g.usd_per_hour * n / g.chips for g, n in idle)
        what = ", ".join(f"{n} of {g.chips} {g.hardware} chips" for g, n in idle)
        out.append(Binding(name="whole_units", detail=f"units are bought whole: {what} idle (${usd:,.2f}/h)", usd_per_hour_saved=None))
    out.sort(key=lambda b: -(b.usd_per_hour_saved or 0.0))
    return out


def _without_resilience(ctx: _Ctx) -> float | None:
    """Fleet $/h of the cheapest plan without the N+k rows (re-solved; ``None``: none within the limit)."""
    m = ctx.model
    m.resilience.deactivate()
    m.uses_link.deactivate()
    try:
        r = ctx.solve_relaxed()
        ctx.proven = r.status == "optimal"
        return _fleet_cost(m, ctx.data) if r.has_solution else None
    finally:
        m.resilience.activate()
        m.uses_link.activate()


def runner_up(ctx: _Ctx, main: str) -> RunnerUp:
    """The cheapest plan without ``main``, the hardware that carries most of the winner's cost."""
    m = ctx.model
    # the plan with the workloads that ran on the excluded hardware re-served greedily, else the greedy plan: a
    # feasible start, but not a good one (a greedy re-serve is dearer than the optimum by a few percent), so HiGHS's
    # primal heuristics stay on (measured: the 3-workload fleet's runner-up proven in 3.0-3.7 s with them on three
    # seeds, where without them two of three stop at the 5 s limit; the 10-workload fleet's found at $925.04/h in
    # 5 s on three seeds, against $936.88-974.00 without)
    hw = m._arr["hardware"]
    moved = {m._arr["workload"][i] for i in ctx.base_rows() if hw[i] == main}
    m.u[main].fix(0)
    try:
        r = solve_from(ctx._quick(), m, [lambda: greedy_start(m, ctx.base, moved, check=False),
                                         lambda: greedy_start(m, check=False)], heuristics=True)
        if not r.has_solution:
            if r.status == "infeasible":
                return RunnerUp(excluded=main, status=r.status, summary=f"no feasible plan without {main}")
            # stopped at the analysis's time limit before any plan: nothing is proven either way
            return RunnerUp(excluded=main, status=r.status,
                            summary=f"no plan without {main} found within the {SENSITIVITY_TIME_LIMIT_S:g} s an analysis "
                            "re-solve may take (none is proven impossible; raise --time-limit or plan without it "
                            "to see)")
        usd = _fleet_cost(m, ctx.data)
        x, u = solution_values(m)
        hws = sorted(h for h, k in u.items() if k > 0)
        tokens = sum(w.requests_per_s * (w.input_tokens + w.output_tokens) for w in ctx.rs.scenario.workloads)
        rows = ctx.data.rows
        desc = "; ".join(
            f"{n} x {rows.loc[i, 'role']} {rows.loc[i, 'hardware']} {rows.loc[i, 'engine']} "
            f"{describe_layout(rows.loc[i, 'tp'], rows.loc[i, 'ep'], rows.loc[i, 'pp'], rows.loc[i, 'attn_dp'], rows.loc[i, 'redundant'])} "
            f"batch {rows.loc[i, 'batch']} ({rows.loc[i, 'workload']})"
            for i, n in sorted(x.items())
        )
        units = ", ".join(f"{u[h]} x {h}" for h in hws)
        return RunnerUp(
            excluded=main,
            status=r.status,
            usd_per_hour=usd,
            usd_per_hour_floor=_fleet_floor(r, ctx.data, usd),
            usd_per_mtok=usd / (tokens * 3600 / 1e6),
            hardware=hws,
            summary=f"{units}: {desc}",
        )
    finally:
        m.u[main].unfix()


def assumptions(rs: ResolvedScenario, engine: str | None) -> list[str]:
    sc = rs.scenario
    out = [
        f"Utilisation cap {sc.utilisation_cap:g}: no pool is sized to run more than {sc.utilisation_cap:.0%} busy; "
        "within it, each pool carries at most the request rate at which its TTFT under open (Poisson) arrivals meets "
        "the target (M/D/c queueing in front of its prefill ranks).",
        "Replicas of different workloads do not share a pool; traffic is split over a workload's pools in proportion "
        "to their capacity, and prefixes are routed by family to the pools that cache them.",
        *(["Pools of different models share purchase units chip by chip (a node's chips split between them); no chip "
           "holds the weights of two models."] if len(rs.models) > 1 else []),
        "Prefix KV loaded from host DRAM or flash overlaps with the prefill of the new tokens layer by layer.",
        "KV spilled to host DRAM crosses the host link on every decode step, added to the step time.",
        "Disaggregated prefill ships each prompt's KV to its decode pool over scale-up inside a rack-scale domain, else scale-out.",
        "Expert-parallel pools across nodes pay one scale-out send per remote node a token is routed to (node-limited "
        "routing where the model has group-limited routing), forwarded to its experts over the scale-up fabric.",
        "The KV cache is kept in the narrowest allowed format the engine offers (attention maths is bf16 whatever the "
        "cache format, so a narrower cache is never slower).",
        f"Engines: {'every pool runs ' + engine if engine else 'each pool runs the engine chosen for it among those with factors fitted on its hardware'}; "
        "efficiency factors per hardware and engine, see docs/validation.md for their error.",
        "Costs are whole purchase units at the catalog (or scenario) price per chip-hour; $/M tokens split between input and output by the time each pool spends on them.",
    ]
    for model in rs.models:
        spec = model.speculative
        if spec is None:
            continue
        out.append(
            f"{model.id}: speculative decoding ({spec.method}) accepts drafts at {', '.join(f'{a:g}' for a in spec.acceptance)} "
            f"(per draft position, the last repeating; {spec.source.strip()}), scaled by each engine's fitted acceptance share."
        )
    return out


def sources(rs: ResolvedScenario) -> list[dict]:
    out = [{"id": m.id, "kind": "model", "source": m.source, "as_of": str(m.as_of)} for m in rs.models]
    for h in rs.hardware:
        price = h.price
        out.append({
            "id": h.id,
            "kind": "hardware",
            "source": h.source,
            "as_of": str(h.as_of),
            "usd_per_chip_hour": rs.prices[h.id],
            "price_source": price.source if price and price.usd_per_chip_hour == rs.prices[h.id] else "scenario override",
            "efficiency_source": h.efficiency.source,
        })
    for e in rs.engines:
        out.append({"id": e.id, "kind": "engine", "source": e.source, "as_of": str(e.as_of)})
    return out
