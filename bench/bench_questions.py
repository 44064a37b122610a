"""Replay of an N-workload fleet's demand questions with and without block floors (figures for issue notes and
docs/formulation.md section 3, never a test).

    python bench/bench_questions.py [N] [--factors 0.9,0.8] [--limit S] [--variant none|floors|moves ...]

Plans the fleet of ``bench_fleet.py`` in this process (main solve to the default gap), then for each workload and
each factor re-solves with that workload's demand times the factor, from the plan, as the analysis asks a demand
question (``AnalysisContext.solve_relaxed``: the plan as start, else the plan with that workload re-served greedily; HiGHS's
heuristics off; ``--limit`` s, the analysis's 5 s by default). Variants: ``none`` without block floors, ``floors``
with floors and ceilings but no block moves, ``moves`` as the planner runs (floors, ceilings and block moves).
Prints each re-solve's wall, status and fleet $/h, then per variant the total and how many were proven.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from bench_fleet import scenario  # noqa: E402

import planner.pipeline.plan as planning  # noqa: E402
import planner.solve.floors as blocks  # noqa: E402
from planner.catalog import load_catalog  # noqa: E402
from planner.catalog.scenario import Scenario, resolve_scenario  # noqa: E402
from planner.model.bounds import greedy_start, snapshot, solve_from  # noqa: E402
from planner.solve import Solver  # noqa: E402


def plan_model(n: int):
    """The fleet's MILP as the planner builds it (the planner's main solve is intercepted before it runs)."""
    caught = {}

    class Built(Exception):
        pass

    def catch(solver, m, starts, **kw):
        caught["m"] = m
        raise Built

    real, planning.solve_from = planning.solve_from, catch
    try:
        rs = resolve_scenario(Scenario.model_validate(scenario(n)), load_catalog())
        planning.make_plan(rs, planning.PlanOptions(jobs=1, analysis=False))
    except Built:
        pass
    finally:
        planning.solve_from = real
    return caught["m"]


def replay(n: int, variant: str, factors: list[float], limit: float) -> None:
    real_improve, real_min = blocks.improve, blocks.FLOOR_MIN_BLOCKS
    if variant == "none":
        blocks.FLOOR_MIN_BLOCKS = 10**9
    if variant == "floors":
        blocks.improve = lambda *a, **k: None
    try:
        m = plan_model(n)
        solver = Solver()
        r = solve_from(solver, m, greedy_start(m, check=False))
        print(f"[{variant}] plan: {r.status} ${r.objective:,.2f}/h in {r.wall_s:.2f} s", flush=True)
        base = snapshot(m)
        total, proven, asked = 0.0, 0, 0
        for f in factors:
            for w in m.W:
                old = m.demand[w].value
                m.demand[w] = old * f
                t = time.perf_counter()
                q = solver.limited(time_limit_s=limit, mip_gap=solver.mip_gap)
                r = solve_from(q, m, [base, lambda w=w: greedy_start(m, base, {w}, check=False)], heuristics=False)
                dt = time.perf_counter() - t
                m.demand[w] = old
                total, proven, asked = total + dt, proven + (r.status == "optimal"), asked + 1
                cost = "none" if r.objective is None else f"${r.objective:,.2f}/h"
                print(f"  {w} demand x{f:g}: {dt:.2f} s {r.status} {cost}", flush=True)
        print(f"[{variant}] {total:.1f} s for {asked} questions, {proven} proven")
    finally:
        blocks.improve, blocks.FLOOR_MIN_BLOCKS = real_improve, real_min


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="?", type=int, default=10)
    ap.add_argument("--factors", default="0.9,0.8")
    ap.add_argument("--limit", type=float, default=planning.SENSITIVITY_TIME_LIMIT_S)
    ap.add_argument("--variant", nargs="+", choices=["none", "floors", "moves"], default=["none", "floors", "moves"])
    a = ap.parse_args()
    for v in a.variant:
        replay(a.n, v, [float(f) for f in a.factors.split(",")], a.limit)


if __name__ == "__main__":
    main()
