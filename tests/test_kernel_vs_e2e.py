"""bench/kernel_vs_e2e.py: the fused-MoE curve and the HBM floor of a decode step against measured steps."""

from __future__ import annotations

import numpy as np
import pandas as pd

from planner.calib import fit as F
from planner.calib.data import load_measured
from tests.conftest import CALIB, load_bench


def _module():
    return load_bench("kernel_vs_e2e")


def _rows(catalog, tmp_path, model: str, system: str, backend: str, n: int = 6) -> pd.DataFrame:
    df = pd.read_csv(CALIB)
    pick = df[(df["mode"] == "agg") & (df["model_path"] == model) & (df["system"] == system) & (df["backend"] == backend)
              & (df["pp_size"].fillna(1) == 1)].head(n)
    path = tmp_path / "rows.csv"
    pick.to_csv(path, index=False)
    norm, _ = F.prepare([load_measured(path, catalog, measured=True)], catalog)
    return norm


def test_a_step_faster_than_its_weights_and_cache_can_stream_is_flagged(catalog, tmp_path):
    """The HBM floor is the bytes a step must read over the datasheet bandwidth: a measured step 100x shorter
    than the row's own is below it, whatever the row; the floor does not depend on the measured TPOT."""
    mod = _module()
    norm = _rows(catalog, tmp_path, "meta-llama/Llama-3.1-70B", "h200_sxm", "trtllm")
    assert len(norm) >= 3
    f = mod.bandwidth_floors(norm, catalog)
    fast = norm.assign(m_tpot=norm["m_tpot"] / 100.0)
    g = mod.bandwidth_floors(fast, catalog)
    assert np.allclose(g["floor_share"], 100.0 * f["floor_share"])
    assert (g["floor_share"] > 1.0).all()
    # at least Llama-3.1-70B's weights (70.6e9 of them, at the row's format) over the layout's chips at 4.8 TB/s
    from planner.units import dtype_bytes

    hw = catalog.hardware["h200-sxm"]
    floor_s = f["floor_share"] * norm["m_tpot"] / 1e3
    weights = 70.6e9 * norm["n_dense"].map(dtype_bytes)
    assert (floor_s >= weights / norm["a_tp"] / hw.hbm_bw).all()
    assert (floor_s <= 1.5 * weights / norm["a_tp"] / hw.hbm_bw + 0.05).all()


def test_the_moe_curve_share_scales_with_the_measured_step_and_drafts(catalog, tmp_path):
    """The MoE curve's time is the row's own; the share is it over TPOT times 1 + drafts: halving the measured TPOT
    doubles the share, and three drafts divide it by four."""
    mod = _module()
    norm = _rows(catalog, tmp_path, "deepseek-ai/DeepSeek-V3", "h200_sxm", "sglang")
    assert len(norm) >= 3
    s = mod.moe_shares(norm, catalog)
    assert len(s) == len(norm) and (s["share"] > s["share_no_fixed"]).all() and (s["share_no_fixed"] > 0).all()
    half = mod.moe_shares(norm.assign(m_tpot=norm["m_tpot"] / 2.0), catalog)
    assert np.allclose(half["share"], 2.0 * s["share"])
    drafts = mod.moe_shares(norm.assign(n_spec=3.0), catalog)
    assert (drafts["spec"] == "on").all()
    # four tokens a sequence and step: the curve at four times the tokens over four times the step
    assert (drafts["share"] < s["share"]).all()


def test_the_gemm_curve_share_is_the_rows_own_and_needs_the_term(catalog, tmp_path):
    """The non-expert GEMM curve's share of a measured step exists only where the gemm term would time the step
    (``with_term``); it is the curve's time at the row's own batch over TPOT, so halving the TPOT doubles it, and
    Llama-3.1-70B's GEMMs take the per-tensor FP8 curve (its checkpoint's scales)."""
    from planner.calib.consistency import gemm_shares, with_term

    mod = _module()
    norm = _rows(catalog, tmp_path, "meta-llama/Llama-3.1-70B", "h200_sxm", "trtllm")
    assert len(norm) >= 3
    assert gemm_shares(norm, catalog).empty  # the catalog keeps the term off
    on = with_term(catalog, "gemm")
    assert "gemm" in on.hardware["h200-sxm"].efficiency.kernels.terms
    assert on.hardware["h200-sxm"].efficiency.kernels.terms[:-1] == catalog.hardware["h200-sxm"].efficiency.kernels.terms
    s = gemm_shares(norm, on)
    assert len(s) == len(norm) and (s["share"] > 0).all()
    fp8 = s[s["dense"] == "fp8"]
    assert len(fp8) and (fp8["curve"] == "gemm/trtllm/fp8").all()
    half = gemm_shares(norm.assign(m_tpot=norm["m_tpot"] / 2.0), on)
    assert np.allclose(half["share"], 2.0 * s["share"])
    assert mod.gemm_shares is gemm_shares


def test_a_closed_loop_faster_than_its_prefill_pool_is_flagged(catalog, tmp_path):
    """Little's law: the rate a disaggregated run completed, conc / (TTFT + (O - 1) TPOT), over the model's prefill
    capacity of its recorded pool; the capacity is the model's alone, so the same run measured twice as fast is
    twice the share."""
    mod = _module()
    df = pd.read_csv(CALIB)
    pick = df[(df["mode"] == "disagg") & df["decode_num_workers"].notna() & (df["system"] == "b200_sxm")].head(8)
    path = tmp_path / "rows.csv"
    pick.to_csv(path, index=False)
    norm, _ = F.prepare([load_measured(path, catalog, measured=True)], catalog)
    assert len(norm) >= 3
    p = mod.prefill_shortfalls(norm, catalog)
    fast = mod.prefill_shortfalls(norm.assign(m_ttft=norm["m_ttft"] / 2.0, m_tpot=norm["m_tpot"] / 2.0), catalog)
    assert len(p) == len(norm) and (p["rate_share"] > 0).all()
    assert np.allclose(fast["rate_share"], 2.0 * p["rate_share"])
