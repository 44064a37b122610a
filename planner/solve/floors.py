"""Block floors: valid rows that tell HiGHS what each block of a MILP costs at least, for one solve.

A model may declare blocks (:attr:`planner.solve.structure.Structure.blocks`: for each, its variables and a linear cost of them at the
parameters as they stand) such that every plan's block cost is at least what the block's own rows allow. The
deployment MILP's blocks are its workloads, their cost the dollars of the chips their replicas occupy
(:func:`planner.model.build.define_workload_blocks`): the workloads share nothing but the purchase units, so the
MILP's LP relaxation lets each workload serve its demand with a fraction of its cheapest row's replicas, and the
gap between that and the cheapest whole replicas, summed over the workloads, is most of what branch and bound then
has to close (on the 30-workload fleet the LP bound is $2,029.52/h where the optimum is $2,084.80/h, and the
workloads' floors add to $2,080.70/h).

For each block ``b`` its floor ``Z_b`` is the dual bound of a small MILP: minimise the block's cost subject to every
row of the model HiGHS holds that touches the block, each with the other blocks' columns replaced by the range
their bounds allow (a row that the others can always satisfy drops out; a unit that is fixed to 0 or capped keeps
its bound on the block). That is a relaxation of the model, so every plan has block cost at least ``Z_b``: the row
``cost_b(x) >= Z_b`` cuts off no plan. Where the model also declares that its objective is at least the sum of its
blocks' costs (``Structure.objective_covers_blocks``) and the solve starts from a plan of objective ``C`` (every
plan worth finding costs at most ``C``), a plan worth finding has ``cost_b(x) <= C - sum_{b' != b} Z_b'`` too: the
row gets that upper side, which confines each block to its near-cheapest configurations.

Each block's MILP also yields an assignment of least block cost; from a known plan, :func:`improve` tries moving
blocks to those (one binary per block), and a cheaper plan found becomes the solve's start and cutoff.

The rows are added to HiGHS's copy of the model for one solve and removed after it (Pyomo never sees them), and
each block's floor is kept by a digest of its small MILP, so a re-solve that changed one block solves one.
docs/formulation.md section 3 has the figures.
Knows nothing of the physics: only rows, columns and the costs the model declares.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

FLOOR_MIN_BLOCKS = 2
"""Floors are added to models of at least this many blocks (one block's floor is the model's own question)."""

FLOOR_TIME_LIMIT_S = 1.0
"""Time limit of one block's MILP; its dual bound at the limit is still a floor, only a lower one."""

FLOOR_GAP = 1e-6
"""Relative gap a block's MILP is solved to (its dual bound is the floor)."""

_CACHE_SIZE = 4096
_floors: OrderedDict[bytes, tuple[float, np.ndarray | None] | None] = OrderedDict()
"""Floors and the assignments that attain them by the digest of their block's MILP, across the solvers of this
process (``None``: infeasible)."""


class Lp:
    """The arrays of the model HiGHS holds, column-wise, with each entry's row and column."""

    def __init__(self, h):
        h.ensureColwise()
        lp = h.getLp()
        self.ncol, self.nrow = lp.num_col_, lp.num_row_
        a = lp.a_matrix_
        start = np.asarray(a.start_, dtype=np.int64)
        self.rows = np.asarray(a.index_, dtype=np.int64)
        self.vals = np.asarray(a.value_, dtype=float)
        self.cols = np.repeat(np.arange(self.ncol), np.diff(start))
        self.clo, self.chi = np.asarray(lp.col_lower_, dtype=float), np.asarray(lp.col_upper_, dtype=float)
        self.rlo, self.rhi = np.asarray(lp.row_lower_, dtype=float), np.asarray(lp.row_upper_, dtype=float)
        self.cost = np.asarray(lp.col_cost_, dtype=float)
        self.offset = float(lp.offset_)
        self.integer = np.zeros(self.ncol, dtype=np.int8)
        if len(lp.integrality_):
            self.integer = np.asarray([int(t) for t in lp.integrality_], dtype=np.int8)


def objective_of(lp: Lp, x: np.ndarray, tol: float = 1e-6) -> float | None:
    """The objective of the column vector ``x`` in ``lp``, or ``None`` where it breaks a row or column bound
    (relative tolerance ``tol``) or is fractional where a column is integer."""
    if ((x < lp.clo - tol) | (x > lp.chi + tol)).any():
        return None
    integer = lp.integer != 0
    if integer.any() and (np.abs(x - np.round(x))[integer] > tol).any():
        return None
    act = np.bincount(lp.rows, weights=lp.vals * x[lp.cols], minlength=lp.nrow)
    scale = tol * np.maximum(1.0, np.abs(act))
    if ((act < lp.rlo - scale) | (act > lp.rhi + scale)).any():
        return None
    return float(lp.cost @ x + lp.offset)


@dataclass
class Floors:
    lp: Lp
    """The model the floors were derived from (HiGHS's copy, without the floor rows)."""
    floors: list[tuple[float, np.ndarray, np.ndarray]]
    """``(floor, columns, coefficients)`` per block with a finite floor."""
    optima: list[tuple[np.ndarray, np.ndarray]]
    """Per block whose MILP found one: its columns and the assignment of least block cost (it meets the block's
    rows with the other blocks at their bounds, not necessarily with them where a plan puts them)."""

    @property
    def total(self) -> float:
        return sum(f for f, _, _ in self.floors)

    def rows(self, cutoff: float | None, objective_covers: bool) -> list[tuple[float, float, np.ndarray, np.ndarray]]:
        """``(lower, upper, columns, coefficients)`` per block with a finite floor: ``cost_b(x) >= Z_b`` and, where
        the objective covers the blocks' costs and a plan of objective ``cutoff`` is known, ``cost_b(x) <= cutoff -
        sum_{b' != b} Z_b'`` (tolerances on both sides)."""
        total, out = self.total, []
        for floor, idx, cost in self.floors:
            lower = floor - 1e-7 * max(1.0, abs(floor))
            upper = np.inf
            if objective_covers and cutoff is not None and np.isfinite(cutoff):
                upper = cutoff - (total - floor) + 1e-6 * max(1.0, abs(cutoff))
                if upper < lower:  # a plan that breaks a floor cannot be (tolerances): keep the lower side only
                    upper = np.inf
            out.append((lower, upper, idx, cost))
        return out


def block_floors(h, blocks: list[tuple[np.ndarray, np.ndarray]], *, threads: int) -> Floors | None:
    """The floors of ``blocks`` (column indices and their cost coefficients) of the HiGHS model ``h``
    (``highspy.Highs``, loaded); ``None`` where a block's MILP is infeasible (so is the model: HiGHS will say so on
    its own)."""
    lp = Lp(h)
    # each entry's least and most contribution to its row's activity over its column's bounds
    lo_c = np.where(lp.vals > 0, lp.vals * lp.clo[lp.cols], lp.vals * lp.chi[lp.cols])
    hi_c = np.where(lp.vals > 0, lp.vals * lp.chi[lp.cols], lp.vals * lp.clo[lp.cols])
    act = _Activity(lp.rows, lo_c, hi_c, lp.nrow)
    floors, optima = [], []
    for idx, cost in blocks:
        if not len(idx):
            continue
        found = _block_floor(lp, idx, cost, lo_c, hi_c, act, threads)
        if found is None:
            return None
        floor, best = found
        if best is not None:
            optima.append((idx, best))
        if np.isfinite(floor):
            floors.append((floor, idx, cost))
    return Floors(lp, floors, optima)


def improve(lp: Lp, start: np.ndarray, blocks: list[np.ndarray], optima: list[tuple[np.ndarray, np.ndarray]], *,
            threads: int) -> tuple[np.ndarray, float] | None:
    """A cheaper plan than ``start`` (a plan of the model ``lp``, :attr:`Floors.lp`, a vector over its columns) and
    its objective, checked on ``lp`` (:func:`objective_of`),
    or ``None``: the best of the plans that keep each block where ``start`` has it or move it to its block optimum
    (``optima``), every column of no block (``blocks``: the blocks' columns) set anew (:func:`choose`, one option
    per block: a few milliseconds). A block's optimum ignores where the others are, so the cheapest choice is seldom
    all of them; it is a plan of the whole model, and where a change relaxed one block (less demand, a looser SLO)
    it is often the re-solve's optimum."""
    found = choose(lp, start, blocks, [(idx, [best]) for idx, best in optima], threads=threads,
                   time_limit_s=FLOOR_TIME_LIMIT_S)
    if found is None:
        return None
    x, value, _ = found
    if value >= float(lp.cost @ start + lp.offset) - 1e-9 * max(1.0, abs(value)):
        return None
    return x, value


def choose(lp: Lp, start: np.ndarray, blocks: list[np.ndarray], options: list[tuple[np.ndarray, list[np.ndarray]]],
           *, threads: int, time_limit_s: float, mip_gap: float = 1e-9) -> tuple[np.ndarray, float, float] | None:
    """The cheapest plan of ``lp`` that keeps each block where ``start`` (a plan, a vector over ``lp``'s columns) has
    it or moves it to one of its ``options`` (per block: its columns and assignments of them), with every column of
    no block (``blocks``: the blocks' columns) set anew: a MILP of one binary per option that differs from
    ``start``, at most one per block, plus the columns of no block. Returns the plan, its objective (checked on
    ``lp`` with :func:`objective_of`, never assumed from HiGHS's tolerances) and HiGHS's dual bound, or ``None``
    where HiGHS ends without a plan that passes the check."""
    import highspy

    in_block = np.zeros(lp.ncol, dtype=bool)
    for idx in blocks:
        in_block[idx] = True
    moves, groups, owner = [], [], []  # (columns, change from start) per option, and its block; option indices per
    # block with more than one
    for b, (idx, assignments) in enumerate(options):
        first = len(moves)
        for a in assignments:
            a = np.where(lp.integer[idx] != 0, np.round(a), a)
            if np.abs(a - start[idx]).max() > 1e-9:
                moves.append((idx, a - start[idx]))
                owner.append(b)
        if len(moves) - first > 1:
            groups.append(range(first, len(moves)))
    if not moves:
        return None
    free = np.flatnonzero(~in_block)
    fixed = np.where(in_block, start, 0.0)
    shift = np.bincount(lp.rows, weights=lp.vals * fixed[lp.cols], minlength=lp.nrow)
    m = highspy.Highs()
    m.setOptionValue("output_flag", False)
    m.setOptionValue("threads", int(threads))
    m.setOptionValue("mip_rel_gap", mip_gap)
    m.setOptionValue("time_limit", float(time_limit_s))
    inf = highspy.kHighsInf
    n = len(free) + len(moves)
    lb = np.concatenate([lp.clo[free], np.zeros(len(moves))])
    ub = np.concatenate([lp.chi[free], np.ones(len(moves))])
    m.addVars(n, np.where(np.isfinite(lb), lb, -inf), np.where(np.isfinite(ub), ub, inf))
    cost = np.concatenate([lp.cost[free], [float(lp.cost[idx] @ d) for idx, d in moves]])
    m.changeColsCost(n, np.arange(n, dtype=np.int32), cost)
    kind = np.concatenate([lp.integer[free], np.ones(len(moves), dtype=np.int8)])
    if kind.any():
        m.changeColsIntegrality(n, np.arange(n, dtype=np.int32), np.asarray([highspy.HighsVarType(int(k)) for k in kind]))
    # entries: the free columns' own, and each move's column A[:, idx] @ d
    local = np.full(lp.ncol, -1, dtype=np.int64)
    local[free] = np.arange(len(free))
    own = local[lp.cols] >= 0
    r_parts, c_parts, v_parts = [lp.rows[own]], [local[lp.cols[own]]], [lp.vals[own]]
    # A row of no free column that the moves of one block alone touch, and that start and each of those moves keep,
    # holds in every plan of the master (at most one move per block): left out, as the blocks' own rows are.
    slack = 1e-7 * np.maximum(1.0, np.abs(shift))
    holds = (shift >= lp.rlo - slack) & (shift <= lp.rhi + slack)
    touched_by = np.full(lp.nrow, -1, dtype=np.int64)  # the one block whose moves touch the row (-2: several)
    for k, (idx, d) in enumerate(moves):
        delta = np.zeros(lp.ncol)
        delta[idx] = d
        sel = delta[lp.cols] != 0
        col = np.bincount(lp.rows[sel], weights=lp.vals[sel] * delta[lp.cols[sel]], minlength=lp.nrow)
        nz = np.flatnonzero(col)
        act = shift[nz] + col[nz]
        holds[nz] &= (act >= lp.rlo[nz] - slack[nz]) & (act <= lp.rhi[nz] + slack[nz])
        prev = touched_by[nz]
        touched_by[nz] = np.where((prev == -1) | (prev == owner[k]), owner[k], -2)
        r_parts.append(nz)
        c_parts.append(np.full(len(nz), len(free) + k))
        v_parts.append(col[nz])
    redundant = holds & (touched_by >= 0)
    redundant[lp.rows[own]] = False
    r, c, v = np.concatenate(r_parts), np.concatenate(c_parts), np.concatenate(v_parts)
    keep_entry = ~redundant[r]
    r, c, v = r[keep_entry], c[keep_entry], v[keep_entry]
    kept = np.unique(r)  # a row of the fixed columns alone holds at start's values: left out
    pos = np.full(lp.nrow, -1, dtype=np.int64)
    pos[kept] = np.arange(len(kept))
    r = pos[r]
    order = np.lexsort((c, r))
    r, c, v = r[order], c[order], v[order]
    starts = np.concatenate([[0], np.cumsum(np.bincount(r, minlength=len(kept)))]).astype(np.int32)
    lo, hi = (lp.rlo - shift)[kept], (lp.rhi - shift)[kept]
    m.addRows(len(kept), np.where(np.isfinite(lo), lo, -inf), np.where(np.isfinite(hi), hi, inf), len(v),
              starts[:-1], c.astype(np.int32), v)
    for g in groups:  # at most one option of a block
        m.addRow(-inf, 1.0, len(g), np.asarray([len(free) + k for k in g], dtype=np.int32), np.ones(len(g)))
    keep = highspy.HighsSolution()
    keep.col_value = list(np.concatenate([start[free], np.zeros(len(moves))]))
    keep.value_valid = True
    m.setSolution(keep)
    m.run()
    sol = m.getSolution()
    if not sol.value_valid:
        return None
    y = np.asarray(sol.col_value, dtype=float)
    x = start.copy()
    x[free] = np.where(lp.integer[free] != 0, np.round(y[: len(free)]), y[: len(free)])
    for k, (idx, d) in enumerate(moves):
        if y[len(free) + k] > 0.5:
            x[idx] = start[idx] + d
    value = objective_of(lp, x)  # HiGHS's tolerances and the rounding to integers: checked, never assumed
    if value is None:
        return None
    return x, value, float(m.getInfo().mip_dual_bound)


class _Activity:
    """Per row: the sum of the finite least (most) contributions and the count of infinite ones."""

    def __init__(self, rows, lo_c, hi_c, nrow):
        self.lo_fin, self.lo_inf = _split(rows, lo_c, nrow)
        self.hi_fin, self.hi_inf = _split(rows, hi_c, nrow)


def _split(rows, c, nrow):
    inf = ~np.isfinite(c)
    return (np.bincount(rows, weights=np.where(inf, 0.0, c), minlength=nrow),
            np.bincount(rows, weights=inf.astype(float), minlength=nrow))


def _block_floor(lp: Lp, idx, cost, lo_c, hi_c, act, threads):
    cols, rows, vals, clo, chi, rlo, rhi, integer = lp.cols, lp.rows, lp.vals, lp.clo, lp.chi, lp.rlo, lp.rhi, lp.integer
    ncol = len(clo)
    local = np.full(ncol, -1, dtype=np.int64)
    local[idx] = np.arange(len(idx))
    mine = local[cols] >= 0
    touched = np.unique(rows[mine])
    # the other columns' least and most activity per touched row: the row's less the block's own entries
    b_lo_fin, b_lo_inf = _split(rows[mine], lo_c[mine], len(rlo))
    b_hi_fin, b_hi_inf = _split(rows[mine], hi_c[mine], len(rlo))
    o_lo_inf = (act.lo_inf - b_lo_inf)[touched]
    o_hi_inf = (act.hi_inf - b_hi_inf)[touched]
    o_lo = np.where(o_lo_inf > 0.5, -np.inf, (act.lo_fin - b_lo_fin)[touched])
    o_hi = np.where(o_hi_inf > 0.5, np.inf, (act.hi_fin - b_hi_fin)[touched])
    lower = rlo[touched] - o_hi  # rlo - (most the others add); -inf where they can add without limit
    upper = rhi[touched] - o_lo
    lower = np.where(np.isnan(lower), -np.inf, lower)
    upper = np.where(np.isnan(upper), np.inf, upper)
    keep = np.isfinite(lower) | np.isfinite(upper)
    touched, lower, upper = touched[keep], lower[keep], upper[keep]
    # the block's entries of the rows kept, row by row
    pos = np.full(len(rlo), -1, dtype=np.int64)
    pos[touched] = np.arange(len(touched))
    sel = mine & (pos[rows] >= 0)
    r_local, c_local, v = pos[rows[sel]], local[cols[sel]], vals[sel]
    order = np.lexsort((c_local, r_local))
    r_local, c_local, v = r_local[order], c_local[order], v[order]
    starts = np.concatenate([[0], np.cumsum(np.bincount(r_local, minlength=len(touched)))]).astype(np.int32)
    lb, ub, kind = clo[idx], chi[idx], integer[idx]
    key = _digest(cost, lb, ub, kind, lower, upper, starts, c_local, v)
    if key in _floors:
        _floors.move_to_end(key)
        return _floors[key]
    found = _solve_block(cost, lb, ub, kind, lower, upper, starts, c_local, v, threads)
    _floors[key] = found
    if len(_floors) > _CACHE_SIZE:
        _floors.popitem(last=False)
    return found


def _digest(*arrays) -> bytes:
    d = hashlib.blake2b(digest_size=16)
    for arr in arrays:
        b = np.ascontiguousarray(arr).tobytes()
        d.update(len(b).to_bytes(8, "little"))
        d.update(b)
    return d.digest()


def _solve_block(cost, lb, ub, kind, lower, upper, starts, cols, vals, threads):
    """The block's floor, its MILP's dual bound (its LP optimum where no column is integer; ``-inf`` where HiGHS ends
    without a bound), and the best assignment it found (``None``: none); ``None`` where it is infeasible."""
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", int(threads))
    h.setOptionValue("mip_rel_gap", FLOOR_GAP)
    h.setOptionValue("time_limit", FLOOR_TIME_LIMIT_S)
    inf = highspy.kHighsInf
    n = len(cost)
    h.addVars(n, np.where(np.isfinite(lb), lb, -inf), np.where(np.isfinite(ub), ub, inf))
    h.changeColsCost(n, np.arange(n, dtype=np.int32), np.asarray(cost, dtype=float))
    if kind.any():
        h.changeColsIntegrality(n, np.arange(n, dtype=np.int32),
                                np.asarray([highspy.HighsVarType(int(k)) for k in kind]))
    if len(lower):
        h.addRows(len(lower), np.where(np.isfinite(lower), lower, -inf), np.where(np.isfinite(upper), upper, inf),
                  len(vals), starts[:-1], cols.astype(np.int32), vals)
    h.run()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible:
        return None
    info = h.getInfo()
    if kind.any():
        bound = info.mip_dual_bound
    elif status == highspy.HighsModelStatus.kOptimal:
        bound = info.objective_function_value
    else:
        bound = -np.inf
    sol = h.getSolution()
    best = np.asarray(sol.col_value, dtype=float) if sol.value_valid else None
    return (float(bound) if np.isfinite(bound) else -np.inf), best
