"""Skewed expert routing (perf/routing.py): the busiest rank's copies, touched experts and padded rows under
power-law expert loads, and the fused-MoE kernel fit on rows measured under such routing (calib/kernels.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from planner.perf import kernels as K
from planner.perf.routing import _whole_copies, power_law_load, power_law_loads


def test_one_rank_carries_every_copy_whatever_the_skew():
    copies, touched, rows = power_law_load(4096, 256, 8, 1, 1.01)
    assert copies == 4096 * 8
    assert 200 < touched <= 256  # a few cold experts get nothing
    assert rows >= copies  # each expert's rows padded to a 64-row tile


def test_the_busiest_of_eight_ranks_carries_well_above_its_share():
    """Power-law loads (exponent 1.01, up to 0.8x the tokens an expert) leave the hottest block of 32 experts with
    about 1.45x the mean, the skew the H200 kernel rows show at EP8 and 4,096 tokens (1.45x the balanced latency)."""
    copies, touched, _ = power_law_load(4096, 256, 8, 8, 1.01)
    mean = 4096 * 8 / 8
    assert 1.3 * mean < copies < 1.6 * mean
    assert touched <= 32


def test_few_tokens_spread_their_rounding_over_the_ranks():
    """With fewer copies than experts every power-law share rounds to zero and the copies are handed out
    round-robin over the ranks: one token's eight copies over eight ranks leave one on the busiest, as balanced
    routing does (the kernel rows: 40 us either way on H200 at EP8)."""
    assert power_law_load(1, 256, 8, 8, 1.01)[:2] == (1.0, 1.0)
    assert power_law_load(2, 256, 8, 8, 1.2)[0] <= 2.5
    # on one rank the same copies touch as many experts
    assert power_law_load(1, 256, 8, 1, 1.01)[:2] == (8.0, 8.0)


def test_no_expert_takes_more_copies_than_there_are_tokens():
    share = np.array([[0.9, 0.05, 0.03, 0.02]])
    load = _whole_copies(share, copies=200, cap=100, ranks=2)
    assert load.sum() == 200 and load.max() <= 100
    assert load.shape == (1, 2, 2)


def test_loads_are_reproducible_and_broadcast():
    a = power_law_loads(np.array([64.0, 4096.0]), 128.0, 8.0, 4.0, 1.2)
    b = power_law_loads(np.array([64.0, 4096.0]), 128.0, 8.0, 4.0, 1.2)
    for x, y in zip(a, b, strict=True):
        assert x.shape == (2,) and np.array_equal(x, y)


def _skewed_table(p, hw, alphas=(1.01, 1.2)):
    """A synthetic ``moe_perf`` table timed by the MoE curve ``p`` on the loads each routing gives."""
    rows = []
    for h, inter, e, k in ((4096, 1536, 128, 8), (2048, 768, 128, 8), (6144, 2560, 160, 8)):
        for ep in (1, 4, 8):
            for t in (1, 4, 16, 64, 256, 1024, 4096):
                for dist in ("balanced", *(f"power_law_{a}" for a in alphas)):
                    if dist == "balanced":
                        load = K.uniform_moe_load(t, k, e, e / ep)
                    else:
                        load = power_law_load(t, e, k, ep, float(dist.rsplit("_", 1)[1]))
                    s = K.moe_time(p, t, h, inter, k, e, e / ep, hw.flops("fp8"), hw.hbm_bw, 1.0, load=load)
                    rows.append(dict(framework="x", version="0", device="x", op_name="moe",
                                     kernel_source="moe_torch_flow_cutlass", moe_dtype="fp8", num_tokens=t,
                                     hidden_size=h, inter_size=inter, topk=k, num_experts=e, moe_tp_size=1,
                                     moe_ep_size=ep, distribution=dist, latency=float(s) * 1e3))
    return pd.DataFrame(rows)


def test_skewed_rows_are_fitted_with_their_loads_and_reported_apart(tmp_path, catalog):
    """Rows measured under power-law routing join the fit with the busiest rank's loads: a curve that generated
    both kinds is recovered from them, and the report splits the error by routing."""
    from planner.calib.kernel_report import report_markdown
    from planner.calib.kernels import fit_kernels

    hw = catalog.hardware["h200-sxm"]
    # (streaming at 60% of peak: the uniform balanced rows touch fewer experts than the plausibility floor counts)
    truth = dict(K.PRIOR["moe"], t0_us=25.0, compute=0.6, memory=0.6, tile_ns=12.0, copy_bytes=2.0)
    d = tmp_path / "h200_sxm" / "moe" / "trtllm"
    d.mkdir(parents=True)
    table = _skewed_table(truth, hw)
    table.to_parquet(d / "moe_perf.parquet")
    (rep,) = fit_kernels(tmp_path, catalog, families={"moe"})
    c = rep.curves["moe/trtllm/fp8"]
    assert c.rows == len(table) and c.fit_mape < 0.01
    assert c.params["memory"] == pytest.approx(0.6, rel=0.05) and c.params["compute"] == pytest.approx(0.6, rel=0.1)
    groups = rep.groups["moe/trtllm/fp8"]
    assert (groups == "skewed").sum() == 2 * (groups == "balanced").sum()
    md = report_markdown([rep], "test", None)
    assert "| h200_sxm | 63 | 0.0% | 126 | 0.0% |" in md


def test_skew_slows_a_wide_rank_and_speeds_a_lone_one():
    """At thousands of tokens the hottest of eight ranks computes more than its share (slower than balanced);
    at a few dozen tokens on one rank, skew concentrates the copies on fewer experts (fewer weights streamed)."""
    p, F, W = dict(K.PRIOR["moe"]), 989e12, 4.8e12

    def ratio(t, ep):
        args = (p, t, 7168, 2048, 8, 256, 256 / ep, F, W, 1.0)
        return float(K.moe_time(*args, load=power_law_load(t, 256, 8, ep, 1.01)) / K.moe_time(*args))

    assert ratio(4096, 8) > 1.25
    assert ratio(32, 1) < 0.9


def test_expert_parallelism_must_divide_the_experts():
    with pytest.raises(ValueError, match="does not divide"):
        power_law_load(64, 256, 8, 3, 1.01)


def test_skewed_rows_of_an_undivided_layout_are_a_note_not_a_crash(tmp_path, catalog):
    from planner.calib.kernels import read_moe

    hw = catalog.hardware["h200-sxm"]
    table = _skewed_table(dict(K.PRIOR["moe"]), hw, alphas=(1.2,))
    odd = table[table["distribution"] != "balanced"].head(3).assign(moe_ep_size=3)
    path = tmp_path / "moe_perf.parquet"
    pd.concat([table, odd]).to_parquet(path)
    notes: list[str] = []
    rows = read_moe(path, hw, notes=notes)["fp8"]
    assert len(rows.y) == len(table)
    assert "3 skewed-routing rows whose moe_ep_size does not divide num_experts left out" in notes[0]
