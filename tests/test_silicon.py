"""Silicon factors from a system's own kernel curves (planner/calib/silicon.py): worked fractions, the relative and
absolute rules, the FP4-weights factor on chips without FP4 maths, and the catalog blocks they produce."""

from __future__ import annotations

import datetime as dt

import pytest

from planner.calib import fit as F
from planner.calib import silicon as S
from planner.catalog import EngineEfficiency
from planner.catalog.schemas import KernelFits
from planner.perf import kernels as K
from planner.perf.roofline import factor_dtype, gemm_efficiency


def _curve(family, **kw):
    return {"params": {**K.PRIOR[family], **kw}, "rows": 100, "fit_mape": 0.05}


def _with_kernels(hw, curves):
    kf = KernelFits(source="test curves", as_of=dt.date(2026, 11, 26), system="x", curves=curves)
    return hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"kernels": kf})})


def _ideal_gemm(compute):
    """A GEMM curve with no fixed latency, full tile fill and a hard roofline: its large-shape fraction is ``compute``."""
    return _curve("gemm", t0_us=0.0, compute=compute, tile_half=0.0, memory=1.0, sharpness=30.0, act_bytes=2.0)


def test_kernel_fraction_of_a_large_gemm_is_the_curves_peak_share(catalog):
    """Worked number: a bf16 GEMM curve at 0.6 of peak with nothing else in its way gives ``compute`` 0.6 (the
    reference shape is compute bound); no MoE curve, so the GEMM alone sets it."""
    hw = _with_kernels(catalog.hardware["h200-sxm"], {"gemm/trtllm/bf16": _ideal_gemm(0.6)})
    f = S.kernel_fractions(hw, "trtllm")
    assert f["compute"] == pytest.approx(0.6, rel=1e-3)
    assert "compute_fp8" not in f and "compute_fp4" not in f  # no curve runs those formats
    # memory: a 16-row GEMM streams its weights at the curve's full HBM share
    assert f["memory"] == pytest.approx(1.0, rel=0.02)


def test_gemm_and_moe_fractions_combine_geometrically(catalog):
    m, n, k = S.GEMM_REF
    hw = _with_kernels(catalog.hardware["b200-sxm"], {
        "gemm/sglang/fp4": _ideal_gemm(0.4),
        "moe/sglang/fp4": _curve("moe", t0_us=0.0, compute=0.9, tile_ns=0.0, memory=1.0, sharpness=30.0,
                                 copy_bytes=0.0)})
    g = S._gemm_fraction(hw, "sglang", "fp4")
    mo = S._moe_fraction(hw, "sglang", "fp4")
    assert g == pytest.approx(0.4, rel=1e-3)
    assert 0.5 < mo <= 0.9  # tile padding of the routed rows is the only loss
    assert S.kernel_fractions(hw, "sglang")["compute_fp4"] == pytest.approx((g * mo) ** 0.5, rel=1e-9)


def test_where_the_moe_curve_times_the_experts_the_compute_factor_is_the_gemm_curves(catalog):
    """With the fused MoE layers timed by the system's own curve (``terms: [moe]``), the compute factors time only
    the other GEMMs: the dense GEMM curve's fraction alone, not its mean with the MoE curve's; a format without a GEMM
    curve keeps the MoE curve's fraction."""
    curves = {"gemm/sglang/fp4": _ideal_gemm(0.4),
              "moe/sglang/fp4": _curve("moe", t0_us=0.0, compute=0.9, tile_ns=0.0, memory=1.0, sharpness=30.0,
                                       copy_bytes=0.0),
              "moe/sglang/fp8": _curve("moe", t0_us=0.0, compute=0.5, tile_ns=0.0, memory=1.0, sharpness=30.0,
                                       copy_bytes=0.0)}
    hw = _with_kernels(catalog.hardware["b200-sxm"], curves)
    timed = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={
        "kernels": hw.efficiency.kernels.model_copy(update={"terms": ["moe"]})})})
    g, mo = S._gemm_fraction(hw, "sglang", "fp4"), S._moe_fraction(hw, "sglang", "fp4")
    assert S.kernel_fractions(hw, "sglang")["compute_fp4"] == pytest.approx((g * mo) ** 0.5, rel=1e-9)
    f = S.kernel_fractions(timed, "sglang")
    assert f["compute_fp4"] == pytest.approx(g, rel=1e-9)
    assert f["compute_fp8"] == pytest.approx(S._moe_fraction(hw, "sglang", "fp8"), rel=1e-9)


def test_relative_scales_by_the_kernel_ratio_and_is_the_identity_on_itself(catalog):
    b200 = _with_kernels(catalog.hardware["b200-sxm"], {"gemm/trtllm/fp4": _ideal_gemm(0.4)})
    b300 = _with_kernels(catalog.hardware["b300-sxm"], {"gemm/trtllm/fp4": _ideal_gemm(0.3)})
    block = EngineEfficiency(compute=0.7, compute_fp4=0.5, memory=0.8)
    same, _ = S.relative(block, b200, b200, "trtllm")
    assert same.compute_fp4 == pytest.approx(0.5) and same.memory == pytest.approx(0.8, rel=1e-3)
    moved, names = S.relative(block, b300, b200, "trtllm")
    assert moved.compute_fp4 == pytest.approx(0.5 * 0.3 / 0.4, rel=1e-3)
    assert "compute_fp4" in names and "compute" not in names  # no bf16 curve on either: kept
    assert moved.compute == 0.7


def test_absolute_sets_only_the_named_factors(catalog):
    hw = _with_kernels(catalog.hardware["h100-sxm"], {"gemm/vllm/bf16": _ideal_gemm(0.55),
                                                      "gemm/vllm/fp8": _ideal_gemm(0.45)})
    block = EngineEfficiency(compute=0.9, compute_fp8=0.8, compute_fp4=0.7)
    out, names = S.absolute(block, hw, "vllm", ["compute_fp8", "compute_fp4"])
    assert names == ["compute_fp8"]  # no FP4 curve: compute_fp4 kept
    assert out.compute_fp8 == pytest.approx(0.45, rel=1e-3)
    assert out.compute == 0.9 and out.compute_fp4 == 0.7


def test_fp4_weights_keep_their_own_factor_on_hopper(catalog):
    """H100/H200 have no FP4 maths: FP4 experts run a w4a16 kernel at bf16 peak, timed by ``compute_fp4`` (not the
    bf16 GEMMs' ``compute``); Blackwell runs FP4 maths with the same factor; FP8 keeps the maths format's."""
    h200, b200 = catalog.hardware["h200-sxm"], catalog.hardware["b200-sxm"]
    assert h200.compute_dtype("fp4") == "bf16" and factor_dtype(h200, "fp4") == "fp4"
    assert factor_dtype(b200, "fp4") == "fp4" and factor_dtype(h200, "fp8") == "fp8"
    eff = EngineEfficiency(compute=0.9, compute_fp4=0.4, gemm_half_tokens=0.0)
    assert float(gemm_efficiency(eff, factor_dtype(h200, "fp4"), 1e6)) == pytest.approx(0.4)
    assert float(gemm_efficiency(eff, factor_dtype(h200, "bf16"), 1e6)) == pytest.approx(0.9)


def test_catalog_blocks_take_unrun_formats_and_transfers_from_kernels(catalog):
    """A fit result with H200 rows of FP8 only: H200's ``compute`` and ``compute_fp4`` come from its own kernels;
    B300 (transferred from B200) has every silicon factor scaled by the two systems' kernel ratio, and says so."""
    eff = EngineEfficiency(compute=0.9, compute_fp8=0.6, compute_fp4=0.6, memory=0.85)
    res = F.FitResult(by_group={}, by_hw={"h200-sxm": eff, "b200-sxm": eff}, by_engine={"trtllm": eff}, overall=eff,
                      rows={}, rows_hw={"h200-sxm": 100, "b200-sxm": 100}, dropped=0,
                      formats={"h200-sxm": {"compute_fp8"}, "b200-sxm": set(S.FORMAT_FACTORS)})
    blocks = F.efficiency_blocks(res, catalog, "test rows")
    h200 = catalog.hardware["h200-sxm"]
    kf = S.kernel_fractions(h200, None)
    assert blocks["h200-sxm"].default.compute_fp8 == 0.6  # its rows run FP8: fitted
    assert blocks["h200-sxm"].default.compute_fp4 == pytest.approx(kf["compute_fp4"], abs=1e-4)
    assert blocks["h200-sxm"].default.compute == pytest.approx(kf["compute"], abs=1e-4)
    assert blocks["h200-sxm"].kernel_factors == ["compute", "compute_fp4"]
    assert blocks["b200-sxm"].kernel_factors == []  # every format run by its rows
    b300 = blocks["b300-sxm"]
    assert b300.transferred_from == "b200-sxm"
    own, rel = S.kernel_fractions(catalog.hardware["b300-sxm"], None), S.kernel_fractions(catalog.hardware["b200-sxm"], None)
    assert b300.default.compute_fp4 == pytest.approx(0.6 * own["compute_fp4"] / rel["compute_fp4"], abs=1e-4)
    assert set(b300.kernel_factors) == set(S.SILICON_FACTORS)
    assert "scaled from b200-sxm" in b300.source
    # hardware without kernel curves is left as the fit gave it
    assert blocks["mi300x"].kernel_factors == []


def test_plans_name_the_factors_taken_from_kernels(catalog):
    """The committed catalog: B300 and GB300 carry their own kernels' silicon (scaled from B200 / GB200), and a pool
    on them says so; B200's factors are all fitted on its rows."""
    from planner.results import physics_path

    b300 = catalog.hardware["b300-sxm"]
    assert set(b300.efficiency.kernel_factors) == set(S.SILICON_FACTORS)
    assert "scaled from b200-sxm" in b300.efficiency.source
    text = physics_path(b300)
    assert text.startswith("datasheet roofline with fitted factors") and "b300_sxm's own kernel curves" in text
    assert "compute_fp4" in text
    # B200's factors are all fitted on its rows; its fused MoE layers, decode all-reduces, expert exchanges and attention are timed
    # by its curves
    assert physics_path(catalog.hardware["b200-sxm"]) == (
        "datasheet roofline with fitted factors (fused MoE layers, decode all-reduces, decode expert exchanges "
        "(dispatch and combine) and decode attention timed by b200_sxm's own kernel curves)")
    assert physics_path(catalog.hardware["mi300x"]) == "datasheet roofline with fitted factors"
    # B300's FP4 GEMMs and fused MoE measure ~1.1x B200's, not the datasheet's 1.56x: its effective FP4 rate follows
    b200 = catalog.hardware["b200-sxm"]
    eff_b300 = b300.efficiency.default.compute_fp4 * b300.flops("fp4")
    eff_b200 = b200.efficiency.default.compute_fp4 * b200.flops("fp4")
    assert 1.0 < eff_b300 / eff_b200 < 1.3


def test_a_misspelt_kernel_factor_is_a_catalog_error(tmp_path):
    """``kernel_factors`` names efficiency factors: a typo is refused with the file and field, not carried silently."""
    import shutil

    from planner.catalog.loader import load_catalog
    from planner.errors import InputError
    from tests.conftest import ROOT

    shutil.copytree(ROOT / "catalogs", tmp_path / "catalogs")
    f = tmp_path / "catalogs" / "hardware" / "b300-sxm.yaml"
    f.write_text(f.read_text().replace("  - compute_fp4\n", "  - compute_fp5\n", 1))
    with pytest.raises(InputError, match=r"b300-sxm.yaml.*kernel_factors"):
        load_catalog(tmp_path / "catalogs")
