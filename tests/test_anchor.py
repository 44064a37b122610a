"""A chip with a few measured rows, too few for a fit of its own, is anchored on them (planner/calib/anchor.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from conftest import CALIB, ROOT

from planner.calib import fit as F
from planner.calib.anchor import anchored, few_row_hardware
from planner.calib.data import Measured, load_measured, normalise
from planner.calib.predict import predict_normalised
from planner.results.extract import unvalidated

TRN2_ROWS = ROOT / "catalogs" / "measured" / "trn2-nxdi.csv"


def _row(catalog, tpot_ms: float, ttft_ms: float, model="meta-llama/Llama-3.1-70B-Instruct") -> pd.DataFrame:
    raw = pd.DataFrame([dict(
        id="t", silicon_data_source="test; silicon_concurrency=1", backend="vllm", model_path=model, system="trn2",
        precision="bf16", mode="agg", isl=10_000, osl=1_500, batch_size=1, tp_size=16, pp_size=1,
        attention_dp_size=1, moe_tp_size=1, moe_ep_size=1, silicon_ttft_ms=ttft_ms, silicon_tpot_ms=tpot_ms)])
    norm, _ = F.prepare([Measured(Path("one.csv"), "silicon", raw, normalise(raw, catalog))], catalog)
    return norm


def _predicted(catalog, norm, eff):
    return predict_normalised(norm, catalog, lambda h, e: eff).iloc[0]


def _transfer(catalog):
    """trn2's block as a plain transfer (the bundled one is anchored already): its anchored factors set back."""
    eff = catalog.hardware["trn2"].efficiency
    base = eff.for_engine("vllm").model_copy(update={"step_overhead_us": 0.0, "prefill_comm_bandwidth": 0.2,
                                                     "prefill_compute": 0.3})
    return eff.model_copy(update={"default": base, "by_engine": {"vllm": base}, "engine_rows": {},
                                  "free_factors": {}})


def test_a_row_slower_than_the_transfer_sets_the_chips_step_cost_and_nothing_else(catalog):
    eff = _transfer(catalog)
    assert eff.fitted_rows == 0 and eff.transferred_from
    base = eff.for_engine("vllm")
    p0 = _predicted(catalog, _row(catalog, 1.0, 1.0), base)
    # measured: the transferred step plus 5 ms a step, the transferred TTFT
    norm = _row(catalog, p0["predicted_tpot_ms"] + 5.0, p0["predicted_ttft_ms"])
    b = anchored({"trn2": eff}, norm, catalog, "one.csv", F.BOUNDS, F.INFORM_DELTA)["trn2"]
    got = b.for_engine("vllm")
    assert got.step_overhead_us == pytest.approx(base.step_overhead_us + 5000.0, rel=0.02)
    p1 = _predicted(catalog, norm, got)
    assert p1["predicted_tpot_ms"] == pytest.approx(norm["m_tpot"].iloc[0], rel=0.005)
    assert p1["predicted_ttft_ms"] == pytest.approx(norm["m_ttft"].iloc[0], rel=0.01)
    # the silicon, the decode links and the scheduling stay the transfer's; the block stays a transfer
    for k in ("compute", "memory", "collective_latency_us", "seq_overhead_us", "layer_overhead_us", "first_token_steps"):
        assert getattr(got, k) == getattr(base, k), k
    assert b.fitted_rows == 0 and b.transferred_from == eff.transferred_from
    assert b.engine_rows == {"vllm": 1} and "step_overhead_us" in b.free_factors["vllm"]
    assert "anchored on 1 measured row of one.csv" in b.source


def test_a_faster_prefill_moves_the_links_share_first_then_the_compute_rate(catalog):
    eff = _transfer(catalog)
    base = eff.for_engine("vllm")
    p0 = _predicted(catalog, _row(catalog, 1.0, 1.0), base)
    norm = _row(catalog, p0["predicted_tpot_ms"], 0.5 * p0["predicted_ttft_ms"])
    got = anchored({"trn2": eff}, norm, catalog, "one.csv", F.BOUNDS, F.INFORM_DELTA)["trn2"].for_engine("vllm")
    assert got.prefill_comm_bandwidth > base.prefill_comm_bandwidth
    assert got.prefill_compute > base.prefill_compute
    assert _predicted(catalog, norm, got)["predicted_ttft_ms"] == pytest.approx(norm["m_ttft"].iloc[0], rel=0.01)
    assert got.step_overhead_us == pytest.approx(base.step_overhead_us, abs=50.0)  # TPOT was right already


def test_rows_of_a_few_row_chip_weigh_nothing_in_the_fits(catalog):
    sil = load_measured(CALIB, catalog, measured=True)
    trn = load_measured(TRN2_ROWS, catalog, measured=True)
    alone, _ = F.prepare([sil], catalog)
    both, _ = F.prepare([sil, trn], catalog)
    few = few_row_hardware(both, F.MIN_ROWS)
    # trn2's one row, and any chip of the file with fewer fittable rows than a fit of its own needs
    assert "trn2" in few and few - {"trn2"} == few_row_hardware(alone, F.MIN_ROWS)
    assert all(0 < n < F.MIN_ROWS for n in both["n_hw"].value_counts()[sorted(few)])
    # the other rows weigh exactly what they weigh without the file; the few-row chips' rows weigh nothing in a fit
    fitted = ~both["n_hw"].isin(few)
    assert both.loc[fitted, "w"].to_numpy() == pytest.approx(alone.loc[~alone["n_hw"].isin(few), "w"].to_numpy(),
                                                             rel=1e-12)
    assert (both.loc[~fitted, "w"] == 1.0).all()


def test_the_bundled_trn2_row_is_the_published_405b_run(catalog):
    m = load_measured(TRN2_ROWS, catalog, measured=True)
    n = m.norm.iloc[0]
    assert (n["n_model"], n["n_hw"], n["n_engine"], n["reason"]) == ("llama-3.1-405b", "trn2", "vllm", "")
    assert (n["m_tpot"], n["m_ttft"], n["a_tp"], n["n_conc"]) == (37.93, 2441.96, 16.0, 1.0)


def test_a_plan_says_a_pool_on_an_anchored_chip_is_still_a_transfer(catalog):
    hw = catalog.hardware["trn2"]
    eff = hw.efficiency.model_copy(update={"engine_rows": {"vllm": 1},
                                           "free_factors": {"vllm": ["prefill_compute", "step_overhead_us"]}})
    msg = unvalidated(hw.model_copy(update={"efficiency": eff}))
    assert msg.startswith("unvalidated: factors transferred from all-hardware")
    assert "prefill_compute, step_overhead_us anchored on 1 measured row of trn2" in msg
    plain = hw.efficiency.model_copy(update={"engine_rows": {}, "free_factors": {}})
    assert "no measured rows for trn2" in unvalidated(hw.model_copy(update={"efficiency": plain}))


def test_the_bundled_trn2_block_is_anchored_on_the_bundled_row(catalog):
    eff = catalog.hardware["trn2"].efficiency
    assert eff.fitted_rows == 0 and eff.engine_rows == {"vllm": 1}
    assert "anchored on 1 measured row of trn2-nxdi.csv" in eff.source
    m = load_measured(TRN2_ROWS, catalog, measured=True)
    p = predict_normalised(m.norm, catalog).iloc[0]
    assert p["predicted_tpot_ms"] == pytest.approx(37.93, rel=0.01)
    assert p["predicted_ttft_ms"] == pytest.approx(2441.96, rel=0.02)


def test_a_fit_stage_moves_a_factor_that_starts_on_its_bound(catalog, monkeypatch):
    """The fit's stages start a factor a millionth of its range inside its bounds: from exactly 0 (an overhead the
    prior put on its lower bound) the trust region's scaling would leave it frozen there."""
    monkeypatch.setattr(F, "MIN_ROWS", 1)
    m = load_measured(TRN2_ROWS, catalog, measured=True)
    norm, _ = F.prepare([m], catalog)
    base = catalog.hardware["trn2"].efficiency.for_engine("vllm").model_copy(update={"step_overhead_us": 0.0})
    out = F._fit_stage(norm, catalog, base, ("step_overhead_us",), "tpot", None)
    assert out.step_overhead_us > 1000.0
    assert _predicted(catalog, norm, out)["predicted_tpot_ms"] == pytest.approx(37.93, rel=0.01)
