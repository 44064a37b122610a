"""Waiting in an M/G/c queue: the probability of waiting (Erlang's C, exact up to 256 servers, Halfin and Whitt's
limit beyond), the decay of the wait's tail (the Cramer-Lundberg root of the queue with service ``S / c``) and its
mean (Pollaczek-Khinchine for one server, Cosmetatos' M/D/c correction between M/D/c and M/M/c, Allen-Cunneen
above). :mod:`planner.perf.latency` builds TTFT's distribution from them; the references are in
:func:`wait_tail` and :func:`mean_wait_factor`.
"""

from __future__ import annotations

import math

import numpy as np

_LOGIT = np.linspace(-24.0, 24.0, 9601)
_DT = float(_LOGIT[1] - _LOGIT[0])
EXACT_SERVERS = 256
"""Erlang's C is exact (tabulated) up to this many servers; beyond, the Halfin-Whitt limit."""
_ERLANG = np.full((EXACT_SERVERS + 1, _LOGIT.size), np.nan)
_HW_BETA = np.linspace(0.0, 40.0, 4001)
_HW: np.ndarray | None = None


def _erlang_rows(cs: np.ndarray) -> None:
    """Fill the table's rows ``cs``: ln C(c, rho) over the log-odds grid (Erlang B by its recursion
    ``B_k = a B_{k-1} / (k + a B_{k-1})``, then ``C = B / (1 - rho (1 - B))``)."""
    rho = 1.0 / (1.0 + np.exp(-_LOGIT))
    for c in cs:
        a = rho * c
        b = np.ones_like(a)
        for k in range(1, int(c) + 1):
            b = a * b / (k + a * b)
        _ERLANG[int(c)] = np.log(np.maximum(b / (1.0 - rho * (1.0 - b)), 1e-300))


def _halfin_whitt(beta: np.ndarray) -> np.ndarray:
    """ln C of many servers at ``beta = (1 - rho) sqrt(c)`` (Halfin and Whitt, Operations Research 29(3), 1981):
    ``C = 1 / (1 + beta Phi(beta) / phi(beta))``, tabulated over beta."""
    global _HW
    if _HW is None:
        log_ratio = np.array([math.log(b * 0.5 * math.erfc(-b / math.sqrt(2.0)) * math.sqrt(2.0 * math.pi)) + b * b / 2.0
                              if b > 0 else -np.inf for b in _HW_BETA])
        _HW = -np.logaddexp(0.0, log_ratio)
    far = beta > _HW_BETA[-1]
    out = np.interp(np.minimum(beta, _HW_BETA[-1]), _HW_BETA, _HW)
    # beyond the table: ratio ~ beta sqrt(2 pi) e^{beta^2 / 2}
    return np.where(far, -np.log(np.maximum(beta, 1e-300) * math.sqrt(2.0 * math.pi)) - beta * beta / 2.0, out)


def erlang_c(servers, rho) -> np.ndarray:
    """Probability that an arrival waits in an M/M/c queue at utilisation ``rho``: Erlang's C formula, exact at
    whole server counts up to :data:`EXACT_SERVERS` (tabulated per count, interpolated in the log-odds of
    ``rho``), the Halfin-Whitt limit beyond."""
    c = np.maximum(np.rint(np.asarray(servers, dtype=float)), 1.0)
    rho = np.clip(np.asarray(rho, dtype=float), 0.0, 1.0 - 1e-12)
    c, rho = np.broadcast_arrays(c, rho)
    shape = c.shape
    c, rho = c.ravel(), rho.ravel()
    with np.errstate(divide="ignore"):
        t = np.log(rho) - np.log1p(-rho)
    small = c <= EXACT_SERVERS
    ci = np.where(small, c, 1).astype(np.int64)
    if np.isnan(_ERLANG[ci, 0]).any():
        rows = np.unique(ci)
        _erlang_rows(rows[np.isnan(_ERLANG[rows, 0])])
    pos = (np.clip(t, _LOGIT[0], _LOGIT[-1]) - _LOGIT[0]) / _DT
    i = np.minimum(pos.astype(np.int64), _LOGIT.size - 2)
    f = pos - i
    v = (1.0 - f) * _ERLANG[ci, i] + f * _ERLANG[ci, i + 1]
    # below the grid C ~ rho^c (every server busy); above it C -> 1
    v = np.where(t < _LOGIT[0], _ERLANG[ci, 0] + ci * np.minimum(t - _LOGIT[0], 0.0), v)
    if not small.all():
        big = ~small
        v[big] = _halfin_whitt((1.0 - rho[big]) * np.sqrt(c[big]))
    out = np.where(rho <= 0, 0.0, np.exp(np.minimum(v, 0.0)))
    return out.reshape(shape)


_DECAY: dict[float, np.ndarray] = {}


def _decay_table(cs2: float) -> np.ndarray:
    """ln u*(rho) over ``_LOGIT``: the root ``u > 0`` of ``rho (M(u) - 1) = u`` where ``M`` is the moment generating
    function of a service time of mean 1 and squared coefficient of variation ``cs2`` (a gamma law; ``e^u`` for
    deterministic service). Solved in ``v = ln M(u)``, where ``u = (1 - e^{-cs2 v}) / cs2`` (``v`` itself for
    ``cs2 = 0``) and ``F(v) = rho (e^v - 1) - u(v)`` is convex with ``F(0) = 0`` and ``F'(0) < 0``: Newton from the
    right of the root (``v0 = 2 ln(1 + 1 / rho) + 2``, where ``rho e^v0 ~ e^2 / rho`` exceeds ``u(v0) <= v0``) climbs
    down to it monotonically."""
    t = _DECAY.get(cs2)
    if t is None:
        rho = 1.0 / (1.0 + np.exp(-_LOGIT))

        def u_of(v):
            return v if cs2 <= 1e-12 else -np.expm1(-cs2 * v) / cs2

        def du_of(v):
            return np.ones_like(v) if cs2 <= 1e-12 else np.exp(-cs2 * v)

        v = 2.0 * np.log1p(1.0 / rho) + 2.0
        for _ in range(200):
            f = rho * np.expm1(v) - u_of(v)
            step = f / (rho * np.exp(v) - du_of(v))
            new = v - step
            if np.all(np.abs(new - v) <= 1e-14 * np.maximum(v, 1e-300)):
                v = new
                break
            v = np.maximum(new, 1e-300)
        u = u_of(v)
        heavy = 2.0 * (1.0 - rho) / (rho * (1.0 + cs2))  # the heavy-traffic root, where Newton ran out of digits
        u = np.where((u > 1e-250) & np.isfinite(u), u, heavy)
        t = np.log(u)
        _DECAY[cs2] = t
    return t


def decay_rate(rho, cs2=0.0) -> np.ndarray:
    """u*: the exponential decay rate of the wait's tail in units of the per-server mean service (see
    :func:`wait_tail`)."""
    rho = np.clip(np.asarray(rho, dtype=float), 1e-300, 1.0 - 1e-12)
    cs2 = np.asarray(cs2, dtype=float)
    rho, cs2 = np.broadcast_arrays(rho, cs2)
    t = np.clip(np.log(rho) - np.log1p(-rho), _LOGIT[0], _LOGIT[-1])
    pos = (t - _LOGIT[0]) / _DT
    i = np.minimum(pos.astype(np.int64), _LOGIT.size - 2)
    f = pos - i
    if cs2.size and cs2.min() == cs2.max():
        tab = _decay_table(round(float(cs2.flat[0]), 9))
        return np.exp((1.0 - f) * tab[i] + f * tab[i + 1])
    out = np.empty(rho.shape)
    key = np.round(cs2, 9)
    for v in np.unique(key):
        m = key == v
        tab = _decay_table(float(v))
        out[m] = np.exp((1.0 - f[m]) * tab[i[m]] + f[m] * tab[i[m] + 1])
    return out


def mean_wait_factor(servers, rho, cs2) -> np.ndarray:
    """The mean wait of an M/G/c queue over that of M/M/c: Cosmetatos' correction for deterministic service,
    ``(1 + K) / 2`` with ``K = (1 - rho) (c - 1) (sqrt(4 + 5 c) - 2) / (16 rho c)`` (Cosmetatos, Operational
    Research Quarterly 27(3), 1976; at most 1), interpolated linearly in ``cs2`` to M/M/c's 1, and Allen-Cunneen's
    ``(1 + cs2) / 2`` above it."""
    c = np.maximum(np.asarray(servers, dtype=float), 1.0)
    rho = np.clip(np.asarray(rho, dtype=float), 1e-12, 1.0)
    cs2 = np.asarray(cs2, dtype=float)
    k = (1.0 - rho) * (c - 1.0) * (np.sqrt(4.0 + 5.0 * c) - 2.0) / (16.0 * rho * c)
    det = np.minimum(0.5 * (1.0 + k), 1.0)  # never above M/M/c's (the correction grows without bound as rho -> 0)
    return np.where(cs2 <= 1.0, cs2 + (1.0 - cs2) * det, (1.0 + cs2) / 2.0)


def wait_tail(rho, servers, work, cs2=0.0) -> tuple[np.ndarray, np.ndarray]:
    """(probability of waiting, mean wait of a request that waits) of an M/G/c queue at utilisation ``rho``
    with mean service ``work`` on ``servers`` servers; the tail is ``P(W > t) = P_W e^{-t / theta}``. One server:
    it decays at the Cramer-Lundberg rate ``u* / work`` (exact in the tail of M/D/1 and M/M/1), weighted so that the
    mean is Pollaczek-Khinchine's. Several: ``P_W`` is Erlang's C and ``theta`` gives the mean of
    :func:`mean_wait_factor` times M/M/c's. Against simulation of M/D/c and M/G/c at 1-256 servers and
    utilisation 0.3-0.9 the p90 and p99 stay within about 15% (``tests/test_latency.py``)."""
    rho = np.clip(np.asarray(rho, dtype=float), 0.0, 1.0 - 1e-12)
    c = np.maximum(np.asarray(servers, dtype=float), 1.0)
    cs2 = np.asarray(cs2, dtype=float)
    work = np.asarray(work, dtype=float)
    rho, c, cs2, work = np.broadcast_arrays(rho, c, cs2, work)
    pw = erlang_c(c, rho)
    # several servers: Erlang's C and the mean
    th = mean_wait_factor(c, rho, cs2) * work / (c * (1.0 - rho))
    one = np.rint(c) <= 1.0
    if one.any():
        # one server: the Cramer-Lundberg decay, the mean matched (Erlang's C is rho)
        u = decay_rate(rho[one], cs2[one])
        pw = np.array(pw, dtype=float)
        th = np.array(th, dtype=float)
        pw[one] = np.minimum(rho[one] * (1.0 + cs2[one]) / 2.0 * u / (1.0 - rho[one]), 1.0)
        th[one] = work[one] / u
    return np.where(rho > 0, pw, 0.0), th


def max_wait_tail(s, p1, t1, p2, t2):
    """P(max(W1, W2) > s), ``s >= 0``, of independent waits that are 0 or, with probability ``p``, exponential of mean
    ``t``: ``1 - (1 - P1(s)) (1 - P2(s))``. The wait for a batch slot and the prefill queue's overlap rather than add:
    first come, first served, a request starts its prefill at the later of its admission (a slot freed) and the
    server's release from the work of the requests before it, and that work was served while it waited for the slot
    (``planner.analysis.simulate.fcfs``). Summing the two waits put long-docs' p99 TTFT 19% above its simulation
    (``bench/percentiles.py``); the maximum is within 1% of it pooled over five seeds (4% simulated alone) and
    exact where either wait vanishes."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        e1 = np.where(t1 > 0, np.exp(-s / np.where(t1 > 0, t1, 1.0)), 0.0)
        e2 = np.where(t2 > 0, np.exp(-s / np.where(t2 > 0, t2, 1.0)), 0.0)
    a, b = p1 * e1, p2 * e2
    return a + b - a * b


def max_mean(p1, t1, p2, t2):
    """E[max(W1, W2)] of the waits of :func:`max_wait_tail`: ``E W1 + E W2 - E min(W1, W2)``, the minimum exponential of
    rate ``1/t1 + 1/t2`` where both wait."""
    with np.errstate(divide="ignore", invalid="ignore"):
        both = np.where((t1 > 0) & (t2 > 0), t1 * t2 / np.where((t1 > 0) & (t2 > 0), t1 + t2, 1.0), 0.0)
    return p1 * t1 + p2 * t2 - p1 * p2 * both


def slot_tail(rho_slot, batch, hold, cs2_out=0.0) -> tuple[np.ndarray, np.ndarray]:
    """(probability of waiting, mean wait of a request that waits) for one of a replica's ``batch`` slots, each
    held ``hold`` seconds on average (from admission to the last token), at slot utilisation ``rho_slot``: the
    same M/G/c approximation with the output-length spread as service variability (no slots, ``batch`` 0: no
    wait)."""
    b = np.asarray(batch, dtype=float)
    pw, th = wait_tail(rho_slot, np.maximum(b, 1.0), hold, cs2_out)
    return np.where(b > 0, pw, 0.0), np.where(b > 0, th, 0.0)


def decode_slot_rho(batch, miss, cap_rho) -> np.ndarray:
    """The highest slot utilisation (at most ``cap_rho``) at which a request waits for one of ``batch`` slots with
    probability at most ``miss`` (Erlang's C; deterministic holding times wait less), by bisection from below."""
    b = np.maximum(np.asarray(batch, dtype=float), 1.0)
    b, miss, cap_rho = np.broadcast_arrays(b, np.asarray(miss, dtype=float), np.asarray(cap_rho, dtype=float))
    ok = erlang_c(b, cap_rho) <= miss
    lo, hi = np.zeros(b.shape), cap_rho.astype(float).copy()
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        good = erlang_c(b, mid) <= miss
        lo, hi = np.where(good, mid, lo), np.where(good, hi, mid)
    return np.where(ok, cap_rho, lo)
