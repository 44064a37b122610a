"""Candidate table (groundwork of the plan issue): filters hold and pruning loses nothing."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from planner.catalog.scenario import load_scenario, resolve_scenario
from planner.perf.candidates import build_candidates, layouts
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def llama(catalog):
    p = ROOT / "catalogs" / "scenarios" / "llama-70b-chat.yaml"
    return resolve_scenario(load_scenario(p), catalog, p)


def test_rows_meet_slo_and_memory(llama):
    ct = build_candidates(llama)
    r = ct.rows
    assert len(r) > 0 and ct.evaluated > len(r)
    w = llama.scenario.workloads[0]
    assert (r["tpot_s"] <= w.slo.tpot_ms / 1e3 + 1e-12).all()
    assert (r["ttft_s"] <= w.slo.ttft_ms / 1e3 + 1e-12).all()
    used = r["weight_bytes_per_chip"] + r["kv_bytes_per_chip"] + r["other_bytes_per_chip"]
    assert (used <= r["hbm_bytes_per_chip"]).all()
    assert set(r["role"]) == {"aggregated", "prefill", "decode"}
    assert sum(ct.dropped.values()) + len(r) == ct.evaluated


def test_pruning_keeps_a_row_at_least_as_good_as_every_feasible_row(llama):
    full = build_candidates(llama, prune=False).rows
    kept = build_candidates(llama).rows
    for (wl, role, hw), g in full.groupby(["workload", "role", "hardware"]):
        k = kept[(kept.workload == wl) & (kept.role == role) & (kept.hardware == hw)]
        chips = k["chips"].to_numpy()
        cost = k["usd_per_rps"].to_numpy()
        for c, u in zip(g["chips"].to_numpy(), g["usd_per_rps"].to_numpy(), strict=True):
            assert np.any((chips <= c) & (cost <= u * (1 + 1e-12)))


def test_layouts_respect_the_model(catalog):
    lay = layouts(catalog.models["deepseek-v3"], catalog.hardware["gb200-nvl72"])
    stage = lay["tp"] * lay["attn_dp"]
    assert ((lay["ep"] == 1) | (lay["ep"] == stage)).all()
    assert (128 % lay["tp"] == 0).all()
    # EP degrees that do not divide the 256 experts are the wide ones, run with redundant slots (see below).
    assert ((256 % lay["ep"] == 0) | (lay["ep"] > 64)).all()
    dense = layouts(catalog.models["llama-3.1-70b"], catalog.hardware["h100-sxm"])
    assert (dense["ep"] == 1).all() and (dense["attn_dp"] == 1).all()


@pytest.fixture(scope="module")
def deepseek(catalog):
    p = ROOT / "catalogs" / "scenarios" / "deepseek-chat.yaml"
    return resolve_scenario(load_scenario(p), catalog, p)


def test_engines_run_only_where_they_can(catalog, deepseek):
    """Every row names an engine that runs on its hardware and serves its weights there: no TensorRT-LLM on AMD,
    no ATOM on NVIDIA, FP4 only where the hardware has FP4 units or as a named weight-only option."""
    from planner.perf.candidates import evaluate_candidates

    rows = evaluate_candidates(deepseek).rows
    pairs = rows.groupby(["hardware", "engine", "weights_dtype", "weights_mode"], observed=True).size().reset_index()
    for r in pairs.itertuples(index=False):
        hw, eng = catalog.hardware[r.hardware], catalog.engines[r.engine]
        assert eng.runs_on(hw)
        assert eng.weight_mode(hw, r.weights_dtype) == r.weights_mode
        if r.weights_dtype == "fp4" and r.weights_mode == "native":
            assert "fp4" in hw.dense_tflops
    amd = pairs[pairs["hardware"].isin(["mi300x", "mi355x", "mi325x"])]
    assert "trtllm" not in set(amd["engine"])
    assert not ((pairs["hardware"] == "mi300x") & (pairs["weights_dtype"] == "fp4")).any()
    assert "atom" not in set(pairs.loc[pairs["hardware"].str.startswith(("h", "b", "gb")), "engine"])


def test_wide_expert_parallelism_with_redundant_experts(catalog):
    """DeepSeek on 8-GPU H200 nodes offers attention-DP EP72 and EP144 with 32 redundant experts (one packing
    domain per 8 GPUs), priced with redundant weights; micro-batch overlap only where the exchange exists."""
    from planner.perf.candidates import _grid

    g = _grid(catalog.models["deepseek-v3"], catalog.hardware["h200-sxm"], catalog.engines["sglang"])
    wide = g[(g["ep"] == 72) | (g["ep"] == 144)]
    assert set(wide["redundant"]) == {32} and (wide["attn_dp"] == wide["ep"]).all()
    assert wide["expert_copies"].to_numpy() == pytest.approx(np.full(len(wide), (256 + 32) / 256))
    tbo = g[g["tbo"] == 1]
    assert len(tbo) and ((tbo["attn_dp"] > 1) & (tbo["ep"] > 1)).all()
    assert set(g["spec"]) == {0, 1, 2, 3}
    trt = _grid(catalog.models["deepseek-v3"], catalog.hardware["h200-sxm"], catalog.engines["trtllm"])
    assert (trt["tbo"] == 0).all()  # no micro-batch overlap option among TensorRT-LLM's keys
    dense = _grid(catalog.models["llama-3.1-70b"], catalog.hardware["h200-sxm"], catalog.engines["sglang"])
    assert set(dense["spec"]) == {0} and (dense["tbo"] == 0).all()  # no published draft acceptance for it


def _greedy_reference(s, q, c, t):
    """The dominance rule written out row by row (the former implementation): the brute force that
    :func:`nondominated` must match (``c``: prefix bytes per request/s, compared as they are, not ``k``-fold:
    ``k`` replicas of a row hold its share of the traffic they serve, no more)."""
    order = sorted(range(len(s)), key=lambda i: (s[i], -q[i], -c[i], t[i], i))
    kept: list[int] = []
    best_cap: dict[float, float] = {}
    for i in order:
        if c[i] <= best_cap.get(s[i], -np.inf):
            continue
        best_cap[s[i]] = c[i]
        dominated = False
        for j in kept:
            if s[j] >= s[i]:
                continue
            k = s[i] / s[j]
            kr = round(k)
            if abs(k - kr) < 1e-9 and kr * q[j] >= q[i] * (1 - 1e-12) and c[j] >= c[i] * (1 - 1e-12):
                dominated = True
                break
        if not dominated:
            kept.append(i)
    out = np.zeros(len(s), dtype=bool)
    out[kept] = True
    return out


@pytest.mark.parametrize("seed", range(40))
def test_vectorised_pruning_matches_the_row_by_row_rule(seed):
    from planner.perf.candidates import nondominated

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    s = rng.choice([1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0, 24.0, 8 / 3, 72 / 14], n)
    # coarse values so that ties (equal rates, capacities, TPOTs, exact k-fold rates) are common
    q = s * rng.integers(1, 6, n) / rng.choice([1.0, 2.0, 4.0], n)
    c = rng.choice([0.0, 1.0, 2.0, 4.0], n) * s * rng.integers(0, 3, n)
    t = rng.integers(1, 4, n) / 100.0
    assert (nondominated(s, q, c, t) == _greedy_reference(s, q, c, t)).all()


@pytest.mark.parametrize("quantile", [None, 0.9, 0.99])
def test_planned_load_matches_bisection_and_never_breaks_the_target(quantile):
    """The load a TTFT slack allows (the mean, or a quantile, within the limit; root tables refined by false
    position) agrees with sixty bisection steps on the wait itself and errs only below the root: the planned load
    never breaks the SLO."""
    from planner.perf.latency import ttft_quantile
    from planner.perf.queueing import planned_load

    rng = np.random.default_rng(7)
    n = 4000
    c = rng.integers(1, 129, n).astype(float)
    work = rng.uniform(1e-3, 30.0, n)
    base = work * rng.uniform(1.0, 3.0, n)
    slack = work * 10.0 ** rng.uniform(-3, 2, n)
    rows = {"capacity_rps": np.full(n, 1e9), "ttft_base_s": base, "queue_work_s": work, "queue_servers": c}
    lam, _ = planned_load(rows, base + slack, 1.0 - 1e-9, quantile=quantile)
    rho = lam * work / c
    q = np.full(n, np.nan if quantile is None else quantile)
    lo, hi = np.zeros(n), np.full(n, 1.0 - 1e-9)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        fits = ttft_quantile(q, base, work, mid, c) <= base + slack
        lo, hi = np.where(fits, mid, lo), np.where(fits, hi, mid)
    assert np.abs(rho - lo).max() < 1e-5
    assert (ttft_quantile(q, base, work, rho, c) <= (base + slack) * (1 + 1e-9)).all()


@pytest.mark.parametrize("name", ["llama-70b-margin", "long-context"])
def test_streamed_pool_answers_every_level_like_the_whole_pool(catalog, name):
    """A pool filtered and pruned chunk by chunk as it is evaluated gives, at each SLO level it was streamed
    for, exactly the table the whole pool gives, with the same drop counts at the scenario's level; it holds a
    small fraction of the rows."""
    from planner.perf.candidates import evaluate_candidates, scenario_slos, select_candidates
    from planner.perf.refine import refine_targets
    from planner.pipeline.plan import slo_levels

    p = ROOT / "catalogs" / "scenarios" / f"{name}.yaml"
    rs = resolve_scenario(load_scenario(p), catalog, p)
    slos = scenario_slos(rs.scenario.workloads)
    levels = slo_levels(slos, True)
    assert len(levels) == 1 + 2 * len(slos)
    # the whole pool refined at the levels' TPOT targets, as the streamed one is by default
    full = evaluate_candidates(rs, refine=refine_targets(levels, rs.scenario.workloads))
    streamed = evaluate_candidates(rs, None, levels)
    assert streamed.evaluated == full.evaluated and streamed.fit == len(full.rows)
    assert len(streamed.rows) < 0.2 * len(full.rows)
    for i, lv in enumerate(levels):
        a, b = select_candidates(full, lv), select_candidates(streamed, lv)
        pd.testing.assert_frame_equal(a.rows.drop(columns="pool_row"), b.rows.drop(columns="pool_row"))
        if i == 0:
            assert a.dropped == b.dropped
    # a level the pool was not streamed for is refused nothing, but is not promised either: the whole pool
    # admits rows a much looser TPOT brings in that the streamed pool never kept
    loose = {w: (f, t * 3) for w, (f, t) in slos.items()}
    top = max(t for lv in levels for _, t in lv.values())
    assert (select_candidates(full, loose).rows["tpot_s"] > top).any()
    slow = select_candidates(streamed, loose).rows["tpot_s"] > top
    assert slow.sum() < (select_candidates(full, loose).rows["tpot_s"] > top).sum()


@pytest.mark.parametrize("seed", range(20))
def test_rows_bound_dominated_are_rows_the_dominance_test_drops(seed):
    """A row whose rate is only bounded (its load not searched) is flagged only where :func:`nondominated` drops it
    whatever its rate up to the bound, and leaving the flagged rows out keeps exactly the same rows."""
    from planner.perf.pruning import bound_dominated, nondominated

    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 200))
    s = rng.choice([1.0, 2.0, 4.0, 8.0], n)
    groups = np.searchsorted(np.array([1.0, 2.0, 4.0, 8.0]), s)
    upper = s * rng.integers(1, 6, n) / 2.0  # each row's rate at its cap
    at_cap = rng.random(n) < 0.5
    pcap = rng.choice([0.0, 0.0, 1.0, 4.0], n)
    share = None if seed % 2 else (0.5, 2.0)
    from planner.perf.pruning import usable_share

    known = np.where(at_cap, upper, np.nan)
    bound = usable_share(pcap, 0.0, share)
    flag = bound_dominated(groups, known, usable_share(pcap, known, share), np.where(at_cap, np.nan, upper), bound)
    assert not (flag & at_cap).any()
    if seed == 0:
        assert flag.any()
    for _ in range(5):
        # any rate below the cap for the rows not at it
        rate = np.where(at_cap, upper, upper * rng.uniform(0.01, 0.999, n))
        cap = usable_share(pcap, rate, share)
        t = rng.integers(1, 4, n) / 100.0
        full = nondominated(s, rate, cap, t, groups)
        assert not (full & flag).any()
        rest = np.flatnonzero(~flag)
        part = np.zeros(n, dtype=bool)
        part[rest[nondominated(s[rest], rate[rest], cap[rest], t[rest], groups[rest])]] = True
        assert (part == full).all()


def test_tail_load_searches_only_the_rows_asked():
    """Rows at their cap come back at it whether searched or not; rows below it come back as ``PENDING`` where not
    searched and with the same load as a search of every row where searched."""
    from planner.perf.latency import PENDING, tail_load

    rng = np.random.default_rng(3)
    n = 500
    c = rng.integers(1, 65, n).astype(float)
    work = rng.uniform(1e-3, 10.0, n)
    base = work * rng.uniform(1.0, 2.0, n)
    lim = base + work * 10.0 ** rng.uniform(-2, 1.5, n)
    cap = np.full(n, 0.9)
    full = tail_load(base, work, c, lim, np.full(n, 0.99), cap)
    none = tail_load(base, work, c, lim, np.full(n, 0.99), cap, search=np.zeros(n, dtype=bool))
    below = np.isfinite(full) & (full < 0.9)
    assert below.any() and (full == 0.9).any()
    assert (none[below] == PENDING).all()
    np.testing.assert_array_equal(np.isnan(none), np.isnan(full))
    np.testing.assert_array_equal(none[~below & np.isfinite(full)], full[~below & np.isfinite(full)])
    some = rng.random(n) < 0.5
    part = tail_load(base, work, c, lim, np.full(n, 0.99), cap, search=some)
    np.testing.assert_array_equal(part[below & some], full[below & some])
    assert (part[below & ~some] == PENDING).all()
