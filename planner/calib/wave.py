"""Fit of the one-time first-wave delay of benchmark runs (``EngineEfficiency.first_wave_s``).

A benchmark run of InferenceX's client warms the server with one prompt, then releases ``conc`` requests at once.
Engines that build kernels per shape at first use (DeepGEMM JIT-compiles one FP8 GEMM kernel per shape and tile
choice, AITER builds its JIT modules, FlashInfer its first-use kernels) build them when that first wave's prompt
batch reaches token counts the one-prompt warm-up did not: the wave's first tokens wait seconds that no later
request pays. Its measured p99 TTFT is then the first wave's (the slowest 1% of ``10 conc`` requests are the
slowest 10% of the wave), and at 4-16 clients, where the wave drains in well under a second, that delay is most
of it (TensorRT-LLM on H200, 1K/8K, 4 clients: 102-129 ms median TTFT, 1.7-3.8 s p99 in nine identical runs).

The delay depends on the engine's kernel stack, not on the chip's speed, so it is one value per engine and hardware
vendor (SGLang builds AITER's JIT modules on ROCm; on CUDA, DeepGEMM's kernels, which releases since early 2026
compile during the server's own warm-up), fitted over every such hardware's runs that record a p99 TTFT (a chip
without rows inherits its engine's value on its vendor): the robust (soft-L1, as :mod:`planner.calib.fit`)
least-squares value of ``log(max(steady, wave + d) / measured p99)`` over a grid of ``d``. The other factors do not
depend on it (it enters no median), so it is fitted after them, on their predictions.
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
"""Soft-L1 scale of the log residuals: this fit's and the end-to-end fit's (:func:`planner.calib.fit._fit_stage`), one
value so the two weigh outliers alike."""
MIN_RUNS = 10
"""Runs with a p99 TTFT that a group (an engine on a vendor, an engine, a vendor) needs for its own value; fewer: the
next group :func:`lookup` tries."""


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
    """``result`` (a :class:`planner.calib.fit.FitResult`) with ``first_wave`` (:func:`delays`) fitted on ``norm``'s
    rows that record a p99 TTFT, each row predicted with the block the catalog would give it, and every block's
    ``first_wave_s`` set from it (:func:`lookup`; the vendor-free blocks, per engine and over all hardware, take the
    engine's value over every vendor's runs)."""
    result = _with_delay(result, lambda hw, eng: 0.0)  # also gives blocks pickled before the field one
    if "m_ttft_p99" not in norm.columns:
        return result
    rows = norm[np.isfinite(norm["m_ttft_p99"].to_numpy(float))]
    if rows.empty:
        return result

    def eff_for(hw: str, eng: str):
        return result.by_group.get((hw, eng), result.by_hw.get(hw, result.overall))

    pred = predict_normalised(rows, catalog, eff_for)
    parts = pd.DataFrame({"eng": rows["n_engine"].to_numpy(), "vendor": [catalog.hardware[h].vendor for h in rows["n_hw"]],
                          "s": pred["predicted_ttft_steady_ms"].to_numpy(float),
                          "w": pred["predicted_ttft_wave_ms"].to_numpy(float), "m": rows["m_ttft_p99"].to_numpy(float)})
    fitted = delays(parts)
    vendor = {h: catalog.hardware[h].vendor for h in {*result.by_hw, *(h for h, _ in result.by_group)}}
    out = _with_delay(result, lambda hw, eng: lookup(fitted, eng, vendor.get(hw) if hw else None))
    return replace(out, first_wave=fitted)


def delays(parts: pd.DataFrame) -> dict[str, float]:
    """The fitted delays of ``parts`` (columns ``eng``, ``vendor``, ``s``, ``w``, ``m``: the steady state's and the
    first wave's predicted p99 TTFT and the measured one, ms), keyed ``engine@vendor`` (the kernel stack: SGLang
    JIT-builds AITER modules on ROCm and, in older releases, DeepGEMM kernels on CUDA), ``engine``, ``@vendor`` and
    ``""`` (every run), each where at least :data:`MIN_RUNS` runs inform it."""
    out = {"": best_delay(parts["s"], parts["w"], parts["m"])}
    for cols, key in ((["eng", "vendor"], "{0}@{1}"), (["eng"], "{0}"), (["vendor"], "@{0}")):
        for k, g in parts.groupby(cols):
            if len(g) >= MIN_RUNS:
                out[key.format(*(k if isinstance(k, tuple) else (k,)))] = best_delay(g["s"], g["w"], g["m"])
    return out


def lookup(fitted: dict[str, float], engine: str | None, vendor: str | None) -> float:
    """The delay of ``engine`` on a ``vendor``'s hardware (either may be None: a block of no single engine or no
    single vendor): the most specific of ``engine@vendor``, ``engine`` (another vendor's stack: none of this vendor's
    runs), ``@vendor`` and every run that the fit has."""
    keys = [f"{engine}@{vendor}", str(engine), f"@{vendor}"] if engine and vendor else (
        [str(engine)] if engine else [f"@{vendor}"] if vendor else [])
    return next((fitted[k] for k in keys if k in fitted), fitted.get("", 0.0))


def _with_delay(result, delay):
    """``result`` with every block's ``first_wave_s`` set to ``delay(hardware, engine)`` (``None`` for a block of no
    single hardware or engine: per-engine priors, hardware defaults and the all-hardware fits)."""

    def put(block, hw=None, eng=None):
        return block.model_copy(update={"first_wave_s": delay(hw, eng)})

    return replace(
        result,
        by_group={k: put(b, *k) for k, b in result.by_group.items()},
        by_hw={h: put(b, h) for h, b in result.by_hw.items()},
        by_engine={e: put(b, None, e) for e, b in result.by_engine.items()},
        overall=put(result.overall),
        overall_kernels=put(result.overall_kernels) if result.overall_kernels is not None else None,
        by_engine_kernels=({e: put(b, None, e) for e, b in result.by_engine_kernels.items()}
                           if result.by_engine_kernels is not None else None),
    )


def set_vendor_delays(eff, fitted: dict[str, float] | None, vendor: str):
    """A catalog ``Efficiency`` block (of a hardware of ``vendor``) with its engines' and its default's
    ``first_wave_s`` from ``fitted`` (:func:`lookup`): hardware transferred from another chip or from the all-hardware
    fit keeps its own vendor's kernel stack."""
    if not fitted:
        return eff
    return eff.model_copy(update={
        "default": eff.default.model_copy(update={"first_wave_s": lookup(fitted, None, vendor)}),
        "by_engine": {e: b.model_copy(update={"first_wave_s": lookup(fitted, e, vendor)}) for e, b in eff.by_engine.items()}})
