"""Block floors (issue 18, item 1): each workload's floor is the least chip dollars its own rows allow, cuts off no
plan (checked against enumeration), its ceiling from a known plan's cost cuts off no plan as cheap, the rows last
one solve, and optima are those of enumeration with and without them."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pyomo.environ as pyo
import pytest
from pyomo.common.collections import ComponentMap

from planner.model.bounds import greedy_start, objective_at, solve_from
from planner.model.build import build_model
from planner.model.data import PlanData
from planner.results import solution_values
from planner.solve import Solver
from planner.solve.floors import improve
from tests.test_milp import WorkloadData, _cost, _hw, _random_instance, _rows

TWO_WORKLOADS = [s for s in range(16) if s % 2]  # _random_instance: odd seeds have two workloads


def _chip_usd(data: PlanData, x, w: str) -> float:
    r = data.rows
    return sum(n * r["slots"][i] * data.hardware[r["hardware"][i]].usd_per_chip_hour
               for i, n in enumerate(x) if r["workload"][i] == w)


def _floors(m, cutoff=None) -> dict[str, tuple[float, float]]:
    """Each workload's (lower, upper) floor row, by the workload of the columns it holds."""
    solver = Solver(mip_gap=0.0)
    solver.load(m)
    rows = solver.floor_rows(m, cutoff)
    if rows is None:
        return {}
    cols = solver._opt._pyomo_var_to_solver_var_map
    workload_of = {cols[id(m.x[i, 0])]: m._arr["workload"][i] for i in m.R}
    out = {}
    for lower, upper, idx, cost in rows:
        (w,) = {workload_of[j] for j, c in zip(idx, cost, strict=True) if c and j in workload_of}
        out[w] = (lower, upper)
    return out


@functools.cache
def _plans(seed: int, xmax: int = 3) -> list[tuple[tuple[int, ...], float]]:
    """Every plan of ``_random_instance(seed)`` with at most ``xmax`` replicas a row, and its cost."""
    data = _random_instance(seed)
    out = []
    for x in itertools.product(range(xmax + 1), repeat=len(data.rows)):
        c = _cost(data, x)
        if c is not None:
            out.append((x, c))
    return out


def _alone(data: PlanData, w: str) -> float | None:
    """The least chip dollars of ``w`` served alone (its rows, its demand, no limits): its floor by definition."""
    keep = [i for i in range(len(data.rows)) if data.rows["workload"][i] == w]
    rows = data.rows.iloc[keep].reset_index(drop=True)
    one = PlanData(rows, data.hardware, {w: data.workloads[w]}, roles=data.roles)
    m = build_model(one)
    m.cost.deactivate()
    m.chips = pyo.Objective(expr=sum(m._arr["slots"][i] * one.hardware[m._arr["hardware"][i]].usd_per_chip_hour
                                     * m.x[i, 0] for i in m.R))
    r = Solver(mip_gap=0.0).solve(m)
    return pyo.value(m.chips) if r.has_solution else None


@pytest.mark.parametrize("seed", TWO_WORKLOADS)
def test_a_floor_is_the_workloads_own_least_and_cuts_off_no_plan(seed):
    data = _random_instance(seed)
    m = build_model(data)
    floors = _floors(m)
    alone = {w: _alone(data, w) for w in data.workloads}
    if any(v is None for v in alone.values()):
        assert floors == {}  # a workload with no plan of its own: no floors (HiGHS proves the model infeasible)
        return
    assert set(floors) == set(data.workloads)
    for w, (lower, upper) in floors.items():
        assert lower == pytest.approx(alone[w], rel=1e-6, abs=1e-9)
        assert upper == np.inf  # no known plan: no ceiling
    for x, _ in _plans(seed):
        for w, (lower, _) in floors.items():
            assert _chip_usd(data, x, w) >= lower - 1e-9


@pytest.mark.parametrize("seed", TWO_WORKLOADS)
def test_a_ceiling_from_a_known_plan_cuts_off_no_plan_as_cheap(seed):
    data = _random_instance(seed)
    plans = _plans(seed)
    if not plans:
        return
    m = build_model(data)
    best = min(c for _, c in plans)
    cutoff = best * (1 + 1e-6) + _tie_break(data, plans)
    floors = _floors(m, cutoff)
    assert floors
    for x, c in plans:
        if c <= best + 1e-9:
            for w, (lower, upper) in floors.items():
                assert lower - 1e-9 <= _chip_usd(data, x, w) <= upper + 1e-9
    # the ceilings bite: the floors leave each workload less than the whole cost above its floor
    assert all(upper < cutoff for _, upper in floors.values())


def _tie_break(data, plans) -> float:
    """The objective's tie-break term at its largest over the enumerated plans (the cutoff is an objective)."""
    from planner.model.build import EPSILON

    return max(EPSILON * sum(_chip_usd(data, x, w) for w in data.workloads) for x, _ in plans)


@pytest.mark.parametrize("seed", TWO_WORKLOADS)
def test_optima_with_floors_are_those_of_enumeration(seed):
    """With and without floors the same optimum, a plan by the enumeration's rules; the enumeration's own (up to 3
    replicas a row) where the optimum needs no more."""
    data = _random_instance(seed)
    brute = min((c for _, c in _plans(seed)), default=None)
    found = []
    for floors in (True, False):
        m = build_model(data)
        solver = Solver(mip_gap=0.0, floors=floors)
        solver.load(m)
        rows = solver._opt._solver_model.getNumRow()
        res = solve_from(solver, m, greedy_start(m, check=False), loaded=True)
        assert solver._opt._solver_model.getNumRow() == rows  # the floor rows last one solve
        if brute is None:
            assert res.status == "infeasible"
            continue
        assert res.status == "optimal"
        x, u = solution_values(m)
        usd = sum(u[h] * hd.usd_per_unit_hour for h, hd in data.hardware.items())
        xs = tuple(x.get(i, 0) for i in range(len(data.rows)))
        assert _cost(data, xs) == pytest.approx(usd, abs=1e-9)
        assert usd <= brute + 1e-9 and (max(xs) > 3 or usd == pytest.approx(brute, abs=1e-9))
        found.append(usd)
    assert len(set(np.round(found, 9))) <= 1


def _two_on_a() -> PlanData:
    """Two workloads whose cheapest rows are on hardware ``a``."""
    hw = {"a": _hw("a", 4, 1.0), "b": _hw("b", 4, 2.0)}
    rows = _rows([("w1", "aggregated", "a", 1.0, 2.0, 0), ("w1", "aggregated", "b", 2.0, 3.0, 0),
                  ("w2", "aggregated", "a", 2.0, 5.0, 0), ("w2", "aggregated", "b", 1.0, 1.5, 0)])
    wd = {"w1": WorkloadData("w1", 6.0, 100, 100, 0.0), "w2": WorkloadData("w2", 9.0, 100, 100, 0.0)}
    return PlanData(rows, hw, wd)


def test_a_unit_fixed_to_nothing_raises_the_floor_and_the_answer_is_kept():
    """With ``a`` left out (a runner-up's re-solve fixes its units to 0) each floor is its cheapest on ``b``, and the
    re-solve from a plan on ``b`` finds the optimum."""
    m = build_model(_two_on_a())
    assert _floors(m) == {"w1": pytest.approx((3 * 1.0, np.inf)), "w2": pytest.approx((2 * 2 * 1.0, np.inf))}
    m.u["a"].fix(0)
    # w1 on b: 2 replicas of 2 slots at $2; w2 on b: 6 replicas of 1 slot at $2
    assert _floors(m) == {"w1": pytest.approx((8.0, np.inf)), "w2": pytest.approx((12.0, np.inf))}
    start = greedy_start(m, check=False)
    solver = Solver(mip_gap=0.0)
    res = solve_from(solver, m, start)
    assert res.status == "optimal"
    x, u = solution_values(m)
    assert u == {"a": 0, "b": 3} and objective_at(m, start) >= res.objective - 1e-9


@pytest.mark.parametrize("seed", TWO_WORKLOADS)
def test_a_start_improved_by_moving_blocks_to_their_optima_is_the_best_such_move(seed):
    """From a greedy plan, :func:`improve` returns the cheapest plan that keeps each workload where the start has
    it or moves it to its block optimum (the enumeration of those 2^2 choices, units bought anew), or ``None`` where
    none is cheaper than the start."""
    data = _random_instance(seed)
    m = build_model(data)
    solver = Solver(mip_gap=0.0)
    solver.load(m)
    start = greedy_start(m, check=False)
    found = solver._block_floors(m)
    if start is None or found is None or solver.start_objective(start) is None:
        return
    floors, blocks = found
    cols = solver._opt._pyomo_var_to_solver_var_map
    col_of = [cols[id(m.x[i, 0])] for i in m.R]
    vec = solver._column_values(start)
    ours = {i: vec[j] for i, j in enumerate(col_of)}
    moves = []
    for idx, best in floors.optima:
        where = dict(zip(idx.tolist(), np.round(best).tolist(), strict=True))
        moves.append({i: where[j] for i, j in enumerate(col_of) if j in where})
    choices = []
    for pick in itertools.product([False, True], repeat=len(moves)):
        x = dict(ours)
        for use, mv in zip(pick, moves, strict=True):
            if use:
                x.update(mv)
        c = _cost(data, tuple(round(x[i]) for i in range(len(data.rows))))
        if c is not None:
            choices.append(c)
    start_usd = _cost(data, tuple(round(ours[i]) for i in range(len(data.rows))))
    better = improve(floors.lp, vec, blocks, floors.optima, threads=1)
    if better is None:
        assert min(choices) >= start_usd - 1e-6
        return
    y, value = better
    assert value < solver.start_objective(start) - 1e-9
    usd = _cost(data, tuple(round(y[j]) for j in col_of))
    assert usd is not None and usd == pytest.approx(min(choices), abs=1e-6)


def test_a_plan_on_the_dear_hardware_is_moved_to_the_block_optima():
    """From the plan with both workloads on ``b`` ($24/h: 10 chips in 3 units), both moved to their optima on ``a``
    (3 + 4 chips in 2 units, $8/h); the solve from that plan keeps it, the optimum."""
    m = build_model(_two_on_a())
    m.u["a"].fix(0)
    start = greedy_start(m, check=False)
    m.u["a"].unfix()
    solver = Solver(mip_gap=0.0)
    solver.load(m)
    assert solver.start_objective(start) == pytest.approx(24.0, abs=1e-3)
    floors, blocks = solver._block_floors(m)
    y, value = improve(floors.lp, solver._column_values(start), blocks, floors.optima, threads=1)
    assert value == pytest.approx(8.0, abs=1e-3)
    assert solver.start_objective(ComponentMap((v, y[j]) for v, j in _by_column(solver, m))) == pytest.approx(value)
    res = solve_from(solver, m, start, loaded=True)
    x, u = solution_values(m)
    assert res.status == "optimal" and u == {"a": 2, "b": 0} and x == {0: 3, 2: 2}


def _by_column(solver, m):
    cols = solver._opt._pyomo_var_to_solver_var_map
    return [(v, cols[id(v)]) for v in m.component_data_objects(pyo.Var) if id(v) in cols]
