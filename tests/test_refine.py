"""Rows between the batch grid's steps at the largest batch that meets a TPOT target (planner.perf.refine)."""

from pathlib import Path

import numpy as np
import pytest

from planner.catalog.scenario import load_scenario, resolve_scenario
from planner.perf.candidates import (
    BATCH_PER_RANK,
    engine_choices,
    evaluate_candidates,
    grid_arrays,
    kv_options,
    weight_options,
)
from planner.perf.latency import lognormal_quantile, workload_tail
from planner.perf.refine import crossing_batches, refine_targets, refined_grids
from planner.perf.roofline import Setup
from planner.perf.setup import engine_options
from planner.perf.variants import variants

ROOT = Path(__file__).resolve().parents[1]


def test_crossing_batches_worked_example():
    """TPOT quantile linear in the batch between the steps: 10 ms at 16 per rank, 20 ms at 32, a 13 ms target is
    crossed at 16 + 3/10 x 16 = 20.8, so 20. A line that meets the target at every step, misses it at the first,
    or whose next step was not evaluated (memory) gets nothing; nor does a crossing that rounds down to the step."""
    b = np.tile(np.array([8, 16, 32, 64]), (5, 1))
    tpq = np.array([[5.0, 10.0, 20.0, 40.0],
                    [1.0, 2.0, 3.0, 4.0],  # meets everywhere
                    [14.0, 15.0, 16.0, 17.0],  # misses everywhere
                    [5.0, 10.0, np.nan, np.nan],  # the next step does not fit
                    [5.0, 12.99, 20.0, 40.0]]) * 1e-3  # crosses at 16.02: rounds down to the step
    rows, got = crossing_batches(tpq, b, 13e-3)
    assert rows.tolist() == [0] and got.tolist() == [20]
    rows, got = crossing_batches(tpq, b, 30e-3)
    assert rows.tolist() == [0, 4] and got.tolist() == [48, 48]  # 20 ms at 32, 40 at 64: 30 at 48


def test_refined_grids_copy_the_layout_and_move_the_batch():
    g = {"b_rank": np.tile(np.array([1, 2, 4]), 2), "batch": np.tile(np.array([1, 2, 4]), 2) * np.repeat([1, 4], 3),
         "attn_dp": np.repeat([1, 4], 3), "tp": np.repeat([8, 2], 3)}
    tpot = np.array([1.0, 2.0, 4.0, 1.0, 2.0, 4.0]) * 1e-3
    seen = [("aggregated", np.arange(6), tpot, np.zeros(6)), ("decode", np.arange(6), tpot, np.zeros(6)),
            ("prefill", np.arange(6), tpot, np.zeros(6))]
    out = refined_grids(g, seen, None, (3e-3, 3.5e-3), 3)
    assert set(out) == {"aggregated", "decode"}  # a prefill pass has no decode batch
    a = out["aggregated"]
    # 3 ms at 3 per rank, 3.5 ms at 3.5 -> 3: one row per line, found twice
    assert a["b_rank"].tolist() == [3, 3] and a["tp"].tolist() == [8, 2] and a["batch"].tolist() == [3, 12]
    assert refine_targets(None, []) == {}


@pytest.fixture(scope="module")
def chat(catalog):
    p = ROOT / "catalogs" / "scenarios" / "llama-70b-chat.yaml"
    return resolve_scenario(load_scenario(p), catalog, p)


def _tpot_quantile(setup, grid, w, q) -> np.ndarray:
    """Each grid row's TPOT at quantile ``q`` on an aggregated replica without prefix or KV tiers (NaN where it
    does not fit in memory)."""
    n = len(grid["b_rank"])
    out = np.full(n, np.nan)
    tags, var, rows = next(iter(variants(setup, grid, w, "aggregated", {})))
    idx = np.arange(n) if rows is None else rows
    ok = np.broadcast_to(var["ok_memory"], idx.shape)
    t = lognormal_quantile(np.broadcast_to(var["tpot_s"], idx.shape), np.broadcast_to(var["tpot_cv"], idx.shape), q)
    out[idx[ok]] = t[ok]
    return out


@pytest.mark.parametrize("hid", ["h100-sxm", "mi355x"])
def test_refined_batch_against_every_batch(catalog, chat, hid):
    """Brute force: for each of llama-70b-chat's layouts on one hardware whose TPOT crosses the target between two
    grid steps, every batch per rank from 1 to 1,024 evaluated; the refined batch meets the target, is never above
    the largest batch that does, and is within 2% of it at the median (at most 20% below: the step time is convex
    in the batch where attention grows, and the line between two steps runs above it)."""
    w = chat.scenario.workloads[0]
    model, hw = chat.model_for(w.name), catalog.hardware[hid]
    ch = engine_choices(chat, hw)[0]
    (wdt, _), kdt = weight_options(chat, model, hw, ch.engine)[0], kv_options(chat.scenario.kv_cache, ch.engine)[0]
    setup = Setup.make(model, hw, weights=wdt, kv=kdt, eff=ch.eff, engine=ch.engine.id, **engine_options(ch.engine))
    g = grid_arrays(model, hw, ch.engine, chat.expert_load_for(model))
    q, target = workload_tail(w).tpot_q, w.slo.tpot_s
    steps = len(BATCH_PER_RANK)
    lines = len(g["b_rank"]) // steps
    coarse = _tpot_quantile(setup, g, w, q).reshape(lines, steps)
    rows, refined = crossing_batches(coarse, g["b_rank"].reshape(lines, steps), target)
    assert rows.size >= 10
    dense = np.arange(1, 1025)
    ratios = []
    for line, b in zip(rows[:10], refined[:10], strict=True):
        at = line * steps
        dg = {k: np.repeat(v[at:at + 1], dense.size) for k, v in g.items()}
        dg["b_rank"], dg["batch"] = dense, dense * g["attn_dp"][at]
        t = _tpot_quantile(setup, dg, w, q)
        best = dense[t <= target].max()
        assert t[b - 1] <= target and b <= best
        ratios.append(b / best)
    assert np.median(ratios) >= 0.98 and min(ratios) >= 0.8


def test_refined_rows_are_in_the_pool_and_never_raise_the_cost(catalog, chat, monkeypatch):
    """The pool holds rows at batches off the grid, each meeting its TPOT target as the filter checks any row; with
    them the plan costs no more than without (the grid's rows are all still there)."""
    from planner.options import PlanOptions
    from planner.perf import candidates as C
    from planner.pipeline.plan import make_plan

    pool = evaluate_candidates(chat, refine={w.name: (w.slo.tpot_s,) for w in chat.scenario.workloads})
    off = ~np.isin(pool.rows["b_rank"].to_numpy(), BATCH_PER_RANK)
    assert off.any() and (pool.rows.loc[off, "role"].astype(str) != "prefill").all()
    with_rows = make_plan(chat, PlanOptions(analysis=False)).plan.objective.usd_per_hour
    monkeypatch.setattr(C, "refine_targets", lambda levels, workloads: {})
    without = make_plan(chat, PlanOptions(analysis=False)).plan.objective.usd_per_hour
    assert with_rows <= without * (1 + 1e-9) and with_rows < without  # on this scenario the rows pay
