"""The first wave's one-time delay of benchmark runs (``first_wave_s``, ``planner.calib.wave``, issue 46)."""

from __future__ import annotations

import numpy as np
import pytest

from planner.calib import fit as F
from planner.calib.data import load_measured
from planner.calib.predict import predict_normalised
from planner.calib.wave import GRID_S, best_delay, fit_first_wave, lookup, set_vendor_delays
from tests.conftest import IX


def test_best_delay_recovers_a_delay_the_wave_carries_and_ignores_an_outlier():
    wave = np.array([150.0, 300.0, 600.0, 1200.0, 2400.0, 250.0])
    steady = np.full(6, 100.0)
    measured = wave + 1500.0
    assert best_delay(steady, wave, measured) == pytest.approx(1.5)
    measured[-1] = 80_000.0  # a stalled run pulls a robust loss by a few per cent only (a squared loss: to seconds)
    assert best_delay(steady, wave, measured) == pytest.approx(1.5, abs=0.15)
    # runs whose steady state sets the p99 say nothing about the delay: a delay up to steady - wave is free, and the
    # grid's first (0) is taken
    assert best_delay([900.0, 900.0], [100.0, 200.0], [900.0, 900.0]) == 0.0
    assert best_delay([np.nan], [100.0], [500.0]) == 0.0  # no usable row
    assert best_delay([100.0], [100.0], [1e9]) == GRID_S[-1]  # bounded by the grid


def _ix_norm(catalog):
    norm, _ = F.prepare([load_measured(IX, catalog, measured=True)], catalog)
    return norm


def _catalog_result(catalog, norm):
    """A FitResult holding the catalog's blocks for ``norm``'s pairs (what a fit would hand the first-wave step)."""
    pairs = {(h, e) for h, e in zip(norm["n_hw"], norm["n_engine"], strict=True)}
    eff = {h: catalog.hardware[h].efficiency for h in norm["n_hw"].unique()}
    return F.FitResult(
        by_group={(h, e): eff[h].for_engine(e) for h, e in pairs}, by_hw={h: b.default for h, b in eff.items()},
        by_engine={e: F.START for e in norm["n_engine"].unique()}, overall=F.START, rows={}, rows_hw={}, dropped=0)


def test_the_fit_recovers_each_kernel_stacks_delay_and_every_block_carries_its_own(catalog):
    norm = _ix_norm(catalog)
    res = _catalog_result(catalog, norm)
    pred = predict_normalised(norm, catalog, lambda h, e: res.by_group[(h, e)])
    vendor = norm["n_hw"].map(lambda h: catalog.hardware[h].vendor)
    true = {"trtllm@nvidia": 1.8, "sglang@nvidia": 0.3, "sglang@amd": 1.2, "atom@amd": 0.0}
    d = (norm["n_engine"] + "@" + vendor).map(true).fillna(0.0).to_numpy() * 1e3
    norm = norm.assign(m_ttft_p99=np.maximum(pred["predicted_ttft_steady_ms"].to_numpy(),
                                             pred["predicted_ttft_wave_ms"].to_numpy() + d))
    out = fit_first_wave(norm, catalog, res)
    for key in ("trtllm@nvidia", "sglang@nvidia", "sglang@amd"):
        assert out.first_wave[key] == pytest.approx(true[key])
    for (h, e), b in out.by_group.items():
        key = f"{e}@{catalog.hardware[h].vendor}"
        assert b.first_wave_s == pytest.approx(out.first_wave.get(key, out.first_wave.get(f"@{catalog.hardware[h].vendor}")))
    # the engine's own value over both vendors' runs lies between them; a hardware default takes its vendor's
    assert 0.3 <= out.by_engine["sglang"].first_wave_s <= 1.2
    assert out.by_hw["mi355x"].first_wave_s == pytest.approx(out.first_wave["@amd"])
    # a chip without rows keeps its own vendor's stack, whichever block it was given (lookup's fallbacks)
    blk = catalog.hardware["mi325x"].efficiency
    moved = set_vendor_delays(blk, out.first_wave, "amd")
    assert moved.for_engine("sglang").first_wave_s == pytest.approx(1.2)
    assert lookup(out.first_wave, "vllm", "amd") == out.first_wave["@amd"]  # no vLLM runs: the vendor's
    assert lookup(out.first_wave, "sglang", "google") == out.first_wave["sglang"]  # no such vendor: the engine's
    assert lookup({}, "sglang", "amd") == 0.0
    # the fit is idempotent: refitting a result that already carries delays finds the same ones
    again = fit_first_wave(norm, catalog, out)
    assert again.first_wave == out.first_wave


def test_the_delay_moves_only_the_p99_ttft_of_runs_whose_first_wave_sets_it(catalog):
    norm = _ix_norm(catalog)
    res = _catalog_result(catalog, norm)
    base = predict_normalised(norm, catalog, lambda h, e: res.by_group[(h, e)].model_copy(update={"first_wave_s": 0.0}))
    late = predict_normalised(norm, catalog, lambda h, e: res.by_group[(h, e)].model_copy(update={"first_wave_s": 2.0}))
    want = np.maximum(base["predicted_ttft_steady_ms"], base["predicted_ttft_wave_ms"] + 2000.0)
    ok = base["predicted_ttft_p99_ms"].notna()
    assert ok.sum() > 50
    assert np.allclose(late["predicted_ttft_p99_ms"][ok], want[ok])
    assert (late["predicted_ttft_p99_ms"][ok] > base["predicted_ttft_p99_ms"][ok]).any()
    for col in ("predicted_ttft_ms", "predicted_tpot_ms", "predicted_tpot_p99_ms", "predicted_itl_p99_ms"):
        assert np.allclose(late[col], base[col], equal_nan=True)
