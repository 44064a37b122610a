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
    ``rho^(sqrt(2 (c + 1)) - 1) / (c (1 - rho)) * work / 2``; exact M/D/1 for one server)."""
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


def planned_load(rows, ttft_limit_s, cap: float, *, with_ttft: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """(requests/s per replica, TTFT at that load) of each row: the highest request rate whose TTFT under
    open arrivals stays within ``ttft_limit_s`` and whose utilisation stays within ``cap`` (NaN rate where
    even an idle replica misses the limit). Decode rows carry no TTFT and run at the cap. Elementwise: the
    columns and the limit may be arrays of any shape that broadcast together. ``with_ttft=False``: the rate
    alone (``None`` for the TTFT)."""
    full, base, work, c = (np.asarray(rows[k], dtype=float)
                           for k in ("capacity_rps", "ttft_base_s", "queue_work_s", "queue_servers"))
    lim = np.broadcast_to(np.asarray(ttft_limit_s, dtype=float), base.shape)
    queued = work > 0
    slack = lim - base
    # Highest queue utilisation whose wait fits the slack (the wait grows with utilisation). Only rows whose
    # wait at the utilisation cap exceeds the slack need it; one server is the exact M/D/1
    # ``rho work / (2 (1 - rho)) <= slack``, i.e. ``rho = 2 slack / (work + 2 slack)``; more servers bisect.
    cs = np.maximum(c, 1.0)
    at_cap = np.clip(cap * full * work / cs, 0.0, 1.0)
    need = queued & (slack >= 0) & (queue_wait(at_cap, c, work) > slack)
    rho = np.ones(need.shape)
    one = need & (cs <= 1.0)
    rho[one] = 2.0 * slack[one] / (work[one] + 2.0 * slack[one])
    many = need & (cs > 1.0)
    if many.any():
        rho[many] = _utilisation_for_wait(c[many], work[many], slack[many])
    lam_slo = np.where(need, rho * cs / np.maximum(work, 1e-30), np.inf)
    lam = np.minimum(cap * full, lam_slo)
    lam = np.where(slack >= 0, lam, np.nan)
    if not with_ttft:
        return lam, None
    t = np.where(queued, base + queue_wait(lam * work / np.maximum(c, 1.0), c, work), base)
    return lam, t
