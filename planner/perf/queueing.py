"""Queueing at a pool's prefill: the wait of open arrivals (M/D/c), and the load a pool may be planned for so that
its TTFT (service plus wait) meets the target.
"""

from __future__ import annotations

import numpy as np

BOUNDS = ("compute", "memory", "communication")
PENDING_LOAD = -1.0
"""The load :func:`planned_load` gives a row not searched (``search`` False) that meets its TTFT at some load but not
at its cap: below ``cap x capacity``, not known."""


LABELS = ("workload", "model", "role", "hardware", "engine", "weights_dtype", "weights_mode", "kv_dtype", "kv_tier",
          "prefix_tier", "bound", "factors")


def queue_wait(rho, servers, work_s):
    """Mean wait in queue of an M/D/c system (Poisson arrivals, deterministic service of ``work_s`` on
    ``servers`` parallel servers) at utilisation ``rho``: Erlang's C times the exact M/D/c mean wait of those who wait
    (:func:`planner.perf.waits.wait_tail`; Pollaczek-Khinchine for one server). With variable service (M/G/c, squared
    coefficient of variation ``cs2``) pass ``work_s * (1 + cs2)``: the wait scales by ``(1 + cs2)`` while the
    utilisation stays that of the mean work."""
    from planner.perf.latency import wait_tail

    pw, th = wait_tail(rho, servers, work_s)
    return pw * th


def planned_load(rows, ttft_limit_s, cap: float, *, with_ttft: bool = True, quantile=None, nodes=None,
                 cs2=0.0, slots=None, handover=None, search=None) -> tuple[np.ndarray, np.ndarray | None]:
    """(requests/s per replica, TTFT at that load) of each row: the highest request rate whose TTFT under
    open arrivals stays within ``ttft_limit_s`` and whose utilisation stays within ``cap`` (NaN rate where
    even an idle replica misses the limit). Decode rows carry no TTFT and run at the cap. Elementwise: the
    columns and the limit may be arrays of any shape that broadcast together. ``with_ttft=False``: the rate
    alone (``None`` for the TTFT).

    ``quantile``: the share of requests whose TTFT must meet the limit (a scalar or one per row; ``None`` or NaN:
    the mean TTFT meets it), with prompt lengths ``nodes = (x, p)`` (multiples of the mean length and their
    probabilities; fixed lengths without) and prefill service variability ``cs2`` (see
    :mod:`planner.perf.latency`); the TTFT returned is then at that quantile. ``slots``: ``(batch, cs2_out)`` per
    row, the batch slots an aggregated replica's requests wait for (held from admission to the last token, the
    replica's ``batch / capacity_rps`` seconds on average, output-length spread ``cs2_out``); batch 0: none.
    ``handover``: ``(batch, miss)`` per row of a disaggregated decode pool, whose load keeps the chance that a
    handed-over request finds every slot held within ``miss`` (:func:`planner.perf.latency.decode_slot_rho`).
    ``search``: per row (broadcast to the rows), whether to search the load of a queued row that misses its TTFT at
    the cap; the others come back as :data:`PENDING_LOAD` (below the cap, not known; TTFT NaN), so
    that a caller can search only the rows whose exact load can matter (None: every row)."""
    full, base, work, c = (np.asarray(rows[k], dtype=float)
                           for k in ("capacity_rps", "ttft_base_s", "queue_work_s", "queue_servers"))
    lim = np.broadcast_to(np.asarray(ttft_limit_s, dtype=float), base.shape)
    q = np.broadcast_to(np.asarray(np.nan if quantile is None else quantile, dtype=float), base.shape)
    cs2 = np.broadcast_to(np.asarray(cs2, dtype=float), base.shape)
    queued = work > 0
    slack = lim - base
    cs = np.maximum(c, 1.0)
    at_cap = np.clip(cap * full * work / cs, 0.0, 1.0 - 1e-9)  # a queue is stable below utilisation 1
    slot_b = np.zeros(base.shape) if slots is None else np.broadcast_to(np.asarray(slots[0], dtype=float), base.shape)
    # every queued row solves for its load the same way, on the mean or at a quantile (perf/latency.py)
    lam_slo = np.full(base.shape, np.inf)
    pending = np.zeros(base.shape, dtype=bool)
    feasible = slack >= 0
    sel = np.flatnonzero(queued.ravel())
    pick = _picker(base.shape, sel, nodes)
    if sel.size:
        from planner.perf.latency import PENDING, tail_load

        r = tail_load(pick(base), pick(work), pick(cs), pick(lim), pick(q), np.maximum(pick(at_cap), 1e-300),
                      *pick.nodes, pick(cs2), slots=_slot_spec(pick, slots, slot_b, full),
                      search=None if search is None else pick(np.asarray(search, dtype=bool)))
        lt = np.full(base.size, np.inf)
        lt[sel] = np.where(np.isnan(r), np.nan, r * pick(cs) / np.maximum(pick(work), 1e-30))
        pending = np.zeros(base.size, dtype=bool)
        pending[sel] = r == PENDING
        pending = pending.reshape(base.shape)
        lt = lt.reshape(base.shape)
        lam_slo = np.where(queued, np.where(np.isnan(lt), 0.0, lt), lam_slo)
        feasible = np.where(queued, ~np.isnan(lt), feasible)
    lam = np.minimum(cap * full, lam_slo)
    if handover is not None:
        from planner.perf.latency import decode_slot_rho

        hb = np.broadcast_to(np.asarray(handover[0], dtype=float), base.shape)
        miss = np.broadcast_to(np.asarray(handover[1], dtype=float), base.shape)
        dec = ~queued & (hb > 0) & ~np.isnan(miss)
        if dec.any():
            lam = np.array(lam, dtype=float)
            lam[dec] = np.minimum(lam[dec], decode_slot_rho(hb[dec], miss[dec], cap) * full[dec])
    lam = np.where(feasible, np.where(pending, PENDING_LOAD, lam), np.nan)
    if not with_ttft:
        return lam, None
    t = base.copy()
    if sel.size:
        from planner.perf.latency import ttft_quantile

        rho_at = np.maximum(np.nan_to_num(pick(lam)), 0.0) * pick(work) / pick(cs)
        t = t.copy().ravel()
        t[sel] = ttft_quantile(pick(q), pick(base), pick(work), rho_at, pick(cs), *pick.nodes, pick(cs2),
                               slots=_slot_spec(pick, slots, slot_b, full))
        t = np.where(pending, np.nan, t.reshape(base.shape))
    return lam, t


def _slot_spec(pick, slots, slot_b, full):
    """``(batch, hold, cs2_out)`` of the picked rows' slot queues (None without slots)."""
    if slots is None:
        return None
    b = pick(slot_b)
    return b, b / np.maximum(pick(full), 1e-30), pick(np.asarray(slots[1], dtype=float))


class _picker:
    """The rows ``sel`` (flat positions in ``shape``) of arrays that broadcast to ``shape``, and of the length
    nodes (one set for every row, or one per row)."""

    def __init__(self, shape, sel, nodes):
        self.shape, self.sel = shape, sel
        xs, ps = (np.ones(1), np.ones(1)) if nodes is None else (np.asarray(nodes[0], float), np.asarray(nodes[1], float))
        self.nodes = tuple(v if v.ndim == 1 else
                           np.broadcast_to(v, (*shape, v.shape[-1])).reshape(-1, v.shape[-1])[sel] for v in (xs, ps))

    def __call__(self, v):
        return np.broadcast_to(v, self.shape).ravel()[self.sel]
