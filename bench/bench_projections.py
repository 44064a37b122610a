"""The master over each workload's slot vectors (:mod:`planner.solve.master`) measured on the N-workload fleet
(figures for issue 18 and docs/formulation.md section 3, never a test).

    python bench/bench_projections.py [N] [--demand W=F ...] [--window question|plan] [--reference]
                                      [--block-limit S]

Plans the N-workload fleet of ``bench_fleet.py`` (default 10) in this process, then, on the plan's MILP as HiGHS
holds it (with ``--demand``: that workload's rate times F, re-solved from the plan as the analysis asks it; the windows
from that re-solve's plan, or with ``--window plan`` from the plan's cost):

1. each workload's floor ``Z_w`` (:mod:`planner.solve.floors`) and its window ``U_w = C - sum_{w' != w} Z_w'``, where
   ``C`` is the best plan's cost: every plan of cost at most ``C`` gives workload ``w`` chip dollars at most ``U_w``;
2. each workload's Pareto-minimal slot vectors within its window, from its rows
   (:func:`planner.solve.master.vectors`); with ``--reference`` also by the first method, one small MILP of the
   workload's own rows per box of slot counts, splitting each box around the vector it found, and the two sets
   compared;
3. the masters over those vectors: the MILP (:func:`planner.solve.floors.choose`) and the residue programme
   (``block_master._residues``), beside what HiGHS's own solve of the MILP took;
4. :func:`planner.solve.master.prove` from the plan as the solve runs it (windows widened from the floors' sum).
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

import planner.solve.master as bm  # noqa: E402
from planner.model.bounds import greedy_start, snapshot, solve_from  # noqa: E402
from planner.solve import Solver  # noqa: E402
from planner.solve.floors import choose  # noqa: E402


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
    """An assignment of least ``cost`` per Pareto-minimal slot vector (rows ``link``) of the block's integer
    assignments with ``cost <= budget`` under its own rows ``own``; the MILPs solved; whether it finished."""
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
    kept = [x for t, x in found if not any((u <= t + 1e-9).all() and (u < t - 1e-9).any() for u, _ in found)]
    return kept, calls[0], done


def exact_here(m, lp, idx, cost, link) -> str | None:
    """Why the master would not be exact for this block, or ``None``: every linking row can only be filled by the
    block (an upper bound, entries >= 0), and the block's cost and objective are a price per linking row times the
    column's entry in it, so an assignment of fewer slots on every row costs no more."""
    from planner.solve.structure import structure_of

    if not structure_of(m).objective_covers_blocks:
        return "the objective does not cover the blocks' costs (no windows)"
    inside = np.zeros(lp.ncol, dtype=bool)
    inside[idx] = True
    sel = inside[lp.cols] & np.isin(lp.rows, link)
    if not (np.isinf(lp.rlo[link]).all() and (lp.vals[sel] >= 0).all()):
        return "a linking row the block can empty as well as fill"
    col_cost = np.zeros(lp.ncol)
    col_cost[idx] = cost
    per_row: dict[int, tuple[float, float]] = {}
    linked = np.zeros(lp.ncol, dtype=bool)
    for r, j, v in zip(lp.rows[sel], lp.cols[sel], lp.vals[sel], strict=True):
        if linked[j]:
            return "a column on two linking rows"
        linked[j] = True
        price = (col_cost[j] / v, lp.cost[j] / v)
        if not np.allclose(per_row.setdefault(int(r), price), price, rtol=1e-9, atol=1e-12):
            return "a cost that is not a price per slot of its row"
    if (col_cost[idx][~linked[idx]] != 0).any() or (lp.cost[idx][~linked[idx]] != 0).any():
        return "a cost on a column of no linking row"
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="?", type=int, default=10)
    ap.add_argument("--demand", action="append", default=[], help="W=F: workload W's rate times F, re-solved from the plan")
    ap.add_argument("--window", choices=["question", "plan"], default="question",
                    help="the windows from the question's best plan (default) or from the plan's cost")
    ap.add_argument("--reference", action="store_true", help="also enumerate by one MILP per box and compare")
    ap.add_argument("--block-limit", type=float, default=60.0, help="seconds one workload's enumeration (and its reference) may take")
    a = ap.parse_args()
    m = plan_model(a.n)
    changes = []
    for spec in a.demand:
        w, _, f = spec.partition("=")
        try:
            factor = float(f)
        except ValueError:
            factor = -1.0
        if w not in m.W or not factor > 0:
            ap.error(f"--demand {spec}: give W=F, W one of {', '.join(m.W)} and F a positive number")
        changes.append((w, factor))
    solver = Solver()
    r = solve_from(solver, m, greedy_start(m, check=False))
    print(f"plan: {r.status} ${r.objective:,.2f}/h, HiGHS {r.wall_s:.2f} s")
    cost = r.objective
    if changes:
        base = snapshot(m)
        for w, factor in changes:
            m.demand[w] = m.demand[w].value * factor
        q = solver.limited(time_limit_s=60.0, mip_gap=solver.mip_gap)
        r = solve_from(q, m, [base, lambda: greedy_start(m, base, check=False)], heuristics=False)
        print(f"question {' '.join(a.demand)}: {r.status} ${r.objective:,.2f}/h, bound ${r.bound:,.2f}/h, "
              f"HiGHS {r.wall_s:.2f} s (60 s limit)")
        if a.window == "question":
            cost = r.objective  # the best plan known: the windows follow it
    solver.load(m)
    start = solver._column_values(snapshot(m))  # the best plan known, as a vector over HiGHS's columns
    floors, blocks = solver._block_floors(m)
    covers = solver._covers(m, floors)
    lp = floors.lp
    total = floors.total
    print(f"floors: sum ${total:,.2f}/h, windows from ${cost:,.2f}/h: ${cost - total:,.2f}/h wide")
    options, vecs, shapes = [], [], []
    t_all, t_ref = time.perf_counter(), 0.0
    for (z, idx, c), cover in zip(floors.floors, covers, strict=True):
        own, link = split_rows(lp, idx)
        why = exact_here(m, lp, idx, c, link)
        sh = bm.shape(lp, idx, c, cover)
        if why is not None or isinstance(sh, str):
            print(f"the master is not exact here: {why or sh}")
            return
        shapes.append(sh)
        budget = cost - (total - z) + 1e-6
        t = time.perf_counter()
        try:
            found = bm.vectors(sh, budget, deadline=t + a.block_limit)
        except bm.TooMany:
            print(f"  floor ${z:8.2f}/h  window to ${budget:8.2f}/h  stopped after {time.perf_counter() - t:.1f} s "
                  f"(--block-limit) or at {bm.MAX_CANDIDATES:,} candidates: the master is not tried")
            return
        dt = time.perf_counter() - t
        line = f"  floor ${z:8.2f}/h  window to ${budget:8.2f}/h  {len(found):5d} vectors  {dt:6.3f} s"
        if a.reference:
            t = time.perf_counter()
            points, calls, done = projections(lp, idx, c, own, link, budget, a.block_limit)
            t_ref += time.perf_counter() - t
            ref = {tuple(int(round(v)) for v in _slots(lp, sh, idx, x)) for x in points}
            mine = {tuple(int(v) for v in vec) for vec, _ in found}
            line += (f"  | reference {len(ref):5d} in {calls:4d} MILPs {time.perf_counter() - t:6.2f} s"
                     f"{'' if done else ' (stopped: incomplete)'}  {'same' if ref == mine else 'DIFFERENT'}")
        print(line, flush=True)
        option, vec = bm._as_options(sh, z, found)
        options.append(option)
        vecs.append(vec)
    print(f"enumeration {time.perf_counter() - t_all - t_ref:.3f} s" + (f", reference {t_ref:.2f} s" if a.reference else ""))
    n = sum(len(o) for _, o in options)
    t = time.perf_counter()
    found = choose(lp, start, [idx for _, idx, _ in floors.floors], options, threads=1, time_limit_s=600.0,
                   mip_gap=solver.mip_gap)
    wall = time.perf_counter() - t
    if found is None:
        print(f"MILP master: {wall:.3f} s, no plan that differs from the best known (${cost:,.2f}/h)")
    else:
        print(f"MILP master: one binary per vector ({n}), {wall:.3f} s, ${found[1]:,.2f}/h checked on the MILP, "
              f"bound ${found[2]:,.2f}/h")
    units = bm._units(bm._Index(lp), floors, shapes)
    if units is None:
        print("residue master: the linking rows are not units")
    else:
        t = time.perf_counter()
        got = bm._residues(lp, start, units, floors, vecs, options, cost, cost, float("inf"))
        wall = time.perf_counter() - t
        print("residue master: " + ("out of states" if got is None else
                                    f"{wall:.3f} s, ${got[1]:,.2f}/h checked on the MILP, bound ${got[2]:,.2f}/h"))
    t = time.perf_counter()
    proof = bm.prove(floors, covers, start, cost, threads=1, mip_gap=solver.mip_gap, time_limit_s=600.0)
    if proof is None:
        print("prove: nothing proven")
        return
    print(f"prove from the best plan: {time.perf_counter() - t:.3f} s, ${proof.value:,.2f}/h, bound ${proof.bound:,.2f}/h")
    for level, used, best, bound, master, took in proof.levels:
        print(f"  window to ${level:,.2f}/h: {used:5d} vectors, {master:8s} best ${best:,.2f}/h, bound ${bound:,.2f}/h, "
              f"{took:.3f} s")


def _slots(lp, sh, idx, x):
    """The slots assignment ``x`` of the block's columns puts on each of its linking rows (``sh.links``)."""
    full = np.zeros(lp.ncol)
    full[idx] = x
    put = np.bincount(lp.rows, weights=lp.vals * full[lp.cols], minlength=lp.nrow)[sh.links]
    return np.abs(put)


if __name__ == "__main__":
    main()
