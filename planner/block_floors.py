"""Block floors: valid rows that tell HiGHS what each block of a MILP costs at least, for one solve.

A model may declare blocks (``model._blocks()``: for each, its variables and a linear cost of them at the
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
blocks' costs (``model._objective_covers_blocks``) and the solve starts from a plan of objective ``C`` (every
plan worth finding costs at most ``C``), a plan worth finding has ``cost_b(x) <= C - sum_{b' != b} Z_b'`` too: the
row gets that upper side, which confines each block to its near-cheapest configurations.

The rows are added to HiGHS's copy of the model for one solve and removed after it (Pyomo never sees them), and
each block's floor is kept by a digest of its small MILP, so a re-solve that changed one block solves one.
Knows nothing of the physics: only rows, columns and the costs the model declares.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

FLOOR_MIN_BLOCKS = 2
"""Floors are added to models of at least this many blocks (one block's floor is the model's own question)."""

FLOOR_TIME_LIMIT_S = 1.0
"""Time limit of one block's MILP; its dual bound at the limit is still a floor, only a lower one."""

FLOOR_GAP = 1e-6
"""Relative gap a block's MILP is solved to (its dual bound is the floor)."""

_CACHE_SIZE = 4096
_floors: OrderedDict[bytes, float | None] = OrderedDict()
"""Floors by the digest of their block's MILP, across the solvers of this process (``None``: infeasible)."""


def block_rows(h, blocks: list[tuple[np.ndarray, np.ndarray]], *, threads: int, cutoff: float | None,
               objective_covers: bool) -> tuple[list[tuple[float, float, np.ndarray, np.ndarray]], float] | None:
    """Floor rows for the HiGHS model ``h`` (``highspy.Highs``, loaded) and its ``blocks`` (column indices and their
    cost coefficients): ``(lower, upper, columns, coefficients)`` per block with a finite floor, and the sum of the
    floors; ``None`` where a block's MILP is infeasible (so is the model: HiGHS will say so on its own)."""
    h.ensureColwise()
    lp = h.getLp()
    ncol, nrow = lp.num_col_, lp.num_row_
    a = lp.a_matrix_
    start = np.asarray(a.start_, dtype=np.int64)
    rows = np.asarray(a.index_, dtype=np.int64)
    vals = np.asarray(a.value_, dtype=float)
    cols = np.repeat(np.arange(ncol), np.diff(start))
    clo, chi = np.asarray(lp.col_lower_, dtype=float), np.asarray(lp.col_upper_, dtype=float)
    rlo, rhi = np.asarray(lp.row_lower_, dtype=float), np.asarray(lp.row_upper_, dtype=float)
    integer = np.zeros(ncol, dtype=np.int8)
    if len(lp.integrality_):
        integer = np.asarray([int(t) for t in lp.integrality_], dtype=np.int8)
    # each entry's least and most contribution to its row's activity over its column's bounds
    lo_c = np.where(vals > 0, vals * clo[cols], vals * chi[cols])
    hi_c = np.where(vals > 0, vals * chi[cols], vals * clo[cols])
    act = _Activity(rows, lo_c, hi_c, nrow)
    out, total = [], 0.0
    for idx, cost in blocks:
        if not len(idx):
            continue
        floor = _block_floor(idx, cost, cols, rows, vals, lo_c, hi_c, act, clo, chi, rlo, rhi, integer, threads)
        if floor is None:
            return None
        if not np.isfinite(floor):
            continue
        out.append([floor, idx, cost])
        total += floor
    result = []
    for floor, idx, cost in out:
        lower = floor - 1e-7 * max(1.0, abs(floor))
        upper = np.inf
        if objective_covers and cutoff is not None and np.isfinite(cutoff):
            upper = cutoff - (total - floor)
            upper += 1e-6 * max(1.0, abs(cutoff))
            if upper < lower:  # a start that breaks a floor cannot be (tolerances): keep the lower side only
                upper = np.inf
        result.append((lower, upper, idx, cost))
    return result, total


class _Activity:
    """Per row: the sum of the finite least (most) contributions and the count of infinite ones."""

    def __init__(self, rows, lo_c, hi_c, nrow):
        self.lo_fin, self.lo_inf = _split(rows, lo_c, nrow)
        self.hi_fin, self.hi_inf = _split(rows, hi_c, nrow)


def _split(rows, c, nrow):
    inf = ~np.isfinite(c)
    return (np.bincount(rows, weights=np.where(inf, 0.0, c), minlength=nrow),
            np.bincount(rows, weights=inf.astype(float), minlength=nrow))


def _block_floor(idx, cost, cols, rows, vals, lo_c, hi_c, act, clo, chi, rlo, rhi, integer, threads) -> float | None:
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
    floor = _solve_block(cost, lb, ub, kind, lower, upper, starts, c_local, v, threads)
    _floors[key] = floor
    if len(_floors) > _CACHE_SIZE:
        _floors.popitem(last=False)
    return floor


def _digest(*arrays) -> bytes:
    d = hashlib.blake2b(digest_size=16)
    for arr in arrays:
        b = np.ascontiguousarray(arr).tobytes()
        d.update(len(b).to_bytes(8, "little"))
        d.update(b)
    return d.digest()


def _solve_block(cost, lb, ub, kind, lower, upper, starts, cols, vals, threads) -> float | None:
    """The block's floor: its MILP's dual bound (its LP optimum where no column is integer); ``None`` where it is
    infeasible, ``-inf`` where HiGHS ends without a bound."""
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
    return float(bound) if np.isfinite(bound) else -np.inf
