"""Batch limits between the grid's: a row at the largest batch that meets a TPOT target, per layout.

The candidate grid tries batch limits per attention rank in steps (:data:`planner.perf.candidates.BATCH_PER_RANK`).
A decode or aggregated layout whose TPOT quantile meets the workload's target at one step and misses it at the next
runs, on the grid alone, at the lower step: with doubling steps up to half the throughput per replica the target
allows, and the plan buys the difference (llama-70b-chat cost 1.74x what it costs with these rows; steps of 1.5x
instead took 1.5x the rows and still cost 1.23x; ``python bench/refine_check.py``, 2 min, every bundled scenario). So, per layout and target, the batch where the TPOT quantile crosses the
target is read off the two grid rows around it (TPOT is nearly linear in the batch between them), rounded down to a
whole batch per rank, and that one row is evaluated like any other: the performance model times it and the SLO
filter keeps it only if it meets its targets, so a refined row is never assumed, only placed.
"""

from __future__ import annotations

import numpy as np

from planner.perf.latency import lognormal_quantile

REFINED_ROLES = ("aggregated", "decode")
"""Roles whose rows carry a decode batch (a prefill pass is one prompt per rank)."""


def crossing_batches(tpq: np.ndarray, b_rank: np.ndarray, target: float) -> tuple[np.ndarray, np.ndarray]:
    """(line, batch per rank) of the rows to add for one TPOT ``target``: ``tpq`` and ``b_rank`` are (lines, steps),
    a line a layout's grid rows in rising batch (NaN: not evaluated, e.g. out of memory). Where a line meets the
    target at step ``k`` and misses it at ``k + 1``, the batch where the quantile, linear between the two, reaches
    the target, rounded down; only batches strictly between the two steps."""
    ok = tpq <= target
    n, steps = tpq.shape
    if steps < 2 or not ok.any():
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    # the last step that meets the target, per line (argmax over the reversed row)
    last = steps - 1 - np.argmax(ok[:, ::-1], axis=1)
    rows = np.flatnonzero(ok.any(axis=1) & (last < steps - 1))
    k = last[rows]
    lo_q, hi_q = tpq[rows, k], tpq[rows, k + 1]
    lo_b, hi_b = b_rank[rows, k].astype(float), b_rank[rows, k + 1].astype(float)
    live = np.isfinite(hi_q) & (hi_q > target) & (hi_q > lo_q)
    rows, lo_q, hi_q, lo_b, hi_b = rows[live], lo_q[live], hi_q[live], lo_b[live], hi_b[live]
    b = np.floor(lo_b + (target - lo_q) / (hi_q - lo_q) * (hi_b - lo_b))
    keep = (b > lo_b) & (b < hi_b)
    return rows[keep], b[keep].astype(np.int64)


def refined_grids(grid: dict[str, np.ndarray], evaluated, q: float | None, targets, steps: int
                  ) -> dict[str, dict[str, np.ndarray]]:
    """Per role of :data:`REFINED_ROLES`, the grid rows to add between ``grid``'s batch steps (``steps`` a line;
    the grid's rows are lines of rising batch): ``evaluated`` holds ``(role, grid positions, tpot_s, tpot_cv)`` of
    rows the grid evaluated (every format and tier of one workload), ``q`` the TPOT quantile (None: the mean) and
    ``targets`` the TPOT limits (seconds) to meet. A line's rows are its grid's with ``b_rank`` and ``batch`` moved;
    lines and batches are sorted and unique, so the rows do not depend on the order they were found in."""
    n = len(grid["b_rank"])
    lines = n // steps
    b_rank = grid["b_rank"].reshape(lines, steps)
    qq = np.nan if q is None else q
    picks: dict[str, set[tuple[int, int]]] = {}
    for role, gat, tpot, cv in evaluated:
        if role not in REFINED_ROLES or not len(gat):
            continue
        tpq = np.full(n, np.nan)
        tpq[gat] = lognormal_quantile(np.asarray(tpot, dtype=float), np.asarray(cv, dtype=float), qq)
        tpq = tpq.reshape(lines, steps)
        got = picks.setdefault(role, set())
        for t in targets:
            rows, b = crossing_batches(tpq, b_rank, float(t))
            got.update(zip(rows.tolist(), b.tolist(), strict=True))
    out = {}
    for role, got in picks.items():
        if not got:
            continue
        line, b = (np.array(v, dtype=np.int64) for v in zip(*sorted(got), strict=True))
        at = line * steps  # any row of the line: the layout's columns do not depend on the batch
        g = {k: v[at].copy() for k, v in grid.items()}
        g["b_rank"] = b.astype(grid["b_rank"].dtype)
        g["batch"] = (b * grid["attn_dp"][at]).astype(grid["batch"].dtype)
        out[role] = g
    return out


def refine_targets(levels, workloads) -> dict[str, tuple[float, ...]]:
    """Per workload, the TPOT limits (seconds) its layouts get a row at: every level's (``levels``: SLO sets, as
    :func:`planner.perf.candidates.evaluate_candidates` streams them), or the workload's own without levels."""
    sets = levels or [{w.name: (w.slo.ttft_s, w.slo.tpot_s) for w in workloads}]
    return {w.name: tuple(sorted({float(lv[w.name][1]) for lv in sets if w.name in lv})) for w in workloads}
