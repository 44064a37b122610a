"""What the analysis's answers say: the binding constraints with what relaxing each is worth, what N+k costs and
the runner-up (the cheapest plan without the winner's main hardware).
"""

from __future__ import annotations

from planner.analysis.context import (
    SENSITIVITY_TIME_LIMIT_S,
    AnalysisContext,
    Answer,
    Question,
    fleet_cost,
    fleet_floor,
    saved_by,
)
from planner.model.bounds import greedy_start, solve_from
from planner.model.build import solution_values
from planner.model.families import (
    FAMILIES,
    RELAX,
    Relaxation,
)
from planner.perf.candidates import (
    scenario_slos,
)
from planner.perf.layout import describe_layout
from planner.results import (
    Binding,
    Plan,
    RunnerUp,
)


def _units_of(plan: Plan, h: str) -> int:
    return next((g.count for g in plan.units if g.hardware == h), 0)




def binding_constraints(ctx: AnalysisContext, qs: list[Question], answers: dict[Question, Answer]) -> list[Binding]:
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
        rows = [(r, saved_by(base, a.cost), a.proven) for r, a in priced] if asked else [(None, 0.0, True)]
        for r, s, proven in rows:
            row = f.binding(data, plan, r, f"{saves(proven)} ${s or 0:,.2f}/h", s)
            if row is not None:
                out.append(Binding(name=row[0], detail=row[1], usd_per_hour_saved=s, saving_proven=proven))
    for q in qs:
        a = answers.get(q)
        if a is None or q.kind in ("runner_up", "resilience", "limit"):
            continue
        s, proven = saved_by(base, a.cost), a.proven
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


def without_resilience(ctx: AnalysisContext) -> float | None:
    """Fleet $/h of the cheapest plan without the N+k rows (re-solved; ``None``: none within the limit)."""
    m = ctx.model
    m.resilience.deactivate()
    m.uses_link.deactivate()
    try:
        r = ctx.solve_relaxed()
        ctx.proven = r.status == "optimal"
        return fleet_cost(m, ctx.data) if r.has_solution else None
    finally:
        m.resilience.activate()
        m.uses_link.activate()


def runner_up(ctx: AnalysisContext, main: str) -> RunnerUp:
    """The cheapest plan without ``main``, the hardware that carries most of the winner's cost."""
    m = ctx.model
    # the plan with the workloads that ran on the excluded hardware re-served greedily, else the greedy plan: a
    # feasible start, but not a good one (a greedy re-serve is dearer than the optimum by a few percent), so HiGHS's
    # primal heuristics stay on (measured: the 3-workload fleet's runner-up proven in 3.0-3.7 s with them on three
    # seeds, where without them two of three stop at the 5 s limit; the 10-workload fleet's found at $925.04/h in
    # 5 s on three seeds, against $936.88-974.00 without)
    hw = m._arr["hardware"]
    moved = {m._arr["workload"][i] for i in ctx.base_rows() if hw[i] == main}
    shut = [m.u[main]] + [v for (g, _t), v in getattr(m, "bf_keep", {}).items() if m._groups[g].hardware == main]
    for v in shut:  # none bought, none of the deployed kept
        v.fix(0)
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
        usd = fleet_cost(m, ctx.data)
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
            usd_per_hour_floor=fleet_floor(r, ctx.data, usd),
            usd_per_mtok=usd / (tokens * 3600 / 1e6),
            hardware=hws,
            summary=f"{units}: {desc}",
        )
    finally:
        for v in shut:
            v.unfix()

