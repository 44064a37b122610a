"""Percentile SLOs: the queue's wait distribution against closed forms, the simulator against the same closed
forms, sizing at a quantile, and the length distributions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.analysis.simulate import fcfs
from planner.catalog.scenario import LengthSpread, Slo, quantile_label
from planner.perf.latency import (
    Tail,
    length_nodes,
    lognormal_attainment,
    lognormal_quantile,
    spec_step_spread,
    tail_load,
    ttft_exceedance,
    ttft_quantile,
    wait_tail,
)
from planner.perf.queueing import planned_load


def erlang_c_ref(c: int, a: float) -> float:
    """Probability of waiting in M/M/c with offered load ``a = lambda / mu``."""
    rho = a / c
    top = a ** c / math.factorial(c) / (1 - rho)
    return top / (sum(a ** k / math.factorial(k) for k in range(c)) + top)


def mmc_wait_quantile(q: float, c: int, rho: float, s: float) -> float:
    """Exact M/M/c wait quantile: P(W > t) = C e^{-(c mu - lambda) t}."""
    pc = erlang_c_ref(c, rho * c)
    if 1 - q >= pc:
        return 0.0
    return math.log(pc / (1 - q)) / (c / s * (1 - rho))


def md1_wait_cdf(t: float, rho: float, d: float = 1.0) -> float:
    """Exact M/D/1 wait distribution (Erlang 1909): P(W <= t) = (1 - rho) sum_{k=0}^{floor(t/D)}
    (lambda (k D - t))^k / k! e^{-lambda (k D - t)}."""
    lam = rho / d
    tot = 0.0
    for k in range(int(math.floor(t / d)) + 1):
        x = lam * (k * d - t)
        tot += x ** k / math.factorial(k) * math.exp(-x)
    return (1 - rho) * tot


def md1_wait_quantile(q: float, rho: float) -> float:
    if md1_wait_cdf(0.0, rho) >= q:
        return 0.0
    lo, hi = 0.0, 1.0
    while md1_wait_cdf(hi, rho) < q:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if md1_wait_cdf(mid, rho) < q else (lo, mid)
    return hi


@pytest.mark.parametrize("c", [1, 2, 4, 8])
@pytest.mark.parametrize("rho", [0.5, 0.7, 0.9])
def test_ttft_tail_against_exact_mmc(c, rho):
    # exponential service: cs2 = 1; TTFT = base + wait. The approximation stays within 15% of the exact TTFT
    # quantile (base 0.5 s, mean service 1 s) at p90 and p99.
    base, s = 0.5, 1.0
    for q in (0.9, 0.99):
        exact = base + mmc_wait_quantile(q, c, rho, s)
        approx = float(ttft_quantile(q, base, s, rho, c, cs2=1.0)[0])
        assert approx == pytest.approx(exact, rel=0.15), (q, exact, approx)


@pytest.mark.parametrize("rho", [0.3, 0.6, 0.8, 0.9])
def test_ttft_tail_against_exact_md1(rho):
    base = 1.0
    for q in (0.9, 0.99):
        exact = base + md1_wait_quantile(q, rho)
        approx = float(ttft_quantile(q, base, 1.0, rho, 1)[0])
        assert approx == pytest.approx(exact, rel=0.15), (q, exact, approx)


def test_md1_closed_form_itself():
    # Erlang's formula reproduces the Pollaczek-Khinchine mean rho D / (2 (1 - rho)) (sanity of the reference)
    rho = 0.7
    grid = np.linspace(0, 25, 2501)
    cdf = np.array([md1_wait_cdf(t, rho) for t in grid])
    mean = float(np.sum((1 - cdf[1:] + 1 - cdf[:-1]) / 2 * np.diff(grid)))
    assert mean == pytest.approx(rho / (2 * (1 - rho)), rel=0.01)


def test_mean_wait():
    # one server: Pollaczek-Khinchine; several: M/M/c exactly for exponential service, and for deterministic service
    # the exact M/D/c wait (probability and mean), within the table's interpolation
    from planner.perf.latency import erlang_c, mean_wait_factor
    from planner.perf.queueing import queue_wait
    from planner.perf.waits import md_c_wait

    assert float(queue_wait(0.75, 1, 0.2)) == pytest.approx(0.75 * 0.2 / 0.5, rel=1e-6)
    for c in (2, 3, 8):
        pw, th = wait_tail(0.75, c, 0.2, 1.0)
        assert float(pw * th) == pytest.approx(float(erlang_c(c, 0.75)) * 0.2 / (c * 0.25), rel=1e-6)
        k = 0.25 * (c - 1) * (math.sqrt(4 + 5 * c) - 2) / (16 * 0.75 * c)
        assert float(mean_wait_factor(c, 0.75, 0.0)) == pytest.approx(0.5 * (1 + k))  # Cosmetatos, still for reference
        pw, th = wait_tail(0.75, c, 0.2, 0.0)
        p_exact, mean_exact = md_c_wait(c, 0.75)
        assert float(pw) == pytest.approx(float(erlang_c(c, 0.75)))  # P(wait): Erlang's C (insensitive to service)
        assert float(th) == pytest.approx(mean_exact / p_exact * 0.2, rel=0.01)  # who waits, waits M/D/c's mean


def test_md_c_wait_is_exact():
    """The M/D/c wait (``waits.md_c_wait``) reproduces M/D/1's closed forms (P(wait) = rho, mean rho D / (2 (1 - rho)))
    and a simulated M/D/8 and M/D/64; the shipped table is its output."""
    from planner.perf.mdc_table import MDC_MEAN, MDC_P, MDC_SHAPE
    from planner.perf.waits import MDC_SERVERS, _md_c_row, md_c_wait

    for rho in (0.3, 0.7, 0.9):
        p, m = md_c_wait(1, rho)
        assert p == pytest.approx(rho, rel=1e-6)
        assert m == pytest.approx(rho / (2 * (1 - rho)), rel=1e-4)
    rng = np.random.default_rng(3)
    for c, rho in ((8, 0.79), (64, 0.79)):
        n = 400_000
        arr = np.cumsum(rng.exponential(1.0 / (rho * c), size=n))
        start, _ = fcfs(arr, np.ones(n), c)
        w = (start - arr)[n // 10:]
        p, m = md_c_wait(c, rho)
        waited = w[w > 1e-12]
        assert float(np.mean(w > 1e-12)) == pytest.approx(p, rel=0.1)
        assert float(np.mean(waited)) == pytest.approx(m / p, rel=0.05)  # the mean wait of those who wait
    k = MDC_SERVERS.index(8)
    pr, er, kk = _md_c_row(8)
    assert np.asarray(MDC_P[k]) == pytest.approx(pr, rel=1e-5, abs=1e-6)
    assert np.asarray(MDC_MEAN[k]) == pytest.approx(er, rel=1e-5, abs=1e-6)
    assert np.asarray(MDC_SHAPE[k]) == pytest.approx(kk, rel=1e-5, abs=1e-6)


def test_md_c_quantile_and_decay():
    """The exact M/D/c quantile (``waits.md_c_quantile``) is M/D/1's closed form at one server and a simulated M/D/8's
    p99; the tail decay rate (``waits.md_c_decay``) is M/D/1's Cramer-Lundberg root at one server (``u = rho (e^u -
    1)``) and solves its equation."""
    from planner.perf.waits import md_c_decay, md_c_quantile

    for rho in (0.5, 0.8):
        assert md_c_quantile(1, rho, 0.99) == pytest.approx(md1_wait_quantile(0.99, rho), rel=2e-3)
        u = md_c_decay(1, rho)
        assert u == pytest.approx(rho * math.expm1(u), rel=1e-9)
    for c, rho in ((8, 0.85), (64, 0.9)):
        g = md_c_decay(c, rho)
        assert g == pytest.approx(c * math.log1p(g / (rho * c)), rel=1e-9) and g > 0
    rng = np.random.default_rng(5)
    n = 400_000
    arr = np.cumsum(rng.exponential(1.0 / (0.85 * 8), size=n))
    start, _ = fcfs(arr, np.ones(n), 8)
    w = (start - arr)[n // 10:]
    assert md_c_quantile(8, 0.85, 0.99) == pytest.approx(float(np.quantile(w, 0.99)), rel=0.05)


@pytest.mark.parametrize("c", [2, 4, 8, 16, 64, 256])
@pytest.mark.parametrize("rho", [0.6, 0.79, 0.9, 0.95])
def test_md_c_tail_shape(c, rho):
    """Deterministic service, several servers: the planner's wait (Erlang's C, the exact mean and a gamma law of the
    exact decay rate) at p99 and p99.9 within 10% of the exact M/D/c quantile wherever the queue waits beyond 2% of a
    service there, and never short of it by more than 10% (the exponential of the same mean ran to +34%)."""
    from planner.perf.waits import md_c_quantile

    for q in (0.99, 0.999):
        exact = md_c_quantile(c, rho, q)
        approx = float(ttft_quantile(q, 0.0, 1.0, rho, c)[0])
        if exact < 0.02:
            assert approx < 0.05
            continue
        assert approx == pytest.approx(exact, rel=0.10), (q, exact, approx)


def test_erlang_c_exact():
    from planner.perf.latency import erlang_c

    for c in (1, 2, 5, 16):
        for rho in (0.2, 0.6, 0.95):
            assert float(erlang_c(c, rho)) == pytest.approx(erlang_c_ref(c, rho * c), rel=1e-5)


@pytest.mark.parametrize(("kind", "c"), [("det", 1), ("exp", 1), ("exp", 4)])
def test_simulator_queue_against_closed_forms(kind, c):
    rng = np.random.default_rng(7)
    rho, n = 0.8, 200_000
    arr = np.cumsum(rng.exponential(1.0 / (rho * c), size=n))
    svc = np.ones(n) if kind == "det" else rng.exponential(1.0, size=n)
    start, _ = fcfs(arr, svc, c)
    w = (start - arr)[n // 10:]
    for q in (0.9, 0.99):
        exact = md1_wait_quantile(q, rho) if kind == "det" else mmc_wait_quantile(q, c, rho, 1.0)
        assert float(np.quantile(w, q)) == pytest.approx(exact, rel=0.05), (q, exact)


def test_planned_load_meets_its_quantile_exactly():
    rows = {"capacity_rps": np.array([20.0, 20.0]), "ttft_base_s": np.array([0.4, 0.4]),
            "queue_work_s": np.array([0.1, 0.1]), "queue_servers": np.array([1.0, 4.0])}
    for q in (0.5, 0.9, 0.99):
        lam, t = planned_load(rows, 1.0, 0.95, quantile=q)
        for i in range(2):
            rho = lam[i] * 0.1 / rows["queue_servers"][i]
            if rho < 0.95 * 20 * 0.1 / rows["queue_servers"][i] - 1e-9:  # queue-bound: the quantile is the limit
                assert float(ttft_quantile(q, 0.4, 0.1, rho, rows["queue_servers"][i])[0]) == pytest.approx(1.0, rel=1e-6)
            assert t[i] <= 1.0 + 1e-9


def test_load_falls_as_the_quantile_rises():
    rows = {"capacity_rps": np.array([50.0]), "ttft_base_s": np.array([0.3]), "queue_work_s": np.array([0.05]),
            "queue_servers": np.array([2.0])}
    loads = [float(planned_load(rows, 0.6, 0.99, quantile=q)[0][0]) for q in (0.5, 0.9, 0.99, 0.999)]
    assert loads == sorted(loads, reverse=True) and loads[0] > loads[-1]


def test_slot_queue_lowers_the_load():
    # an aggregated replica whose 8 slots are held 10 s each: waiting for a slot counts in TTFT
    rows = {"capacity_rps": np.array([0.8]), "ttft_base_s": np.array([0.3]), "queue_work_s": np.array([0.05]),
            "queue_servers": np.array([1.0])}
    free = float(planned_load(rows, 2.0, 0.9, quantile=0.9)[0][0])
    held = float(planned_load(rows, 2.0, 0.9, quantile=0.9, slots=(np.array([8.0]), 0.0))[0][0])
    assert held < free
    rho = held * 0.05
    t = float(ttft_quantile(0.9, 0.3, 0.05, rho, 1.0, slots=(8.0, 8.0 / 0.8, 0.0))[0])
    assert t == pytest.approx(2.0, rel=1e-4)


def test_length_nodes_keep_the_mean_and_the_p90():
    x, p = length_nodes(LengthSpread(mean=1000, p90=2000))
    assert float(np.sum(x * p)) == pytest.approx(1.0, rel=1e-12)
    assert float(np.sum(p)) == pytest.approx(1.0)
    # the 90th percentile lies between the node below and the node above 0.9 of the probability
    cum = np.cumsum(p)
    assert x[np.searchsorted(cum, 0.9 - 1e-12)] <= 2.0 <= x[np.searchsorted(cum, 0.9 - 1e-12) + 1]
    hx, hp = length_nodes(LengthSpread(points=[(t, 1.0) for t in range(100, 5100, 100)]))
    assert float(np.sum(hx * hp)) == pytest.approx(1.0, rel=1e-12)
    assert length_nodes(None) == (pytest.approx(np.ones(1)), pytest.approx(np.ones(1)))


def test_long_prompts_raise_the_tail():
    x, p = length_nodes(LengthSpread(mean=1000, p90=2000))
    cs2 = float(np.sum(p * x * x) - 1)
    fixed = float(ttft_quantile(0.99, 0.5, 0.2, 0.5, 2)[0])
    spread = float(ttft_quantile(0.99, 0.5, 0.2, 0.5, 2, x, p, cs2)[0])
    assert spread > fixed
    # the exceedance at the quantile is the quantile's complement
    assert float(ttft_exceedance(spread, 0.5, 0.2, 0.5, 2, x, p, cs2)[0]) == pytest.approx(0.01, abs=1e-6)


def test_tail_load_refuses_prompts_too_long_for_the_target():
    x, p = length_nodes(LengthSpread(mean=1000, p90=2200))
    # the base grows with the prompt: the longest 5% alone miss a 1.0 s target at any load
    r = tail_load(np.array([0.6]), np.array([0.3]), np.array([1.0]), np.array([1.0]), np.array([0.99]),
                  np.array([0.8]), x, p, 0.0)
    assert np.isnan(r[0])


def test_lognormal_tpot():
    assert float(lognormal_quantile(0.03, 0.0, 0.99)) == pytest.approx(0.03)
    q = float(lognormal_quantile(0.03, 0.1, 0.9))
    assert float(lognormal_attainment(0.03, 0.1, q)) == pytest.approx(0.9, rel=1e-6)
    assert float(lognormal_quantile(0.03, 0.1, np.nan)) == pytest.approx(0.03)


def test_spec_step_spread_matches_enumeration():
    a, k = 0.7, 3
    probs = {1: 1 - a, 2: a * (1 - a), 3: a * a * (1 - a), 4: a ** 3}
    mean = sum(t * pr for t, pr in probs.items())
    var = sum(t * t * pr for t, pr in probs.items()) - mean ** 2
    m, v = spec_step_spread(k, a)
    assert float(m) == pytest.approx(mean) and float(v) == pytest.approx(var)


def test_a_requests_own_acceptance_spreads_its_tpot():
    """One draft accepted at ``a``: ``m = 1 + a`` tokens a step, so a request whose acceptance sits ``s`` from the mean
    has a mean ``s / (1 + a)`` off in log (central difference: exact for a line); more drafts are more sensitive; no
    drafts, no spread. ``tpot_cv`` adds it in quadrature to the step-by-step spread, which averages over the steps."""
    from planner.perf.latency import spec_request_cv, tpot_cv

    assert float(spec_request_cv(1.0, 0.8, spread=0.08)) == pytest.approx(0.08 * (np.log(1.81) - np.log(1.79)) / 0.02)
    assert float(spec_request_cv(1.0, 0.8, spread=0.08)) == pytest.approx(0.08 / 1.8, rel=1e-3)
    cvs = [float(spec_request_cv(float(k), (0.875, 0.616), spread=0.08)) for k in (0, 1, 2, 3)]
    assert cvs[0] == 0.0 and cvs[1] < cvs[2] < cvs[3]
    base = float(tpot_cv(0.0, 64.0, 0.0, 1000.0, 2.0, 0.5, noise=0.0))
    both = float(tpot_cv(0.0, 64.0, 0.0, 1000.0, 2.0, 0.5, request_cv=0.1, noise=0.0))
    assert both == pytest.approx(np.hypot(base, 0.1))
    assert base < 0.02  # within a request, 500 steps average the draws out


def test_slo_quantiles_and_names():
    s = Slo(ttft_ms=1000, tpot_ms=50)
    assert (s.ttft_q, s.tpot_q) == (0.9, 0.9)
    s = Slo(ttft_ms=1000, tpot_ms=50, quantile="p99", tpot_quantile="mean", goodput=0.95)
    assert (s.ttft_q, s.tpot_q, s.goodput) == (0.99, None, 0.95)
    assert s.describe() == "p99 TTFT 1000 ms, mean TPOT 50 ms, goodput 0.95"
    assert quantile_label(0.999) == "p99.9" and quantile_label(0.5) == "median"


def test_goodput_split_for_disaggregated_pools():
    from planner.perf.latency import HANDOVER_SHARE

    t = Tail(ttft_q=0.9, tpot_q=0.9, goodput=0.95)
    # each role meets sqrt(g); the prefill pool leaves a share of its misses to the wait for a decode slot
    assert t.ttft_sizing_q == pytest.approx(1 - (1 - HANDOVER_SHARE) * (1 - math.sqrt(0.95)))
    assert t.handover_miss == pytest.approx(HANDOVER_SHARE * (1 - math.sqrt(0.95)))


@pytest.mark.parametrize("cs2", [0.0, 0.3, 1.0, 2.0])
def test_decay_rate_solves_its_equation_at_every_load(cs2):
    from planner.perf.latency import decay_rate

    rho = 1.0 / (1.0 + np.exp(-np.linspace(-12, 12, 241)))
    u = decay_rate(rho, cs2)
    assert (np.diff(u) < 0).all()  # a busier queue's tail decays more slowly
    m = np.exp(u) if cs2 == 0 else (1 - u * cs2) ** (-1 / cs2)
    assert np.allclose(rho * (m - 1), u, rtol=1e-4)


def test_tail_load_is_monotone_in_the_slack():
    # more slack, more load: the root, never a grid point
    sig = 10.0 ** np.linspace(-3, 1, 200)
    for c in (1.0, 4.0):
        r = tail_load(np.full(200, 10.0), np.full(200, 5.0), np.full(200, c), 10.0 + 5.0 * sig, np.full(200, 0.9),
                      np.full(200, 1 - 1e-9))
        assert (np.diff(r) >= -1e-12).all() and r[0] > 0


def test_decode_pools_keep_the_handover_wait_within_its_share():
    from planner.perf.latency import HANDOVER_SHARE, decode_slot_rho, erlang_c

    t = Tail(ttft_q=0.9)
    assert t.handover_miss == pytest.approx(HANDOVER_SHARE * 0.1)
    assert t.ttft_sizing_q == pytest.approx(1 - (1 - HANDOVER_SHARE) * 0.1)
    b = np.array([4.0, 16.0, 64.0, 512.0])
    rho = decode_slot_rho(b, t.handover_miss, 0.8)
    assert (erlang_c(b, rho) <= t.handover_miss * (1 + 1e-9)).all()
    assert (np.diff(rho) >= 0).all() and rho[-1] == pytest.approx(0.8)  # a large batch runs at the cap
    # a decode row's load: capped by its slots (no prefill queue of its own)
    rows = {"capacity_rps": np.full(4, 10.0), "ttft_base_s": np.zeros(4), "queue_work_s": np.zeros(4),
            "queue_servers": np.ones(4)}
    lam, _ = planned_load(rows, 1.0, 0.8, handover=(b, t.handover_miss))
    assert lam == pytest.approx(rho * 10.0)


@pytest.mark.parametrize("slots,decode_s,rate", [(8, 31.4, 0.158), (8, 31.4, 0.19), (8, 31.4, 0.12), (4, 10.0, 0.2)])
def test_slot_and_prefill_waits_overlap_as_the_simulator_runs_them(slots, decode_s, rate):
    """An aggregated replica: one prefill server (4 s a 128k-token prompt), ``slots`` batch slots held through the
    prefill and ``decode_s`` of decode. The simulator (first come, first served, admitted only with a free slot) and
    the formula (the larger of the slot wait and the prefill queue's) agree on p90 and p99 TTFT within 8% (within 4%
    at these seeds; summing the two waits is 13-18% high on three of the four). The first case is the long-context
    plan's long-docs pool."""
    from planner.analysis.simulate import fcfs

    work, base = 3.976, 4.125
    rng = np.random.default_rng(1)
    n = 200_000
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    hold = np.full(n, decode_s + base - work)
    start, _ = fcfs(arrivals, np.full(n, work), 1, slots=slots, hold=hold)
    sim = np.percentile(start + base - arrivals, [90, 99])
    f = [float(ttft_quantile(q, base, work, rate * work, 1.0, slots=(slots, base + decode_s, 0.0))[0]) for q in (0.9, 0.99)]
    assert np.allclose(f, sim, rtol=0.08)


def test_context_spread_in_tpot():
    """One sequence's context over a request's decode is its prompt plus half its output; the batch's mean context
    averages ``B`` of them, so the context term adds ``(elasticity x spread)^2 / B`` to TPOT's squared coefficient of
    variation."""
    from planner.perf.latency import context_cv, tpot_cv

    assert float(context_cv(1000.0, 0.0, 0.04, 0.0)) == pytest.approx(0.2)
    assert float(context_cv(1000.0, 1000.0, 0.0, 0.16)) == pytest.approx(0.4 * 500.0 / 1500.0)
    base = float(tpot_cv(0.0, 4.0, 0.0, 500.0, noise=0.0))
    with_ctx = float(tpot_cv(0.0, 4.0, 0.0, 500.0, context=0.2, noise=0.0))
    assert base == 0.0 and with_ctx == pytest.approx(0.1)


def test_step_noise_averages_over_a_requests_steps():
    """The step-time noise leaves a request's TPOT a spread of ``STEP_NOISE / sqrt(steps)``, steps = ``O`` over the
    tokens a step yields, added in quadrature to the other sources; eight times the output, ``sqrt(8)`` less."""
    from planner.perf.latency import STEP_NOISE, step_noise_cv, tpot_cv

    assert float(step_noise_cv(1000.0)) == pytest.approx(STEP_NOISE / np.sqrt(1000.0))
    assert float(step_noise_cv(1000.0, 2.0, noise=0.4)) == pytest.approx(0.4 / np.sqrt(500.0))
    assert float(step_noise_cv(8000.0)) == pytest.approx(float(step_noise_cv(1000.0)) / np.sqrt(8.0))
    assert float(step_noise_cv(0.5)) == pytest.approx(STEP_NOISE)  # at least one step
    assert float(tpot_cv(0.0, 4.0, 0.0, 1000.0)) == pytest.approx(STEP_NOISE / np.sqrt(1000.0))
    other = float(tpot_cv(0.3, 16.0, 0.1, 1000.0, 2.0, 0.5, context=0.2, noise=0.0))
    assert float(tpot_cv(0.3, 16.0, 0.1, 1000.0, 2.0, 0.5, context=0.2)) == pytest.approx(
        np.hypot(other, STEP_NOISE / np.sqrt(500.0)))


def test_incomplete_gamma_without_scipy():
    """The planning path's own incomplete gamma function (``waits._gammaincc``, its inverse and ``_lgamma``: scipy's
    import costs a second) agrees with scipy's to 1e-9 over the shapes and arguments the waits use."""
    from scipy.special import gammaincc, gammainccinv, gammaln

    from planner.perf.waits import _gammaincc, _gammainccinv, _lgamma

    rng = np.random.default_rng(0)
    a = rng.uniform(1.0, 7.0, 20_000)
    x = rng.uniform(0.0, 60.0, 20_000) * rng.uniform(0.0, 1.0, 20_000)
    assert _lgamma(a) == pytest.approx(gammaln(a), abs=1e-9)
    q = gammaincc(a, x)
    assert _gammaincc(a, x) == pytest.approx(q, rel=1e-9, abs=1e-12)
    assert _gammaincc(np.array([2.0]), np.array([0.0]))[0] == 1.0
    r = rng.uniform(1e-6, 1.0, 2_000) ** 3
    assert _gammainccinv(a[:2_000], r) == pytest.approx(gammainccinv(a[:2_000], r), rel=1e-9)
