"""Queueing at a pool's prefill: the wait of open arrivals (M/D/c), and the load a pool may be planned for so that
its TTFT (service plus wait) meets the target.
"""

from __future__ import annotations

import numpy as np

BOUNDS = ("compute", "memory", "communication")


LABELS = ("workload", "model", "role", "hardware", "engine", "weights_dtype", "weights_mode", "kv_dtype", "kv_tier",
          "prefix_tier", "bound", "factors")


def queue_wait(rho, servers, work_s):
    """Mean wait in queue of an M/D/c system (Poisson arrivals, deterministic service of ``work_s`` on
    ``servers`` parallel servers) at utilisation ``rho`` (Sakasegawa's approximation:
    ``rho^(sqrt(2 (c + 1)) - 1) / (c (1 - rho)) * work / 2``; exact M/D/1 for one server). With variable service
    (M/G/c, squared coefficient of variation ``cs2``) pass ``work_s * (1 + cs2)``: the wait scales by
    ``(1 + cs2)`` (Allen-Cunneen) while the utilisation stays that of the mean work."""
    rho = np.clip(np.asarray(rho, dtype=float), 0.0, 1.0 - 1e-12)
    c = np.maximum(np.asarray(servers, dtype=float), 1.0)
    return np.power(rho, np.sqrt(2.0 * (c + 1.0)) - 1.0) / (c * (1.0 - rho)) * np.asarray(work_s, dtype=float) / 2.0


def _utilisation_for_wait(c, work, slack) -> np.ndarray:
    """The utilisation at which the M/D/c wait of :func:`queue_wait` equals ``slack`` (``c > 1``, ``slack > 0``),
    from below. Newton on the log of the wait over the log-odds ``t = ln(rho / (1 - rho))``:
    ``f(t) = ln(work / (2 c slack)) + softplus(t) - a softplus(-t)`` with ``a = sqrt(2 (c + 1)) - 1 >= 1`` is
    increasing and concave, so after the first step every iterate lies at or below the root and climbs to it
    (the answer never breaks the wait); about six iterations where a bisection took forty."""
    c = np.maximum(np.asarray(c, dtype=float), 1.0)
    a = np.sqrt(2.0 * (c + 1.0)) - 1.0
    k = np.log(np.asarray(work, dtype=float) / (2.0 * c)) - np.log(np.asarray(slack, dtype=float))
    t = np.zeros_like(c)
    for _ in range(60):
        up, down = np.logaddexp(0.0, t), np.logaddexp(0.0, -t)  # -ln(1 - rho), -ln(rho)
        f = k + up - a * down
        step = f / (a * np.exp(-down - t) + np.exp(-up + t))  # f' = a (1 - rho) + rho
        t = t - step
        if np.all(np.abs(step) <= 1e-12 * np.maximum(1.0, np.abs(t))):
            break
    rho = 1.0 / (1.0 + np.exp(-t))
    # near rho = 1 the rounding of 1 - rho can put the wait a hair over: step down until it is not
    for i in range(40):
        over = queue_wait(rho, c, work) > slack
        if not over.any():
            break
        rho = np.where(over, rho - np.minimum(rho, 1.0 - rho) * 1e-13 * 2.0**i, rho)
    return rho


def planned_load(rows, ttft_limit_s, cap: float, *, with_ttft: bool = True, quantile=None, nodes=None,
                 cs2=0.0) -> tuple[np.ndarray, np.ndarray | None]:
    """(requests/s per replica, TTFT at that load) of each row: the highest request rate whose TTFT under
    open arrivals stays within ``ttft_limit_s`` and whose utilisation stays within ``cap`` (NaN rate where
    even an idle replica misses the limit). Decode rows carry no TTFT and run at the cap. Elementwise: the
    columns and the limit may be arrays of any shape that broadcast together. ``with_ttft=False``: the rate
    alone (``None`` for the TTFT).

    ``quantile``: the share of requests whose TTFT must meet the limit (a scalar or one per row; ``None`` or NaN:
    the mean TTFT meets it), with prompt lengths ``nodes = (x, p)`` (multiples of the mean length and their
    probabilities; fixed lengths without) and prefill service variability ``cs2`` (see
    :mod:`planner.perf.latency`); the TTFT returned is then at that quantile."""
    full, base, work, c = (np.asarray(rows[k], dtype=float)
                           for k in ("capacity_rps", "ttft_base_s", "queue_work_s", "queue_servers"))
    lim = np.broadcast_to(np.asarray(ttft_limit_s, dtype=float), base.shape)
    q = np.broadcast_to(np.asarray(np.nan if quantile is None else quantile, dtype=float), base.shape)
    cs2 = np.broadcast_to(np.asarray(cs2, dtype=float), base.shape)
    queued = work > 0
    slack = lim - base
    cs = np.maximum(c, 1.0)
    at_cap = np.clip(cap * full * work / cs, 0.0, 1.0)
    tail = ~np.isnan(q)
    mean = ~tail
    # Mean TTFT: the highest queue utilisation whose mean wait fits the slack (the wait grows with utilisation).
    # Only rows whose wait at the utilisation cap exceeds the slack need it; one server is the exact M/G/1
    # ``rho (1 + cs2) work / (2 (1 - rho)) <= slack``; more servers solve for it.
    weff = work * (1.0 + cs2)
    need = mean & queued & (slack >= 0) & (queue_wait(at_cap, c, weff) > slack)
    rho = np.ones(need.shape)
    one = need & (cs <= 1.0)
    rho[one] = 2.0 * slack[one] / (weff[one] + 2.0 * slack[one])
    many = need & (cs > 1.0)
    if many.any():
        rho[many] = _utilisation_for_wait(c[many], weff[many], slack[many])
    lam_slo = np.where(need, rho * cs / np.maximum(work, 1e-30), np.inf)
    feasible = slack >= 0
    sel = np.flatnonzero((tail & queued).ravel())
    pick = _picker(base.shape, sel, nodes)
    if sel.size:
        from planner.perf.latency import tail_load

        r = tail_load(pick(base), pick(work), pick(cs), pick(lim), pick(q), np.maximum(pick(at_cap), 1e-300),
                      *pick.nodes, pick(cs2))
        lt = np.full(base.size, np.inf)
        lt[sel] = np.where(np.isnan(r), np.nan, r * pick(cs) / np.maximum(pick(work), 1e-30))
        lt = lt.reshape(base.shape)
        lam_slo = np.where(tail & queued, np.where(np.isnan(lt), 0.0, lt), lam_slo)
        feasible = np.where(tail & queued, ~np.isnan(lt), feasible)
    lam = np.minimum(cap * full, lam_slo)
    lam = np.where(feasible, lam, np.nan)
    if not with_ttft:
        return lam, None
    t = np.where(queued & mean, base + queue_wait(lam * work / np.maximum(c, 1.0), c, weff), base)
    if sel.size:
        from planner.perf.latency import ttft_quantile

        rho_at = np.nan_to_num(pick(lam)) * pick(work) / pick(cs)
        t = t.copy().ravel()
        t[sel] = ttft_quantile(pick(q), pick(base), pick(work), rho_at, pick(cs), *pick.nodes, pick(cs2))
        t = t.reshape(base.shape)
    return lam, t


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
