"""Latency distributions: the quantiles of TTFT, TPOT and ITL a pool's requests see, not only their means.

**TTFT** is the request's own base (fixed overheads, its prefill, the iterations it waits for) plus its wait in
the pool's prefill queue. Prompts of different lengths make both vary: a prompt ``x`` times the mean length has a
base of ``base + work (x - 1)`` (its prefill work scales with its tokens) and puts ``x`` times the mean work on
its server, so the queue is M/G/c with service-time squared coefficient of variation ``cs2 = Var(x)``. Its wait
follows the two-moment approximation of the GI/G/c queue (Whitt, "Approximations for the GI/G/m queue",
Production and Operations Management 2(2), 1993, sections 2-4): a request waits at all with the M/M/c
probability ``P_W = C(c, rho)`` (Erlang's C formula, which the probability of delay is nearly insensitive to),
and a waiting request waits an exponential time of mean ``(1 + cs2) / 2 * E[S] / (c (1 - rho))`` (the M/M/c
conditional wait scaled by the Allen-Cunneen factor; exact for M/M/c, exact in mean for M/D/1 and Kingman's
heavy-traffic limit for one server). The mean ``P_W * theta`` is the Allen-Cunneen M/G/c wait. With several servers
and less variable service than exponential, the mean and the shape of the wait of those who wait come from the exact
M/D/c queue (a gamma law with its mean and tail decay, :func:`planner.perf.waits.wait_tail`).
``tests/test_latency.py`` holds the approximation against the exact M/M/c tail, the exact M/D/1 wait distribution
(Erlang's formula) and the exact M/D/c quantiles.

**TPOT** of one request is the mean of its output steps. Each step costs the plain decode step plus, on an
aggregated replica, the chunks of other prompts it carries; the prompts that arrive while a request decodes are
Poisson (open arrivals; about ``B`` of them over its ``O`` steps, each of a random length), so the share of its
TPOT spent on prompts has a coefficient of variation ``sqrt((1 + cv_in^2) / B)``. Speculative decoding adds the
spread of accepted drafts per step, averaged over the request's steps. The request's TPOT is lognormal with
that mean and spread, and with speculative decoding a request's own acceptance differs from the mean
(:data:`SPEC_REQUEST_SPREAD`). A router that places requests on decode workers at random adds the spread of the
sequences beside a request (:func:`random_route_sd`). Every request's mean step also varies with the server's own
step-time noise, averaged over its steps (:data:`STEP_NOISE`).

**ITL** (the gap between two streamed emissions) is a plain step or, for the share of steps that carry a
prefill chunk, a chunk step; with speculative decoding one emission carries the step's accepted tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from planner.perf.waits import (  # noqa: F401  (re-exported: the queue's waits are part of the latency model)
    decay_rate,
    decode_slot_rho,
    erlang_c,
    max_mean,
    max_wait_tail,
    mean_wait_factor,
    slot_tail,
    wait_quantile,
    wait_survival,
    wait_tail,
)


def ndtri(q):
    """Standard normal quantile, elementwise (scipy is not imported on the planning path: it costs a second)."""
    q = np.asarray(q, dtype=float)
    if q.ndim == 0:
        return NormalDist().inv_cdf(float(q)) if 0 < q < 1 else (-np.inf if q <= 0 else np.inf)
    out = np.empty(q.shape)
    u, inv = np.unique(q, return_inverse=True)
    out.ravel()[:] = np.array([ndtri(v) for v in u])[inv.ravel()]
    return out


def ndtr(z):
    """Standard normal distribution function, elementwise."""
    z = np.asarray(z, dtype=float)
    if z.size <= 64:
        return np.vectorize(lambda v: 0.5 * math.erfc(-v / math.sqrt(2.0)), otypes=[float])(z) if z.ndim else \
            0.5 * math.erfc(-float(z) / math.sqrt(2.0))
    from scipy.special import ndtr as fast

    return fast(z)

# Probability edges of the length quadrature: deciles, then finer into the tail the p99 of TTFT comes from.
_EDGES = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 1.0])
Z90 = NormalDist().inv_cdf(0.9)


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
    def _disagg_q(self) -> float | None:
        """The TTFT quantile of a disaggregated request: the SLO's, or with a goodput target ``g`` at least
        ``sqrt(g)`` (its TPOT is another pool's, sized for ``sqrt(g)`` too)."""
        if self.goodput is None:
            return self.ttft_q
        return max(self.ttft_q or 0.0, float(np.sqrt(self.goodput)))

    @property
    def ttft_sizing_q(self) -> float | None:
        """The TTFT quantile a disaggregated prefill pool is sized for: its request's (:attr:`_disagg_q`) less the
        share :data:`HANDOVER_SHARE` of the misses left to the wait for a decode slot."""
        q = self._disagg_q
        return None if q is None else 1.0 - (1.0 - HANDOVER_SHARE) * (1.0 - q)

    @property
    def handover_miss(self) -> float | None:
        """The probability a disaggregated request may wait for a decode slot at all (None: the SLO is on the
        mean, and the decode pool runs at the utilisation cap)."""
        q = self._disagg_q
        return None if q is None else HANDOVER_SHARE * (1.0 - q)


HANDOVER_SHARE = 0.1
"""Share of a disaggregated request's TTFT misses (``1 - q``) left to waiting for a decode slot: the decode pool
keeps its probability of waiting at all within it, the prefill pool meets the rest, so the two together meet the
quantile (a union bound)."""


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


def _nodes(x, p, n: int) -> tuple[np.ndarray, np.ndarray]:
    x, p = np.asarray(x, dtype=float), np.asarray(p, dtype=float)
    return (np.broadcast_to(x, (n, x.shape[-1])), np.broadcast_to(p, (n, p.shape[-1])))


def ttft_exceedance(limit, base, work, rho, servers, x=(1.0,), p=(1.0,), cs2=0.0, slot=None) -> np.ndarray:
    """P(TTFT > ``limit``) of requests at a pool whose mean-length prompt has TTFT ``base`` without waiting and
    prefill ``work``, at utilisation ``rho`` (elementwise over rows; ``x``, ``p`` the length nodes, one set for
    all rows or one row each). ``slot``: (probability, mean, shape) of the wait for a batch slot (:func:`slot_tail`),
    overlapping the prefill queue's wait (the larger of the two, :func:`planner.perf.waits.max_wait_tail`)."""
    base = np.atleast_1d(np.asarray(base, dtype=float))
    n = base.shape[0]
    work = np.broadcast_to(np.asarray(work, dtype=float), (n,))
    lim = np.broadcast_to(np.asarray(limit, dtype=float), (n,))
    pw, th, k = wait_tail(np.broadcast_to(rho, (n,)), np.broadcast_to(servers, (n,)), work, np.broadcast_to(cs2, (n,)),
                          shape=True)
    X, Pr = _nodes(x, p, n)
    s = lim[:, None] - (base[:, None] + work[:, None] * (X - 1.0))
    sp = np.maximum(s, 0.0)
    if slot is None:
        tail = pw[:, None] * wait_survival(sp, th[:, None], k[:, None])
    else:
        p2, t2, k2 = (np.broadcast_to(np.asarray(v, dtype=float), (n,))[:, None] for v in slot)
        tail = max_wait_tail(sp, pw[:, None], th[:, None], p2, t2, k[:, None], k2)
    tail = np.where(s < 0, 1.0, tail)
    return np.sum(Pr * tail, axis=1)


def _slot_at(rho, servers, work, slots):
    """(probability, mean, shape) of the slot wait at prefill utilisation ``rho`` for ``slots = (batch, hold,
    cs2_out)`` (the slot utilisation is the arrival rate ``rho c / work`` times ``hold / batch``), or None."""
    if slots is None:
        return None
    batch, hold, cs2_out = (np.asarray(v, dtype=float) for v in slots)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho2 = np.where(batch > 0, np.asarray(rho, dtype=float) * np.maximum(np.asarray(servers, dtype=float), 1.0)
                        * hold / (np.maximum(np.asarray(work, dtype=float), 1e-30) * np.maximum(batch, 1.0)), 0.0)
    return slot_tail(np.minimum(rho2, 1.0 - 1e-9), batch, hold, cs2_out)


def ttft_quantile(q, base, work, rho, servers, x=(1.0,), p=(1.0,), cs2=0.0, slots=None) -> np.ndarray:
    """TTFT at quantile ``q`` (NaN: the mean) of the requests at a pool (arguments as
    :func:`ttft_exceedance`; ``slots``: ``(batch, hold, cs2_out)`` of the batch-slot queue, or None)."""
    base = np.atleast_1d(np.asarray(base, dtype=float))
    n = base.shape[0]
    q = np.broadcast_to(np.asarray(q, dtype=float), (n,))
    work = np.broadcast_to(np.asarray(work, dtype=float), (n,))
    rho = np.broadcast_to(np.asarray(rho, dtype=float), (n,))
    pw, th, k = wait_tail(rho, np.broadcast_to(servers, (n,)), work, np.broadcast_to(cs2, (n,)), shape=True)
    X, Pr = _nodes(x, p, n)
    slot = _slot_at(rho, servers, work, slots)
    mean = base + (pw * th if slot is None else max_mean(pw, th, slot[0], slot[1]))
    if X.shape[1] == 1 and slot is None:
        extra = wait_quantile(pw, th, k, np.maximum(1.0 - np.where(np.isnan(q), 0.5, q), 1e-300))
        b = base + work * (X[:, 0] - 1.0)
        return np.where(np.isnan(q), mean, b + extra)
    b = base[:, None] + work[:, None] * (X - 1.0)
    lo = b.min(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        span = th + (0.0 if slot is None else slot[1])
        hi = b.max(axis=1) + np.where(span > 0, span * (np.log(np.maximum(2.0 / np.maximum(1.0 - q, 1e-300), 1.0)) + 2.0),
                                      0.0)
    if np.all(np.isnan(q)):
        return mean
    # the exceedance falls with t: false position on ln(1 - q) - ln P(TTFT > t), which rises through zero
    sel = np.flatnonzero(~np.isnan(q))
    target = np.log(np.maximum(1.0 - q[sel], 1e-300))
    X_, P_ = _nodes(x, p, n)
    srv = np.broadcast_to(np.asarray(servers, dtype=float), (n,))
    c2 = np.broadcast_to(np.asarray(cs2, dtype=float), (n,))
    sl = None if slot is None else tuple(np.broadcast_to(np.asarray(v, dtype=float), (n,)) for v in slot)

    def g(t, k):
        r = sel[k]
        ex = ttft_exceedance(t, base[r], work[r], rho[r], srv[r], X_[r], P_[r], c2[r],
                             None if sl is None else (sl[0][r], sl[1][r], sl[2][r]))
        return target[k] - np.log(np.maximum(ex, 1e-300))

    a, b = lo[sel].copy(), hi[sel].copy()
    k = np.arange(sel.size)
    ga = g(a, k)
    lo_end, hi_end, g_lo = _narrow_raw(g, a, ga, b, g(b, k), 1e-10, close=1e-10)
    out = mean.copy()
    # the lowest t whose exceedance is within the quantile: the lower end where it is (already) there
    out[sel] = np.where(g_lo >= -1e-10, lo_end, hi_end)
    return out


PENDING = -1.0
"""The load :func:`tail_load` (and :func:`planned_load <planner.perf.queueing.planned_load>`) gives a row that meets
its target at some load but not at its cap, when asked not to search it (``search`` False): below the cap, not
known."""


def tail_load(base, work, servers, limit, q, cap_rho, x=(1.0,), p=(1.0,), cs2=0.0, slots=None, *,
              search=None, _table: bool = True) -> np.ndarray:
    """The highest utilisation (at most ``cap_rho``) at which TTFT stays within ``limit`` for a share ``q`` of
    requests (NaN ``q``: the mean TTFT within it); NaN where even an idle pool misses (the long prompts alone
    exceed ``1 - q``). ``slots``: ``(batch, hold, cs2_out)`` per row of the batch-slot queue whose wait adds to the
    prefill queue's (see :func:`ttft_quantile`). Rows with ``work`` > 0 only. ``search``: per row, whether to search
    for the load of a row below its cap (the costly part); rows not searched come back as :data:`PENDING` (None:
    search every row)."""
    base = np.asarray(base, dtype=float)
    n = base.shape[0]
    bc = (lambda v: np.broadcast_to(np.asarray(v, dtype=float), (n,)))  # noqa: E731
    work, c, lim, q, cap_rho, cs2 = (bc(v) for v in (work, servers, limit, q, cap_rho, cs2))
    slots = None if slots is None else tuple(bc(v) for v in slots)
    mean = np.isnan(q)
    X, Pr = _nodes(x, p, n)
    idle_miss = np.sum(Pr * ((lim[:, None] - (base[:, None] + work[:, None] * (X - 1.0))) < 0), axis=1)
    ok = np.where(mean, base <= lim, (idle_miss <= 1.0 - q + 1e-12) & (q < 1.0))

    def gap(r, sel):
        """How far each row misses its target at utilisation ``r`` (<= 0: it meets it): the mean TTFT over the
        limit, or the log of the exceedance over ``1 - q``; increasing in ``r``."""
        sl = None if slots is None else tuple(v[sel] for v in slots)
        r = np.broadcast_to(np.asarray(r, dtype=float), sel.shape)
        qq, cc, ww, cs, bb, ll = q[sel], c[sel], work[sel], cs2[sel], base[sel], lim[sel]
        slot = _slot_at(r, cc, ww, sl)
        out = np.empty(sel.size)
        m = np.isnan(qq)
        if m.any():
            pw, th = wait_tail(r[m], cc[m], ww[m], cs[m])
            extra = 0.0 if slot is None else slot[0][m] * slot[1][m]
            out[m] = bb[m] + pw * th + extra - ll[m]
        if (~m).any():
            k = ~m
            ex = ttft_exceedance(ll[k], bb[k], ww[k], r[k], cc[k], X[sel][k], Pr[sel][k], cs[k],
                                 None if slot is None else (slot[0][k], slot[1][k], slot[2][k]))
            out[k] = np.log(np.maximum(ex, 1e-300)) - np.log(np.maximum(1.0 - qq[k], 1e-300))
        return out

    at_cap = gap(cap_rho, np.arange(n)) <= 0
    rho = np.where(at_cap, cap_rho, 0.0)
    need = ok & ~at_cap
    if search is not None:
        search = np.broadcast_to(np.asarray(search, dtype=bool), (n,))
        rho[need & ~search] = PENDING
        need &= search
    if need.any():
        i = np.flatnonzero(need)
        hi = np.log(cap_rho[i] / (1.0 - cap_rho[i]))
        if X.shape[1] == 1 and _table:
            # fixed lengths: the root without slots is a function of (servers, slack / work) for the quantile, read
            # from a table; it bounds the root with slots from above (waiting for a slot only adds)
            t0 = np.minimum(hi, _root_table(c[i], (lim[i] - base[i]) / work[i], q[i], cs2[i]))
            # the table's root is within a few thousandths of the log-odds of the root without slots: bracket it
            # there and narrow (slot rows whose wait moves the root further fall back to the search below)
            lo_t, hi_t = t0 - 0.01, np.minimum(t0 + 0.01, hi)
            both = gap(1.0 / (1.0 + np.exp(-np.concatenate([lo_t, hi_t]))), np.concatenate([i, i]))
            g_lo, g_hi = both[: i.size], both[i.size:]
            at_top = (g_hi <= 0) & (hi_t >= hi)  # meets up to the cap (the table's root is the cap's)
            rho[i[at_top]] = 1.0 / (1.0 + np.exp(-hi[at_top]))
            inside = (g_lo <= 0) & (g_hi > 0)
            if inside.any():
                j = i[inside]
                rho[j] = _narrow(lambda t, sel: gap(1.0 / (1.0 + np.exp(-t)), j[sel]), lo_t[inside], g_lo[inside],
                                 hi_t[inside], g_hi[inside], 1e-8)
            below = ~inside & ~at_top & (g_lo > 0)  # slots moved the root under the bracket: search below it
            if below.any():
                j = i[below]
                # one secant step down from the bracket (half as far again, to land below the root), then narrow
                slope = np.maximum((g_hi[below] - g_lo[below]) / (hi_t[below] - lo_t[below]), 1e-6)
                t1 = lo_t[below] - 1.5 * g_lo[below] / slope - 1e-3
                g1 = gap(1.0 / (1.0 + np.exp(-t1)), j)
                hit = g1 <= 0
                if hit.any():
                    jj = j[hit]
                    rho[jj] = _narrow(lambda t, sel: gap(1.0 / (1.0 + np.exp(-t)), jj[sel]), t1[hit], g1[hit],
                                      lo_t[below][hit], g_lo[below][hit], 1e-8)
                if (~hit).any():
                    jj = j[~hit]
                    rho[jj] = _illinois(lambda t, sel: gap(1.0 / (1.0 + np.exp(-t)), jj[sel]), t1[~hit], near=True)
            above = ~inside & ~at_top & ~below  # the table was cautious by more than the bracket: up to the cap
            if above.any():
                j = i[above]
                rho[j] = _illinois(lambda t, sel: gap(1.0 / (1.0 + np.exp(-t)), j[sel]), hi[above],
                                   lo=(hi_t[above], g_hi[above]))
        else:
            rho[i] = _illinois(lambda t, sel: gap(1.0 / (1.0 + np.exp(-t)), i[sel]), hi)
    return np.where(ok, rho, np.nan)


_SIGMA = np.linspace(-12.0, 14.0, 2601)
"""ln(slack / work) of the root tables."""
_ROOTS: dict[tuple, np.ndarray] = {}


def _root_table(servers, sigma, q, cs2) -> np.ndarray:
    """Log-odds of the highest utilisation at which a queue without slots, with fixed lengths, keeps the wait
    within ``sigma`` times the mean service at quantile ``q`` (NaN: in mean), read from a table per (servers,
    quantile, variability) over ``ln sigma``, interpolated (the caller checks the value and refines it)."""
    out = np.empty(np.shape(sigma))
    c = np.maximum(np.rint(servers), 1.0)
    key_q = np.where(np.isnan(q), -1.0, q)
    ls = np.log(np.maximum(sigma, 1e-300))
    pos = np.clip((ls - _SIGMA[0]) / (_SIGMA[1] - _SIGMA[0]), -1.0, _SIGMA.size - 1.0)
    keys = np.stack([c, key_q, np.round(cs2, 9)], axis=1)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    for j, (cv, qv, sv) in enumerate(uniq):
        tab = _ROOTS.get((cv, qv, sv))
        if tab is None:
            m = _SIGMA.size
            qq = np.full(m, np.nan if qv < 0 else qv)
            tab = np.log(tail_load(np.zeros(m), np.ones(m), np.full(m, cv), np.exp(_SIGMA), qq,
                                   np.full(m, 1.0 - 1e-10), cs2=np.full(m, sv), _table=False))
            tab = tab - np.log1p(-np.exp(tab))
            _ROOTS[(cv, qv, sv)] = tab
        sel = inv.ravel() == j
        out[sel] = np.where(pos[sel] < 0, -40.0, np.interp(pos[sel], np.arange(_SIGMA.size), tab))
    return out


_CLOSE = 1e-7
"""A load is taken once its miss ``g`` is this close below zero: the exceedance within 1e-7 of ``1 - q`` (relative)
or the mean TTFT within 0.1 us of its limit (1e-5 saved a third of the evaluations, but where the exceedance barely
moves with the load, as at light load, it left loads 1e-3 from the root: ``tests/test_candidates.py``)."""


def _illinois(g, hi: np.ndarray, tol: float = 1e-8, near: bool = False, lo=None) -> np.ndarray:
    """The utilisation at the root of the increasing ``g(t, rows)`` (``t`` the log-odds of the utilisation), from
    below (``g(hi) > 0``): a bracket found on a grid of log-odds evaluated at once, narrowed by the Illinois variant of false position, so the lower end always meets
    the target (``g <= 0``) and is returned (``near``: a grid of offsets below ``hi`` instead; ``lo``: a bracket's
    lower end and its ``g``, no grid). It stops when the lower end is within :data:`_CLOSE` of the root in
    ``g`` or the bracket is ``tol`` wide. Rows that miss at every utilisation (``g(-40) > 0``) come back at ~0."""
    n = hi.size
    # one evaluation over a grid of log-odds per row brackets the root within one unit where pools run
    grid = np.array([-40.0, -20.0, -14.0, -10.0, -7.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0,
                     6.0, 8.0, 11.0, 15.0])
    if lo is not None:  # a bracket given: ``lo`` meets the target (its ``g`` given), ``hi`` does not
        a, ga = lo[0].copy(), lo[1].copy()
        b = hi.copy()
        gb = g(b, np.arange(n))
        return _narrow(g, a, ga, b, gb, tol)
    if near:  # ``hi`` is close to the root (a table's): look just below it first
        grid = np.array([-40.0, -2.0, -0.3, -0.03])
        ts = hi[:, None] + grid[None, :]
    else:
        ts = np.minimum(grid[None, :], hi[:, None])
    ts = np.concatenate([ts, hi[:, None]], axis=1)
    m = ts.shape[1]
    gs = g(ts.ravel(), np.repeat(np.arange(n), m)).reshape(n, m)
    # the last grid point that meets the target (g increases along the row), and the next one
    j = np.maximum(np.sum(gs <= 0, axis=1) - 1, 0)
    j = np.minimum(j, m - 2)
    rows = np.arange(n)
    a, ga, b, gb = ts[rows, j], gs[rows, j], ts[rows, j + 1], gs[rows, j + 1]
    return _narrow(g, a, ga, b, gb, tol)


def _narrow(g, a, ga, b, gb, tol):
    """Illinois false position on the brackets ``[a, b]`` (``g(a) <= 0 < g(b)``) of log-odds; the lower ends, as
    utilisations."""
    return 1.0 / (1.0 + np.exp(-_narrow_raw(g, a, ga, b, gb, tol)[0]))


def _narrow_raw(g, a, ga, b, gb, tol, close: float = _CLOSE):
    """Illinois false position on the brackets ``[a, b]`` of an increasing ``g(t, rows)`` with ``g(a) <= 0 < g(b)``:
    the final (lower, upper) ends and the lower end's ``g``, narrowed until that is within ``close`` of zero or the
    bracket is ``tol`` wide (relative)."""
    a, ga, b, gb = (np.array(v, dtype=float) for v in (a, ga, b, gb))
    n = a.size
    side = np.zeros(n)
    live = (b - a > tol * np.maximum(1.0, np.abs(a))) & (ga < -close) & (gb > 0)
    for _ in range(100):
        if not live.any():
            break
        k = np.flatnonzero(live)
        t = b[k] - gb[k] * (b[k] - a[k]) / (gb[k] - ga[k])
        bad = ~((t > a[k]) & (t < b[k]))
        t[bad] = 0.5 * (a[k][bad] + b[k][bad])
        gt = g(t, k)
        low = gt <= 0
        # the lower end moves: halve the upper end's weight if it moved last time too (Illinois)
        kl, kh = k[low], k[~low]
        gb[kl] = np.where(side[kl] == -1, gb[kl] / 2.0, gb[kl])
        a[kl], ga[kl], side[kl] = t[low], gt[low], -1
        ga[kh] = np.where(side[kh] == 1, ga[kh] / 2.0, ga[kh])
        b[kh], gb[kh], side[kh] = t[~low], gt[~low], 1
        live[k] = (b[k] - a[k] > tol * np.maximum(1.0, np.abs(a[k]))) & (ga[k] < -close)
    return a, b, ga


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


SPEC_REQUEST_SPREAD = 0.08
"""Standard deviation across requests of a request's draft acceptance (every draft position's acceptance shifted
alike for the whole request: some texts are easier to draft than others). Drafts accepted step by step average out
over a request's hundreds of steps; this does not, and it is what makes speculative runs' TPOT spread: the measured
p99 / median TPOT of the InferenceX DeepSeek-R1 runs grows with the drafts (disaggregated: 1.027 without, 1.15 with
one MTP draft, 1.34 / 1.33 with two / three). One spread reproduces all three: at 0.08 the predicted p99 / median is
0.98, 0.94 and 0.98 of the measured for one, two and three drafts (``python bench/percentiles.py --spread`` scans it;
0 gives 0.90, 0.80, 0.80). A single value for every engine, hardware and draft count: no group has its own."""


STEP_NOISE = 0.5
"""Step-time noise of a serving engine, as the coefficient of variation of one decode step's time that, averaged over a
request's ``n`` steps (``O / tokens_per_step``), leaves its TPOT a spread of ``STEP_NOISE / sqrt(n)`` around the
mean: the time-varying part of a step that no batch or length of the model's sets (clock and power state, host
scheduling, garbage collection, streaming). Measured where nothing else spreads TPOT: the InferenceX runs without
drafts have a p99 / median TPOT above the model's other sources at every load (disaggregated at 1-8 clients 1.024
where those give 1.009), and the excess falls with the output length as ``1 / sqrt(n)`` (the median p99 excess
in quadrature 4.0% and 3.7% at 1K-token outputs, 1.6% at 8K: about ``sqrt(8)`` apart). 0.5 sets the median of predicted over measured
p99 / median TPOT of those runs to 1.000 (-0.07%, -0.24% and +0.13% at 1K/1K, 1K/8K and 8K/1K; it was -3.1%, -1.3%
and -1.6% without; ``python bench/percentiles.py --noise`` scans it). One value for every engine and hardware."""


def step_noise_cv(output_tokens, tokens_mean=1.0, noise: float | None = None) -> np.ndarray:
    """Coefficient of variation of a request's TPOT from the step-time noise (:data:`STEP_NOISE`) averaged over its
    ``O / tokens_mean`` steps."""
    noise = STEP_NOISE if noise is None else noise
    steps = np.maximum(np.asarray(output_tokens, dtype=float) / np.asarray(tokens_mean, dtype=float), 1.0)
    return noise / np.sqrt(steps)


def spec_request_cv(spec_tokens, accept, spread: float | None = None):
    """Coefficient of variation across requests of the mean tokens a speculative step yields (:data:`SPEC_REQUEST_SPREAD`
    of acceptance times ``d ln m / d a``, by central difference over each position's acceptance shifted alike); 0
    without drafts."""
    k = np.asarray(spec_tokens, dtype=float)
    acc = np.atleast_1d(np.asarray(accept, dtype=float))
    spread = SPEC_REQUEST_SPREAD if spread is None else spread
    if spread <= 0 or not np.any(k > 0):
        return np.zeros_like(k)
    h = 0.01
    up = spec_step_spread(k, np.clip(acc + h, 0.0, 1.0))[0]
    dn = spec_step_spread(k, np.clip(acc - h, 0.0, 1.0))[0]
    return np.where(k > 0, (np.log(up) - np.log(dn)) / (2.0 * h) * spread, 0.0)


def context_cv(input_tokens, output_tokens, cv2_in, cv2_out) -> np.ndarray:
    """Coefficient of variation of one sequence's context averaged over a request's decode, its prompt plus half its
    output (``I + O / 2``), with prompt and output lengths of squared coefficients of variation ``cv2_in`` and
    ``cv2_out`` (independent)."""
    i, o = np.asarray(input_tokens, dtype=float), np.asarray(output_tokens, dtype=float)
    var = np.asarray(cv2_in, dtype=float) * i * i + np.asarray(cv2_out, dtype=float) * o * o / 4.0
    return np.sqrt(np.maximum(var, 0.0)) / np.maximum(i + o / 2.0, 1.0)


def tpot_cv(input_share, batch, cv2_in, output_tokens, tokens_mean=1.0, tokens_var=0.0, closed: bool = False,
            request_cv=0.0, context=0.0, noise: float | None = None):
    """Coefficient of variation of one request's TPOT (see the module docstring): ``input_share`` of the mean
    TPOT is other prompts' chunks, about ``B`` of them arriving over the request's decode (Poisson, or exactly
    ``B - 1`` in a closed loop of ``B`` clients, where only their lengths vary), and speculative decoding
    yields ``tokens_mean`` tokens a step with variance ``tokens_var``, averaged over ``O / tokens_mean`` steps, around
    a request's own mean that varies across requests by ``request_cv`` (:func:`spec_request_cv`). ``context``: the
    step's elasticity to the batch's mean context (:attr:`planner.perf.setup.StepTimes.context_share`) times one
    sequence's context spread (:func:`context_cv`); the batch's mean context over the request's decode averages ``B``
    independent sequences (the request's own among them), so it adds ``context^2 / B``: at one sequence a long
    prompt's own KV reads set its TPOT. ``noise``: the step-time noise (:data:`STEP_NOISE` when None; 0 leaves it
    out), averaged over the request's steps (:func:`step_noise_cv`)."""
    B = np.maximum(np.asarray(batch, dtype=float), 1.0)
    share = np.clip(np.asarray(input_share, dtype=float), 0.0, 1.0)
    cv2_in = np.asarray(cv2_in, dtype=float)
    prompts = np.maximum(B - 1.0, 1.0) if closed else B
    count_var = cv2_in if closed else 1.0 + cv2_in
    cv2_int = share * share * count_var / prompts
    steps = np.maximum(np.asarray(output_tokens, dtype=float) / np.asarray(tokens_mean, dtype=float), 1.0)
    cv2_spec = np.asarray(tokens_var, dtype=float) / np.asarray(tokens_mean, dtype=float) ** 2 / steps
    cv2_ctx = np.asarray(context, dtype=float) ** 2 / B
    cv2_noise = step_noise_cv(output_tokens, tokens_mean, noise) ** 2
    return np.sqrt(cv2_int + cv2_spec + np.asarray(request_cv, dtype=float) ** 2 + cv2_ctx + cv2_noise)


def random_route_sd(decoding, workers) -> np.ndarray:
    """Standard deviation of the sequences beside a request on its decode worker, averaged over the request's decode,
    when a router sends each request to one of ``workers`` decode workers at random (SGLang's router with
    ``--decode-policy random``) and ``decoding`` requests decode across them (a closed loop: each client's next
    request is placed afresh). Over the request's decode each other client spends the rest ``u`` of the request it
    has in progress (``u`` uniform: lengths alike) and then the start of its next, each on the request's worker with
    probability ``q = 1 / workers`` independently, so the share of the decode it spends beside the request is
    ``u I1 + (1 - u) I2``: mean ``q``, variance ``E[u^2 + (1 - u)^2] q (1 - q) = 2/3 q (1 - q)``; the ``decoding - 1``
    clients are independent. A round-robin or load-aware router keeps each worker within about one request of its
    share instead (0 here). ``tests/test_inferencex.py`` holds it against a step-by-step simulation of such a loop."""
    n = np.asarray(decoding, dtype=float)
    w = np.maximum(np.asarray(workers, dtype=float), 1.0)
    q = 1.0 / w
    return np.where(w > 1.0, np.sqrt(2.0 / 3.0 * np.maximum(n - 1.0, 0.0) * q * (1.0 - q)), 0.0)


def itl_quantiles(plain_s, chunk_s, chunk_share, qs=(0.5, 0.9, 0.99)) -> list[np.ndarray]:
    """ITL quantiles of a replica whose steps (emissions) take ``plain_s``, or ``chunk_s`` for the share
    ``chunk_share`` that carries a prefill chunk."""
    plain, chunk = np.asarray(plain_s, dtype=float), np.asarray(chunk_s, dtype=float)
    share = np.clip(np.asarray(chunk_share, dtype=float), 0.0, 1.0)
    return [np.where(share > 1.0 - q, np.maximum(chunk, plain), plain) for q in qs]


QS = (0.5, 0.9, 0.99)
"""The quantiles plans report: p50, p90, p99."""


def pool_latency(row, tail: Tail, rate_per_replica: float, ttft_target_s: float, tpot_target_s: float,
                 batch: float = 0.0, handover: float = 0.0) -> dict:
    """Latency of one pool's requests at ``rate_per_replica`` requests/s per replica, from its candidate row
    (``ttft_base_s``, ``queue_work_s``, ``queue_servers``, ``tpot_s``, ``tpot_cv``, ``itl_plain_s``, ``itl_chunk_s``,
    ``chunk_share``): TTFT, TPOT and ITL at p50/p90/p99 (``*_p``: three values), the mean TTFT, TTFT and TPOT at the
    SLO's quantiles (``ttft_slo``, ``tpot_slo``), and the share of requests meeting each target (``ttft_ok``,
    ``tpot_ok``; 1 for a role that has no such latency). ``batch``: the slots an aggregated replica's requests wait
    for (0: none); ``handover``: a decode replica's slots, whose chance of being all held is its ``ttft_ok``'s miss."""
    base, work, c = (float(row[k]) for k in ("ttft_base_s", "queue_work_s", "queue_servers"))
    c = max(c, 1.0)
    x, p, cs2 = np.asarray(tail.x), np.asarray(tail.p), tail.cs2
    out: dict = {}
    if work > 0:
        rho = min(rate_per_replica * work / c, 1.0 - 1e-9)
        args = (base, work, rho, c, x, p, cs2)
        slots = (batch, batch / max(float(row["capacity_rps"]), 1e-30), tail.cv2_out) if batch > 0 else None
        # every quantile in one evaluation (rows of the same pool), the mean last
        qs = np.array([*QS, np.nan if tail.ttft_q is None else tail.ttft_q, np.nan])
        k = qs.size
        rows = (np.full(k, base), np.full(k, work), np.full(k, rho), np.full(k, c))
        t = ttft_quantile(qs, *rows, x, p, np.full(k, cs2),
                          slots=None if slots is None else tuple(np.full(k, v) for v in slots))
        out["ttft_p"] = [float(v) for v in t[: len(QS)]]
        out["ttft_slo"], out["ttft_mean"] = float(t[len(QS)]), float(t[-1])
        out["ttft_ok"] = 1.0 - float(ttft_exceedance(ttft_target_s, *args, slot=_slot_at(rho, c, work, slots))[0])
    else:
        out["ttft_p"] = [base] * len(QS)
        out["ttft_mean"] = out["ttft_slo"] = base
        out["ttft_ok"] = 1.0 if base <= ttft_target_s else 0.0
        if handover > 0 and float(row["capacity_rps"]) > 0:
            # a decode pool: the share of hand-overs that find a slot free at once
            u = min(rate_per_replica / float(row["capacity_rps"]), 1.0 - 1e-9)
            out["ttft_ok"] = 1.0 - float(erlang_c(handover, u))
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
