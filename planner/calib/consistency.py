"""Kernel curves that an engine's own measured steps contradict (``KernelFits.overruled``).

The fused-MoE rows of the kernel data were measured by a collector that runs one kernel path per engine and expert
format (TensorRT-LLM's CUTLASS w4a16 MoE for MXFP4 experts on Hopper, say). A deployment of the same engine may run
another path (a Triton or Marlin kernel, a DeepGEMM backend) that is faster. Where the curve's MoE layers alone take
longer than the whole measured decode step, the engine did not run that kernel: a step also holds attention, the
dense GEMMs, communication and overheads. This module finds the (hardware, engine, format) combinations where that
happens on more than a tenth of the engine's measured rows (:data:`OVERRULE_QUANTILE`), with at least
:data:`OVERRULE_MIN_ROWS` rows to judge by; ``planner calibrate fit`` then times their MoE layers on the roofline with
fitted factors, as on hardware without curves. Rows are measured runs of the data the fit is given; the curve is
evaluated at each row's own decode batch and layout, uniform routing, and its fixed latency paid in full (the
kernel as measured), so the test leans towards keeping a curve.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pandas as pd

from planner.catalog import Catalog
from planner.perf import compose as C
from planner.perf import params as P

log = logging.getLogger(__name__)

OVERRULE_QUANTILE = 0.9
"""A curve is overruled where this quantile of (its MoE time / the measured TPOT) over an engine's rows exceeds 1."""
OVERRULE_MIN_ROWS = 20
"""Fewest measured rows of a (hardware, engine, format) to overrule its curve on."""


def _timed(catalog: Catalog, hw_id: str) -> bool:
    kf = catalog.hardware[hw_id].efficiency.kernels
    return kf is not None and (kf.compose or "moe" in kf.terms)


def moe_shares(norm: pd.DataFrame, catalog: Catalog) -> pd.DataFrame:
    """Per measured decode row of a MoE model on hardware whose step times its MoE layers by a kernel curve
    (aggregated rows, and disaggregated rows that record their workers): ``hw``, ``curve`` (``moe/ENGINE/FORMAT``,
    the curve that engine would use) and ``share``, the curve's MoE time of one step at the row's batch (its drafts
    included) over the measured step (TPOT times ``1 + drafts``: ``bench/kernel_vs_e2e.py`` prints the same share)."""
    ok = norm[(norm["reason"] == "") & (norm["m_tpot"] > 0) & ~norm["n_workers_assumed"].astype(bool)]
    frames = []
    for (hid, eng, mid, ed, mode), g in ok.groupby(["n_hw", "n_engine", "n_model", "n_expert", "n_mode"], sort=False):
        m = catalog.models[mid]
        s = P.model_stats(m)
        if not s.experts or not _timed(catalog, hid):
            continue
        hw = catalog.hardware[hid]
        kf = hw.efficiency.kernels
        _, fmt = C.pick(kf, "moe", eng, C.MOE_FORMAT.get(ed, ("bf16",)))
        if fmt is None:
            continue
        x = "a" if mode == "agg" else "d"
        tp, ep, pp, dp = (g[f"{x}_{k}"].to_numpy(float) for k in ("tp", "ep", "pp", "dp"))
        drafts = g["n_spec"].fillna(0.0).to_numpy(float)
        tokens = g[f"{x}_batch"].to_numpy(float) * (1.0 + drafts)
        plain = kf.model_copy(update={"overruled": []})
        t = C.moe_gemm_time(plain, eng, m, hw, ed, tokens, ep, tp * dp, s.moe_layers / pp, 1.0, 1.0, 1.0, dp)
        if t is None:
            continue
        # the measured step: TPOT times the most tokens a step can yield (1 + drafts), so that it bounds the step from
        # above whatever the drafts' acceptance
        step_ms = g["m_tpot"].to_numpy(float) * (1.0 + drafts)
        frames.append(pd.DataFrame({"hw": hid, "curve": f"moe/{eng}/{fmt}",
                                    "share": np.asarray(t, dtype=float) * 1e3 / step_ms}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["hw", "curve", "share"])


def overruled_moe(norm: pd.DataFrame, catalog: Catalog) -> dict[str, list[str]]:
    """Per hardware, the fused-MoE curves its engines' measured rows contradict (see the module's text)."""
    sh = moe_shares(norm, catalog)
    out: dict[str, list[str]] = {}
    for (hid, key), g in sh.groupby(["hw", "curve"]):
        q = float(g["share"].quantile(OVERRULE_QUANTILE))
        if len(g) >= OVERRULE_MIN_ROWS and q > 1.0:
            out.setdefault(hid, []).append(key)
            log.info("%s: %s overruled (its MoE time alone over the measured TPOT: p%d %.2f over %d rows)", hid, key,
                     round(OVERRULE_QUANTILE * 100), q, len(g))
    return {h: sorted(v) for h, v in out.items()}


def with_overruled(catalog: Catalog, overruled: dict[str, list[str]]) -> Catalog:
    """``catalog`` with each kernel block's ``overruled`` set from ``overruled`` (empty for hardware not in it)."""
    hw = {h: s.model_copy(update={"efficiency": s.efficiency.model_copy(update={
        "kernels": s.efficiency.kernels.model_copy(update={"overruled": list(overruled.get(h, []))})})})
          if s.efficiency.kernels is not None else s for h, s in catalog.hardware.items()}
    return replace(catalog, hardware=hw)
