"""How large an exact master over each workload's slot vectors would be (figures for issue 18's next step and
docs/formulation.md section 3, never a test; nothing in the planner uses this yet).

    python bench/bench_projections.py [N] [--demand W=F ...] [--block-limit S]

Plans the N-workload fleet of ``bench_fleet.py`` (default 10) in this process, then, on the plan's MILP as HiGHS
holds it (with ``--demand``: that workload's rate times F, re-solved from the plan as the analysis asks it):

1. each workload's floor ``Z_w`` (:mod:`planner.block_floors`) and its window ``U_w = C - sum_{w' != w} Z_w'``, where
   ``C`` is the plan's cost: every plan of cost at most ``C`` gives workload ``w`` chip dollars at most ``U_w``;
2. each workload's *projections*: the slots its replicas take on each purchase unit's packing row, for every
   integer assignment of its columns within the window, kept where no other takes fewer slots on every row
   (Pareto-minimal; found by splitting boxes of slot counts, one small MILP of the workload's own rows per box);
3. the master: one binary per (workload, projection), one chosen per workload, the units and every column of no
   workload as in the MILP, the packing rows with each workload's slots replaced by its chosen projection's. It
   is exact when every workload's columns reach the other workloads only through rows they can only fill (here the
   packing rows): a plan's workloads then each hold one of the projections or take at least its slots, which leaves
   the plan no cheaper. Its optimum is assembled into a plan of the MILP and checked on it.

Prints, per workload, the floor, the window, the projections found, the MILPs the enumeration took and its time;
then the master's size, time, optimum and the check, beside what HiGHS's own solve of the MILP took.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from bench_questions import plan_model  # noqa: E402

from planner.block_floors import objective_of  # noqa: E402
from planner.model.bounds import greedy_start, snapshot, solve_from  # noqa: E402
from planner.solve import Solver  # noqa: E402


def split_rows(lp, idx):
    """The block's own rows (every column of them in ``idx``) and its linking rows (also touching other columns)."""
    inside = np.zeros(lp.ncol, dtype=bool)
    inside[idx] = True
    touched = np.unique(lp.rows[inside[lp.cols]])
    outside_rows = np.unique(lp.rows[~inside[lp.cols]])
    link = np.intersect1d(touched, outside_rows)
    own = np.setdiff1d(touched, outside_rows)
    return own, link


def projections(lp, idx, cost, own, link, budget, limit_s):
    """The Pareto-minimal slot vectors (rows ``link``) of the block's integer assignments with ``cost <= budget``
    under its own rows ``own``: ``[(slots vector, assignment)]``, the MILPs solved, and whether it finished."""
    import highspy

    inf = highspy.kHighsInf
    n = len(idx)
    local = np.full(lp.ncol, -1, dtype=np.int64)
    local[idx] = np.arange(n)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.setOptionValue("mip_rel_gap", 0.0)
    lb, ub = lp.clo[idx], lp.chi[idx]
    h.addVars(n, lb, np.where(np.isfinite(ub), ub, inf))
    h.changeColsCost(n, np.arange(n, dtype=np.int32), cost)
    kind = lp.integer[idx]
    h.changeColsIntegrality(n, np.arange(n, dtype=np.int32), np.asarray([highspy.HighsVarType(int(k)) for k in kind]))

    def add(r, lo, hi):
        e = (lp.rows == r) & (local[lp.cols] >= 0)
        h.addRow(lo, hi, int(e.sum()), local[lp.cols[e]].astype(np.int32), lp.vals[e])

    for r in own:
        add(r, lp.rlo[r] if np.isfinite(lp.rlo[r]) else -inf, lp.rhi[r] if np.isfinite(lp.rhi[r]) else inf)
    h.addRow(-inf, budget, n, np.arange(n, dtype=np.int32), cost)
    P = np.zeros((len(link), n))
    for a, r in enumerate(link):
        e = (lp.rows == r) & (local[lp.cols] >= 0)
        P[a, local[lp.cols[e]]] = lp.vals[e]
    dims = np.flatnonzero(np.abs(P).sum(1) > 0)
    first = h.getNumRow()
    for d in dims:
        nz = np.flatnonzero(P[d])
        h.addRow(-inf, inf, len(nz), nz.astype(np.int32), P[d, nz])
    found, calls, t0 = [], [0], time.perf_counter()

    def box(lo, hi):
        if time.perf_counter() - t0 > limit_s:
            raise TimeoutError
        calls[0] += 1
        for i in range(len(dims)):
            h.changeRowBounds(first + i, lo[i], hi[i])
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return
        x = np.asarray(h.getSolution().col_value)
        x = np.where(kind != 0, np.round(x), x)
        t = P[dims] @ x
        found.append((t, x))
        # what t does not dominate: some row below t's, the rows before it at least t's (disjoint boxes)
        for i in range(len(dims)):
            if t[i] - 0.5 < lo[i]:
                continue
            l2, h2 = lo.copy(), hi.copy()
            h2[i] = t[i] - 0.5  # slot counts are whole on these rows
            l2[:i] = np.maximum(l2[:i], t[:i] - 1e-9)
            if (l2 <= h2).all():
                box(l2, h2)

    try:
        box(np.zeros(len(dims)), np.full(len(dims), 1e30))
        done = True
    except TimeoutError:
        done = False
    kept = [(t, x) for t, x in found if not any((u <= t + 1e-9).all() and (u < t - 1e-9).any() for u, _ in found)]
    full = [(P @ x, x) for _, x in kept]
    return full, calls[0], done


def master(lp, blocks, link_of, options, threads=1):
    """The master MILP over the blocks' projections; returns (objective, plan vector over lp's columns, wall)."""
    import highspy

    inf = highspy.kHighsInf
    in_block = np.zeros(lp.ncol, dtype=bool)
    for idx in blocks:
        in_block[idx] = True
    free = np.flatnonzero(~in_block)
    t0 = time.perf_counter()
    m = highspy.Highs()
    m.setOptionValue("output_flag", False)
    m.setOptionValue("threads", threads)
    m.setOptionValue("mip_rel_gap", 1e-4)
    nl = sum(len(o) for o in options)
    n = len(free) + nl
    lb = np.concatenate([lp.clo[free], np.zeros(nl)])
    ub = np.concatenate([lp.chi[free], np.ones(nl)])
    m.addVars(n, np.where(np.isfinite(lb), lb, -inf), np.where(np.isfinite(ub), ub, inf))
    lam_cost = [float(lp.cost[idx] @ x) for idx, opts in zip(blocks, options, strict=True) for _, x in opts]
    m.changeColsCost(n, np.arange(n, dtype=np.int32), np.concatenate([lp.cost[free], lam_cost]))
    kind = np.concatenate([lp.integer[free], np.ones(nl, dtype=np.int8)])
    m.changeColsIntegrality(n, np.arange(n, dtype=np.int32), np.asarray([highspy.HighsVarType(int(k)) for k in kind]))
    local = np.full(lp.ncol, -1, dtype=np.int64)
    local[free] = np.arange(len(free))
    # rows of non-block columns (packing rows get the projections' slots too); block-own rows are dropped
    extra: dict[int, list] = {}
    k = len(free)
    for b, opts in enumerate(options):
        cols = list(range(k, k + len(opts)))
        m.addRow(1, 1, len(cols), np.asarray(cols, dtype=np.int32), np.ones(len(cols)))
        for a, r in enumerate(link_of[b]):
            extra.setdefault(int(r), []).extend((k + j, float(t[a])) for j, (t, _) in enumerate(opts))
        k += len(opts)
    for r in np.unique(lp.rows[~in_block[lp.cols]]):
        e = (lp.rows == r) & ~in_block[lp.cols]
        cols = list(local[lp.cols[e]]) + [c for c, _ in extra.get(int(r), [])]
        vals = list(lp.vals[e]) + [v for _, v in extra.get(int(r), [])]
        lo = lp.rlo[r] if np.isfinite(lp.rlo[r]) else -inf
        hi = lp.rhi[r] if np.isfinite(lp.rhi[r]) else inf
        m.addRow(lo, hi, len(cols), np.asarray(cols, dtype=np.int32), np.asarray(vals, dtype=float))
    m.run()
    wall = time.perf_counter() - t0
    y = np.asarray(m.getSolution().col_value)
    x = np.zeros(lp.ncol)
    x[free] = np.where(lp.integer[free] != 0, np.round(y[: len(free)]), y[: len(free)])
    k = len(free)
    for idx, opts in zip(blocks, options, strict=True):
        for j, (_, xb) in enumerate(opts):
            if y[k + j] > 0.5:
                x[idx] = xb
        k += len(opts)
    info = m.getInfo()
    return info.objective_function_value, info.mip_dual_bound, x, wall, n, m.getNumRow()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="?", type=int, default=10)
    ap.add_argument("--demand", action="append", default=[], help="W=F: workload W's rate times F, re-solved from the plan")
    ap.add_argument("--block-limit", type=float, default=60.0, help="seconds one workload's enumeration may take")
    a = ap.parse_args()
    m = plan_model(a.n)
    solver = Solver()
    r = solve_from(solver, m, greedy_start(m, check=False))
    print(f"plan: {r.status} ${r.objective:,.2f}/h, HiGHS {r.wall_s:.2f} s")
    cost = r.objective
    if a.demand:
        base = snapshot(m)
        for spec in a.demand:
            w, f = spec.split("=")
            m.demand[w] = m.demand[w].value * float(f)
        q = solver.limited(time_limit_s=60.0, mip_gap=solver.mip_gap)
        r = solve_from(q, m, [base, lambda: greedy_start(m, base, check=False)], heuristics=False)
        print(f"question {' '.join(a.demand)}: {r.status} ${r.objective:,.2f}/h, bound ${r.bound:,.2f}/h, "
              f"HiGHS {r.wall_s:.2f} s (60 s limit)")
        cost = r.objective  # the best plan known: the windows follow it
    solver.load(m)
    floors, blocks = solver._block_floors(m)
    lp = floors.lp
    total = floors.total
    print(f"floors: sum ${total:,.2f}/h, cost ${cost:,.2f}/h, window ${cost - total:,.2f}/h")
    options, links = [], []
    t_all = time.perf_counter()
    for z, idx, c in floors.floors:
        own, link = split_rows(lp, idx)
        ok = all(np.isinf(lp.rlo[r]) and (lp.vals[(lp.rows == r) & np.isin(lp.cols, idx)] >= 0).all() for r in link)
        if not ok:
            print("a linking row the block can empty as well as fill: the master is not exact here")
            return
        t = time.perf_counter()
        opts, calls, done = projections(lp, idx, c, own, link, cost - (total - z) + 1e-6, a.block_limit)
        print(f"  floor ${z:8.2f}/h  window to ${cost - (total - z):8.2f}/h  {len(opts):4d} projections  "
              f"{calls:4d} MILPs  {time.perf_counter() - t:6.2f} s{'' if done else '  (stopped: incomplete)'}")
        options.append(opts)
        links.append(link)
    print(f"enumeration {time.perf_counter() - t_all:.2f} s")
    obj, bound, x, wall, ncol, nrow = master(lp, [idx for _, idx, _ in floors.floors], links, options)
    check = objective_of(lp, x)
    print(f"master: {ncol} columns x {nrow} rows, {wall:.3f} s, ${obj:,.2f}/h (bound ${bound:,.2f}/h); "
          f"its plan on the MILP: {'breaks a row' if check is None else f'${check:,.2f}/h'}")


if __name__ == "__main__":
    main()
