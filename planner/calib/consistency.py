"""Kernel curves that an engine's own measured steps contradict (``KernelFits.overruled``).

The fused-MoE rows of the kernel data were measured by a collector that runs one kernel path per engine and expert
format (TensorRT-LLM's CUTLASS w4a16 MoE for MXFP4 experts on Hopper, say). A deployment of the same engine may run
another path (a Triton or Marlin kernel, a DeepGEMM backend) that is faster. Where the curve's MoE layers alone take
longer than the whole measured decode step, the engine did not run that kernel: a step also holds attention, the
dense GEMMs, communication and overheads. This module finds the (hardware, engine, format) combinations where that
happens on more than a tenth of the engine's measured rows (:data:`OVERRULE_QUANTILE`), with at least
:data:`OVERRULE_MIN_ROWS` rows to judge by; ``planner calibrate fit`` then times their MoE layers on the roofline with
fitted factors, as on hardware without curves. Rows are measured runs of the data the fit is given; the curve is
evaluated at each row's own decode batch and layout with uniform routing (no imbalance: leaning towards keeping a
curve) and its fixed latency paid in full (the kernel as measured: leaning towards overruling it), against the
longest the measured step can be, TPOT times ``1 + drafts``.

Dense GEMM curves are judged the same way where the step times its non-expert GEMMs by them (the ``gemm`` term): the
curve's attention projections, dense and shared FFNs and LM head of one step at the row's tokens per attention rank,
against the measured step (the collector's block-scaled FP8 GEMM for vLLM on Blackwell, 12 TFLOP/s at 16 rows, is not
the kernel vLLM's serving rows ran).
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
"""A curve is overruled where this quantile of (its MoE time / the measured step, TPOT x (1 + drafts)) over an engine's
rows exceeds 1."""
OVERRULE_MIN_ROWS = 20
"""Fewest measured rows of a (hardware, engine, format) to overrule its curve on."""


def _timed(catalog: Catalog, hw_id: str, term: str = "moe") -> bool:
    kf = catalog.hardware[hw_id].efficiency.kernels
    return kf is not None and (kf.compose or term in kf.terms)


def moe_shares(norm: pd.DataFrame, catalog: Catalog, modes: tuple[str, ...] = ("agg", "disagg")) -> pd.DataFrame:
    """Per measured decode row of a MoE model on hardware whose step times its MoE layers by a kernel curve (rows of
    ``modes``; disaggregated ones only where they record their workers), indexed as ``norm``: ``hw``, ``engine``,
    ``model``, ``expert``, ``fmt`` and ``curve`` (``moe/ENGINE/FORMAT``, the curve that engine would use, overruled or
    not), ``spec`` (``on`` / ``off``), and ``share`` (``share_no_fixed``): the curve's MoE time of one step at the
    row's batch (drafts included), with (without) its fixed latency, over the measured step (TPOT times
    ``1 + drafts``, the longest a step can be whatever the drafts' acceptance; ``bench/kernel_vs_e2e.py`` prints it)."""
    ok = norm[(norm["reason"] == "") & (norm["m_tpot"] > 0) & ~norm["n_workers_assumed"].astype(bool)
              & norm["n_mode"].isin(modes)]
    frames = []
    for (hid, eng, mid, ed, mode), g in ok.groupby(["n_hw", "n_engine", "n_model", "n_expert", "n_mode"], sort=False):
        m = catalog.models[mid]
        s = P.model_stats(m)
        if not s.experts or not _timed(catalog, hid):
            continue
        hw = catalog.hardware[hid]
        kf = hw.efficiency.kernels.model_copy(update={"overruled": []})  # the curve itself
        _, fmt = C.pick(kf, "moe", eng, C.formats(C.MOE_FORMAT, m, ed))
        if fmt is None:
            continue
        x = "a" if mode == "agg" else "d"
        tp, ep, pp, dp = (g[f"{x}_{k}"].to_numpy(float) for k in ("tp", "ep", "pp", "dp"))
        drafts = g["n_spec"].fillna(0.0).to_numpy(float) if "n_spec" in g.columns else np.zeros(len(g))
        tokens = g[f"{x}_batch"].to_numpy(float) * (1.0 + drafts)
        times = [C.moe_gemm_time(kf, eng, m, hw, ed, tokens, ep, tp * dp, s.moe_layers / pp, 1.0, 1.0, fixed, dp)
                 for fixed in (1.0, 0.0)]
        step_ms = g["m_tpot"].to_numpy(float) * (1.0 + drafts)
        frames.append(pd.DataFrame({"hw": hid, "engine": eng, "model": mid, "expert": ed, "fmt": fmt,
                                    "curve": f"moe/{eng}/{fmt}", "spec": np.where(drafts > 0, "on", "off"),
                                    "share": np.asarray(times[0], dtype=float) * 1e3 / step_ms,
                                    "share_no_fixed": np.asarray(times[1], dtype=float) * 1e3 / step_ms},
                                   index=g.index))
    cols = ["hw", "engine", "model", "expert", "fmt", "curve", "spec", "share", "share_no_fixed"]
    return pd.concat(frames) if frames else pd.DataFrame(columns=cols)


def gemm_shares(norm: pd.DataFrame, catalog: Catalog) -> pd.DataFrame:
    """As :func:`moe_shares` for the non-expert GEMMs of every measured decode row on hardware whose step times them by
    its dense GEMM curve (``gemm`` term): ``dense`` is the row's dense weight format, ``curve`` ``gemm/ENGINE/FORMAT``,
    ``share`` the curve's GEMM time of one step at the row's tokens per attention rank (drafts included, fixed latency
    in full) over TPOT x (1 + drafts)."""
    ok = norm[(norm["reason"] == "") & (norm["m_tpot"] > 0) & ~norm["n_workers_assumed"].astype(bool)]
    frames = []
    for (hid, eng, mid, dd, mode), g in ok.groupby(["n_hw", "n_engine", "n_model", "n_dense", "n_mode"], sort=False):
        if not _timed(catalog, hid, "gemm"):
            continue
        m = catalog.models[mid]
        s = P.model_stats(m)
        hw = catalog.hardware[hid]
        kf = hw.efficiency.kernels.model_copy(update={"overruled": []})
        _, fmt = C.pick(kf, "gemm", eng, C.formats(C.GEMM_FORMAT, m, dd))
        if fmt is None:
            continue
        x = "a" if mode == "agg" else "d"
        tp, pp, dp = (g[f"{x}_{k}"].to_numpy(float) for k in ("tp", "pp", "dp"))
        drafts = g["n_spec"].fillna(0.0).to_numpy(float) if "n_spec" in g.columns else np.zeros(len(g))
        rows = g[f"{x}_batch"].to_numpy(float) * (1.0 + drafts) / np.maximum(dp, 1.0)
        t = C.dense_gemm_time(kf, eng, m, hw, dd, rows, tp, m.architecture.layers / pp, s.moe_layers / pp, 1.0 / pp)
        step_ms = g["m_tpot"].to_numpy(float) * (1.0 + drafts)
        frames.append(pd.DataFrame({"hw": hid, "engine": eng, "model": mid, "dense": dd, "fmt": fmt,
                                    "curve": f"gemm/{eng}/{fmt}", "spec": np.where(drafts > 0, "on", "off"),
                                    "share": np.asarray(t, dtype=float) * 1e3 / step_ms}, index=g.index))
    cols = ["hw", "engine", "model", "dense", "fmt", "curve", "spec", "share"]
    return pd.concat(frames) if frames else pd.DataFrame(columns=cols)


def with_term(catalog: Catalog, term: str) -> Catalog:
    """``catalog`` with ``term`` among the terms of every kernel block (what the step would take were it on)."""
    return update_kernels(catalog, {h: {"terms": [*s.efficiency.kernels.terms, *([] if term in s.efficiency.kernels.terms
                                                                                 else [term])]}
                                    for h, s in catalog.hardware.items() if s.efficiency.kernels is not None})


def overruled_curves(norm: pd.DataFrame, catalog: Catalog) -> dict[str, list[str]]:
    """Per hardware, the fused-MoE and dense GEMM curves its engines' measured rows contradict (see the module's
    text)."""
    cols = ["hw", "curve", "share"]
    sh = pd.concat([moe_shares(norm, catalog)[cols], gemm_shares(norm, catalog)[cols]])
    out: dict[str, list[str]] = {}
    for (hid, key), g in sh.groupby(["hw", "curve"]):
        q = float(g["share"].quantile(OVERRULE_QUANTILE))
        if len(g) >= OVERRULE_MIN_ROWS and q > 1.0:
            out.setdefault(hid, []).append(key)
            log.info("%s: %s overruled (its time alone over the measured step: p%d %.2f over %d rows)", hid, key,
                     round(OVERRULE_QUANTILE * 100), q, len(g))
    return {h: sorted(v) for h, v in out.items()}


def update_kernels(catalog: Catalog, update: dict[str, dict]) -> Catalog:
    """``catalog`` with the kernel block of each hardware in ``update`` updated by its fields (hardware without a
    kernel block left as it is)."""
    hw = {h: s.model_copy(update={"efficiency": s.efficiency.model_copy(update={
        "kernels": s.efficiency.kernels.model_copy(update=update[h])})})
          if h in update and s.efficiency.kernels is not None else s for h, s in catalog.hardware.items()}
    return replace(catalog, hardware=hw)


def with_overruled(catalog: Catalog, overruled: dict[str, list[str]]) -> Catalog:
    """``catalog`` with each kernel block's ``overruled`` set from ``overruled`` (empty for hardware not in it)."""
    return update_kernels(catalog, {h: {"overruled": list(overruled.get(h, []))} for h in catalog.hardware})
