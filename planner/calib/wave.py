"""Fit of the one-time first-wave delay of benchmark runs (``EngineEfficiency.first_wave_s``).

A benchmark run of InferenceX's client warms the server with one prompt, then releases ``conc`` requests at once.
Engines that build kernels per shape at first use (DeepGEMM JIT-compiles one FP8 GEMM kernel per shape and tile
choice, AITER builds its JIT modules, FlashInfer its first-use kernels) build them when that first wave's prompt
batch reaches token counts the one-prompt warm-up did not: the wave's first tokens wait seconds that no later
request pays. Its measured p99 TTFT is then the first wave's (the slowest 1% of ``10 conc`` requests are the
slowest 10% of the wave), and at 4-16 clients, where the wave drains in well under a second, that delay is most
of it (TensorRT-LLM on H200, 1K/8K, 4 clients: 102-129 ms median TTFT, 1.7-3.8 s p99 in nine identical runs).

The delay depends on the engine's kernel stack, not on the chip's speed, so it is one factor per engine, fitted over
every hardware's runs that record a p99 TTFT (a chip without rows inherits its engine's value): the robust
(soft-L1, as :mod:`planner.calib.fit`) least-squares value of ``log(max(steady, wave + d) / measured p99)`` over a
grid of ``d``. The other factors do not depend on it (it enters no median), so it is fitted after them, on their
predictions; the hardware defaults and the all-hardware blocks take the value fitted over all rows.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from planner.calib.predict import predict_normalised
from planner.catalog import Catalog

GRID_S = np.round(np.arange(0.0, 10.0 + 1e-9, 0.01), 2)
"""Candidate delays (seconds): 0 to 10 s in 10 ms steps."""
F_SCALE = 0.2
"""Soft-L1 scale of the log residuals (the end-to-end fit's)."""
MIN_RUNS = 10
"""Runs with a p99 TTFT an engine needs for its own value; fewer: the all-rows value."""


def best_delay(steady_ms, wave_ms, measured_ms) -> float:
    """The grid delay (seconds) minimising the soft-L1 loss of ``log(max(steady, wave + d) / measured)``; 0 for no
    usable row."""
    s, w, m = (np.asarray(x, dtype=float) for x in (steady_ms, wave_ms, measured_ms))
    ok = np.isfinite(s) & np.isfinite(w) & np.isfinite(m) & (m > 0) & (s > 0)
    if not ok.any():
        return 0.0
    s, w, m = s[ok], w[ok], m[ok]
    pred = np.maximum(s[None, :], w[None, :] + 1e3 * GRID_S[:, None])
    z = (np.log(pred / m[None, :]) / F_SCALE) ** 2
    loss = (2.0 * (np.sqrt(1.0 + z) - 1.0)).sum(axis=1)
    return float(GRID_S[int(np.argmin(loss))])


def fit_first_wave(norm: pd.DataFrame, catalog: Catalog, result):
    """``result`` (a :class:`planner.calib.fit.FitResult`) with ``first_wave_s`` fitted per engine on ``norm``'s
    rows that record a p99 TTFT, each row predicted with the block the catalog would give it."""
    if "m_ttft_p99" not in norm.columns:
        return result
    rows = norm[np.isfinite(norm["m_ttft_p99"].to_numpy(float))]
    if rows.empty:
        return result

    result = _with_delay(result, lambda eng: 0.0)  # also gives blocks pickled before the field one

    def eff_for(hw: str, eng: str):
        return result.by_group.get((hw, eng), result.by_hw.get(hw, result.overall))

    pred = predict_normalised(rows, catalog, eff_for)
    parts = pd.DataFrame({"eng": rows["n_engine"].to_numpy(), "s": pred["predicted_ttft_steady_ms"].to_numpy(float),
                          "w": pred["predicted_ttft_wave_ms"].to_numpy(float), "m": rows["m_ttft_p99"].to_numpy(float)})
    every = best_delay(parts["s"], parts["w"], parts["m"])
    own = {eng: best_delay(g["s"], g["w"], g["m"]) for eng, g in parts.groupby("eng") if len(g) >= MIN_RUNS}
    return _with_delay(result, lambda eng: own.get(eng, every) if eng else every)


def _with_delay(result, delay):
    """``result`` with every block's ``first_wave_s`` set to ``delay(engine)`` (``None`` for the blocks of no
    single engine: hardware defaults and the all-hardware fits)."""

    def put(block, eng=None):
        return block.model_copy(update={"first_wave_s": delay(eng)})

    return replace(
        result,
        by_group={k: put(b, k[1]) for k, b in result.by_group.items()},
        by_hw={h: put(b) for h, b in result.by_hw.items()},
        by_engine={e: put(b, e) for e, b in result.by_engine.items()},
        overall=put(result.overall),
        overall_kernels=put(result.overall_kernels) if result.overall_kernels is not None else None,
        by_engine_kernels=({e: put(b, e) for e, b in result.by_engine_kernels.items()}
                           if result.by_engine_kernels is not None else None),
    )
