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


FAMILIES = {"moe": ("n_expert", C.MOE_FORMAT), "gemm": ("n_dense", C.GEMM_FORMAT)}
"""Per judged curve family: the row's weight-format column and the format table its curve is picked from."""


def _groups(norm: pd.DataFrame, catalog: Catalog, family: str, modes: tuple[str, ...]):
    """Per (hardware, engine, model, format, mode) group of measured decode rows of ``modes`` (disaggregated ones only
    where they record their workers) on hardware whose step times ``family`` by a curve: (group, model, hardware,
    its kernel block with nothing overruled, the row's format, the curve's format, the layout column prefix, drafts
    a step, the measured step in ms: TPOT x (1 + drafts), the longest a step can be whatever the drafts' acceptance)."""
    col, table = FAMILIES[family]
    ok = norm[(norm["reason"] == "") & (norm["m_tpot"] > 0) & ~norm["n_workers_assumed"].astype(bool)
              & norm["n_mode"].isin(modes)]
    for (hid, eng, mid, dt, mode), g in ok.groupby(["n_hw", "n_engine", "n_model", col, "n_mode"], sort=False):
        m = catalog.models[mid]
        if (family == "moe" and not P.model_stats(m).experts) or not _timed(catalog, hid, family):
            continue
        hw = catalog.hardware[hid]
        kf = hw.efficiency.kernels.model_copy(update={"overruled": []})  # the curve itself
        _, fmt = C.pick(kf, family, eng, C.formats(table, m, dt))
        if fmt is None:
            continue
        drafts = g["n_spec"].fillna(0.0).to_numpy(float) if "n_spec" in g.columns else np.zeros(len(g))
        yield g, m, hw, kf, dt, fmt, "a" if mode == "agg" else "d", drafts, g["m_tpot"].to_numpy(float) * (1.0 + drafts)


def _frame(g, family: str, dtype_key: str, dt: str, fmt: str, drafts, shares: dict) -> pd.DataFrame:
    """One group's rows of :func:`moe_shares` or :func:`gemm_shares`."""
    eng = g["n_engine"].iloc[0]
    return pd.DataFrame({"hw": g["n_hw"].iloc[0], "engine": eng, "model": g["n_model"].iloc[0], dtype_key: dt, "fmt": fmt,
                         "curve": f"{family}/{eng}/{fmt}", "spec": np.where(drafts > 0, "on", "off"), **shares},
                        index=g.index)


def moe_shares(norm: pd.DataFrame, catalog: Catalog, modes: tuple[str, ...] = ("agg", "disagg")) -> pd.DataFrame:
    """Per measured decode row of a MoE model on hardware whose step times its MoE layers by a kernel curve (rows of
    ``modes``; disaggregated ones only where they record their workers), indexed as ``norm``: ``hw``, ``engine``,
    ``model``, ``expert``, ``fmt`` and ``curve`` (``moe/ENGINE/FORMAT``, the curve that engine would use, overruled or
    not), ``spec`` (``on`` / ``off``), and ``share`` (``share_no_fixed``): the curve's MoE time of one step at the
    row's batch (drafts included), with (without) its fixed latency, over the measured step (TPOT times
    ``1 + drafts``, the longest a step can be whatever the drafts' acceptance; ``bench/kernel_vs_e2e.py`` prints it)."""
    frames = []
    for g, m, hw, kf, ed, fmt, x, drafts, step_ms in _groups(norm, catalog, "moe", modes):
        tp, ep, pp, dp = (g[f"{x}_{k}"].to_numpy(float) for k in ("tp", "ep", "pp", "dp"))
        tokens = g[f"{x}_batch"].to_numpy(float) * (1.0 + drafts)
        layers = P.model_stats(m).moe_layers / pp
        eng = g["n_engine"].iloc[0]
        share = {k: np.asarray(C.moe_gemm_time(kf, eng, m, hw, ed, tokens, ep, tp * dp, layers, 1.0, 1.0, fixed, dp),
                               dtype=float) * 1e3 / step_ms for k, fixed in (("share", 1.0), ("share_no_fixed", 0.0))}
        frames.append(_frame(g, "moe", "expert", ed, fmt, drafts, share))
    cols = ["hw", "engine", "model", "expert", "fmt", "curve", "spec", "share", "share_no_fixed"]
    return pd.concat(frames) if frames else pd.DataFrame(columns=cols)


def gemm_shares(norm: pd.DataFrame, catalog: Catalog) -> pd.DataFrame:
    """As :func:`moe_shares` for the non-expert GEMMs of every measured decode row on hardware whose step times them by
    its dense GEMM curve (``gemm`` term): ``dense`` is the row's dense weight format, ``curve`` ``gemm/ENGINE/FORMAT``,
    ``share`` the curve's GEMM time of one step at the row's tokens per attention rank (drafts included, fixed latency
    in full) over TPOT x (1 + drafts)."""
    frames = []
    for g, m, hw, kf, dd, fmt, x, drafts, step_ms in _groups(norm, catalog, "gemm", ("agg", "disagg")):
        tp, pp, dp = (g[f"{x}_{k}"].to_numpy(float) for k in ("tp", "pp", "dp"))
        rows = g[f"{x}_batch"].to_numpy(float) * (1.0 + drafts) / np.maximum(dp, 1.0)
        t = C.dense_gemm_time(kf, g["n_engine"].iloc[0], m, hw, dd, rows, tp, m.architecture.layers / pp,
                              P.model_stats(m).moe_layers / pp, 1.0 / pp)
        frames.append(_frame(g, "gemm", "dense", dd, fmt, drafts,
                             {"share": np.asarray(t, dtype=float) * 1e3 / step_ms}))
    cols = ["hw", "engine", "model", "dense", "fmt", "curve", "spec", "share"]
    return pd.concat(frames) if frames else pd.DataFrame(columns=cols)


def with_term(catalog: Catalog, term: str) -> Catalog:
    """``catalog`` with ``term`` among the terms of every kernel block (what the step would take were it on)."""
    blocks = {h: s.efficiency.kernels for h, s in catalog.hardware.items() if s.efficiency.kernels is not None}
    return update_kernels(catalog, {h: {"terms": kf.terms + ([] if term in kf.terms else [term])}
                                    for h, kf in blocks.items()})


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
