"""Kernel curves (perf/kernels.py), their fit (calib/kernels.py, `planner calibrate kernels`) and the step composed
from them (perf/compose.py). Data: the extract in tests/data/kernels (README there)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from planner.perf import kernels as K

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "kernels"


def _p(family, **kw):
    p = dict(K.PRIOR[family])
    p.update(kw)
    return p


# --- curves: worked numbers -------------------------------------------------------------------------


def test_gemm_large_shape_is_its_padded_flops_over_the_fitted_peak():
    p = _p("gemm", t0_us=0.0, compute=0.5, tile_half=0.0, memory=1.0, sharpness=30.0, act_bytes=2.0)
    t = K.gemm_time(p, 4096, 4096, 4096, 1e15, 4.8e12, 2.0)
    assert t == pytest.approx(2 * 4096**3 / (1e15 * 0.5), rel=1e-6)


def test_gemm_one_token_streams_its_weights():
    """A decode GEMM of one row is the weight fetch: n k bytes over the fitted share of HBM, plus the fixed latency."""
    p = _p("gemm", t0_us=5.0, compute=0.7, tile_half=0.0, memory=0.8, sharpness=30.0, act_bytes=2.0)
    n = k = 8192
    t = K.gemm_time(p, 1, n, k, 1e15, 4.8e12, 1.0)
    t_m = (n * k * 1.0 + 2.0 * k + 2.0 * n) / (4.8e12 * 0.8)
    assert t == pytest.approx(5e-6 + t_m, rel=1e-3)


def test_gemm_pads_rows_to_a_tile():
    """8 rows and 64 rows cost the same maths (one 64-row tile); 65 rows cost two tiles."""
    p = _p("gemm", t0_us=0.0, compute=1.0, tile_half=0.0, memory=1.0, sharpness=30.0, act_bytes=0.0)
    big = 1e30  # memory free: compute alone
    t8, t64, t65 = (K.gemm_time(p, m, 4096, 4096, 1e15, big, 0.0) for m in (8, 64, 65))
    assert t8 == pytest.approx(t64, rel=1e-9)
    assert t65 == pytest.approx(2 * t64, rel=1e-9)


def test_all_reduce_is_ring_bytes_over_the_fitted_bus_bandwidth():
    p = _p("collective", alpha_us=0.0, alpha_gpu_us=0.0, bus_eff=0.8, switch_kb=0.0, slow_eff=1.0)
    t = K.collective_time(p, "all_reduce", 8, 1e9, 450e9)
    assert t == pytest.approx(2 * 7 / 8 * 1e9 / (450e9 * 0.8), rel=1e-6)
    assert K.collective_time(p, "all_reduce", 1, 1e9, 450e9) == 0.0


def test_small_collective_is_its_latency():
    p = _p("collective", alpha_us=12.0, alpha_gpu_us=1.5, bus_eff=0.8, switch_kb=1000.0, slow_eff=0.4)
    assert K.collective_time(p, "all_gather", 8, 64, 450e9) == pytest.approx((12.0 + 1.5 * 6) * 1e-6, rel=1e-3)


def test_collective_bytes_below_the_switch_size_move_at_the_slow_protocols_rate():
    """An 8-GPU all-reduce of 1 MB moves 1.75 MB on the bus: at 0.8 of 450 GB/s plus again at 0.4 (all of it under
    a 4 MB switch); a 1 GB one pays the slow rate on its first 4 MB only."""
    p = _p("collective", alpha_us=0.0, alpha_gpu_us=0.0, bus_eff=0.8, switch_kb=4000.0, slow_eff=0.4)
    small = 1.75e6 / (450e9 * 0.8) + 1.75e6 / (450e9 * 0.4)
    assert K.collective_time(p, "all_reduce", 8, 1e6, 450e9) == pytest.approx(small, rel=1e-9)
    large = 1.75e9 / (450e9 * 0.8) + 4e6 / (450e9 * 0.4)
    assert K.collective_time(p, "all_reduce", 8, 1e9, 450e9) == pytest.approx(large, rel=1e-9)


def test_moe_with_every_expert_local_and_busy_is_its_flops():
    """Balanced routing of many tokens over experts all held locally: the grouped GEMM's FLOPs over the fitted
    peak (rows a multiple of the tile, so no padding)."""
    p = _p("moe", t0_us=0.0, compute=0.5, tile_ns=0.0, memory=1.0, sharpness=30.0, copy_bytes=0.0)
    tokens, h, inter, k, e = 8192, 4096, 1024, 8, 64  # 1,024 copies per expert
    t = K.moe_time(p, tokens, h, inter, k, e, e, 1e15, 1e30, 2.0)
    assert t == pytest.approx(2 * tokens * k * 3 * h * inter / (1e15 * 0.5), rel=1e-6)


def test_moe_pays_per_output_tile_so_narrow_experts_run_below_their_flops():
    """Worked numbers: 64 experts of 1,024 columns, 1,024 copies each: 16 row tiles x (16 gate/up + 32 down column
    tiles) = 768 tiles an expert, 49,152 in all, at 20 ns each on top of the FLOPs; the same FLOPs in 512 experts of
    128 columns are 512 x 16 x (2 + 32) tiles, 5.7 times as many."""
    p = _p("moe", t0_us=0.0, compute=0.5, tile_ns=20.0, memory=1.0, sharpness=30.0, copy_bytes=0.0)
    tokens, h, k = 8192, 4096, 8
    wide = K.moe_time(p, tokens, h, 1024, k, 64, 64, 1e15, 1e30, 2.0)
    flops = 2 * tokens * k * 3 * h * 1024
    assert wide == pytest.approx(flops / (1e15 * 0.5) + 49152 * 20e-9, rel=1e-6)
    narrow = K.moe_time(p, tokens * 8, h, 128, k, 512, 512, 1e15, 1e30, 2.0)  # 1,024 copies for each of 512 experts
    tiles = 512 * 16 * (2 + 32)
    assert narrow == pytest.approx(flops / (1e15 * 0.5) + tiles * 20e-9, rel=1e-6)
    assert narrow / wide > 1.3


def test_moe_one_token_reads_only_the_experts_it_touches():
    p = _p("moe", t0_us=0.0, compute=1.0, tile_ns=0.0, memory=1.0, sharpness=30.0, copy_bytes=0.0)
    h, inter, k, e = 4096, 1024, 8, 256
    t = K.moe_time(p, 1, h, inter, k, e, e, 1e30, 1e12, 1.0)
    w = 8 * 3 * h * inter * 1.0
    act = 8 * 2.0 * (2 * h + 2 * inter)
    assert t == pytest.approx((w + act) / 1e12, rel=1e-6)


def test_moe_buffers_every_routed_copy_local_or_not():
    """Worked numbers: 16,384 tokens, top-8, hidden 4,096, experts of 1,536 columns, 128 GPUs of one local expert
    each. Every one of the 131,072 routed copies has buffers of 2 x 4,096 + 5 x 1,536 = 15,872 elements; at
    2 bytes an element over 8 TB/s that is 0.52 ms, whether the GPU holds 1 of the 128 experts or all of them
    (a layer that is all buffers: no weights, no FLOPs). An ungated layer's copies are 2 x 4,096 + 3 x 1,536."""
    p = _p("moe", t0_us=0.0, compute=1.0, tile_ns=0.0, memory=1.0, sharpness=30.0, copy_bytes=2.0)
    args = (16384, 4096, 1536, 8, 128)
    one = K.moe_time(p, *args, 1, 1e30, 8e12, 0.0)
    local = 16384 * 8 / 128 * 2.0 * (2 * 4096 + 2 * 1536) / 8e12  # the one expert's own copies in and out
    assert one == pytest.approx(131072 * 15872 * 2.0 / 8e12 + local, rel=1e-6)
    assert K.moe_time(p, *args, 1, 1e30, 8e12, 0.0, routed_tokens=128) == pytest.approx(
        128 * 8 * 15872 * 2.0 / 8e12 + local, rel=1e-6)
    ungated = K.moe_time(p, *args, 1, 1e30, 8e12, 0.0, gated=False)
    assert ungated == pytest.approx(131072 * (2 * 4096 + 3 * 1536) * 2.0 / 8e12 + local, rel=1e-6)


def test_attention_decode_streams_the_cache():
    p = _p("attn_decode", t0_us=0.0, unit_us=0.0, compute=1.0, memory=0.8, red_us=0.0, fill_half=0.0)
    kv = 64 * 4096 * 2 * 8 * 128 * 2.0  # batch 64, 4k context, 8 KV heads of 128, bf16
    t = K.attn_decode_time(p, 64, kv, 1.0, 1e15, 4.8e12)
    assert t == pytest.approx(kv / (4.8e12 * 0.8), rel=1e-6)


def test_attention_decode_pays_per_kv_head_unit_and_splits_long_contexts_over_blocks():
    """Worked numbers: 16 sequences x 8 KV heads = 128 units at 10 ns each on top of 6 us; a short context runs one
    block a unit (128 units at fill_half 128 stream at half the rate), a long one splits and pays the 5 us reduction."""
    p = _p("attn_decode", t0_us=6.0, unit_us=0.01, compute=1.0, memory=1.0, red_us=5.0, fill_half=128.0)
    units, W = 16 * 8, 4e12
    head = 6e-6 + 128 * 0.01e-6
    short = 16 * 64 * 2 * 8 * 128 * 1.0  # 64 tokens of FP8 cache: 2 MB, 0.52 us at full rate
    assert K.attn_decode_time(p, 16, short, 1.0, 1e18, W, units) == pytest.approx(head + 2 * short / W, rel=1e-9)
    long = 16 * 32768 * 2 * 8 * 128 * 1.0  # 1.07 GB: 268 us at full rate, 537 us at half
    assert K.attn_decode_time(p, 16, long, 1.0, 1e18, W, units) == pytest.approx(head + long / W + 5e-6, rel=1e-9)
    # at no context only the fixed and per-unit costs remain, and they grow with the KV heads, not the sequences
    assert K.attn_decode_time(p, 16, 0.0, 0.0, 1e18, W, 16 * 64) == pytest.approx(6e-6 + 1024 * 0.01e-6, rel=1e-9)


def test_trtllm_runs_its_generic_kernel_outside_xqa_query_head_groups():
    assert list(K.decode_attention_kernel("trtllm", [1, 2, 8, 32, 48, 128])) == ["-mmha", "", "", "", "-mmha", "-mmha"]
    assert list(K.decode_attention_kernel("sglang", [1, 64])) == ["", ""]
    assert list(K.decode_attention_kernel(None, [1])) == [""]


def _attention_rows(p, hq, hk, F, W, head_dim=128):
    """Synthetic decode-attention rows (ms) of ``hq / hk`` heads timed by the curve ``p``."""
    rows = []
    for b in (1, 4, 16, 64, 256):
        for step in (1, 128, 1024, 8192):
            kv = b * step * 2 * hk * head_dim * 2.0
            t = K.attn_decode_time(p, b, kv, 4.0 * b * hq * head_dim * step, F, W, b * hk)
            rows.append(dict(framework="TRTLLM", version="1.0", batch_size=b, isl=1, num_heads=hq,
                             num_key_value_heads=hk, head_dim=head_dim, window_size=0, kv_cache_dtype="bfloat16",
                             step=step, latency=float(t) * 1e3))
    return rows


def _fit_attention_rows(tmp_path, catalog, engine: str, rows: list[dict]):
    """The kernel fit of H200's decode attention on ``rows`` written as ``engine``'s table."""
    from planner.calib.kernels import fit_kernels

    path = tmp_path / "h200_sxm" / "attention" / engine / "generation_attention_perf.parquet"
    path.parent.mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(path)
    (rep,) = fit_kernels(tmp_path, catalog, families={"attn_decode"})
    return rep


def test_trtllm_generic_attention_kernel_is_fitted_as_its_own_curve(tmp_path, catalog):
    """TensorRT-LLM rows of groups 1 and 64 are a curve of their own (``trtllm-mmha``) and do not pull the XQA curve;
    each fit recovers the curve the rows were made with."""
    from planner.perf import compose as C

    hw = catalog.hardware["h200-sxm"]
    F, W = hw.flops("bf16"), hw.hbm_bw
    xqa = _p("attn_decode", t0_us=6.0, unit_us=0.01, compute=0.3, memory=0.85, red_us=4.0, fill_half=100.0)
    mmha = _p("attn_decode", t0_us=9.0, unit_us=0.005, compute=0.006, memory=0.8, red_us=5.0, fill_half=60.0)
    rows = [r for hq, hk in ((8, 1), (16, 2), (32, 8), (64, 8)) for r in _attention_rows(xqa, hq, hk, F, W)]
    rows += [r for hq, hk in ((8, 8), (32, 32), (64, 1), (128, 2)) for r in _attention_rows(mmha, hq, hk, F, W)]
    rep = _fit_attention_rows(tmp_path, catalog, "trtllm", rows)
    assert set(rep.curves) == {"attn_decode/trtllm/bf16-hd128", "attn_decode/trtllm-mmha/bf16-hd128"}
    for key, truth in (("attn_decode/trtllm/bf16-hd128", xqa), ("attn_decode/trtllm-mmha/bf16-hd128", mmha)):
        c = rep.curves[key]
        assert c.rows == 80 and c.fit_mape < 0.01, key
        assert c.params["t0_us"] == pytest.approx(truth["t0_us"], rel=0.05)
        assert c.params["memory"] == pytest.approx(truth["memory"], rel=0.05)
    # the generic kernel's CUDA-core maths binds at 64-128 heads a KV head: its compute is identified
    assert rep.curves["attn_decode/trtllm-mmha/bf16-hd128"].params["compute"] == pytest.approx(0.006, rel=0.1)
    # composed: a model of 64 query heads per KV head on TensorRT-LLM takes the generic kernel's curve, other engines
    # (no curve of their own) borrow TensorRT-LLM's XQA curve, never its generic one
    kf = hw.efficiency.kernels.model_copy(update={"curves": {k: rep.curves[k] for k in rep.curves}})
    m = catalog.models["llama-3.1-70b"]
    mqa = m.model_copy(update={"architecture": m.architecture.model_copy(
        update={"attention": m.architecture.attention.model_copy(update={"kv_heads": 1})})})
    kv, fl = 64 * 2048 * 2 * 128 * 2.0, 4.0 * 64 * 64 * 128 * 2048
    args = (hw, "bf16", 64.0, kv, fl, 1.0, 1.0)
    t_x = K.attn_decode_time(rep.curves["attn_decode/trtllm/bf16-hd128"].params, 64.0, kv, fl, F, W, 64.0)
    t_m = K.attn_decode_time(rep.curves["attn_decode/trtllm-mmha/bf16-hd128"].params, 64.0, kv, fl, F, W, 64.0)
    assert float(C.attention_time(kf, "trtllm", mqa, *args)) == pytest.approx(float(t_m), rel=1e-9)
    assert float(C.attention_time(kf, "sglang", mqa, *args)) == pytest.approx(float(t_x), rel=1e-9)
    assert kf.curve("attn_decode", "vllm", "bf16-hd128") == rep.curves["attn_decode/trtllm/bf16-hd128"].params


def test_decode_attention_is_a_curve_per_head_dimension(tmp_path, catalog):
    """Rows of two head dimensions made with two curves (a 192-wide head's kernel pays twice the fixed latency and
    streams slower) are fitted as two curves, each recovering its own; a model takes the curve of its head
    dimension, else the nearest measured one above it, else below, else a curve over all head dimensions."""
    from planner.perf import compose as C

    hw = catalog.hardware["h200-sxm"]
    F, W = hw.flops("bf16"), hw.hbm_bw
    d128 = _p("attn_decode", t0_us=6.0, unit_us=0.01, compute=0.3, memory=0.85, red_us=4.0, fill_half=100.0)
    d192 = _p("attn_decode", t0_us=12.0, unit_us=0.02, compute=0.3, memory=0.6, red_us=4.0, fill_half=100.0)
    rows = [r for hq, hk in ((8, 1), (16, 2), (32, 8)) for r in _attention_rows(d128, hq, hk, F, W)]
    rows += [r for hq, hk in ((8, 1), (16, 2), (32, 8)) for r in _attention_rows(d192, hq, hk, F, W, head_dim=192)]
    rep = _fit_attention_rows(tmp_path, catalog, "sglang", rows)
    assert set(rep.curves) == {"attn_decode/sglang/bf16-hd128", "attn_decode/sglang/bf16-hd192"}
    for key, truth in (("attn_decode/sglang/bf16-hd128", d128), ("attn_decode/sglang/bf16-hd192", d192)):
        assert rep.curves[key].fit_mape < 0.01, key
        assert rep.curves[key].params["t0_us"] == pytest.approx(truth["t0_us"], rel=0.05)
    avail = {"bf16-hd64", "bf16-hd128", "bf16-hd192", "fp8-hd128", "bf16"}
    assert K.head_dim_formats(avail, ("bf16",), 128) == ("bf16-hd128", "bf16-hd192", "bf16-hd64", "bf16")
    assert K.head_dim_formats(avail, ("bf16",), 160) == ("bf16-hd192", "bf16-hd128", "bf16-hd64", "bf16")
    assert K.head_dim_formats(avail, ("bf16",), 256)[:2] == ("bf16-hd192", "bf16-hd128")
    assert K.head_dim_formats(avail, ("fp8", "bf16"), 64)[:3] == ("fp8-hd128", "fp8", "bf16-hd64")
    # composed: Llama 3.1 70B (128-wide heads) takes the 128 curve; the same model with 192-wide heads the other
    kf = hw.efficiency.kernels.model_copy(update={"curves": dict(rep.curves)})
    m = catalog.models["llama-3.1-70b"]
    wide = m.model_copy(update={"architecture": m.architecture.model_copy(
        update={"attention": m.architecture.attention.model_copy(update={"head_dim": 192})})})
    kv, fl = 64 * 2048 * 2 * 8 * 128 * 2.0, 4.0 * 64 * 64 * 128 * 2048
    args = (hw, "bf16", 64.0, kv, fl, 8.0, 1.0)
    units = 64.0 * 1.0
    for model, truth in ((m, d128), (wide, d192)):
        want = K.attn_decode_time(truth, 64.0, kv, fl, F, W, units)
        assert float(C.attention_time(kf, "sglang", model, *args)) == pytest.approx(float(want), rel=0.02)


def test_smooth_max_table_matches_the_exact_formula():
    """Large arrays take the smooth maximum from a 4,097-point table: within 1e-6 of (a^p + b^p)^(1/p)."""
    rng = np.random.default_rng(0)
    a, b = rng.lognormal(size=20000), rng.lognormal(size=20000)
    for p in (1.0, 1.2, 2.5, 7.0, 30.0):
        exact = np.power(np.power(a, p) + np.power(b, p), 1.0 / p)
        assert np.max(np.abs(K._smax(a, b, p) / exact - 1.0)) < 1e-6


def test_deepep_with_few_experts_is_bound_by_the_busiest_expert_not_the_link():
    """DeepEP low latency gives each expert slot its own warp groups: 1,024 tokens a GPU over 4 GPUs, top-2 of 8
    experts, hidden 4,096, sends 1,024 copies of 4,096 x (1 x 1.03125 + 2) = 12,416 bytes to each expert, 12.7 MB
    at 30 GB/s = 424 us, where the link (900 GB/s, 3/4 of 2,048 copies remote) needs 21 us; with 256 experts the
    link binds. The slot cost is per local expert: 64 slots a GPU at 100 ns = 6.4 us."""
    p = _p("deepep", t0_us=0.0, copy_ns=0.0, bus_eff=1.0, slot_ns=0.0, expert_gbps=30.0)
    per_copy = 4096 * (1.0 * (1.0 + 4.0 / 128.0) + 2.0)
    t = K.deepep_time(p, 1024, 4096, 2, 4, 900e9, experts=8)
    assert t == pytest.approx(1024 * 4 * 2 / 8 * per_copy / 30e9, rel=1e-9)
    wide = K.deepep_time(p, 1024, 4096, 2, 4, 900e9, experts=256)
    assert wide == pytest.approx(2048 * 0.75 * per_copy / 900e9, rel=1e-9)
    slots = K.deepep_time(_p("deepep", t0_us=0.0, copy_ns=0.0, bus_eff=1.0, slot_ns=100.0, expert_gbps=1e4),
                          1, 4096, 2, 4, 900e9, experts=256)
    assert slots == pytest.approx(64 * 100e-9 + 2 * 0.75 * per_copy / 900e9, rel=1e-9)


# --- the fit -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fitted(catalog):
    from planner.calib.kernels import fit_kernels

    return fit_kernels(DATA, catalog)


def test_fit_on_the_extract_recovers_physical_curves(fitted):
    (rep,) = fitted
    assert rep.hardware == "h200-sxm"
    g = rep.curves["gemm/trtllm/bf16"]
    assert g.fit_mape < 0.15 and g.rows == 400
    assert 0.4 < g.params["compute"] <= 1.0 and 0.5 < g.params["memory"] <= 1.0
    m = rep.curves["mla_decode/trtllm/fp8"]
    assert m.fit_mape < 0.15
    ar = rep.curves["collective/nccl/all_reduce"]
    assert ar.fit_mape < 0.2 and ar.holdout_rows > 0 and ar.holdout == "8 GPUs (fitted on fewer)"
    assert 0.3 < ar.params["bus_eff"] < 1.5
    assert rep.curves["deepep/sglang/fp8"].fit_mape < 0.2


def test_held_out_shapes_are_scored_on_a_fit_without_them(fitted):
    (rep,) = fitted
    g = rep.curves["gemm/trtllm/bf16"]
    assert g.holdout == "n or k = 7168" and g.holdout_rows > 0 and g.holdout_mape is not None
    ratio, y, hold, hold_y = rep.errors["gemm/trtllm/bf16"]
    assert len(ratio) == len(y) == g.rows and len(hold) == len(hold_y) == g.holdout_rows
    assert float(np.median(np.abs(hold - 1.0))) == pytest.approx(g.holdout_mape, abs=1e-4)


def test_bad_kernel_files_are_notes_not_crashes(tmp_path, catalog):
    from planner.calib.kernels import fit_kernels
    from planner.errors import InputError

    root = tmp_path / "k"
    shutil.copytree(DATA, root)
    gemm = root / "h200_sxm" / "gemm" / "trtllm" / "gemm_perf.parquet"
    pd.read_parquet(gemm).drop(columns=["k"]).to_parquet(gemm)
    mla = root / "h200_sxm" / "mla" / "trtllm" / "generation_mla_perf.parquet"
    pd.read_parquet(mla).assign(kv_cache_dtype="fp6").to_parquet(mla)
    ep = root / "h200_sxm" / "comm" / "sglang" / "wideep_deepep_ll_perf.parquet"
    pd.read_parquet(ep).head(10).to_parquet(ep)
    ctx = root / "h200_sxm" / "mla" / "trtllm" / "context_mla_perf.parquet"
    pd.read_parquet(ctx).drop(columns=["isl"]).to_parquet(ctx)
    (rep,) = fit_kernels(root, catalog)
    notes = "\n".join(rep.notes)
    assert f"{gemm}: column k is missing" in notes
    assert "kv_cache_dtype 'fp6' is unknown" in notes and str(mla) in notes
    assert "deepep/sglang/fp8: 10 rows, fewer than 30: not fitted" in notes
    assert f"{ctx}: column isl is missing" in notes
    pd.read_parquet(DATA / "h200_sxm" / "mla" / "trtllm" / "context_mla_perf.parquet").assign(isl=-5).to_parquet(ctx)
    with pytest.raises(InputError, match=f"{ctx}: column isl holds -5, not a positive size"):
        fit_kernels(root, catalog, families={"mla_context"})
    assert set(rep.curves) == {"collective/nccl/all_reduce"}


def _moe_table(shapes, hbm_bw, speed):
    """A synthetic ``moe_perf`` table: balanced single-rank rows of each (hidden, columns, experts, top-k) shape at
    1 to 64 tokens, each timed at ``speed[shape]`` times the stream of the experts its routing touches at ``hbm_bw``
    (FP8: one byte an element), plus a fixed 20 us."""
    rows = []
    for (h, inter, e, k) in shapes:
        for t in (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048):
            stream = min(t * k, e) * 3 * h * inter / hbm_bw
            rows.append(dict(framework="x", version="0", device="x", op_name="moe", kernel_source="triton",
                             moe_dtype="fp8", num_tokens=t, hidden_size=h, inter_size=inter, topk=k, num_experts=e,
                             moe_tp_size=1, moe_ep_size=1, distribution="balanced",
                             latency=(stream / speed[(h, inter, e, k)] + 20e-6) * 1e3))
    return pd.DataFrame(rows)


def test_moe_rows_faster_than_hbm_are_left_out_on_every_system(tmp_path, catalog):
    """A fused-MoE shape whose balanced rows stream their experts faster than 1.1x the datasheet HBM bandwidth
    (DeepSeek's grouped top-k confining the collector's routing to half the experts) is flagged on the system where
    it shows and left out of that engine's fit on every system, with a note; a shape at 85% of peak is kept."""
    from planner.calib.kernels import fit_kernels, implausible_moe_shapes

    good, bad = (4096, 1536, 128, 8), (7168, 2048, 256, 8)
    others = [(2048, 768, 128, 8), (6144, 2560, 160, 8)]
    speeds = {good: 0.85, bad: 1.7, others[0]: 0.8, others[1]: 0.9}
    b200, h200 = catalog.hardware["b200-sxm"], catalog.hardware["h200-sxm"]
    t = _moe_table([good, bad], b200.hbm_bw, speeds)
    assert implausible_moe_shapes(t, b200.hbm_bw) == {bad}
    assert implausible_moe_shapes(t, b200.hbm_bw * 2.0) == set()  # at twice the bandwidth both are plausible
    root = tmp_path / "k"
    for system, hw, speed in (("b200_sxm", b200, 1.7), ("h200_sxm", h200, 0.85)):
        d = root / system / "moe" / "sglang"
        d.mkdir(parents=True)
        _moe_table([good, bad, *others], hw.hbm_bw, {**speeds, bad: speed}).to_parquet(d / "moe_perf.parquet")
    reps = {r.system: r for r in fit_kernels(root, catalog, families={"moe"}, jobs=1)}
    for system in ("b200_sxm", "h200_sxm"):
        c = reps[system].curves["moe/sglang/fp8"]
        assert c.rows == 54  # the three plausible shapes' rows only
        assert c.holdout == "DeepSeek-V3's and Qwen3-235B's experts" and c.holdout_rows == 18  # Qwen3's, scored
        note = "\n".join(reps[system].notes)
        assert "18 rows of 1 fused-MoE shapes (hidden x columns x experts x top-k: 7168x2048x256x8) left out" in note
    assert "/h200_sxm/" in "\n".join(reps["h200_sxm"].notes)  # flagged on B200, dropped on H200 too


def test_each_moe_kernel_an_engine_runs_is_its_own_curve(tmp_path, catalog):
    """An engine measured with two fused-MoE kernels for one format (SGLang's FlashInfer TensorRT-LLM kernel on most
    shapes, its Triton kernel on fewer) gets one curve per kernel, not a fit to the faster of the two per shape: the
    kernel with more rows keeps the engine's name, the other is ``sglang-triton``; another engine borrows the main."""
    from planner.calib.kernels import fit_kernels, moe_kernel_tag

    assert moe_kernel_tag("sglang_flashinfer_trtllm_moe") == "trtllm"
    assert moe_kernel_tag("sglang_fused_moe_triton") == "triton"
    assert moe_kernel_tag("vllm_compressedtensorswna16marlinmoe_marlin_marlinexperts") == "marlin"
    assert moe_kernel_tag("moe_torch_flow") == "other" and moe_kernel_tag("") == ""
    hw = catalog.hardware["h200-sxm"]
    shapes = [(4096, 1536, 128, 8), (2048, 768, 128, 8), (6144, 2560, 160, 8)]
    fast = _moe_table(shapes, hw.hbm_bw, dict.fromkeys(shapes, 0.8)).assign(kernel_source="sglang_flashinfer_trtllm_moe")
    slow = _moe_table(shapes[1:], hw.hbm_bw, dict.fromkeys(shapes, 0.4)).assign(kernel_source="sglang_fused_moe_triton")
    d = tmp_path / "h200_sxm" / "moe" / "sglang"
    d.mkdir(parents=True)
    pd.concat([fast, slow]).to_parquet(d / "moe_perf.parquet")
    (rep,) = fit_kernels(tmp_path, catalog, families={"moe"})
    assert set(rep.curves) == {"moe/sglang/fp8", "moe/sglang-triton/fp8"}
    assert rep.curves["moe/sglang/fp8"].rows == 54 and rep.curves["moe/sglang-triton/fp8"].rows == 36
    assert rep.curves["moe/sglang/fp8"].fit_mape < 0.05 and rep.curves["moe/sglang-triton/fp8"].fit_mape < 0.05
    kf = hw.efficiency.kernels.model_copy(update={"curves": dict(rep.curves)})
    assert kf.curve("moe", "vllm", "fp8") == rep.curves["moe/sglang/fp8"].params
    # the Triton kernel streams at half the rate: its curve, evaluated on a memory-bound shape, is about twice as slow
    x = dict(tokens=64.0, hidden=4096.0, inter=1536.0, top_k=8.0, experts=128.0, local=128.0, F=hw.flops("fp8"),
             W=hw.hbm_bw, wb=1.0)
    from planner.calib.kernels import _predict_moe

    ratio = _predict_moe(rep.curves["moe/sglang-triton/fp8"].params, x) / _predict_moe(rep.curves["moe/sglang/fp8"].params, x)
    assert 1.6 < float(ratio) < 2.2


def test_schema_refuses_unknown_families_and_unphysical_parameters():
    from pydantic import ValidationError

    from planner.catalog.schemas import KernelFits

    curve = {"params": dict(K.PRIOR["collective"]), "rows": 40, "fit_mape": 0.1}
    KernelFits(source="test", as_of="2026-11-26", system="x", curves={"collective/nccl/all_reduce": curve})
    with pytest.raises(ValidationError, match="FAMILY/ENGINE/FORMAT"):
        KernelFits(source="test", as_of="2026-11-26", system="x", curves={"gemmx/nccl/bf16": curve})
    attn = {**curve, "params": dict(K.PRIOR["attn_decode"])}
    KernelFits(source="test", as_of="2026-11-26", system="x", curves={"attn_decode/sglang/fp8-hd128": attn,
                                                                      "attn_decode/sglang/bf16": attn})
    for typo in ("fp8-hd", "fp8-hd12x", "fp8-128", "fp8-hd0"):
        with pytest.raises(ValidationError, match="KV_FORMAT-hdN"):
            KernelFits(source="test", as_of="2026-11-26", system="x", curves={f"attn_decode/sglang/{typo}": attn})
    # an earlier release's fused-MoE curve (a flat cost per routed copy) is refused with what to do
    old = {**curve, "params": {**{k: v for k, v in K.PRIOR["moe"].items() if k != "copy_bytes"}, "copy_ns": 3.0}}
    with pytest.raises(ValidationError, match="copy_ns became copy_bytes.*--family moe --write"):
        KernelFits(source="test", as_of="2026-11-26", system="x", curves={"moe/sglang/fp8_block": old})
    bad = {**curve, "params": {**curve["params"], "bus_eff": 9.0}}
    with pytest.raises(ValidationError, match="outside its physical range"):
        KernelFits(source="test", as_of="2026-11-26", system="x", curves={"collective/nccl/all_reduce": bad})


# --- the composed step -------------------------------------------------------------------------------


def _composing(hw):
    """``hw`` with its kernel block switched to compose the step."""
    kf = hw.efficiency.kernels.model_copy(update={"compose": True})
    return hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"kernels": kf})})


def test_calibrated_step_is_composed_from_the_kernel_curves(catalog):
    """With ``compose`` on, the decode step's GEMM time is the sum of the model's own GEMM shapes timed by the
    curve; with it off (the committed catalog) and in the ideal roofline the curves are not used."""
    from planner.perf import compose as C
    from planner.perf.roofline import Setup, decode_step

    hw0 = catalog.hardware["h200-sxm"]
    assert hw0.efficiency.kernels is not None, "the committed catalog has H200 kernel curves"
    m = catalog.models["llama-3.1-70b"]
    eff = hw0.efficiency.for_engine("trtllm")
    off = Setup.make(m, hw0, weights="fp8", kv="fp8", eff=eff, engine="trtllm")
    assert off.kernels is None  # compose: false in the catalog: the datasheet path
    hw = _composing(hw0)
    s = Setup.make(m, hw, weights="fp8", kv="fp8", eff=eff, engine="trtllm")
    assert s.kernels is hw.efficiency.kernels
    st = decode_step(s, 8, 1, 1, 1, 64, 2048)
    t_ne = C.dense_gemm_time(hw.efficiency.kernels, "trtllm", m, hw, "fp8", 64.0, 8.0, 80.0, 0.0, 1.0,
                                eff.kernel_fixed_share)
    assert float(st.gemm_compute_s) == pytest.approx(float(t_ne), rel=1e-9)
    assert float(st.gemm_compute_s) != pytest.approx(float(decode_step(off, 8, 1, 1, 1, 64, 2048).gemm_compute_s))
    assert Setup.make(m, hw, weights="fp8", kv="fp8").kernels is None  # ideal


def _terms(hw, terms):
    """``hw`` with its kernel block timing ``terms`` of the roofline step (compose off)."""
    kf = hw.efficiency.kernels.model_copy(update={"compose": False, "terms": list(terms)})
    return hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"kernels": kf})})


def _on_and_off(catalog, hw_id, term, engine, expert):
    """(model, hardware timing ``term`` by its curves, its efficiency for ``engine``, DeepSeek-V3 setups with the term
    on and off): FP8 dense weights and KV cache, ``expert`` experts."""
    from planner.perf.roofline import Setup

    m = catalog.models["deepseek-v3"]
    hw = _terms(catalog.hardware[hw_id], [term])
    off = _terms(catalog.hardware[hw_id], [])
    eff = hw.efficiency.for_engine(engine)
    return (m, hw, eff, Setup(m, hw, eff, "fp8", expert, "fp8", engine=engine),
            Setup(m, off, eff, "fp8", expert, "fp8", engine=engine))


def test_partial_terms_time_the_fused_moe_by_its_curve(catalog):
    """``terms: [moe]``: a decode step's expert GEMMs are the fused MoE curve's time at the fitted share of its fixed
    latency, the non-expert GEMMs stay on the roofline, and the fitted per-MoE-layer overhead is no longer paid
    (the curve's fixed latency times it); without the term the catalog's roofline holds."""
    from planner.perf import compose as C
    from planner.perf.roofline import Setup, decode_step, expert_load_imbalance, gemm_efficiency

    hw = _terms(catalog.hardware["b200-sxm"], ["moe"])
    off = _terms(catalog.hardware["b200-sxm"], [])
    m = catalog.models["deepseek-v3"]
    eff = hw.efficiency.for_engine("trtllm")
    s = Setup(m, hw, eff, "fp8", "fp4", "fp8", engine="trtllm")
    s0 = Setup(m, off, eff, "fp8", "fp4", "fp8", engine="trtllm")
    assert s.term_kernels("moe") is hw.efficiency.kernels and s.term_kernels("all_reduce") is None
    assert s0.term_kernels("moe") is None and s.kernels is None  # not a composed step
    B = 256.0
    on, base = decode_step(s, 1, 8, 1, 8, B, 2048.0), decode_step(s0, 1, 8, 1, 8, B, 2048.0)
    moe_layers = s.stats.moe_layers
    assert float(base.overhead_s - on.overhead_s) == pytest.approx(eff.moe_layer_overhead_us * 1e-6 * moe_layers,
                                                                   rel=1e-9)
    ex = C.moe_gemm_time(hw.efficiency.kernels, "trtllm", m, hw, "fp4", B, 8.0, 8.0, float(moe_layers),
                         expert_load_imbalance(s, 8.0, B), s.expert_copies, eff.kernel_fixed_share, 8.0)
    ne_c = 2.0 * s.nonexpert_matmul_params * (B / 8.0) / (s.f_dense * float(gemm_efficiency(eff, "fp8", B / 8.0)))
    ne_m = s.streamed_nonexpert_bytes / (s.hbm_bw * eff.memory)
    assert float(on.gemm_compute_s) == pytest.approx(max(ne_c, ne_m) + float(ex), rel=1e-6)
    # the share of the curve's fixed latency a graph-replayed step pays moves the MoE time, and only it
    lo = decode_step(Setup(m, hw, eff.model_copy(update={"kernel_fixed_share": 0.2}), "fp8", "fp4", "fp8",
                           engine="trtllm"), 1, 8, 1, 8, B, 2048.0)
    assert float(lo.gemm_compute_s) < float(on.gemm_compute_s) and float(lo.comm_s) == float(on.comm_s)
    # a dense model has no MoE term to time
    d = catalog.models["llama-3.1-70b"]
    assert float(decode_step(Setup(d, hw, eff, "fp8", "fp8", "fp8", engine="trtllm"), 8, 1, 1, 1, 64, 2048).step_s) == \
        pytest.approx(float(decode_step(Setup(d, off, eff, "fp8", "fp8", "fp8", engine="trtllm"), 8, 1, 1, 1, 64,
                                        2048).step_s), rel=1e-12)


def test_partial_terms_time_the_decode_all_reduce_by_its_curve(catalog):
    """``terms: [all_reduce]``: inside one measured node a decode step's all-reduces are the engine's collective
    curve (its fixed latency at the fitted share); beyond the node the datasheet physics stays."""
    from planner.perf import compose as C
    from planner.perf.roofline import Setup, decode_step

    hw = _terms(catalog.hardware["b200-sxm"], ["all_reduce"])
    off = _terms(catalog.hardware["b200-sxm"], [])
    m = catalog.models["llama-3.1-70b"]
    eff = hw.efficiency.for_engine("trtllm")
    s = Setup(m, hw, eff, "fp8", "fp8", "fp8", engine="trtllm")
    on = decode_step(s, 8, 1, 1, 1, 4, 2048)
    base = decode_step(Setup(m, off, eff, "fp8", "fp8", "fp8", engine="trtllm"), 8, 1, 1, 1, 4, 2048)
    msg = 4.0 * m.architecture.hidden_size * 2.0  # 4 tokens' bf16 activations
    expect = C.all_reduce(hw.efficiency.kernels, "trtllm", hw, 8.0, msg, 2.0 * m.architecture.layers,
                          eff.kernel_fixed_share)
    assert float(on.comm_s) == pytest.approx(float(expect), rel=1e-9)
    # the engine's own all-reduce (a few microseconds) is far below the end-to-end fitted latency of a call
    assert float(on.comm_s) < 0.6 * float(base.comm_s)
    assert float(on.gemm_compute_s) == float(base.gemm_compute_s)


def test_partial_terms_time_the_decode_exchange_by_its_curve(catalog):
    """``terms: [exchange]``: attention-DP8 EP8 decode on one node dispatches and combines by DeepEP's curve; at EP48
    over GB200's NVLink domain (beyond the measured node) the datasheet exchange runs at the link share the curve
    measured, so the batch-proportional part of it is ``1 / bus_eff`` of the datasheet's; without attention DP nothing
    is exchanged."""
    from planner.perf import compose as C
    from planner.perf.roofline import Setup, decode_step, dispatch_bytes, moe_exchange_time

    m, hw, eff, s, s0 = _on_and_off(catalog, "b200-sxm", "exchange", "sglang", "fp8")
    assert s.term_kernels("exchange") is hw.efficiency.kernels and s0.term_kernels("exchange") is None
    B = 8 * 256.0
    on, base = decode_step(s, 1, 8, 1, 8, B, 2048.0), decode_step(s0, 1, 8, 1, 8, B, 2048.0)
    curve = C.deepep(hw.efficiency.kernels, hw, B / 8.0, float(s.stats.hidden), float(s.stats.top_k), 8.0,
                     float(s.stats.moe_layers), dispatch_bytes(s), eff.kernel_fixed_share,
                     experts=float(s.stats.experts) * s.expert_copies)
    ar = float(base.comm_s) - float(moe_exchange_time(s0, 8.0, 8.0, 8.0, B, float(s.stats.moe_layers),
                                                      eff.collective_latency_us * 1e-6, per_copy=True))
    assert float(on.comm_s) == pytest.approx(ar + float(curve), rel=1e-9)
    assert float(on.gemm_compute_s) == float(base.gemm_compute_s)
    # beyond the measured node: the datasheet exchange at the measured link share
    g = _terms(catalog.hardware["gb200-nvl72"], ["exchange"])
    g0 = _terms(catalog.hardware["gb200-nvl72"], [])
    eg = g.efficiency.for_engine("sglang")
    bus = g.efficiency.kernels.curve("deepep", "sglang", "fp8")["bus_eff"]
    sg, sg0 = (Setup(m, h, eg, "fp8", "fp8", "fp8", engine="sglang") for h in (g, g0))
    alpha = eg.collective_latency_us * 1e-6
    t = {n: [float(moe_exchange_time(x, 48.0, 48.0, 48.0, 48.0 * b, 58.0, alpha, per_copy=True)) for b in (256, 1024)]
         for n, x in (("on", sg), ("off", sg0))}
    on_g = [float(decode_step(sg, 1, 48, 1, 48, 48.0 * b, 2048.0).comm_s) for b in (256, 1024)]
    off_g = [float(decode_step(sg0, 1, 48, 1, 48, 48.0 * b, 2048.0).comm_s) for b in (256, 1024)]
    assert on_g[1] - on_g[0] == pytest.approx((off_g[1] - off_g[0]) / bus, rel=1e-6)
    assert t["off"][1] - t["off"][0] == pytest.approx(off_g[1] - off_g[0], rel=1e-6)
    # tensor-parallel attention exchanges nothing, whatever the terms
    assert float(decode_step(s, 8, 8, 1, 1, 64, 2048.0).comm_s) == \
        pytest.approx(float(decode_step(s0, 8, 8, 1, 1, 64, 2048.0).comm_s), rel=1e-12)


def test_kernel_terms_schema_fit_and_cli(catalog, tmp_path):
    """Only known terms are accepted; the fit's all-hardware prior is made with no term timed; the CLI sets terms only
    with --write and names an unknown one."""
    from pydantic import ValidationError

    from planner.calib import fit as F
    from planner.catalog.schemas import KernelFits

    curve = {"params": dict(K.PRIOR["collective"]), "rows": 40, "fit_mape": 0.1}
    ok = KernelFits(source="test", as_of="2026-11-26", system="x", curves={"collective/nccl/all_reduce": curve},
                    terms=["all_reduce"])
    assert ok.terms == ["all_reduce"]
    with pytest.raises(ValidationError):
        KernelFits(source="test", as_of="2026-11-26", system="x", curves={}, terms=["prefill"])
    assert F.kernel_terms(catalog, "b200-sxm") and not F.kernel_terms(catalog, "mi355x")
    rf = F.roofline_catalog(catalog)
    assert not any(F.kernel_terms(rf, h) for h in rf.hardware)
    assert rf.hardware["b200-sxm"].efficiency.kernels.curves == catalog.hardware["b200-sxm"].efficiency.kernels.curves

    def run(*args):
        return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, cwd=ROOT)

    loose = run("calibrate", "kernels", "--data", str(DATA), "--terms", "moe")
    assert loose.returncode == 1 and "--terms" in loose.stderr and "with --write" in loose.stderr
    bad = run("calibrate", "kernels", "--data", str(DATA), "--write", "--terms", "moe,gemv")
    assert bad.returncode == 1 and "--terms gemv: unknown" in bad.stderr and "Traceback" not in bad.stderr


def test_wide_ep_decode_routes_only_its_own_tokens(catalog):
    """Attention-DP + EP decode on a kernel-composed GB200: the MoE time of 1,024 sequences per GPU at EP48 is
    the DeepEP grouped GEMM's (each GPU routes its own rank's tokens), far below the fused MoE that routes every
    token of the group."""
    from planner.perf import compose as C

    hw = _composing(catalog.hardware["gb200-nvl72"])
    m = catalog.models["deepseek-v3"]
    kf = hw.efficiency.kernels
    tokens = 1024.0 * 48
    wide = C.moe_gemm_time(kf, "sglang", m, hw, "fp8", tokens, 48.0, 48.0, 58.0, 1.0, 288 / 256, 1.0, 48.0)
    tp_attn = C.moe_gemm_time(kf, "sglang", m, hw, "fp8", tokens, 48.0, 48.0, 58.0, 1.0, 288 / 256, 1.0, 1.0)
    assert float(wide) < 0.5 * float(tp_attn)
    assert 1e-3 < float(wide) < 0.05  # 58 layers of a few hundred microseconds at most


def test_gemm_shapes_add_up_to_the_models_matmul_parameters(catalog):
    """The composed GEMMs of one token through every layer multiply each active non-expert parameter once."""
    from planner.perf import compose as C
    from planner.perf import params as P

    for mid in ("llama-3.1-70b", "deepseek-v3", "qwen3-30b-a3b"):
        m = catalog.models[mid]
        s = P.model_stats(m)
        sh = C._shapes(m)
        a = m.architecture
        per = lambda gs: sum(g.n * g.k * g.count for g in gs)  # noqa: E731
        att_layers = a.attention.full_layers + a.attention.sliding_layers
        total = (per(sh.attention) * att_layers + per(sh.dense_ffn) * a.dense_layers
                 + per(sh.moe_dense) * s.moe_layers + per(sh.head) + per(sh.linear) * a.attention.linear_layers)
        expect = s.matmul_active_params - s.moe_layers * s.top_k * s.expert_params
        # MLA's absorbed decode multiplies the latent up-projections per token instead of materialising K and V
        # (the same parameters, counted once either way); norms and biases are not GEMMs.
        assert total == pytest.approx(expect, rel=0.03), mid


def test_cli_calibrate_kernels(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, cwd=ROOT)

    p = run("calibrate", "kernels", "--data", str(DATA), "--json", "--jobs", "1")
    assert p.returncode == 0, p.stderr
    import json

    out = json.loads(p.stdout)
    fams = {(r["system"], r["family"]) for r in out["families"]}
    assert ("h200_sxm", "gemm") in fams and ("h200_sxm", "deepep") in fams
    bad = run("calibrate", "kernels", "--data", str(DATA), "--family", "gemv")
    assert bad.returncode == 1 and "--family gemv: unknown" in bad.stderr and "Traceback" not in bad.stderr
    missing = run("calibrate", "kernels", "--data", str(tmp_path / "nope"))
    assert missing.returncode == 1 and "not a folder" in missing.stderr
    loose = run("calibrate", "kernels", "--data", str(DATA), "--compose")
    assert loose.returncode == 1 and "with --write" in loose.stderr


def test_kernel_curves_have_no_rows_inside(catalog):
    """Predictions come from curves: a catalog block holds a handful of numbers per curve, never shapes."""
    for hw in catalog.hardware.values():
        kf = hw.efficiency.kernels
        if kf is None:
            continue
        for key, c in kf.curves.items():
            assert len(c.params) <= 6, key
            assert all(np.isfinite(v) for v in c.params.values())


def test_partial_terms_time_the_decode_attention_by_its_curve(catalog):
    """``terms: [attention]``: the decode attention of a step is the system's MLA curve at the cache's format (the
    roofline's ``attention_compute`` on the bf16 peak no longer applies), so an FP8 cache speeds the attention up by
    what the FP8 kernel measures, not only by the bytes it halves; the GEMMs and collectives do not move."""
    from planner.perf import compose as C
    from planner.perf import params as P
    from planner.perf.roofline import Setup, decode_step

    m = catalog.models["deepseek-v3"]
    hw = _terms(catalog.hardware["b200-sxm"], ["attention"])
    off = _terms(catalog.hardware["b200-sxm"], [])
    eff = hw.efficiency.for_engine("trtllm")
    B, S = 8 * 384.0, 2048.0
    times = {}
    for kv in ("bf16", "fp8"):
        s = Setup(m, hw, eff, "fp8", "fp4", kv, engine="trtllm")
        s0 = Setup(m, off, eff, "fp8", "fp4", kv, engine="trtllm")
        assert s.term_kernels("attention") is hw.efficiency.kernels and s0.term_kernels("attention") is None
        on, base = decode_step(s, 1, 8, 1, 8, B, S), decode_step(s0, 1, 8, 1, 8, B, S)
        seqs = B / 8
        flops = P.attention_flops_per_token(m, S) * seqs
        kvb = P.kv_read_bytes_per_sequence(m, S, kv) * seqs
        curve = float(C.attention_time(hw.efficiency.kernels, "trtllm", m, hw, kv, seqs, kvb, flops, 1.0,
                                       float(m.architecture.layers), eff.kernel_fixed_share))
        assert float(on.attn_compute_s) == pytest.approx(curve, rel=1e-9)
        assert float(on.gemm_compute_s) == float(base.gemm_compute_s) and float(on.comm_s) == float(base.comm_s)
        times[kv] = (curve, float(base.attn_compute_s))
    # the FP8 MLA kernel is faster than its bytes alone make it; the roofline's FP8 attention only halves the bytes
    assert times["fp8"][0] / times["bf16"][0] < 0.8
    assert times["fp8"][1] == pytest.approx(times["bf16"][1])


def test_no_fittable_curve_says_why(tmp_path, catalog):
    """A kernel folder whose only file is malformed is an error that names the file and what is wrong with it (the
    first note), not 'no files'."""
    from planner.calib.kernels import fit_kernels
    from planner.errors import InputError

    d = tmp_path / "h200_sxm" / "gemm" / "trtllm"
    d.mkdir(parents=True)
    path = d / "gemm_perf.parquet"
    pd.read_parquet(DATA / "h200_sxm" / "gemm" / "trtllm" / "gemm_perf.parquet").drop(columns=["k"]).to_parquet(path)
    with pytest.raises(InputError) as err:
        fit_kernels(tmp_path, catalog, families={"gemm"})
    assert f"{path}: column k is missing" in str(err.value) and "no kernel curve could be fitted" in str(err.value)


def test_refitting_some_families_replaces_their_curves_and_keeps_the_others(tmp_path):
    """``calibrate kernels --family F --write`` replaces every curve of F in the block (a key the new fit no longer
    makes, such as a curve over all head dimensions once they are split, does not linger) and keeps the other
    families' curves as they were."""
    import yaml

    src = ROOT / "catalogs" / "hardware" / "h200-sxm.yaml"
    (tmp_path / "hardware").mkdir()
    doc = yaml.safe_load(src.read_text())
    curves = doc["efficiency"]["kernels"]["curves"]
    stale = next(k for k in curves if k.startswith("collective/"))
    curves["collective/stale/all_reduce"] = curves[stale]
    gemm = {k: v for k, v in curves.items() if k.startswith("gemm/")}
    assert gemm
    target = tmp_path / "hardware" / "h200-sxm.yaml"
    target.write_text(yaml.safe_dump(doc, sort_keys=False))
    p = subprocess.run([sys.executable, "-m", "planner", "--catalog", str(tmp_path), "calibrate", "kernels", "--data",
                        str(DATA), "--family", "collective", "--write", "--jobs", "1"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    after = yaml.safe_load(target.read_text())["efficiency"]["kernels"]["curves"]
    assert "collective/stale/all_reduce" not in after
    assert any(k.startswith("collective/nccl/") for k in after)
    assert {k: v for k, v in after.items() if k.startswith("gemm/")} == gemm


# --- prefill (context) attention ---------------------------------------------------------------------


def test_context_attention_shape_counts_deepseeks_causal_mla():
    """One 1,024-token prompt over 128 decompressed MLA heads (192 query/key, 128 value dimensions): 2 (192 + 128)
    FLOPs per query-key pair and head over 1,024 x 1,025 / 2 causal pairs; the last query tile walks all 1,024
    keys; 128 heads x 8 query tiles of 128 rows."""
    fl, mv, lg, un = K.context_attention_shape(1.0, 1024.0, 0.0, 128.0, 128.0, 192.0, 128.0, mla=True)
    assert float(fl) == pytest.approx(128 * 640 * 1024 * 1025 / 2)
    assert float(lg) == pytest.approx(128 * 640 * 1024) and float(un) == 128 * 8
    assert float(mv) == pytest.approx(2.0 * 1024 * (128 * 320 + 128 * 320))
    # a 4,096-token window caps both the pairs and the longest tile's walk; a cached prefix adds its pairs
    fw, _, lw, _ = K.context_attention_shape(1.0, 8192.0, 0.0, 8.0, 1.0, 64.0, 64.0, window=4096.0)
    assert float(fw) == pytest.approx(8 * 256 * min(8192 * 8193 / 2, 8192 * 4096)) and float(lw) == 128 * 256 * 4096
    fp, _, lp, _ = K.context_attention_shape(1.0, 1024.0, 2048.0, 8.0, 1.0, 128.0, 128.0)
    assert float(fp) == pytest.approx(8 * 512 * (1024 * 2048 + 1024 * 1025 / 2)) and float(lp) == 128 * 512 * 3072


def test_context_attention_long_prompt_runs_at_its_fitted_peak_and_short_ones_wait_for_the_last_tile():
    p = _p("mla_context", t0_us=0.0, unit_us=0.0, compute=0.6, memory=1.0, sms=132.0, sharpness=30.0)
    F, W = 989e12, 4.8e12
    big = K.context_attention_shape(1.0, 16384.0, 0.0, 128.0, 128.0, 192.0, 128.0, mla=True)
    assert float(K.attn_context_time(p, *big, F, W)) == pytest.approx(float(big[0]) / (F * 0.6), rel=1e-3)
    # 1 head of a 1,024-token prompt: 8 tiles cannot fill 132 SMs; the last tile's walk over 1,024 keys sets the time
    small = K.context_attention_shape(1.0, 1024.0, 0.0, 1.0, 1.0, 192.0, 128.0, mla=True)
    assert float(K.attn_context_time(p, *small, F, W)) == pytest.approx(float(small[2]) * 132.0 / (F * 0.6), rel=1e-3)
    # the rate climbs with the prompt: the share of the peak reached at 1K is below that at 8K (per-unit costs)
    q = _p("mla_context", t0_us=10.0, unit_us=0.02, compute=0.6, memory=1.0, sms=132.0, sharpness=3.0)
    share = {n: float(K.context_attention_shape(1.0, n, 0.0, 128.0, 128.0, 192.0, 128.0, mla=True)[0])
             / float(K.attn_context_time(q, *K.context_attention_shape(1.0, n, 0.0, 128.0, 128.0, 192.0, 128.0,
                                                                         mla=True), F, W)) / F for n in (1024.0, 8192.0)}
    assert share[1024.0] < 0.75 * share[8192.0] < 0.6


def test_context_mla_fit_on_the_extract(fitted):
    (rep,) = fitted
    for kv in ("bf16", "fp8"):
        c = rep.curves[f"mla_context/trtllm/{kv}"]
        assert c.fit_mape < 0.12 and c.holdout == "16 heads per GPU" and c.holdout_rows > 0
        assert c.holdout_mape < 0.2 and 0.2 < c.params["compute"] <= 2.0


def test_partial_terms_time_the_prefill_attention_by_its_curve(catalog):
    """``terms: [prefill_attention]``: a prefill pass's attention is the system's context-MLA curve over all layers
    (``prefill_compute`` on the attention peak no longer times it; the GEMMs keep it), and the pass's memory and
    communication do not move; an 8K prompt's attention runs nearer the peak than a 1K prompt's."""
    from planner.perf import compose as C
    from planner.perf import params as P
    from planner.perf.roofline import Setup, prefill_parts

    m = catalog.models["deepseek-v3"]
    hw = _terms(catalog.hardware["h200-sxm"], ["prefill_attention"])
    off = _terms(catalog.hardware["h200-sxm"], [])
    eff = hw.efficiency.for_engine("trtllm")
    rate = {}
    for n in (1024.0, 8192.0):
        s = Setup(m, hw, eff, "fp8", "fp8", "fp8", engine="trtllm")
        s0 = Setup(m, off, eff, "fp8", "fp8", "fp8", engine="trtllm")
        on, base = prefill_parts(s, 8, 1, 1, 1, n, 2.0), prefill_parts(s0, 8, 1, 1, 1, n, 2.0)
        att = float(C.prefill_attention_time(hw.efficiency.kernels, "trtllm", m, hw, "fp8", 2.0, n, 0.0, 8.0,
                                             eff.kernel_fixed_share))
        flops = float(P.prefill_attention_flops(m, n)) * 2.0 / 8.0
        roof = flops / (hw.flops("bf16") * eff.prefill_compute)
        assert float(on[0]) == pytest.approx(float(base[0]) - roof + att, rel=1e-9)
        assert on[1:] == base[1:]
        rate[n] = flops / att
    assert rate[8192.0] > 1.5 * rate[1024.0]


def test_prefill_attention_term_times_interleaved_prompt_chunks_by_the_context_curve(catalog):
    """In an aggregated step, ``xr`` interleaved prompt tokens of ``I``-token prompts add ``xr / I`` prompts' worth of
    the context-attention curve (all layers of the stage) to the decode attention; plain steps do not move."""
    from planner.perf import compose as C
    from planner.perf.roofline import _stage_parts

    m, hw, eff, s, s0 = _on_and_off(catalog, "b200-sxm", "prefill_attention", "trtllm", "fp4")
    args = (8.0, 1.0, 1.0, 1.0, 64.0, 3000.0)
    plain_on, plain_off = _stage_parts(s, *args, 0.0, 8192.0), _stage_parts(s0, *args, 0.0, 8192.0)
    assert float(plain_on.attn_c) == float(plain_off.attn_c)
    on = _stage_parts(s, *args, 2048.0, 8192.0, 2048.0)
    one = float(C.prefill_attention_time(hw.efficiency.kernels, "trtllm", m, hw, "fp8", 1.0, 8192.0, 0.0, 8.0,
                                         eff.kernel_fixed_share))
    assert float(on.attn_c) - float(plain_on.attn_c) == pytest.approx(one * 2048.0 / 8192.0, rel=1e-9)


def test_absorbed_context_mla_is_its_own_kernel_path_with_its_own_flops(tmp_path, catalog):
    """SGLang's Hopper collector times context MLA in the absorbed form (one shared 576-wide key, 512-wide values):
    its rows are read with those FLOPs (3.4x a decompressed pair's) under ``-absorbed``, never as the engine's
    decompressed prefill curve."""
    from planner.calib.kernels import read_mla_context, system_hardware

    hw = system_hardware(catalog, "h200_sxm")
    src = pd.read_parquet(DATA / "h200_sxm" / "mla" / "trtllm" / "context_mla_perf.parquet")
    path = tmp_path / "context_mla_perf.parquet"
    src.assign(kernel_source="flash_attention").to_parquet(path)
    absorbed = read_mla_context(path, hw)
    plain = read_mla_context(DATA / "h200_sxm" / "mla" / "trtllm" / "context_mla_perf.parquet", hw)
    assert set(absorbed) == {"bf16-absorbed", "fp8-absorbed"} and set(plain) == {"bf16", "fp8"}
    assert absorbed["bf16-absorbed"].kernel == "-absorbed"
    ratio = absorbed["bf16-absorbed"].x["flops"] / plain["bf16"].x["flops"]
    assert np.allclose(ratio, 2 * (576 + 512) / (2 * (192 + 128)))


# --- TensorRT-LLM's NVLink all-to-all (GB200) ---------------------------------------------------------------------

A2A = ROOT / "tests" / "data" / "kernels_gb200"


def test_rank_fanout_counts_the_distinct_ranks_of_a_tokens_experts():
    # one rank: every expert local; one expert a rank: top-k distinct ranks exactly
    assert float(K.rank_fanout(256, 8, 1)) == pytest.approx(1.0)
    assert float(K.rank_fanout(256, 8, 256)) == pytest.approx(8.0, rel=1e-12)
    # DeepSeek-V3 at EP8: 8 (1 - C(224, 8) / C(256, 8))
    miss = np.prod([(224 - j) / (256 - j) for j in range(8)])
    assert float(K.rank_fanout(256, 8, 8)) == pytest.approx(8 * (1 - miss), rel=1e-12)
    assert 5.0 < float(K.rank_fanout(256, 8, 8)) < 5.5


def test_collectors_balanced_routing_sends_each_token_to_one_rank_until_ranks_hold_fewer_than_top_k():
    from planner.calib.kernels import bench_fanout

    d = bench_fanout(np.array([1, 512, 512, 512]), np.full(4, 256), np.full(4, 8), np.array([8, 8, 32, 64]))
    assert d.tolist() == [1.0, 1.0, 1.0, 2.0]


def test_alltoall_is_latency_plus_tokens_bytes_at_the_node_or_fabric_rate():
    p = _p("alltoall", t0_us=10.0, peer_ns=100.0, tok_ns=5.0, near_gbps=200.0, far_gbps=80.0, fan_share=0.5)
    n, b = 1024.0, 7168.0 * 2.0
    near = float(K.alltoall_time(p, n, b, 1.0, 4, 4))
    assert near == pytest.approx(10e-6 + 4 * 100e-9 + n * 5e-9 + n * b * 0.75 / 200e9, rel=1e-12)
    far = float(K.alltoall_time(p, n, b, 3.0, 8, 4))
    assert far == pytest.approx(10e-6 + 8 * 100e-9 + n * 5e-9 + n * b * (1 + 0.5 * 2) * 0.875 / 80e9, rel=1e-12)
    assert float(K.alltoall_time(p, n, b, 1.0, 1, 4)) == 0.0


def test_alltoall_fit_on_the_extract(catalog):
    from planner.calib.kernels import fit_kernels

    (rep,) = fit_kernels(A2A, catalog)
    assert rep.hardware == "gb200-nvl72"
    two, one = rep.curves["alltoall/trtllm/nvlink"], rep.curves["alltoall/trtllm-onesided/nvlink"]
    # two-sided: the dispatch rows carry its prepare; both payload formats and the combine in one curve
    assert two.rows == 2 * 2 * 36 and one.rows == 2 * 30
    assert two.fit_mape < 0.12 and one.fit_mape < 0.12
    assert two.holdout == "32 ranks" and two.holdout_rows == 2 * 2 * 6 and two.holdout_mape < 0.15
    # far below the 900 GB/s link: warp-issued stores, slower once the group spans trays; a second destination
    # (the 64-rank rows) rides the same load
    p = two.params
    assert 20.0 < p["far_gbps"] < p["near_gbps"] < 400.0 and p["fan_share"] < 0.5


def test_bad_alltoall_files_say_which_file_and_column(tmp_path, catalog):
    from planner.calib.kernels import fit_kernels
    from planner.errors import InputError

    root = tmp_path / "k"
    shutil.copytree(A2A, root)
    f = root / "gb200" / "comm" / "trtllm" / "trtllm_alltoall_perf.parquet"
    src = pd.read_parquet(A2A / "gb200" / "comm" / "trtllm" / "trtllm_alltoall_perf.parquet")
    src.drop(columns=["moe_ep_size"]).to_parquet(f)
    with pytest.raises(InputError, match=f"{f}: column moe_ep_size is missing"):
        fit_kernels(root, catalog)
    src.assign(moe_dtype="int2").to_parquet(f)
    with pytest.raises(InputError, match=f"{f}: column moe_dtype has unknown value 'int2'"):
        fit_kernels(root, catalog)
    src.assign(kernel_source="NVLinkThreeSided").to_parquet(f)
    with pytest.raises(InputError, match=f"{f}: column kernel_source has unknown value 'NVLinkThreeSided'"):
        fit_kernels(root, catalog)
    src.assign(num_tokens=0).to_parquet(f)
    with pytest.raises(InputError, match=f"{f}: column num_tokens holds 0"):
        fit_kernels(root, catalog)


def test_trtllm_exchange_follows_the_engines_method_choice(catalog):
    """TensorRT-LLM's attention-DP exchange: the NVLink all-to-all only with EP above top-k on a multi-node NVLink
    domain (GB200), timed by its curve at the real fan-out; otherwise an all-gather and a reduce-scatter on NCCL's
    curves (EP8 anywhere, any EP on an 8-GPU B200 node)."""
    from planner.perf import compose as C
    from planner.perf.roofline import Setup, decode_step

    g = catalog.hardware["gb200-nvl72"]
    kf = g.efficiency.kernels
    h, k, e = 7168.0, 8.0, 256.0
    e_slots = e
    n = np.array([256.0, 256.0])
    gather, a2a, use = C.trtllm_exchange(kf, g, n, h, k, e, np.array([8.0, 16.0]), np.array([8.0, 16.0]), 58.0,
                                         "fp4", 1.0)
    assert use.tolist() == [False, True]
    p = kf.curve("alltoall", "trtllm", "nvlink")
    d = K.rank_fanout(e, k, 16.0)
    want = 58.0 * (K.alltoall_time(p, 256.0, h * C.TRTLLM_FP4_DISPATCH, d, 16.0, 4.0)
                   + K.alltoall_time(p, 256.0, h * 2.0, d, 16.0, 4.0))
    assert float(a2a[1]) == pytest.approx(float(want), rel=1e-12)
    ag, rs = kf.curve("collective", "nccl", "all_gather"), kf.curve("collective", "nccl", "reduce_scatter")
    want8 = 58.0 * (K.collective_time(ag, "all_gather", 8.0, 8 * 256 * h * C.TRTLLM_FP4_DISPATCH, g.scale_up_bw)
                    + K.collective_time(rs, "reduce_scatter", 8.0, 8 * 256 * h * 2.0, g.scale_up_bw))
    assert float(gather[0]) == pytest.approx(float(want8), rel=1e-12)
    # no multi-node NVLink on an 8-GPU B200 node: never the all-to-all
    b = catalog.hardware["b200-sxm"]
    assert not C.trtllm_exchange(b.efficiency.kernels, b, n, h, k, e, np.array([8.0, 16.0]),
                                 np.array([8.0, 16.0]), 58.0, "fp4", 1.0)[2].any()
    # the decode step pays it only with the ``trtllm_exchange`` term (off in the catalog: docs/validation.md), and
    # only under TensorRT-LLM: at attention-DP16 EP16 on GB200 the all-to-all in place of DeepEP's exchange
    m = catalog.models["deepseek-v3"]
    terms = list(kf.terms)
    on = _terms(g, terms + ["trtllm_exchange"])

    def comm(hw, eng, per_rank=256.0):
        s = Setup(m, hw, hw.efficiency.for_engine(eng), "fp8", "fp4", "fp8", engine=eng)
        return float(decode_step(s, 1, 16, 1, 16, 16 * per_rank, 2048.0).comm_s)

    assert "trtllm_exchange" not in terms and comm(on, "sglang") == comm(g, "sglang")
    # the step's communication changes under TensorRT-LLM (at 256 a rank the all-to-all alone happens to cost within
    # 0.1% of DeepEP's exchange plus the all-reduces with the 2026-12-07 factors, so a second batch is checked too)
    assert any(comm(on, "trtllm", b) != pytest.approx(comm(g, "trtllm", b), rel=1e-3) for b in (256.0, 64.0))
    from planner.perf.roofline import _decode_exchange

    e = g.efficiency.for_engine("trtllm")
    s_on, s_off = (Setup(m, x, e, "fp8", "fp4", "fp8", engine="trtllm") for x in (on, g))
    args = (np.array([16.0]), np.array([16.0]), np.array([16.0]), np.array([16 * 256.0]), 58.0, 1e-5)
    x_on, x_off = (float(_decode_exchange(x, None, *args)[0]) for x in (s_on, s_off))
    a2a = C.trtllm_exchange(kf, g, 256.0, h, k, e_slots, 16.0, 16.0, 58.0, "fp4", e.kernel_fixed_share)[1]
    assert x_on == pytest.approx(float(a2a), rel=1e-12)
    assert x_on != pytest.approx(x_off, rel=1e-3)


def _overruled_on(hw, keys):
    """``hw`` with ``keys`` in its kernel block's ``overruled``."""
    kf = hw.efficiency.kernels.model_copy(update={"overruled": list(keys)})
    return hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"kernels": kf})})


def _decode_step_s(m, hw, engine, tp, batch):
    """Seconds of one decode step of ``m`` (FP8 weights and KV cache) at TP ``tp``, ``batch`` sequences of 2,048."""
    from planner.perf.roofline import Setup, decode_step

    s = Setup(m, hw, hw.efficiency.for_engine(engine), "fp8", "fp8", "fp8", engine=engine)
    return float(decode_step(s, tp, 1, 1, 1, batch, 2048.0).step_s)


def _moe_rows(catalog, hw_id, engine, tpot_over_moe, n):
    """``n`` measured aggregated DeepSeek-V3 rows (FP8 experts, TP8 EP1 at 8..64 sequences) whose measured TPOT is
    ``tpot_over_moe`` times the MoE time the hardware's curve gives at that batch."""
    from planner.perf import compose as C

    hw = catalog.hardware[hw_id]
    m = catalog.models["deepseek-v3"]
    plain = hw.efficiency.kernels.model_copy(update={"overruled": []})
    batch = np.linspace(8.0, 64.0, n)
    moe = C.moe_gemm_time(plain, engine, m, hw, "fp8", batch, 1.0, 8.0, 58.0, 1.0, 1.0, 1.0, 1.0)
    return pd.DataFrame({
        "reason": "", "n_workers_assumed": False, "n_hw": hw_id, "n_engine": engine, "n_model": "deepseek-v3",
        "n_dense": "fp8", "n_expert": "fp8", "n_mode": "agg", "n_spec": np.nan, "a_tp": 8.0, "a_ep": 1.0, "a_pp": 1.0, "a_dp": 1.0,
        "a_batch": batch, "m_tpot": np.asarray(moe) * 1e3 * tpot_over_moe})


def test_a_moe_curve_slower_than_the_engines_measured_steps_is_overruled(catalog):
    """A fused-MoE curve whose MoE time alone exceeds the whole measured step on more than a tenth of an engine's rows
    (with at least OVERRULE_MIN_ROWS rows) is not the kernel the engine runs: it is overruled for that engine and
    format; curves below the measured steps, or judged on too few rows, are kept."""
    from planner.calib.consistency import OVERRULE_MIN_ROWS, overruled_curves

    n = OVERRULE_MIN_ROWS
    hw = _terms(catalog.hardware["h200-sxm"], ["moe"])
    cat = replace(catalog, hardware={**catalog.hardware, "h200-sxm": hw})
    fast = _moe_rows(cat, "h200-sxm", "trtllm", 0.8, n)  # measured steps shorter than the curve's MoE alone
    slow = _moe_rows(cat, "h200-sxm", "trtllm", 2.0, n)
    assert overruled_curves(fast, cat) == {"h200-sxm": ["moe/trtllm/fp8_block"]}
    assert overruled_curves(slow, cat) == {}
    assert overruled_curves(fast.iloc[: n - 1], cat) == {}
    # a tenth of the rows may sit above (noise, a shorter measured step); more may not
    mixed = pd.concat([slow.iloc[: n - 1], fast.iloc[:1]], ignore_index=True)
    assert overruled_curves(mixed, cat) == {}
    mixed = pd.concat([slow.iloc[: n - 3], fast.iloc[:3]], ignore_index=True)
    assert overruled_curves(mixed, cat) == {"h200-sxm": ["moe/trtllm/fp8_block"]}
    # a row with drafts is judged against TPOT times 1 + drafts, the longest its step can be
    spec = fast.assign(n_spec=3.0, a_batch=fast["a_batch"] / 4.0, m_tpot=fast["m_tpot"] / 0.8 * 0.3)
    assert overruled_curves(spec, cat) == {}  # the MoE takes 1 / (0.3 * 4) = 0.83 of the longest step
    # only the engine whose rows contradict the curve loses it
    other = _moe_rows(cat, "h200-sxm", "sglang", 2.0, n)
    assert overruled_curves(pd.concat([fast, other], ignore_index=True), cat) == {"h200-sxm": ["moe/trtllm/fp8_block"]}


def test_an_overruled_moe_curve_leaves_that_engines_step_on_the_roofline(catalog):
    """``KernelFits.overruled``: the engine's decode step times its MoE layers as a catalog without the term does;
    another engine keeps the curve; a malformed entry is refused by the schema."""
    from planner.catalog.kernel_fits import KernelFits

    base = catalog.hardware["h200-sxm"]
    on = _terms(base, ["moe"])
    off = _terms(base, [])
    over = _overruled_on(on, ["moe/trtllm/fp8_block"])
    kf = over.efficiency.kernels

    def step(hw, engine):
        return _decode_step_s(catalog.models["deepseek-v3"], hw, engine, 8, 64.0)

    assert step(over, "trtllm") == pytest.approx(step(off, "trtllm"), rel=1e-12)
    assert step(over, "trtllm") != pytest.approx(step(on, "trtllm"), rel=1e-3)
    assert step(over, "sglang") == pytest.approx(step(on, "sglang"), rel=1e-12)
    with pytest.raises(ValueError, match="moe/ENGINE/FORMAT"):
        KernelFits.model_validate({**kf.model_dump(), "overruled": ["attn_decode/trtllm/fp8"]})
    with pytest.raises(ValueError, match="ENGINE one of"):
        KernelFits.model_validate({**kf.model_dump(), "overruled": ["moe/trtlm/fp8_block"]})  # a typo matches nothing


def test_partial_terms_time_the_dense_gemms_by_their_curve(catalog):
    """``terms: [moe, gemm]``: a decode step's non-expert GEMMs (projections, shared experts, dense FFN layers, LM
    head) are the GEMM curve's time at the model's shapes and the rank's rows, added to the fused MoE curve's; the
    roofline's ``compute_fp8`` no longer times them (halving it moves nothing); a dense model's GEMMs are the curve
    alone, its weights streamed inside it."""
    from planner.perf import compose as C
    from planner.perf.roofline import Setup, decode_step, expert_load_imbalance

    m = catalog.models["deepseek-v3"]
    hw = _terms(catalog.hardware["h200-sxm"], ["moe", "gemm"])
    moe_only = _terms(catalog.hardware["h200-sxm"], ["moe"])
    eff = hw.efficiency.for_engine("trtllm")
    B, S = 8 * 256.0, 1536.0
    s = Setup(m, hw, eff, "fp8", "fp8", "fp8", engine="trtllm")
    on = decode_step(s, 1, 8, 1, 8, B, S)
    base = decode_step(Setup(m, moe_only, eff, "fp8", "fp8", "fp8", engine="trtllm"), 1, 8, 1, 8, B, S)
    kf = hw.efficiency.kernels
    ne = float(C.dense_gemm_time(kf, "trtllm", m, hw, "fp8", B / 8, 1.0, float(m.architecture.layers),
                                 float(s.stats.moe_layers), 1.0, eff.kernel_fixed_share))
    ex = float(C.moe_gemm_time(kf, "trtllm", m, hw, "fp8", B, 8.0, 8.0, float(s.stats.moe_layers),
                               expert_load_imbalance(s, 8.0, B), s.expert_copies, eff.kernel_fixed_share, 8.0))
    assert float(on.gemm_compute_s) == pytest.approx(ne + ex, rel=1e-6)
    assert float(on.gemm_compute_s) != pytest.approx(float(base.gemm_compute_s), rel=1e-3)
    halved = Setup(m, hw, eff.model_copy(update={"compute_fp8": 0.5 * eff.compute_fp8}), "fp8", "fp8", "fp8",
                   engine="trtllm")
    assert float(decode_step(halved, 1, 8, 1, 8, B, S).gemm_compute_s) == pytest.approx(float(on.gemm_compute_s))
    assert float(on.comm_s) == float(base.comm_s) and float(on.attn_compute_s) == float(base.attn_compute_s)
    llama = catalog.models["llama-3.1-70b"]
    got = decode_step(Setup(llama, hw, eff, "fp8", "fp8", "fp8", engine="trtllm"), 2, 1, 1, 1, 64.0, S)
    curve = float(C.dense_gemm_time(kf, "trtllm", llama, hw, "fp8", 64.0, 2.0, float(llama.architecture.layers), 0.0,
                                    1.0, eff.kernel_fixed_share))
    assert float(got.gemm_compute_s) == pytest.approx(curve, rel=1e-6)
    assert float(got.gemm_memory_s) <= curve + 1e-12


def test_fp8_gemms_follow_the_checkpoints_scale_granularity(catalog):
    """``ModelSpec.fp8_scales``: a model whose FP8 checkpoint scales whole tensors (Llama's ModelOpt FP8) is timed by
    the per-tensor FP8 GEMM curve, a block-scaled one (DeepSeek) by the block-scaled curve; other formats are
    unaffected."""
    from planner.perf import compose as C

    llama = catalog.models["llama-3.1-70b"]
    assert llama.fp8_scales == "tensor" and catalog.models["deepseek-v3"].fp8_scales == "block"
    block = llama.model_copy(update={"fp8_scales": "block"})
    assert C.formats(C.GEMM_FORMAT, llama, "fp8") == ("fp8", "fp8_block")
    assert C.formats(C.GEMM_FORMAT, block, "fp8") == ("fp8_block", "fp8")
    assert C.formats(C.GEMM_FORMAT, llama, "bf16") == C.GEMM_FORMAT["bf16"]
    hw = catalog.hardware["b200-sxm"]
    kf = hw.efficiency.kernels
    args = (np.array([16.0, 256.0]), 1.0, float(llama.architecture.layers), 0.0, 1.0, 1.0)
    t_tensor = C.dense_gemm_time(kf, "vllm", llama, hw, "fp8", *args)
    t_block = C.dense_gemm_time(kf, "vllm", block, hw, "fp8", *args)
    only_tensor = kf.model_copy(update={"curves": {k: v for k, v in kf.curves.items() if not k.endswith("/fp8_block")}})
    np.testing.assert_allclose(t_tensor, C.dense_gemm_time(only_tensor, "vllm", block, hw, "fp8", *args), rtol=1e-12)
    assert not np.allclose(t_tensor, t_block, rtol=1e-3)


def _gemm_rows(catalog, hw_id, engine, tpot_over_gemm, n):
    """``n`` measured aggregated Llama-3.1-70B rows (FP8, TP2 at 8..64 sequences) whose measured TPOT is
    ``tpot_over_gemm`` times the non-expert GEMM time the hardware's curve gives at that batch."""
    from planner.perf import compose as C

    hw = catalog.hardware[hw_id]
    m = catalog.models["llama-3.1-70b"]
    plain = hw.efficiency.kernels.model_copy(update={"overruled": []})
    batch = np.linspace(8.0, 64.0, n)
    t = C.dense_gemm_time(plain, engine, m, hw, "fp8", batch, 2.0, float(m.architecture.layers), 0.0, 1.0)
    return pd.DataFrame({
        "reason": "", "n_workers_assumed": False, "n_hw": hw_id, "n_engine": engine, "n_model": "llama-3.1-70b",
        "n_dense": "fp8", "n_expert": "fp8", "n_mode": "agg", "n_spec": np.nan, "a_tp": 2.0, "a_ep": 1.0,
        "a_pp": 1.0, "a_dp": 1.0, "a_batch": batch, "m_tpot": np.asarray(t) * 1e3 * tpot_over_gemm})


def test_a_gemm_curve_slower_than_the_engines_measured_steps_leaves_the_step(catalog):
    """Dense GEMM curves are judged as fused-MoE ones: where the curve's non-expert GEMMs alone exceed the measured
    step on more than a tenth of an engine's rows, ``gemm/ENGINE/FORMAT`` is overruled, and that engine's step times
    its GEMMs on the roofline (another engine keeps the curve)."""
    from planner.calib.consistency import OVERRULE_MIN_ROWS, overruled_curves

    n = OVERRULE_MIN_ROWS
    hw = _terms(catalog.hardware["h200-sxm"], ["gemm"])
    cat = replace(catalog, hardware={**catalog.hardware, "h200-sxm": hw})
    fast = _gemm_rows(cat, "h200-sxm", "vllm", 0.8, n)
    slow = _gemm_rows(cat, "h200-sxm", "vllm", 1.5, n)
    assert overruled_curves(fast, cat) == {"h200-sxm": ["gemm/vllm/fp8"]}
    assert overruled_curves(slow, cat) == {}
    assert overruled_curves(fast, replace(catalog, hardware={**catalog.hardware, "h200-sxm": _terms(hw, ["moe"])})) == {}
    assert overruled_curves(fast.iloc[: n - 1], cat) == {}
    over = _overruled_on(hw, ["gemm/vllm/fp8"])
    off = _terms(catalog.hardware["h200-sxm"], [])

    def step(h, engine):
        return _decode_step_s(catalog.models["llama-3.1-70b"], h, engine, 2, 32.0)

    assert step(over, "vllm") == pytest.approx(step(off, "vllm"), rel=1e-12)
    assert step(over, "vllm") != pytest.approx(step(hw, "vllm"), rel=1e-3)
    assert step(over, "trtllm") == pytest.approx(step(hw, "trtllm"), rel=1e-12)
