"""Waiting in an M/G/c queue: the probability of waiting (Erlang's C, exact up to 256 servers, Halfin and Whitt's
limit beyond), the decay of the wait's tail (the Cramer-Lundberg root of the queue with service ``S / c``) and its
mean (Pollaczek-Khinchine for one server; with several, the exact M/D/c wait of those who wait (:func:`md_c_wait`,
tabulated in ``mdc_table.py`` by ``bench/mdc_table.py``) mixed with M/M/c's below exponential service,
Allen-Cunneen above). :mod:`planner.perf.latency` builds TTFT's distribution from them; the references are in
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
_FILLED = np.zeros(EXACT_SERVERS + 1, dtype=bool)
"""Which of the table's rows are computed (rows are filled on first use)."""
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
        _FILLED[int(c)] = True


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
    if not _FILLED[ci].all():
        rows = np.unique(ci)
        _erlang_rows(rows[~_FILLED[rows]])
    pos = (np.clip(t, _LOGIT[0], _LOGIT[-1]) - _LOGIT[0]) / _DT
    i = np.minimum(pos.astype(np.int64), _LOGIT.size - 2)
    f = pos - i
    at = ci * _LOGIT.size + i  # the table's flat index: two gathers from one array
    flat = _ERLANG.reshape(-1)
    v = (1.0 - f) * flat[at] + f * flat[at + 1]
    below = t < _LOGIT[0]
    if below.any():  # below the grid C ~ rho^c (every server busy); above it C -> 1
        v[below] = _ERLANG[ci[below], 0] + ci[below] * (t[below] - _LOGIT[0])
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


MDC_LOGIT = np.linspace(-6.0, math.log(0.98 / 0.02), 40)
"""Log-odds grid of the exact M/D/c table (:func:`md_c_ratios`): utilisation 0.0025-0.98; above it the ratios run
linearly to their heavy-traffic limits (1 and 1/2) at 1."""


def _md_c_max(c: int, rho: float) -> np.ndarray:
    """``P(M <= s)``, s = 0, 1, ..., of ``M``, the all-time maximum of the walk with steps ``A - c`` (``A`` Poisson of
    mean ``rho c``): the queue beyond the ``c`` servers of M/D/c at the ends of successive service times (Lindley).
    Solved on levels up to where its geometric tail (ratio ``1 / z``, ``ln z = rho (z - 1)``) is below e^-40, as the
    linear system ``F(s) = sum_x P(A = x) F(s + c - x)`` with ``F = 0`` below 0 and 1 beyond the last level."""
    from scipy.linalg import solve
    from scipy.stats import poisson

    a = rho * c
    xmax = int(a + 12.0 * math.sqrt(a) + 20.0)
    pa = poisson.pmf(np.arange(xmax + 1), a)
    z = max(4.0 / rho, 4.0)  # Newton from the right of the root of ln z = rho (z - 1), z > 1 (concave: monotone)
    for _ in range(200):
        nz = z - (math.log(z) - rho * (z - 1.0)) / (1.0 / z - rho)
        if abs(nz - z) <= 1e-14 * z:
            z = nz
            break
        z = nz
    k = int(min(40.0 / max(math.log(z), 1e-6), 20000.0)) + c + 10
    x = np.arange(k)[:, None] + c - np.arange(k)[None, :]
    a_mat = np.where((x >= 0) & (x <= xmax), pa[np.clip(x, 0, xmax)], 0.0)
    lim = np.arange(k) + c - k
    b = np.where(lim >= 0, np.cumsum(pa)[np.clip(lim, 0, xmax)], 0.0)
    return np.clip(solve(np.eye(k) - a_mat, b), 0.0, 1.0)


def _md_c_window(f: np.ndarray, n: int, m: float) -> float:
    """``sum_y P(Poisson(m) = y) P(M <= n - 1 - y)``, ``M`` the maximum of :func:`_md_c_max` (``f`` its CDF)."""
    from scipy.stats import poisson

    y = np.arange(n)
    i = n - 1 - y
    return float(np.sum(poisson.pmf(y, m) * np.where(i < f.size, f[np.minimum(i, f.size - 1)], 1.0)))


def _md_c_check(c, rho) -> None:
    if not (c >= 1 and 0.0 < rho < 1.0):
        raise ValueError(f"the M/D/c wait needs c >= 1 servers and 0 < rho < 1 (a stable queue), got c={c}, rho={rho}")


def md_c_wait(c: int, rho: float, nodes: int = 16) -> tuple[float, float]:
    """(P(wait), mean wait in service times) of the M/D/c queue, exactly: first come, first served, customer ``n``
    starts when customer ``n - c`` has been in service one service time ``D``, so it waits at most ``kD + u`` (``0 <= u
    < D``) unless ``(m + 1) c`` or more arrivals fall in some window ``(m + 1) D - (kD + u)`` before it (``m >= k``):
    ``P(W <= kD + u) = sum_y P(Poisson(lambda (D - u)) = y) P(M <= (k + 1) c - 1 - y)`` (:func:`_md_c_max`; Crommelin's
    M/D/c, 1932, in this form). The mean integrates it over ``u`` by Gauss-Legendre per ``k``. ``tests/test_latency.py``
    holds it against M/D/1's closed forms and a simulated M/D/c."""
    _md_c_check(c, rho)
    f = _md_c_max(c, rho)
    a = rho * c
    xs, ws = np.polynomial.legendre.leggauss(nodes)
    us, ws = 0.5 * (xs + 1.0), 0.5 * ws
    pw = max(1.0 - _md_c_window(f, c, a), 0.0)
    mean = 0.0
    for k in range(100000):
        t = float(sum(w * (1.0 - _md_c_window(f, (k + 1) * c, a * (1.0 - u))) for u, w in zip(us, ws, strict=True)))
        mean += max(t, 0.0)
        if t < 1e-13 or t < 1e-10 * mean:
            break
    return pw, mean


def _md_c_cdf_of(c: int, rho: float):
    """``t -> P(W <= t)`` (``t`` in service times) of the M/D/c queue (:func:`md_c_wait`'s distribution)."""
    _md_c_check(c, rho)
    f = _md_c_max(c, rho)
    a = rho * c

    def cdf(t: float) -> float:
        k = math.floor(t)
        return _md_c_window(f, (k + 1) * c, a * (1.0 - (t - k)))

    return cdf


def md_c_cdf(c: int, rho: float, t: float) -> float:
    """``P(W <= t)`` of the M/D/c queue, ``t`` in service times, exactly."""
    return _md_c_cdf_of(c, rho)(t)


def md_c_quantile(c: int, rho: float, q: float) -> float:
    """The wait (in service times) of the M/D/c queue at quantile ``q``, exactly (the distribution of
    :func:`md_c_wait`, ``P(W <= kD + u)``, inverted by bisection; 0 where ``q`` is below the share that never waits)."""
    from scipy.optimize import brentq

    cdf = _md_c_cdf_of(c, rho)

    if cdf(0.0) >= q:
        return 0.0
    hi = 1.0
    while cdf(hi) < q:
        hi *= 2.0
    return float(brentq(lambda t: cdf(t) - q, 0.0, hi, xtol=1e-9, rtol=1e-10))


def md_c_decay(c: int, rho: float) -> float:
    """The exponential decay rate of the M/D/c wait's tail, per service time: ``P(W > t) ~ A e^{-gamma t}`` with
    ``gamma`` the positive root of ``gamma = c ln(1 + gamma / (rho c))`` (customer ``n``'s wait is that of ``n - c`` plus
    ``D`` less ``c`` exponential gaps, a random walk whose steps have the moment generating function ``e^{gamma D}
    (lambda / (lambda + gamma))^c``, Cramer and Lundberg's root set to 1). Newton from the right of the root (the
    function ``gamma - c ln(1 + gamma / a)`` is convex, 0 at 0 and falling there) climbs down to it monotonically."""
    _md_c_check(c, rho)
    a = rho * c
    g = c * (2.0 / rho + 5.0)
    for _ in range(200):
        h = g - c * math.log1p(g / a)
        step = h / (1.0 - c / (a + g))
        g_new = g - step
        if abs(g_new - g) <= 1e-13 * g:
            return g_new
        g = g_new
    return g


MDC_SERVERS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
"""Server counts of the exact M/D/c table (``planner/perf/mdc_table.py``); between them the ratios are interpolated in
``log c``, beyond the last the last row holds (the ratios flatten as ``c`` grows)."""


def _md_c_row(c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(P(wait), mean wait) of M/D/c over M/M/c's on :data:`MDC_LOGIT`, computed (:func:`md_c_wait`), and the shape
    ``k = gamma theta`` of the wait of those who wait (its decay rate :func:`md_c_decay` times its mean, both per
    service time; 1 for an exponential wait); where M/M/c hardly waits (Erlang's C below 1e-9) the values are
    rounding, and take the first sound node's."""
    grid = 1.0 / (1.0 + np.exp(-MDC_LOGIT))
    mmc = erlang_c(np.full(grid.shape, float(c)), grid)
    vals = np.array([md_c_wait(c, float(r)) for r in grid])
    ok = mmc >= 1e-9
    first = int(np.argmax(ok)) if ok.any() else grid.size - 1
    pr = np.clip(vals[:, 0] / np.maximum(mmc, 1e-300), 0.0, 1.0)
    er = np.clip(vals[:, 1] * c * (1.0 - grid) / np.maximum(mmc, 1e-300), 0.0, 1.0)
    kk = np.array([md_c_decay(c, float(r)) for r in grid]) * vals[:, 1] / np.maximum(vals[:, 0], 1e-300)
    kk = np.maximum(kk, 1.0)
    pr[:first], er[:first], kk[:first] = pr[first], er[first], kk[first]
    return pr, er, kk


_MDC: np.ndarray | None = None
"""The exact M/D/c tables (``mdc_table.py``) as one array (P, mean, shape), read once."""


def md_c_ratios(servers, rho) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(P(wait), mean wait) of M/D/c over M/M/c's (Erlang's C and ``C D / (c (1 - rho))``) and the shape of the wait of
    those who wait (``k`` of :func:`_md_c_row`) at ``servers`` >= 2: the exact table (``planner/perf/mdc_table.py``,
    rows :data:`MDC_SERVERS`) interpolated in ``log c`` and in the log-odds of ``rho`` (the first node's value below
    the grid; above 0.98, linearly to the heavy-traffic limits 1, 1/2 and 1 (exponential) at ``rho`` = 1)."""
    global _MDC
    if _MDC is None:
        from planner.perf.mdc_table import MDC_MEAN, MDC_P, MDC_SHAPE

        _MDC = np.stack([np.asarray(t, dtype=float) for t in (MDC_P, MDC_MEAN, MDC_SHAPE)])
    c = np.clip(np.asarray(servers, dtype=float), MDC_SERVERS[0], MDC_SERVERS[-1])
    rho = np.clip(np.asarray(rho, dtype=float), 0.0, 1.0 - 1e-12)
    c, rho = np.broadcast_arrays(c, rho)
    lc = np.log(np.asarray(MDC_SERVERS, dtype=float))
    pos = np.interp(np.log(c), lc, np.arange(lc.size))
    i = np.minimum(pos.astype(np.int64), lc.size - 2)
    f = pos - i
    t = np.clip(np.log(np.maximum(rho, 1e-300)) - np.log1p(-rho), MDC_LOGIT[0], MDC_LOGIT[-1])
    gpos = (t - MDC_LOGIT[0]) / (MDC_LOGIT[1] - MDC_LOGIT[0])
    j = np.minimum(gpos.astype(np.int64), MDC_LOGIT.size - 2)
    g = gpos - j
    top = 1.0 / (1.0 + math.exp(-MDC_LOGIT[-1]))
    h = np.clip((rho - top) / (1.0 - top), 0.0, 1.0)
    t = _MDC
    at = ((1 - f) * ((1 - g) * t[:, i, j] + g * t[:, i, j + 1]) + f * ((1 - g) * t[:, i + 1, j] + g * t[:, i + 1, j + 1]))
    out = (1.0 - h) * at + h * np.array([1.0, 0.5, 1.0]).reshape((3,) + (1,) * np.ndim(h))
    return out[0], out[1], out[2]


def md_c_table_source() -> str:
    """The source of ``planner/perf/mdc_table.py`` (``python bench/mdc_table.py`` writes it, ~15 s)."""
    rows = [_md_c_row(c) for c in MDC_SERVERS]
    lines = ['"""Exact M/D/c waiting over M/M/c (P(wait) and mean wait) and the shape of the wait of those who wait, rows',
             "``MDC_SERVERS`` and columns ``MDC_LOGIT`` of :mod:`planner.perf.waits`; written by ``python",
             'bench/mdc_table.py`` (do not edit; ``tests/test_latency.py`` recomputes rows)."""']
    for k, name in enumerate(("MDC_P", "MDC_MEAN", "MDC_SHAPE")):
        lines += ["", f"{name} = ["]
        lines += ["    [" + ", ".join(f"{v:.6g}" for v in r[k]) + "]," for r in rows]
        lines += ["]"]
    return "\n".join(lines) + "\n"


def mean_wait_factor(servers, rho, cs2) -> np.ndarray:
    """The mean wait of an M/G/c queue over that of M/M/c (:func:`wait_tail` takes it above exponential service; below,
    exact M/D/c's replaced it, and it is kept as the published approximation the tests compare): Cosmetatos'
    correction for deterministic service, ``(1 + K) / 2`` with ``K = (1 - rho) (c - 1) (sqrt(4 + 5 c) - 2) / (16 rho
    c)`` (Cosmetatos, Operational Research Quarterly 27(3), 1976; at most 1), interpolated linearly in ``cs2`` to
    M/M/c's 1, and Allen-Cunneen's ``(1 + cs2) / 2`` above it."""
    c = np.maximum(np.asarray(servers, dtype=float), 1.0)
    rho = np.clip(np.asarray(rho, dtype=float), 1e-12, 1.0)
    cs2 = np.asarray(cs2, dtype=float)
    k = (1.0 - rho) * (c - 1.0) * (np.sqrt(4.0 + 5.0 * c) - 2.0) / (16.0 * rho * c)
    det = np.minimum(0.5 * (1.0 + k), 1.0)  # never above M/M/c's (the correction grows without bound as rho -> 0)
    return np.where(cs2 <= 1.0, cs2 + (1.0 - cs2) * det, (1.0 + cs2) / 2.0)


def wait_tail(rho, servers, work, cs2=0.0, shape: bool = False):
    """(probability of waiting, mean wait of a request that waits) of an M/G/c queue at utilisation ``rho``
    with mean service ``work`` on ``servers`` servers, and with ``shape`` the shape ``k`` of that wait: the tail is
    ``P(W > t) = P_W Q(k, k t / theta)`` (:func:`wait_survival`; a gamma law of mean ``theta``, exponential at ``k`` =
    1). One server: it decays at the Cramer-Lundberg rate ``u* / work`` (exact in the tail of M/D/1 and M/M/1),
    weighted so that the mean is Pollaczek-Khinchine's (``k`` = 1). Several: ``P_W`` is Erlang's C and ``theta`` M/M/c's
    conditional wait, below exponential service (``cs2 < 1``) mixed linearly in ``cs2`` with exact M/D/c's
    (:func:`md_c_ratios`), above it scaled by Allen-Cunneen's ``(1 + cs2) / 2`` (:func:`mean_wait_factor`). The shape
    of M/D/c's wait of those who wait is ``k = gamma theta``, its exact tail decay rate (:func:`md_c_decay`) times its
    exact mean: the gamma law with both right (its tail decays as ``e^{-k t / theta}``) puts the p99 of the exact M/D/c
    wait within -9% to +9% (median 3%) at 2-256 servers and utilisation 0.5-0.98, where the exponential of the same mean
    ran +1% to +34% long (``python bench/mdc_table.py --check``); between, the squared coefficient of variation of
    the wait, ``1 / k``, mixes linearly in ``cs2`` with M/M/c's 1. Against simulation of M/D/c and M/G/c at 1-256
    servers and utilisation 0.3-0.9 the p90 and p99 stay within about 15% (``tests/test_latency.py``)."""
    rho = np.clip(np.asarray(rho, dtype=float), 0.0, 1.0 - 1e-12)
    c = np.maximum(np.asarray(servers, dtype=float), 1.0)
    cs2 = np.asarray(cs2, dtype=float)
    work = np.asarray(work, dtype=float)
    rho, c, cs2, work = np.broadcast_arrays(rho, c, cs2, work)
    pw = erlang_c(c, rho)
    # several servers: Erlang's C and the mean
    th = mean_wait_factor(c, rho, cs2) * work / (c * (1.0 - rho))
    k = np.ones(rho.shape)
    det = (np.rint(c) >= 2.0) & (cs2 < 1.0) & (rho > 0)
    if det.any():
        # below exponential service, the mean wait of those who wait: exact M/D/c's (md_c_ratios) and M/M/c's mixed
        # linearly in cs2 (Cosmetatos' mean over Erlang's C made that tail 13% short at 64 servers and 0.79)
        pr, er, kd = md_c_ratios(c[det], rho[det])
        w = np.clip(cs2[det], 0.0, 1.0)
        th = np.array(th, dtype=float)
        th[det] = (w + (1.0 - w) * er / np.maximum(pr, 1e-300)) * work[det] / (c[det] * (1.0 - rho[det]))
        k[det] = 1.0 / (w + (1.0 - w) / kd)
    one = np.rint(c) <= 1.0
    if one.any():
        # one server: the Cramer-Lundberg decay, the mean matched (Erlang's C is rho)
        u = decay_rate(rho[one], cs2[one])
        pw = np.array(pw, dtype=float)
        th = np.array(th, dtype=float)
        pw[one] = np.minimum(rho[one] * (1.0 + cs2[one]) / 2.0 * u / (1.0 - rho[one]), 1.0)
        th[one] = work[one] / u
        k[one] = 1.0
    pw = np.where(rho > 0, pw, 0.0)
    return (pw, th, k) if shape else (pw, th)


_HALF_LN_2PI = 0.5 * math.log(2.0 * math.pi)


def _lgamma(a: np.ndarray) -> np.ndarray:
    """ln Gamma(a), ``a > 0``, elementwise: shifted up by six by ``Gamma(a) = Gamma(a + 6) / (a (a + 1) ... (a +
    5))``, then Stirling's series to its ``z^-7`` term (error below 1e-10 at ``z >= 6``). NumPy only (scipy's import
    costs the planning path a second)."""
    a = np.asarray(a, dtype=float)
    z = a + 6.0
    shift = np.log(a * (a + 1.0) * (a + 2.0) * (a + 3.0) * (a + 4.0) * (a + 5.0))
    iz = 1.0 / z
    iz2 = iz * iz
    series = iz * (1.0 / 12.0 - iz2 * (1.0 / 360.0 - iz2 * (1.0 / 1260.0 - iz2 / 1680.0)))
    return (z - 0.5) * np.log(z) - z + _HALF_LN_2PI + series - shift


def _gammaincc(a: np.ndarray, x: np.ndarray, series_terms: int = 28, fraction_terms: int = 16) -> np.ndarray:
    """The regularised upper incomplete gamma function ``Q(a, x)``, ``a >= 1``, ``x >= 0``, elementwise: below ``x =
    a + 1`` one minus the power series of ``P(a, x) = x^a e^-x / Gamma(a + 1) sum_n x^n / ((a + 1) ... (a + n))``,
    above it Legendre's continued fraction ``Q = x^a e^-x / Gamma(a) / (x + 1 - a - 1 (1 - a) / (x + 3 - a - 2 (2 -
    a) / ...))`` evaluated backwards from a fixed depth: at ``a <= 7`` (the waits' shapes stay below 6.3) 28 terms of
    the series and 16 of the fraction are within 1e-10 of scipy's (``tests/test_latency.py``)."""
    a, x = np.broadcast_arrays(np.asarray(a, dtype=float), np.asarray(x, dtype=float))
    x = np.maximum(x, 0.0)
    out = np.empty(a.shape)
    with np.errstate(divide="ignore", under="ignore", over="ignore", invalid="ignore"):
        lo = x < a + 1.0
        if lo.any():
            al, xl = a[lo], x[lo]
            term = np.ones_like(xl)
            total = np.ones_like(xl)
            buf = np.empty_like(xl)
            for n in range(1, series_terms + 1):  # in place: the planning path calls this thousands of times
                np.add(al, float(n), out=buf)
                np.divide(xl, buf, out=buf)
                term *= buf
                total += term
                if n % 6 == 0 and float(term.max()) < 1e-13:  # every term after falls faster (x < a + 1)
                    break
            log_front = al * np.log(np.where(xl > 0, xl, 1.0)) - xl - _lgamma(al) - np.log(al)
            p = np.where(xl > 0, np.exp(log_front) * total, 0.0)
            out[lo] = np.clip(1.0 - p, 0.0, 1.0)
        # the fraction converges faster the further x lies beyond a: 6 terms are within 1e-10 from x = 20
        for sel, depth in ((~lo & (x < 20.0), fraction_terms), (~lo & (x >= 20.0), min(6, fraction_terms))):
            if not sel.any():
                continue
            ah, xh = a[sel], x[sel]
            frac = np.zeros_like(xh)
            base = xh + 1.0 - ah
            buf = np.empty_like(xh)
            for n in range(depth, 0, -1):
                np.add(base, 2.0 * n, out=buf)
                buf -= frac
                np.subtract(float(n), ah, out=frac)
                frac *= float(n)
                frac /= buf
            cf = 1.0 / (base - frac)
            out[sel] = np.clip(np.exp(ah * np.log(xh) - xh - _lgamma(ah)) * cf, 0.0, 1.0)
    return out


def _gammainccinv(a: np.ndarray, r: np.ndarray) -> np.ndarray:
    """``y`` with ``Q(a, y) = r`` (``a >= 1``, ``0 < r <= 1``): Newton on ``ln Q``, which is concave and falling in
    ``y`` (the gamma law is log-concave at ``a >= 1``), so the first step lands right of the root and the rest
    climb down to it monotonically."""
    a, r = np.broadcast_arrays(np.asarray(a, dtype=float), np.asarray(r, dtype=float))
    target = np.log(np.clip(r, 1e-300, 1.0))
    y = np.maximum(a * (1.0 - target), 1e-9)
    lg = _lgamma(a)
    for _ in range(60):
        q = np.maximum(_gammaincc(a, y), 1e-300)
        dens = np.exp((a - 1.0) * np.log(y) - y - lg)
        step = (np.log(q) - target) * q / np.maximum(dens, 1e-300)
        y_new = np.maximum(y + step, 1e-12)
        if np.all(np.abs(y_new - y) <= 1e-12 * np.maximum(y, 1.0)):
            y = y_new
            break
        y = y_new
    return np.where(r >= 1.0, 0.0, y)


def wait_survival(s, th, k=1.0) -> np.ndarray:
    """``P(W > s | W > 0)`` of a wait of a request that waits, gamma of mean ``th`` and shape ``k``
    (:func:`wait_tail`): ``Q(k, k s / th)``, the regularised upper incomplete gamma function (``e^{-s / th}`` at ``k``
    = 1, taken directly); 0 where ``th`` is 0."""
    s, th, k = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (s, th, k)))
    pos = th > 0
    x = np.where(pos, np.maximum(s, 0.0) / np.where(pos, th, 1.0), 0.0)
    with np.errstate(over="ignore", under="ignore"):
        out = np.exp(-x)
        g = pos & (np.abs(k - 1.0) > 1e-12)
        if g.any():
            out = np.array(out, dtype=float)
            out[g] = _gammaincc(k[g], k[g] * x[g])
    return np.where(pos, out, 0.0)


def wait_quantile(pw, th, k, miss) -> np.ndarray:
    """The wait exceeded with probability ``miss`` (``P_W Q(k, k t / th) = miss``), 0 where ``P_W <= miss``."""
    pw, th, k, miss = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (pw, th, k, miss)))
    live = (pw > miss) & (th > 0)
    r = np.where(live, np.minimum(miss / np.where(live, pw, 1.0), 1.0), 1.0)
    with np.errstate(divide="ignore"):
        expo = -np.log(np.maximum(r, 1e-300))
    g = live & (np.abs(k - 1.0) > 1e-12)
    x = np.array(expo, dtype=float)
    if g.any():
        x[g] = _gammainccinv(k[g], r[g]) / k[g]
    return np.where(live, th * x, 0.0)


def max_wait_tail(s, p1, t1, p2, t2, k1=1.0, k2=1.0):
    """P(max(W1, W2) > s), ``s >= 0``, of independent waits that are 0 or, with probability ``p``, gamma of mean ``t``
    and shape ``k`` (:func:`wait_survival`): ``1 - (1 - P1(s)) (1 - P2(s))``. The wait for a batch slot and the prefill
    queue's overlap rather than add: first come, first served, a request starts its prefill at the later of its
    admission (a slot freed) and the server's release from the work of the requests before it, and that work was
    served while it waited for the slot (``planner.analysis.simulate.fcfs``). Summing the two waits put long-docs' p99
    TTFT 19% above its simulation (``bench/percentiles.py``); the maximum is within 1% of it pooled over five seeds (4%
    simulated alone) and exact where either wait vanishes."""
    a, b = p1 * wait_survival(s, t1, k1), p2 * wait_survival(s, t2, k2)
    return a + b - a * b


def max_mean(p1, t1, p2, t2):
    """E[max(W1, W2)] of the waits of :func:`max_wait_tail`: ``E W1 + E W2 - E min(W1, W2)``, the minimum taken as if
    both waits were exponential (rate ``1/t1 + 1/t2`` where both wait; the shapes move only this small term)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        both = np.where((t1 > 0) & (t2 > 0), t1 * t2 / np.where((t1 > 0) & (t2 > 0), t1 + t2, 1.0), 0.0)
    return p1 * t1 + p2 * t2 - p1 * p2 * both


def slot_tail(rho_slot, batch, hold, cs2_out=0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(probability of waiting, mean wait of a request that waits, its shape) for one of a replica's ``batch`` slots,
    each held ``hold`` seconds on average (from admission to the last token), at slot utilisation ``rho_slot``: the
    same M/G/c approximation with the output-length spread as service variability (no slots, ``batch`` 0: no
    wait)."""
    b = np.asarray(batch, dtype=float)
    pw, th, k = wait_tail(rho_slot, np.maximum(b, 1.0), hold, cs2_out, shape=True)
    return np.where(b > 0, pw, 0.0), np.where(b > 0, th, 0.0), k


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
