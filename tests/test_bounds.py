"""Incumbents and cost bounds (issue 18, item 1): a greedy plan is feasible or refused, bounds from a feasible
plan's cost never change the optimum (checked against enumeration), and they are lifted after the solve."""

from __future__ import annotations

import pyomo.environ as pyo
import pytest
from pyomo.common.collections import ComponentMap

from planner.model.bounds import (
    cost_bounds,
    cost_caps,
    greedy_start,
    is_feasible,
    objective_at,
    snapshot,
    solve_from,
)
from planner.model.build import build_model
from planner.results import solution_values
from planner.solve import Solver
from tests.test_milp import _brute, _random_instance


def _usd(m, data):
    _, u = solution_values(m)
    return sum(u[h] * hd.usd_per_unit_hour for h, hd in data.hardware.items())


@pytest.mark.parametrize("seed", range(12))
def test_greedy_start_and_cost_bounds_keep_the_enumerated_optimum(seed):
    data = _random_instance(seed)
    brute = _brute(data, xmax=3)
    m = build_model(data)
    start = greedy_start(m)
    if start is not None:
        assert is_feasible(m, start)
        cost = objective_at(m, start)
        assert brute is not None and cost >= brute - 1e-9  # a feasible plan costs at least the optimum
    ubs = [v.ub for v in m.component_data_objects(pyo.Var)]
    with cost_bounds(m, objective_at(m, start) if start is not None else None):
        if start is not None:
            assert any(m.u[h].ub is not None for h in m.H)
        res = Solver(mip_gap=0.0).solve(m, start)
    assert [v.ub for v in m.component_data_objects(pyo.Var)] == ubs  # lifted again
    if brute is None:
        assert res.status == "infeasible" and start is None
    else:
        assert res.status == "optimal" and _usd(m, data) == pytest.approx(brute, rel=1e-12, abs=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 3, 4, 5, 8, 9])
def test_relaxation_solved_with_the_base_plan_as_start_and_bound(seed):
    """Less demand: re-solved from the base plan (under its cost's bounds where it is still feasible: not always,
    a prefix-caching replica then carries a larger share), the optimum is the enumerated one."""
    data = _random_instance(seed)
    m = build_model(data)
    solver = Solver(mip_gap=0.0)
    res = solver.solve(m)
    if res.status != "optimal":
        pytest.skip("no plan at this seed")
    base = snapshot(m)
    w = next(iter(data.workloads))
    m.demand[w, 0] = data.workloads[w].requests_per_s * 0.6
    if seed == 4:  # its plan caches prefixes: with less demand a replica's share (and prefix load) grows
        assert not is_feasible(m, base)
    r2 = solve_from(solver, m, base)
    relaxed = _random_instance(seed)
    wd = relaxed.workloads[w]
    relaxed.workloads[w] = type(wd)(wd.name, wd.requests_per_s * 0.6, wd.input_tokens, wd.output_tokens, wd.working_set_bytes)
    assert r2.status == "optimal" and _usd(m, data) == pytest.approx(_brute(relaxed, xmax=3), rel=1e-12, abs=1e-9)


def test_infeasible_assignment_is_refused():
    data = _random_instance(1)
    m = build_model(data)
    zero = snapshot(m)  # nothing bought, nothing served
    assert not is_feasible(m, zero)
    start = greedy_start(m)
    assert start is not None
    start[m.u[next(iter(m.H))]] = 0.5  # not whole
    assert not is_feasible(m, start)


@pytest.mark.parametrize("seed", range(12))
def test_the_solver_side_start_check_agrees_with_the_model_side_one(seed):
    """:meth:`Solver.start_objective` (vectorised over HiGHS's copy) gives the verdict and objective of
    :func:`is_feasible` / :func:`objective_at` (every Pyomo constraint evaluated), on feasible plans, on plans a
    change has broken and on assignments that are fractional or buy nothing."""
    data = _random_instance(seed)
    m = build_model(data)
    solver = Solver(mip_gap=0.0)
    starts = [snapshot(m)]  # all zero: serves nothing
    g = greedy_start(m, check=False)
    if g is not None:
        starts.append(g)
        frac = ComponentMap(g)
        frac[m.u[next(iter(m.H))]] = 0.5
        starts.append(frac)
    if solver.solve(m).status == "optimal":
        starts.append(snapshot(m))
        w = next(iter(data.workloads))
        m.demand[w, 0] = data.workloads[w].requests_per_s * 1.7  # the optimum no longer serves it
    solver.load(m)
    verdicts = []
    for s in starts:
        ok = is_feasible(m, s)
        got = solver.start_objective(s)
        assert (got is not None) == ok
        if ok:
            assert got == pytest.approx(objective_at(m, s), rel=1e-12, abs=1e-12)
        verdicts.append(ok)
    assert verdicts[0] is False


def _solved(seed: int):
    """A random instance, its model, a solver holding it and its optimum (skipped where it has no plan)."""
    data = _random_instance(seed)
    m = build_model(data)
    solver = Solver(mip_gap=0.0)
    if solver.solve(m).status != "optimal":
        pytest.skip("no plan at this seed")
    return data, m, solver, snapshot(m)


@pytest.mark.parametrize("seed", [0, 1, 3, 5, 8])
def test_caps_last_one_solve_and_a_repaired_start_keeps_the_other_workloads(seed):
    data, m, solver, base = _solved(seed)
    hw = solver._opt._solver_model
    before = list(hw.getLp().col_upper_)
    cost = solver.start_objective(base)
    r = solver.solve(m, base, caps=cost_caps(m, cost))
    assert r.status == "optimal"
    assert list(hw.getLp().col_upper_) == before  # the caps were lifted after the solve
    w = next(iter(data.workloads))
    rep = greedy_start(m, base, {w}, check=False)
    for i in m.R:
        if m._arr["workload"][i] != w:
            assert rep[m.x[i, 0]] == round(base[m.x[i, 0]])


def test_greedy_start_survives_the_loss_of_units_it_must_survive():
    """N+k: one 8-chip node holds the whole demand (8 replicas of 1 req/s for 5 req/s), so the greedy plan must
    buy replicas beyond the demand by what k lost nodes carry (5 + 1 x 8 req/s: 13 replicas on 2 nodes), not
    (k + 1) x the demand (10 replicas, which fit in 2 nodes but leave one node's loss uncovered when they
    fill it); the start is then feasible and the solve proves the same optimum from it."""
    from dataclasses import replace

    from planner.model import PlanData, WorkloadData
    from tests.test_milp import _hw, _rows

    rows = _rows([("w", "aggregated", "a", 1.0, 1.0, 0)])
    data = PlanData(rows, {"a": _hw("a", 8, 1.0)}, {"w": WorkloadData("w", 5.0, 100, 100, 0.0)})
    for k, nodes in ((1, 2), (2, 3)):
        m = build_model(replace(data, lose_units=k))
        start = greedy_start(m)
        assert start is not None and start[m.x[0, 0]] == 5 + 8 * k and start[m.u["a"]] == nodes
        res = Solver(mip_gap=0.0).solve(m)
        assert res.status == "optimal" and objective_at(m, start) >= pyo.value(m.cost) - 1e-9


def test_solvers_asking_for_other_thread_counts_in_one_process_all_solve():
    """HiGHS's task scheduler is process-wide and refuses a solve that asks for another thread count than the one
    it started with (the solve then ends with no result: a plan would read 'no feasible plan within the time
    limit'). A small model gets one thread by default and a sweep's workers ask for one; a solver that asks for
    another count in the same process must still solve."""
    from planner.solve import SMALL_MODEL_COLUMNS

    def small():
        m = pyo.ConcreteModel()
        m.x = pyo.Var(within=pyo.NonNegativeIntegers)
        m.y = pyo.Var(within=pyo.NonNegativeReals)
        m.c = pyo.Constraint(expr=m.x + 2 * m.y >= 2.5)
        m.o = pyo.Objective(expr=m.x + m.y)
        return m

    s = Solver()
    s.load(small())
    assert s.threads_for() == 1 and 2 <= SMALL_MODEL_COLUMNS
    for threads in (None, 2, 1, 0, None, 2):
        r = Solver(threads=threads).solve(small())
        assert r.status == "optimal" and r.objective == pytest.approx(1.25), threads


@pytest.mark.parametrize("seed", [0, 1, 3])
def test_a_fallback_start_is_searched_from_with_heuristics(seed, monkeypatch):
    """``heuristics=False`` trusts the first start only (a solved plan: HiGHS need not look for better incumbents);
    where it no longer fits and a repaired or greedy start is used instead, that start is feasible but not good,
    and HiGHS searches from it with its heuristics."""
    from planner import solve as solve_mod
    from planner.model.bounds import solve_from

    data, m, solver, base = _solved(seed)
    used = []
    original = solve_mod.Solver.limited

    def limited(self, **kw):
        used.append(kw.get("heuristics"))
        return original(self, **kw)

    monkeypatch.setattr(solve_mod.Solver, "limited", limited)
    starts = [base, lambda: greedy_start(m, check=False)]
    assert solve_from(solver, m, starts, heuristics=False).status == "optimal" and used == [False]
    w = next(iter(data.workloads))
    m.demand[w, 0] = data.workloads[w].requests_per_s * 1.7  # the plan no longer serves it: the greedy start is used
    used.clear()
    r = solve_from(solver, m, starts, heuristics=False)
    greedy = greedy_start(m, check=False)
    if greedy is None or solver.start_objective(greedy) is None:
        pytest.skip("no feasible greedy start at this seed")
    assert r.status == "optimal" and used == [True]


def test_a_search_from_a_trusted_start_keeps_only_the_incumbent_heuristic(monkeypatch):
    """``heuristics=False`` (a re-solve from a solved plan) switches HiGHS's primal heuristics off but RINS, which
    searches the neighbourhood of the incumbent: the plan itself. With ``heuristics=True`` all are on, and a
    persistent instance gets them back after a search without them. Below ``RESTART_MIN_COLUMNS`` columns RINS is
    off in both."""
    from planner import solve
    from planner.solve import HEURISTICS, INCUMBENT_HEURISTIC

    data = _random_instance(0)
    m = build_model(data)
    solver = Solver(mip_gap=0.0)

    def on():
        h = solver._opt._solver_model
        return {k: bool(h.getOptionValue(k)[1] if isinstance(h.getOptionValue(k), tuple) else h.getOptionValue(k))
                for k in HEURISTICS}

    monkeypatch.setattr(solve, "RESTART_MIN_COLUMNS", 0)  # a large model
    solver.solve(m)
    assert all(on().values())
    solver.limited(time_limit_s=5, mip_gap=0.0, heuristics=False).solve(m)
    assert on() == {k: k == INCUMBENT_HEURISTIC for k in HEURISTICS}
    solver.solve(m)
    assert all(on().values())
    monkeypatch.setattr(solve, "RESTART_MIN_COLUMNS", 10**9)  # a small one
    solver.solve(m)
    assert on() == {k: k != INCUMBENT_HEURISTIC for k in HEURISTICS}
    solver.limited(time_limit_s=5, mip_gap=0.0, heuristics=False).solve(m)
    assert not any(on().values())
    monkeypatch.setattr(solve, "RESTART_MIN_COLUMNS", 0)
    solver.limited(time_limit_s=5, mip_gap=0.0, heuristics=False).solve(m)
    assert on() == {k: k == INCUMBENT_HEURISTIC for k in HEURISTICS}


def test_small_models_are_solved_without_restarts(monkeypatch):
    """HiGHS restarts (a re-presolve after the root) only on models of at least ``RESTART_MIN_COLUMNS`` columns, set
    on every solve (a persistent instance keeps the last solve's options)."""
    from planner import solve

    data = _random_instance(0)
    m = build_model(data)
    solver = Solver(mip_gap=0.0)

    def restarts() -> bool:
        v = solver._opt._solver_model.getOptionValue("mip_allow_restart")
        return bool(v[1] if isinstance(v, tuple) else v)

    small = solver.solve(m)
    assert not restarts()
    monkeypatch.setattr(solve, "RESTART_MIN_COLUMNS", 0)
    large = solver.solve(m)
    assert restarts() and large.objective == pytest.approx(small.objective)
    monkeypatch.setattr(solve, "RESTART_MIN_COLUMNS", 10**9)
    solver.solve(m)
    assert not restarts()


@pytest.mark.parametrize("seed", range(4))
def test_the_digest_of_a_model_is_the_problem_it_poses(seed):
    """Two models built from the same data have one digest (a re-solve of one answers the other); a changed demand,
    a column fixed and a price change each give another, and changing the demand back gives the first again."""
    data = _random_instance(seed)
    a, b = build_model(data), build_model(data)
    sa, sb = Solver(), Solver()
    sa.load(a)
    sb.load(b)
    first = sa.digest()
    assert sb.digest() == first
    w, h = next(iter(data.workloads)), next(iter(data.hardware))
    seen = {first}
    for change, undo in ((lambda: a.demand[w, 0].set_value(data.workloads[w].requests_per_s * 0.9),
                          lambda: a.demand[w, 0].set_value(data.workloads[w].requests_per_s)),
                         (lambda: a.u[h].fix(0), lambda: a.u[h].unfix()),
                         (lambda: a.usd_per_chip_hour[h].set_value(data.hardware[h].usd_per_chip_hour * 1.5),
                          lambda: a.usd_per_chip_hour[h].set_value(data.hardware[h].usd_per_chip_hour))):
        change()
        sa.load(a)
        assert sa.digest() not in seen
        seen.add(sa.digest())
        undo()
        sa.load(a)
        assert sa.digest() == first
