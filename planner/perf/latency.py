"""Latency distributions: the quantiles of TTFT, TPOT and ITL a pool's requests see, not only their means.

**TTFT** is the request's own base (fixed overheads, its prefill, the iterations it waits for) plus its wait in
the pool's prefill queue. Prompts of different lengths make both vary: a prompt ``x`` times the mean length has a
base of ``base + work (x - 1)`` (its prefill work scales with its tokens) and puts ``x`` times the mean work on
its server, so the queue is M/G/c with service-time squared coefficient of variation ``cs2 = Var(x)``. Its wait
follows the two-moment approximation of the GI/G/c queue (Whitt, "Approximations for the GI/G/m queue",
Production and Operations Management 2(2), 1993, sections 2-4): a request waits at all with probability
``P_W ~= rho^(sqrt(2 (c + 1)) - 1)`` (Sakasegawa's approximation of Erlang's C, Annals of the Institute of
Statistical Mathematics 29, 1977), and a waiting request waits an exponential time of mean
``(1 + cs2) / 2 * E[S] / (c (1 - rho))`` (the M/M/c conditional wait scaled by the Allen-Cunneen factor; exact
for M/M/c and Kingman's heavy-traffic limit for one server). The mean ``P_W * theta`` is the M/D/c wait the
planner sized pools by before percentiles (``cs2 = 0``). ``tests/test_latency.py`` holds the approximation
against the exact M/M/c tail and the exact M/D/1 wait distribution (Erlang's formula).

**TPOT** of one request is the mean of its output steps. Each step costs the plain decode step plus, on an
aggregated replica, the chunks of other prompts it carries; the prompts that arrive while a request decodes are
Poisson (open arrivals; about ``B`` of them over its ``O`` steps, each of a random length), so the share of its
TPOT spent on prompts has a coefficient of variation ``sqrt((1 + cv_in^2) / B)``. Speculative decoding adds the
spread of accepted drafts per step, averaged over the request's steps. The request's TPOT is lognormal with
that mean and spread.

**ITL** (the gap between two streamed emissions) is a plain step or, for the share of steps that carry a
prefill chunk, a chunk step; with speculative decoding one emission carries the step's accepted tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr, ndtri

# Probability edges of the length quadrature: deciles, then finer into the tail the p99 of TTFT comes from.
_EDGES = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 1.0])
Z90 = float(ndtri(0.9))


@dataclass(frozen=True)
class Tail:
    """What a workload's latency quantiles depend on besides the pool: its SLO quantiles and its lengths.

    ``x`` and ``p``: prompt lengths as multiples of their mean and their probabilities (one node at 1 for fixed
    lengths); ``cv2_out``: squared coefficient of variation of output lengths."""

    ttft_q: float | None = None
    tpot_q: float | None = None
    goodput: float | None = None
    x: tuple[float, ...] = (1.0,)
    p: tuple[float, ...] = (1.0,)
    cv2_out: float = 0.0

    @property
    def cs2(self) -> float:
        """Squared coefficient of variation of prefill service (prompt tokens)."""
        x, p = np.asarray(self.x), np.asarray(self.p)
        return float(max(np.sum(p * x * x) - 1.0, 0.0))

    @property
    def fixed_lengths(self) -> bool:
        return len(self.x) == 1

    @property
    def ttft_sizing_q(self) -> float | None:
        """The TTFT quantile a disaggregated prefill pool is sized for: the SLO's, or with a goodput target
        ``g`` at least ``sqrt(g)`` (its TPOT is another pool's, sized for ``sqrt(g)`` too)."""
        if self.goodput is None:
            return self.ttft_q
        return max(self.ttft_q or 0.0, float(np.sqrt(self.goodput)))


def workload_tail(w) -> Tail:
    """The :class:`Tail` of a scenario workload."""
    x, p = length_nodes(getattr(w, "input_spread", None))
    xo, po = length_nodes(getattr(w, "output_spread", None))
    return Tail(w.slo.ttft_q, w.slo.tpot_q, w.slo.goodput, tuple(x), tuple(p), float(np.sum(po * xo * xo) - 1.0))


def lognormal_sigma(mean: float, p90: float) -> float:
    """The log-scale spread of the lognormal with this mean and p90: the smaller root of
    ``z90 s - s^2 / 2 = ln(p90 / mean)`` (``p90 / mean`` at most ``exp(z90^2 / 2)``, about 2.27)."""
    r = np.log(max(p90, mean) / mean)
    disc = max(Z90 * Z90 - 2.0 * r, 0.0)
    return float(Z90 - np.sqrt(disc))


def length_nodes(spread) -> tuple[np.ndarray, np.ndarray]:
    """(lengths over their mean, probabilities) of a :class:`~planner.catalog.scenario.LengthSpread` (or one
    node at 1 for ``None``): the conditional mean of each probability bin of ``_EDGES``, so the nodes keep the
    distribution's mean exactly and resolve its tail to the 99.9th percentile."""
    if spread is None:
        return np.ones(1), np.ones(1)
    lo, hi = _EDGES[:-1], _EDGES[1:]
    if spread.points is not None:
        pts = np.asarray(spread.points, dtype=float)
        pts = pts[np.argsort(pts[:, 0], kind="stable")]
        t, w = pts[:, 0], pts[:, 1] / pts[:, 1].sum()
        if len(t) <= len(lo):
            keep = w > 0
            return t[keep] / spread.mean, w[keep]
        # split each point's weight over the bins its cumulative range covers
        c1 = np.cumsum(w)
        c0 = c1 - w
        share = np.clip(np.minimum(c1[None, :], hi[:, None]) - np.maximum(c0[None, :], lo[:, None]), 0.0, None)
        mass = share.sum(axis=1)
        x = (share @ t) / np.maximum(mass, 1e-300) / spread.mean
        keep = mass > 0
        return x[keep], mass[keep] / mass[keep].sum()
    s = lognormal_sigma(spread.mean, spread.p90)
    if s <= 1e-9:
        return np.ones(1), np.ones(1)
    # E[X 1{a < U < b}] / (b - a) for X lognormal of mean 1: (Phi(z_b - s) - Phi(z_a - s)) / (b - a)
    za, zb = ndtri(lo), ndtri(hi)
    x = (ndtr(zb - s) - ndtr(za - s)) / (hi - lo)
    return x, hi - lo


def wait_tail(rho, servers, work, cs2=0.0) -> tuple[np.ndarray, np.ndarray]:
    """(probability of waiting, mean wait of a request that waits) of an M/G/c queue at utilisation ``rho``
    with mean service ``work`` on ``servers`` servers (see the module docstring)."""
    rho = np.clip(np.asarray(rho, dtype=float), 0.0, 1.0 - 1e-12)
    c = np.maximum(np.asarray(servers, dtype=float), 1.0)
    pw = np.power(rho, np.sqrt(2.0 * (c + 1.0)) - 1.0)
    theta = (1.0 + np.asarray(cs2, dtype=float)) / 2.0 * np.asarray(work, dtype=float) / (c * (1.0 - rho))
    return pw, theta


def _nodes(x, p, n: int) -> tuple[np.ndarray, np.ndarray]:
    x, p = np.asarray(x, dtype=float), np.asarray(p, dtype=float)
    return (np.broadcast_to(x, (n, x.shape[-1])), np.broadcast_to(p, (n, p.shape[-1])))


def ttft_exceedance(limit, base, work, rho, servers, x=(1.0,), p=(1.0,), cs2=0.0) -> np.ndarray:
    """P(TTFT > ``limit``) of requests at a pool whose mean-length prompt has TTFT ``base`` without waiting and
    prefill ``work``, at utilisation ``rho`` (elementwise over rows; ``x``, ``p`` the length nodes, one set for
    all rows or one row each)."""
    base = np.atleast_1d(np.asarray(base, dtype=float))
    n = base.shape[0]
    work = np.broadcast_to(np.asarray(work, dtype=float), (n,))
    lim = np.broadcast_to(np.asarray(limit, dtype=float), (n,))
    pw, th = wait_tail(np.broadcast_to(rho, (n,)), np.broadcast_to(servers, (n,)), work, np.broadcast_to(cs2, (n,)))
    X, Pr = _nodes(x, p, n)
    s = lim[:, None] - (base[:, None] + work[:, None] * (X - 1.0))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        tail = np.where(th[:, None] > 0, pw[:, None] * np.exp(-np.maximum(s, 0.0) / th[:, None]), 0.0)
    tail = np.where(s < 0, 1.0, tail)
    return np.sum(Pr * tail, axis=1)


def ttft_quantile(q, base, work, rho, servers, x=(1.0,), p=(1.0,), cs2=0.0) -> np.ndarray:
    """TTFT at quantile ``q`` (NaN: the mean) of the requests at a pool (arguments as
    :func:`ttft_exceedance`)."""
    base = np.atleast_1d(np.asarray(base, dtype=float))
    n = base.shape[0]
    q = np.broadcast_to(np.asarray(q, dtype=float), (n,))
    work = np.broadcast_to(np.asarray(work, dtype=float), (n,))
    pw, th = wait_tail(np.broadcast_to(rho, (n,)), np.broadcast_to(servers, (n,)), work, np.broadcast_to(cs2, (n,)))
    X, Pr = _nodes(x, p, n)
    mean = base + pw * th  # the nodes keep the mean length, so the mean base is ``base``
    if X.shape[1] == 1:
        with np.errstate(divide="ignore", invalid="ignore"):
            extra = np.where((pw > 0) & (th > 0), th * np.log(np.maximum(pw / np.maximum(1.0 - q, 1e-300), 1.0)), 0.0)
        b = base + work * (X[:, 0] - 1.0)
        return np.where(np.isnan(q), mean, b + extra)
    b = base[:, None] + work[:, None] * (X - 1.0)
    lo = b.min(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        hi = b.max(axis=1) + np.where(th > 0, th * np.log(np.maximum(pw / np.maximum(1.0 - q, 1e-300), 1.0)), 0.0)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        over = ttft_exceedance(mid, base, work, rho, servers, x, p, cs2) > 1.0 - q
        lo, hi = np.where(over, mid, lo), np.where(over, hi, mid)
    return np.where(np.isnan(q), mean, hi)


def _rho_for_tail(c, work, slack, q, cs2) -> np.ndarray:
    """Fixed lengths: the highest utilisation whose wait exceeds ``slack`` with probability at most ``1 - q``:
    the root of ``g(rho) = a ln rho - k (1 - rho) - ln(1 - q)``, ``a = sqrt(2 (c + 1)) - 1``,
    ``k = 2 c slack / ((1 + cs2) work)``. ``g`` is increasing and concave, so Newton's iterates from the left
    climb to the root and never pass it (the answer never breaks the quantile)."""
    c = np.maximum(np.asarray(c, dtype=float), 1.0)
    a = np.sqrt(2.0 * (c + 1.0)) - 1.0
    k = 2.0 * c * np.asarray(slack, dtype=float) / ((1.0 + np.asarray(cs2, dtype=float)) * np.asarray(work, dtype=float))
    L = np.log(1.0 - np.asarray(q, dtype=float))
    # a start left of the root: g(rho0) <= a ln rho0 - L <= 0 at rho0 = exp(L / a) (where k (1 - rho0) >= 0)
    rho = np.minimum(np.exp(L / a), 1.0 - 1e-12)
    for _ in range(100):
        g = a * np.log(rho) - k * (1.0 - rho) - L
        step = g / (a / rho + k)
        new = np.minimum(rho - step, 1.0 - 1e-12)
        done = np.abs(new - rho) <= 1e-13 * np.maximum(rho, 1e-300)
        rho = new
        if np.all(done):
            break
    return np.clip(rho, 0.0, 1.0 - 1e-12)


def tail_load(base, work, servers, limit, q, cap_rho, x=(1.0,), p=(1.0,), cs2=0.0) -> np.ndarray:
    """The highest utilisation (at most ``cap_rho``) at which TTFT stays within ``limit`` for a share ``q`` of
    requests; NaN where even an idle pool misses (the long prompts alone exceed ``1 - q``). Rows with
    ``work`` > 0 only."""
    base = np.asarray(base, dtype=float)
    n = base.shape[0]
    work = np.broadcast_to(np.asarray(work, dtype=float), (n,))
    c = np.broadcast_to(np.asarray(servers, dtype=float), (n,))
    lim = np.broadcast_to(np.asarray(limit, dtype=float), (n,))
    q = np.broadcast_to(np.asarray(q, dtype=float), (n,))
    cap_rho = np.broadcast_to(np.asarray(cap_rho, dtype=float), (n,))
    X, Pr = _nodes(x, p, n)
    idle_miss = np.sum(Pr * ((lim[:, None] - (base[:, None] + work[:, None] * (X - 1.0))) < 0), axis=1)
    ok = (idle_miss <= 1.0 - q + 1e-12) & (q < 1.0)
    at_cap = ttft_exceedance(lim, base, work, cap_rho, c, x, p, cs2) <= 1.0 - q
    rho = np.where(at_cap, cap_rho, 0.0)
    need = ok & ~at_cap
    if need.any():
        idx = np.flatnonzero(need)
        if X.shape[1] == 1:
            slack = lim[idx] - base[idx] - work[idx] * (X[idx, 0] - 1.0)
            rho[idx] = np.minimum(_rho_for_tail(c[idx], work[idx], slack, q[idx],
                                                np.broadcast_to(cs2, (n,))[idx]), cap_rho[idx])
        else:
            # bisection on the log-odds of the utilisation; ``lo`` always meets the quantile
            lo, hi = np.full(idx.size, -40.0), np.log(cap_rho[idx] / (1.0 - cap_rho[idx]))
            xs, ps = X[idx], Pr[idx]
            cs = np.broadcast_to(cs2, (n,))[idx]
            for _ in range(50):
                mid = 0.5 * (lo + hi)
                r = 1.0 / (1.0 + np.exp(-mid))
                good = ttft_exceedance(lim[idx], base[idx], work[idx], r, c[idx], xs, ps, cs) <= 1.0 - q[idx]
                lo, hi = np.where(good, mid, lo), np.where(good, hi, mid)
            rho[idx] = 1.0 / (1.0 + np.exp(-lo))
    return np.where(ok, rho, np.nan)


def lognormal_quantile(mean, cv, q) -> np.ndarray:
    """Quantile ``q`` (NaN: the mean) of a lognormal of this mean and coefficient of variation."""
    mean, cv, q = (np.asarray(v, dtype=float) for v in (mean, cv, q))
    s2 = np.log1p(cv * cv)
    with np.errstate(invalid="ignore"):
        z = ndtri(np.where(np.isnan(q), 0.5, q))
    return np.where(np.isnan(q), mean, mean * np.exp(np.sqrt(s2) * z - s2 / 2.0))


def lognormal_attainment(mean, cv, target) -> np.ndarray:
    """P(X <= target) of a lognormal of this mean and coefficient of variation."""
    mean, cv, target = (np.asarray(v, dtype=float) for v in (mean, cv, target))
    s2 = np.log1p(cv * cv)
    s = np.sqrt(s2)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (np.log(np.maximum(target, 1e-300) / np.maximum(mean, 1e-300)) + s2 / 2.0) / s
    return np.where(s > 0, ndtr(z), (mean <= target).astype(float))


def spec_step_spread(spec_tokens, accept) -> tuple[np.ndarray, np.ndarray]:
    """(mean, variance) of the tokens one speculative step yields: 1 plus draft ``j`` when it and every draft
    before it are accepted (``accept`` one acceptance or one per draft position; fractional draft counts
    interpolate)."""
    k = np.asarray(spec_tokens, dtype=float)
    acc = np.atleast_1d(np.asarray(accept, dtype=float))
    n = int(np.ceil(np.max(k))) if k.size and np.max(k) > 0 else 0
    if n <= 0:
        return np.ones_like(k), np.zeros_like(k)
    per = np.array([acc[min(i, len(acc) - 1)] for i in range(n)])
    c = np.cumprod(per)  # P(tokens >= 1 + j), j = 1..n
    out_m, out_v = [], []
    for kk in np.atleast_1d(k).ravel():
        lo = int(np.floor(kk))
        frac = kk - lo

        def moments(m):
            cj = c[:m]
            mean = 1.0 + cj.sum()
            # E[T^2] = sum_t (2 t - 1) P(T >= t), t = 1..m+1
            second = 1.0 + np.sum((2.0 * np.arange(2, m + 2) - 1.0) * cj)
            return mean, second

        m0, s0 = moments(lo)
        m1, s1 = moments(min(lo + 1, n))
        mean = m0 + frac * (m1 - m0)
        second = s0 + frac * (s1 - s0)
        out_m.append(mean)
        out_v.append(max(second - mean * mean, 0.0))
    shape = np.shape(k)
    return np.reshape(out_m, shape), np.reshape(out_v, shape)


def tpot_cv(input_share, batch, cv2_in, output_tokens, tokens_mean=1.0, tokens_var=0.0, closed: bool = False):
    """Coefficient of variation of one request's TPOT (see the module docstring): ``input_share`` of the mean
    TPOT is other prompts' chunks, about ``B`` of them arriving over the request's decode (Poisson, or exactly
    ``B - 1`` in a closed loop of ``B`` clients, where only their lengths vary), and speculative decoding
    yields ``tokens_mean`` tokens a step with variance ``tokens_var``, averaged over ``O / tokens_mean`` steps."""
    B = np.maximum(np.asarray(batch, dtype=float), 1.0)
    share = np.clip(np.asarray(input_share, dtype=float), 0.0, 1.0)
    cv2_in = np.asarray(cv2_in, dtype=float)
    prompts = np.maximum(B - 1.0, 1.0) if closed else B
    count_var = cv2_in if closed else 1.0 + cv2_in
    cv2_int = share * share * count_var / prompts
    steps = np.maximum(np.asarray(output_tokens, dtype=float) / np.asarray(tokens_mean, dtype=float), 1.0)
    cv2_spec = np.asarray(tokens_var, dtype=float) / np.asarray(tokens_mean, dtype=float) ** 2 / steps
    return np.sqrt(cv2_int + cv2_spec)


def itl_quantiles(plain_s, chunk_s, chunk_share, qs=(0.5, 0.9, 0.99)) -> list[np.ndarray]:
    """ITL quantiles of a replica whose steps (emissions) take ``plain_s``, or ``chunk_s`` for the share
    ``chunk_share`` that carries a prefill chunk."""
    plain, chunk = np.asarray(plain_s, dtype=float), np.asarray(chunk_s, dtype=float)
    share = np.clip(np.asarray(chunk_share, dtype=float), 0.0, 1.0)
    return [np.where(share > 1.0 - q, np.maximum(chunk, plain), plain) for q in qs]


QS = (0.5, 0.9, 0.99)
"""The quantiles plans report: p50, p90, p99."""


def pool_latency(row, tail: Tail, rate_per_replica: float, ttft_target_s: float, tpot_target_s: float) -> dict:
    """Latency of one pool's requests at ``rate_per_replica`` requests/s per replica, from its candidate row
    (``ttft_base_s``, ``queue_work_s``, ``queue_servers``, ``tpot_s``, ``tpot_cv``, ``itl_plain_s``, ``itl_chunk_s``,
    ``chunk_share``): TTFT, TPOT and ITL at p50/p90/p99 (``*_p``: three values), the mean TTFT, TTFT and TPOT at the
    SLO's quantiles (``ttft_slo``, ``tpot_slo``), and the share of requests meeting each target (``ttft_ok``,
    ``tpot_ok``; 1 for a role that has no such latency)."""
    base, work, c = (float(row[k]) for k in ("ttft_base_s", "queue_work_s", "queue_servers"))
    c = max(c, 1.0)
    x, p, cs2 = np.asarray(tail.x), np.asarray(tail.p), tail.cs2
    out: dict = {}
    if work > 0:
        rho = min(rate_per_replica * work / c, 1.0 - 1e-9)
        args = (base, work, rho, c, x, p, cs2)
        out["ttft_p"] = [float(ttft_quantile(q, *args)[0]) for q in QS]
        out["ttft_mean"] = float(ttft_quantile(np.nan, *args)[0])
        out["ttft_slo"] = float(ttft_quantile(np.nan if tail.ttft_q is None else tail.ttft_q, *args)[0])
        out["ttft_ok"] = 1.0 - float(ttft_exceedance(ttft_target_s, base, work, rho, c, x, p, cs2)[0])
    else:
        out["ttft_p"] = [base] * len(QS)
        out["ttft_mean"] = out["ttft_slo"] = base
        out["ttft_ok"] = 1.0 if base <= ttft_target_s else 0.0
    tpot, cv = float(row["tpot_s"]), float(row["tpot_cv"])
    if tpot > 0:
        out["tpot_p"] = [float(lognormal_quantile(tpot, cv, q)) for q in QS]
        out["tpot_slo"] = float(lognormal_quantile(tpot, cv, np.nan if tail.tpot_q is None else tail.tpot_q))
        out["tpot_ok"] = float(lognormal_attainment(tpot, cv, tpot_target_s))
        out["itl_p"] = [float(v) for v in itl_quantiles(row["itl_plain_s"], row["itl_chunk_s"], row["chunk_share"])]
    else:
        out["tpot_p"] = out["itl_p"] = [0.0] * len(QS)
        out["tpot_slo"], out["tpot_ok"] = 0.0, 1.0
    return out
