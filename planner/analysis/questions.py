"""The analysis's questions (what is relaxed, how far), how each is answered, and how many processes answer them.
"""

from __future__ import annotations

from planner.analysis.binding import runner_up, without_resilience
from planner.analysis.context import (
    AnalysisContext,
    Answer,
    OutOfTime,
    Question,
    relaxed_slos,
    spend_by_workload,
)
from planner.model.families import (
    RELAX,
    Relaxation,
    limit_relaxations,
    prefix_bounds_move,
    relaxed_parameter,
)
from planner.perf.candidates import (
    scenario_slos,
)

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


def _ask_together(ctx: AnalysisContext, q: Question) -> Answer:
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


def questions(ctx: AnalysisContext) -> list[Question]:
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
    spend = spend_by_workload(plan)
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


def ask(ctx: AnalysisContext, q: Question, known: tuple | None = None) -> Answer:
    """Re-solve one question on ``ctx``'s model (raises :class:`OutOfTime` where the time limit is spent);
    ``known``: see :meth:`AnalysisContext.cost_relaxed`."""
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
        cost = without_resilience(ctx)
    else:
        raise ValueError(f"unknown analysis question {q.kind!r}")
    return Answer(cost, ctx.proven)










def answer_here(ctx: AnalysisContext, qs: list[Question]) -> tuple[dict[Question, Answer], bool]:
    """:func:`answer_questions` on this process alone, questions as they are (a ``together`` one answered as one)."""
    answers: dict[Question, Answer] = {}
    for q in qs:
        ctx.say(f"analysis: {q.label}")
        try:
            answers[q] = ask(ctx, q)
        except OutOfTime:
            return answers, True
    return answers, False

