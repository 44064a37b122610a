"""Plan a deployment end to end: candidates -> MILP -> solve -> plan, the analysis (binding constraints with what
relaxing each is worth, the runner-up), the day over a traffic profile, expert placement and the re-check, or a
computed diagnosis when nothing is feasible.

This is the library behind ``planner plan``; the CLI only parses flags and writes files.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyomo.core as pyo

from planner.analysis.binding import binding_constraints
from planner.analysis.context import (
    SENSITIVITY_TIME_LIMIT_S,
    AnalysisContext,
    Answer,
    Question,
    relaxed_slos,
)
from planner.analysis.questions import questions
from planner.analysis.workers import analysis_jobs, answer_questions, prestart_workers
from planner.catalog.scenario import ResolvedScenario, with_engine
from planner.catalog.writer import atomic_write_with
from planner.errors import InfeasibleError, PlanCheckError
from planner.model import PlanData, build_model, prepare
from planner.model.bounds import greedy_start, snapshot, solve_from
from planner.model.build import solution_values
from planner.model.data import drop_unpowered
from planner.model.families import (
    RELAX,
)
from planner.options import PlanOptions
from planner.perf.candidates import (
    CandidatePool,
    CandidateTable,
    evaluate_candidates,
    prefix_shares,
    scenario_slos,
    select_candidates,
)
from planner.pipeline.diagnose import diagnose_candidates, diagnose_limits, no_plan
from planner.pipeline.periods import plan_months, plan_periods
from planner.results import (
    SCHEMA_VERSION,
    Plan,
    ResilienceOut,
    capacity_after_losing,
    extract,
    recheck,
    software_versions,
)
from planner.solve import Solver


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
    (datasheet, price and fitted efficiency), what each engine offers, and the plan schema version."""
    doc = {
        "schema": SCHEMA_VERSION,
        "scenario": rs.scenario.model_dump(mode="json"),
        "engine": engine,
        "model": rs.model.model_dump(mode="json"),
        **({"models": [m.model_dump(mode="json") for m in rs.models]} if len(rs.models) > 1 else {}),
        "hardware": [h.model_dump(mode="json") for h in rs.hardware],
        # what each engine offers decides the candidates (its release -- images, flags -- does not)
        "engines": [e.model_dump(mode="json", exclude={"release", "source", "as_of", "notes", "metrics"})
                    for e in rs.engines],
        "prices": rs.prices,
        "expert_load": None if rs.expert_load is None else hashlib.sha256(np.round(rs.expert_load, 12).tobytes()).hexdigest(),
        **({"fleet": rs.fleet.summary()} if rs.fleet is not None else {}),
    }
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


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
    table = select_candidates(pool, slos, keep=rs.fleet.keys() if rs.fleet is not None else None)
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
        no_plan(res, f"no feasible plan found within --time-limit {opts.time_limit_s:g} s ({res.termination}); "
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
        ctx = AnalysisContext(rs, pool, data, model, solver, res, plan, opts, deadline, base, say=say)
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
    if data.fleet is not None:
        from planner.pipeline.brownfield import plan_migration

        plan_migration(rs, data, model, solver, plan, x, u, deadline, say)
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
    if any(w.months is not None for w in rs.scenario.workloads):
        say("planning what to reserve and rent month by month")
        plan_months(rs, data, table, plan, max(deadline - time.perf_counter(), 1.0), opts.mip_gap, (x, u))
    say("placing experts and re-checking the plan")
    files = place_pool_experts(rs, plan, opts.expert_time_limit_s, opts.expert_mip_gap)
    plan.assumptions += list(rs.notes) + assumptions(rs, engine) + self_quantised(rs, plan.pools)
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
    from planner.analysis.workers import evaluate_beside

    return evaluate_beside(workers, rs, engine, levels, shares)


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
    held = held_variables(m)
    for v in held:
        v.fix(round(v.value or 0.0))
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
        for v in held:
            v.unfix()


def held_variables(m) -> list:
    """The variables that say which units are held (units bought over the horizon or by month; deployed units
    kept and the new pool identities a deployed fleet's change pays for): fixed at the optimum, the replicas can
    move within them at the same cost."""
    out = list(m.u.values())
    for name in ("ub", "bf_keep", "bf_new"):
        if hasattr(m, name):
            out += list(getattr(m, name).values())
    return out


def place_pool_experts(rs: ResolvedScenario, plan, time_limit_s: float, mip_gap: float = 1e-3) -> dict[str, str]:
    """Run the expert-placement MILP for every expert-parallel pool (one per distinct stage size and
    redundancy) and attach its map file; the candidate rows priced the step time with the faster
    heuristic placement the MILP starts from, so the MILP's imbalance is never above it."""
    from planner.perf.params import model_stats
    from planner.pipeline.experts import LayeredPlacement, place_experts, placement_map

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


def slo_assumptions(workloads) -> list[str]:
    """What each workload's SLO is met at, the default said where it applies."""
    from planner.catalog.scenario import DEFAULT_QUANTILE, quantile_label

    out = []
    for w in workloads:
        said = "ttft_quantile" in w.slo.model_fields_set or "tpot_quantile" in w.slo.model_fields_set or \
            "quantile" in w.slo.model_fields_set
        how = "as the scenario sets" if said else f"the default ({quantile_label(DEFAULT_QUANTILE)} unless slo.quantile says)"
        out.append(f"SLO of {w.name}: {w.slo.describe()}, {how}; each request's TPOT is lognormal around the "
                   "pool's mean (prefill chunks of other prompts and speculative acceptance), TTFT adds the queue's "
                   "wait to the request's own prefill.")
    return out


def assumptions(rs: ResolvedScenario, engine: str | None) -> list[str]:
    sc = rs.scenario
    out = [
        f"Utilisation cap {sc.utilisation_cap:g}: no pool is sized to run more than {sc.utilisation_cap:.0%} busy; "
        "within it, each pool carries at most the request rate at which its TTFT under open (Poisson) arrivals meets "
        "the target at the SLO's quantile (M/G/c queueing in front of its prefill ranks, the prompt-length spread "
        "included: Whitt's two-moment approximation).",
        *slo_assumptions(sc.workloads),
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


def self_quantised(rs: ResolvedScenario, pools) -> list[str]:
    """A line per pool whose weight format has no published checkpoint and no on-load quantisation (a scenario
    with ``self_quantise``): what to quantise, and how the export takes it."""
    hw = {h.id: h for h in rs.hardware}
    engines = {e.id: e for e in rs.engines}
    out = []
    for p in pools:
        model = rs.model_for(p.workload)
        if model.weights_source(p.weights_dtype, hw[p.hardware].vendor, engines.get(p.engine)) is None:
            out.append(f"{p.id}: no {p.weights_dtype} checkpoint of {model.id} is published for {hw[p.hardware].vendor} "
                       f"hardware and {p.engine} does not quantise to it on load (self_quantise): quantise "
                       f"{(model.hf_ids or [model.id])[0]} to {p.weights_dtype} and export with --checkpoint {p.id}=PATH")
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

