"""Solving one point of a sweep, sharing the candidate pool and the model of its group with the points before it
(mutable parameters re-solved in place): what every runner (this process, worker processes, Dask) runs.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from planner.catalog.loader import Catalog
from planner.catalog.scenario import ResolvedScenario
from planner.errors import InfeasibleError, PlannerError
from planner.model import build_model, prepare
from planner.model.build import update_parameters
from planner.model.data import drop_unpowered
from planner.options import PlanOptions
from planner.perf.candidates import evaluate_candidates, scenario_slos, scenario_tails, select_candidates
from planner.pipeline.diagnose import diagnose_candidates, diagnose_limits
from planner.results import extract, solution_values
from planner.solve import Solver
from planner.sweep.points import (
    keys_of,
    validate_point,
)

_CHUNK_LOCK = threading.Lock()


@dataclass
class _Group:
    table: object
    model: object
    solver: Solver


_POOLS: dict[str, tuple] = {}


_GROUPS: dict[str, _Group] = {}


def clear_groups() -> None:
    """Forget the candidate pools and models kept for the groups of points solved so far (a new sweep)."""
    _POOLS.clear()
    _GROUPS.clear()


def _workload_columns(plan, sc) -> dict:
    out = {}
    for w in sc.workloads:
        pools = [p for p in plan.pools if p.workload == w.name]
        wo = next(x for x in plan.workloads if x.name == w.name)
        out[f"{w.name}.hardware"] = "+".join(sorted({p.hardware for p in pools}))
        out[f"{w.name}.layout"] = "+".join(
            f"{p.role[0]}:{p.engine}:{p.layout.notation.replace(' ', '')}x{p.replicas}" for p in pools
        )
        out[f"{w.name}.batch"] = "+".join(str(p.batch) for p in pools)
        out[f"{w.name}.kv_tier"] = "+".join(sorted({p.kv_tier for p in pools}))
        out[f"{w.name}.ttft_ms"] = wo.ttft_s * 1e3
        out[f"{w.name}.tpot_ms"] = wo.tpot_s * 1e3
        out[f"{w.name}.tokens_per_s_per_user"] = 1.0 / wo.tpot_s if wo.tpot_s > 0 else math.nan
    return out


def solve_point(rs: ResolvedScenario, doc: dict, opts: PlanOptions) -> dict:
    """One point: reuse the evaluated pool and the built model of its group when there is one."""
    pool_key, model_key = keys_of(doc)
    t0 = time.perf_counter()
    build_s = update_s = solve_s = 0.0
    row: dict = {}
    try:
        rs2, _ = drop_unpowered(rs)
        if pool_key not in _POOLS:
            # points arrive grouped (see ``iter_points``): keep one evaluated pool and its models at a time
            _POOLS.clear()
            _GROUPS.clear()
            _POOLS[pool_key] = (evaluate_candidates(rs2, opts.engine, shares=opts.prefix_shares),)
        (pool,) = _POOLS[pool_key]
        grp = _GROUPS.get(model_key)
        if grp is None:
            table = select_candidates(pool, scenario_slos(rs2.scenario.workloads), tails=scenario_tails(rs2.scenario.workloads),
                                      keep=None if rs2.fleet is None else rs2.fleet.keys())
            diagnose_candidates(rs2, pool, table)
            data = prepare(rs2, table)
            model = build_model(data)
            grp = _Group(table, model, Solver(time_limit_s=opts.time_limit_s, mip_gap=opts.mip_gap,
                                              threads=opts.solver_threads))
            _GROUPS[model_key] = grp
            build_s = time.perf_counter() - t0
        else:
            diagnose_candidates(rs2, pool, grp.table)
            t1 = time.perf_counter()
            data = prepare(rs2, grp.table)
            update_parameters(grp.model, data)
            update_s = time.perf_counter() - t1
        res = grp.solver.solve(grp.model)
        solve_s = res.wall_s
        if res.status == "infeasible":
            raise InfeasibleError(diagnose_limits(data, opts))
        if not res.has_solution:
            row = {"status": "limit", "diagnosis": f"no plan within {opts.time_limit_s:g} s ({res.termination})"}
        else:
            x, u = solution_values(grp.model)
            plan = extract(rs2, data, x, u, res)
            o = plan.objective
            row = {"status": plan.status, "usd_per_hour": o.usd_per_hour, "usd_per_mtok": o.usd_per_mtok,
                   "usd_per_mtok_input": o.usd_per_mtok_input, "usd_per_mtok_output": o.usd_per_mtok_output,
                   "mip_gap": res.mip_gap, **_workload_columns(plan, rs2.scenario), "diagnosis": ""}
    except PlannerError as err:
        row = {"status": "infeasible" if isinstance(err, InfeasibleError) else "error", "diagnosis": str(err)}
    row.update({"build_s": build_s, "update_s": update_s, "solve_s": solve_s, "wall_s": time.perf_counter() - t0})
    return row


def run_chunk(args) -> list[tuple[int, dict]]:
    """Solve a chunk of points in a worker: ``(points, catalog, scenario path, options)``; ``catalog`` is a
    :class:`Catalog` or the folder to load one from. One chunk at a time per process (the evaluated pools
    and built models are cached per process)."""
    points, catalog, path, opts = args
    with _CHUNK_LOCK:
        if not isinstance(catalog, Catalog):
            from planner.catalog import load_catalog

            root, alone = catalog if catalog is not None else (None, False)
            catalog = load_catalog(root, alone=alone)
        return [(idx, solve_one(inputs, doc, catalog, path, opts)) for idx, inputs, doc in points]


def solve_one(inputs: dict, doc: dict, catalog: Catalog, path: Path, opts: PlanOptions) -> dict:
    """One point's row; a combination of values the scenario schema refuses is an error row, not an abort."""
    try:
        rs = validate_point(doc, catalog, path, inputs)
    except PlannerError as err:
        return {**inputs, "status": "error", "diagnosis": str(err), "build_s": 0.0, "update_s": 0.0,
                "solve_s": 0.0, "wall_s": 0.0}
    return {**inputs, **solve_point(rs, doc, opts)}

