"""Read measured rows (the column format of shared/calibration/silicon_calibration.csv) into a
normalised table: catalog ids, number formats, layouts, batch and concurrency per worker.

Conventions of the data (checked on the calibration file): ``batch_size`` is per attention-data-
parallel rank (``batch_size * attention_dp_size == concurrency`` on every agg row), GPUs per worker
are ``tp * pp * attention_dp`` and the MoE group (``moe_tp * moe_ep``) spans a pipeline stage.
Disaggregated rows without worker counts are flagged (``n_workers_assumed``); ``predict`` sizes their
pools. Draft tokens of speculative decoding are read where a ``spec_tokens`` or
``num_speculative_tokens`` column gives them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from planner.calib.checks import finish
from planner.catalog import Catalog
from planner.errors import InputError
from planner.perf.roofline import MAX_SPEC_TOKENS

REQUIRED = ["model_path", "system", "backend", "mode", "isl", "osl"]
QUANT = {"fp8": "fp8", "fp8_block": "fp8", "fp8_blockwise": "fp8", "nvfp4": "fp4", "mxfp4": "fp4", "fp4": "fp4",
         "bf16": "bf16", "fp16": "fp16", "float16": "fp16", "int4": "int4", "w4a16": "int4", "int8": "int8"}


MEASURED = ["silicon_ttft_ms", "silicon_tpot_ms"]
LAYOUT_COLUMNS = {"tp": "tp_size", "ep": "moe_ep_size", "pp": "pp_size", "dp": "attention_dp_size"}
SPEC_COLUMNS = ["spec_tokens", "num_speculative_tokens"]
"""Optional columns with the draft tokens per step of speculative decoding (MTP / EAGLE)."""
ENGINE_ALIASES = {"tensorrt-llm": "trtllm", "tensorrt_llm": "trtllm", "trt-llm": "trtllm", "trt_llm": "trtllm"}
"""Other spellings of the engine names the efficiency blocks, KV formats and admission policy key on."""


FORMATS = ("silicon", "inferencex")
"""Measured-data formats: ``silicon`` (the CSV columns of silicon_calibration.csv) and ``inferencex``
(a JSON array of SemiAnalysis InferenceX runs)."""


@dataclass
class Measured:
    """One measured-data file read and normalised: ``raw`` as read (one row per measured configuration,
    file order), ``norm`` the normalised frame with the measured ``m_ttft``/``m_tpot`` (ms) and ``m_otpg``
    (output tokens/s per GPU, where recorded), and ``reason`` where a row cannot be predicted."""

    path: Path
    fmt: str
    raw: pd.DataFrame
    norm: pd.DataFrame


def detect_format(path: Path | str) -> str:
    """``inferencex`` for a JSON array, ``silicon`` for a CSV (by the first non-blank byte)."""
    from planner.catalog.inputs import MAX_DATA_BYTES, read_bytes

    head = read_bytes(path, limit=MAX_DATA_BYTES)[:4096].lstrip(b"\xef\xbb\xbf \t\r\n")
    if head[:1] in (b"[", b"{"):
        return "inferencex"
    return "silicon"


def load_measured(path: Path | str, catalog: Catalog, *, fmt: str | None = None, measured: bool = False) -> Measured:
    """Read and normalise a measured-data file of either format (detected unless ``fmt`` names it);
    ``measured`` requires the measured latency columns (fit, validate, report)."""
    path = Path(path)
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise InputError(f"--format: unknown format '{fmt}'; use {' or '.join(FORMATS)}")
    if fmt == "inferencex":
        from planner.calib.inferencex import normalise_runs, read_runs

        raw = read_runs(path)
        return Measured(path, fmt, raw, normalise_runs(raw, catalog))
    raw = read_rows(path, measured=measured)
    return Measured(path, fmt, raw, normalise(raw, catalog))


def read_rows(path: Path | str, *, measured: bool = False) -> pd.DataFrame:
    """Read measured rows; with ``measured`` also require the measured TTFT/TPOT columns (fit, validate, report)."""
    from planner.catalog.inputs import read_csv

    path = Path(path)
    df = read_csv(path)
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)} (expected the silicon_calibration.csv format)")
    if measured:
        for col in MEASURED:
            if col not in df.columns:
                raise InputError(f"{path}: column '{col}' is missing (fitting and validation need measured values)")
    if df.empty:
        raise InputError(f"{path}: no rows below the header; add measured rows")
    return df


def _num(df: pd.DataFrame, col: str, default: float = np.nan) -> pd.Series:
    if col not in df.columns:
        return pd.Series(default, index=df.index, dtype=float)
    return pd.to_numeric(df[col], errors="coerce")


def _pos(s: pd.Series, default: float = 1.0) -> pd.Series:
    """Layout degrees: missing or zero means 1."""
    return s.where(s > 0, default).fillna(default)


def _dtype_from_name(name: str) -> str | None:
    n = name.lower()
    if "nvfp4" in n or n.endswith("-fp4") or "-fp4-" in n:
        return "fp4"
    if "fp8" in n:
        return "fp8"
    return None


def _squared_moe_grid(tp: pd.Series, dp: pd.Series, ep: pd.Series, mtp: pd.Series, domain: pd.Series):
    """Read a layout recorded as ``moe_tp = moe_ep = k`` with a ``k * k``-GPU attention group (``tp`` or
    ``attention_dp`` equal to ``k * k``, the other 1) that would not fit one scale-up domain as the
    ``k``-GPU layout it is: ``k``-way TP or attention DP with ``k``-way expert parallelism.

    Such rows record the MoE grid's product (``moe_tp * moe_ep``) in the attention field, and the
    calibration file holds each of them twice, with identical measurements, once as the ``k``-GPU layout
    (e.g. "tp 64, moe_tp 8, moe_ep 8" and "tp 8, moe_ep 8"; "attention_dp 16, moe_tp 4, moe_ep 4" and
    "attention_dp 4, moe_ep 4"). A 64-way TP agg replica spread over eight 8-GPU nodes is also no
    deployment anyone runs. Grids that fit the domain (e.g. TP16 with moe_tp 4 x moe_ep 4 on an NVL72)
    are kept as recorded.
    """
    k = ep
    odd = (mtp == ep) & (k >= 4) & (tp * dp == k * k) & ((tp == 1) | (dp == 1)) & (k * k > domain)
    tp = tp.where(~odd | (tp == 1), k)
    dp = dp.where(~odd | (dp == 1), k)
    mtp = mtp.where(~odd, 1.0)
    return tp, dp, mtp


def _series(df: pd.DataFrame) -> pd.Series:
    """A concurrency sweep's series (:func:`planner.calib.checks.inconsistent_sweeps`): the file the row was read from
    (the first field of ``silicon_data_source``) and the engine's version."""
    empty = pd.Series("", index=df.index)
    src = df["silicon_data_source"].astype(str).str.split(";").str[0] if "silicon_data_source" in df.columns else empty
    ver = df["backend_version"].astype(str) if "backend_version" in df.columns else empty
    return src + "|" + ver


def normalise(df: pd.DataFrame, catalog: Catalog) -> pd.DataFrame:
    """Add normalised columns (prefixed ``n_``) and a ``reason`` where a row cannot be predicted."""
    out = pd.DataFrame(index=df.index)
    reason = pd.Series("", index=df.index, dtype=object)
    # empty text cells read as missing values: make them empty strings (numbers are parsed per column below)
    df = df.copy()
    for col in df.columns:
        if not pd.api.types.is_numeric_dtype(df[col]):
            df[col] = df[col].astype(object).where(df[col].notna(), "").astype(str)

    model_ids = df["model_path"].astype(str).map(lambda s: catalog.model_id(s) or "")
    hw_ids = df["system"].astype(str).map(lambda s: catalog.hardware_id(s) or "")
    reason[model_ids == ""] = "unknown model: " + df["model_path"].astype(str)
    reason[(hw_ids == "") & (reason == "")] = "unknown hardware: " + df["system"].astype(str)
    out["n_model"] = model_ids
    out["n_hw"] = hw_ids
    eng = df["backend"].astype(str).str.strip().str.lower()
    out["n_engine"] = eng.map(lambda e: catalog.engine_id(e) or ENGINE_ALIASES.get(e, e))
    out["n_mode"] = df["mode"].astype(str).str.lower()
    bad_mode = ~out["n_mode"].isin(["agg", "disagg"])
    reason[bad_mode & (reason == "")] = "mode must be agg or disagg"

    # Number formats -----------------------------------------------------------------------------
    dense, expert = [], []
    for i in df.index:
        mid = model_ids[i]
        if not mid:
            dense.append("")
            expert.append("")
            continue
        m = catalog.models[mid]
        g = str(df.at[i, "gemm_quant_mode"]) if "gemm_quant_mode" in df.columns else "nan"
        e = str(df.at[i, "moe_quant_mode"]) if "moe_quant_mode" in df.columns else "nan"
        pr = str(df.at[i, "precision"]) if "precision" in df.columns else "nan"
        by_name = _dtype_from_name(str(df.at[i, "model_path"]))
        d_ = QUANT.get(g.lower()) or QUANT.get(pr.lower()) or by_name or m.weights_dtype
        x_ = QUANT.get(e.lower()) or d_
        if m.expert_weights_dtype in ("fp4", "int4") and d_ == "fp4":
            # Checkpoints with native 4-bit experts (gpt-oss MXFP4) keep attention in their own format.
            d_, x_ = m.weights_dtype, m.expert_weights_dtype
        if not m.is_moe:
            x_ = d_
        dense.append(d_)
        expert.append(x_)
    out["n_dense"] = dense
    out["n_expert"] = expert
    # KV format: TensorRT-LLM serves quantised checkpoints with an FP8 KV cache; SGLang and vLLM keep
    # the model's activation format unless told otherwise.
    quant = out["n_dense"].isin(["fp8", "fp4"])
    out["n_kv"] = np.where((out["n_engine"] == "trtllm") & quant, "fp8", "bf16")

    out["n_isl"] = _num(df, "isl")
    out["n_osl"] = _num(df, "osl")
    conc = df["silicon_data_source"].astype(str).str.extract(r"silicon_concurrency=(\d+)")[0] \
        if "silicon_data_source" in df.columns else pd.Series(np.nan, index=df.index)
    out["n_conc"] = pd.to_numeric(conc, errors="coerce")
    if "concurrency" in df.columns:
        out["n_conc"] = out["n_conc"].fillna(_num(df, "concurrency"))

    # Speculative decoding: draft tokens per step where the file records them (0: off). Rows without the
    # column leave it open only where they also leave the deployment open (see ``predict``).
    spec = pd.Series(np.nan, index=df.index, dtype=float)
    for col in SPEC_COLUMNS:
        if col not in df.columns:
            continue
        v = _num(df, col)
        given = df[col].notna() & (df[col].astype(str).str.strip() != "")
        bad = given & ~v.between(0, MAX_SPEC_TOKENS)
        reason[bad & (reason == "")] = f"{col} must be a number of draft tokens from 0 to {MAX_SPEC_TOKENS}"
        spec = spec.fillna(v.where(~bad))
    out["n_spec"] = spec  # NaN: not recorded

    domain = hw_ids.map(lambda h: float(catalog.hardware[h].scale_up_domain_chips) if h else np.inf)

    # Aggregated layout ------------------------------------------------------------------------
    tp = _pos(_num(df, "tp_size"))
    pp = _pos(_num(df, "pp_size"))
    dp = _pos(_num(df, "attention_dp_size"))
    ep = _pos(_num(df, "moe_ep_size"))
    mtp = _pos(_num(df, "moe_tp_size"))
    dp_recorded = dp  # ``batch_size`` is per recorded attention-DP rank
    tp, dp, mtp = _squared_moe_grid(tp, dp, ep, mtp, domain)
    stage = np.maximum(tp * dp, mtp * ep)
    out["a_tp"], out["a_pp"], out["a_dp"], out["a_ep"] = tp, pp, dp * (stage / (tp * dp)), ep
    bs = _num(df, "batch_size")
    out["a_batch"] = (bs * dp_recorded).fillna(out["n_conc"])

    # Disaggregated layouts --------------------------------------------------------------------
    for role, pre in (("p", "prefill_"), ("d", "decode_")):
        t = _pos(_num(df, pre + "tp_size"))
        p = _pos(_num(df, pre + "pp_size"))
        d = _pos(_num(df, pre + "attention_dp_size"))
        e = _pos(_num(df, pre + "moe_ep_size"))
        mt = _pos(_num(df, pre + "moe_tp_size"))
        t, d, mt = _squared_moe_grid(t, d, e, mt, domain)
        st = np.maximum(t * d, mt * e)
        out[f"{role}_tp"], out[f"{role}_pp"], out[f"{role}_dp"], out[f"{role}_ep"] = t, p, d * (st / (t * d)), e
        out[f"{role}_workers"] = _pos(_num(df, pre + "num_workers"))
    out["n_workers_assumed"] = (out["n_mode"] == "disagg") & (
        _num(df, "prefill_num_workers").isna() | _num(df, "decode_num_workers").isna()
    )
    dbs = _num(df, "decode_batch_size")
    out["d_batch"] = (dbs * out["d_dp"]).fillna(out["n_conc"] / out["d_workers"])

    out["a_red"] = 0.0
    out["p_red"] = 0.0
    out["d_red"] = 0.0
    out["n_gpus_out"] = np.where(
        out["n_mode"] == "agg", out["a_tp"] * out["a_dp"] * out["a_pp"], out["d_tp"] * out["d_dp"] * out["d_pp"] * out["d_workers"]
    )
    out["n_framework"] = df["backend"].astype(str)
    out["n_series"] = _series(df)
    for col, src in (("m_ttft", "silicon_ttft_ms"), ("m_tpot", "silicon_tpot_ms")):
        out[col] = pd.to_numeric(df[src], errors="coerce") if src in df.columns else np.nan
    out["m_otpg"] = np.nan
    names = {role: {k: pre + c for k, c in {**LAYOUT_COLUMNS, "redundant": "redundant_experts"}.items()}
             for role, pre in (("a", ""), ("p", "prefill_"), ("d", "decode_"))}
    return finish(out, reason, catalog, names=names)






