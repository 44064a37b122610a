"""Error metrics of predictions against measured rows: absolute percentage error |pred/meas - 1| of TPOT,
TTFT and output throughput per GPU, overall and per group, for either measured-data format."""

from __future__ import annotations

import numpy as np
import pandas as pd

from planner.calib.checks import unsteady

CONC_BANDS = ([0, 8, 64, 512, np.inf], ["1-8", "9-64", "65-512", ">512"])
"""Concurrency bands (requests in flight) the report groups by."""
DEPLOYMENT_LABELS = ("recorded", "workers assumed", "unsteady sweep")
"""Whether a row records its whole deployment, or is a disaggregated row without worker counts (and batch sizes)
whose deployment the prediction assumes (:func:`planner.calib.predict.predict_normalised`), or records it but
belongs to a concurrency sweep not measured in a steady state (:func:`planner.calib.checks.inconsistent_sweeps`,
left out of the fit): reported apart, since the second's error includes the guess and the third's the
measurement's."""
METRICS = (("tpot", "TPOT"), ("ttft", "TTFT"), ("otpg", "output tok/s/GPU"))
TAIL_METRICS = (("ttft_p99", "p99 TTFT"), ("tpot_p99", "p99 TPOT"), ("itl_p50", "median ITL"), ("itl_p99", "p99 ITL"))
"""The tails a benchmark run records beside its medians (InferenceX), predicted by ``perf/latency.py``'s
closed-loop distributions."""


def ape(pred: pd.Series, meas: pd.Series) -> pd.Series:
    return (pd.to_numeric(pred, errors="coerce") / pd.to_numeric(meas, errors="coerce") - 1.0).abs()


def evaluation_frame(meas, pred: pd.DataFrame, note: pd.Series | None = None) -> pd.DataFrame:
    """One row per measured configuration of a :class:`planner.calib.data.Measured` file with its
    predictions ``pred`` (from ``predict_normalised``): the grouping columns every report uses (system,
    engine, framework, model, mode, speculative decoding, concurrency band, lengths), measured and
    predicted values and their absolute percentage errors."""
    n, raw = meas.norm, meas.raw
    f = pd.DataFrame(index=n.index)
    f["source"] = meas.path.name
    if meas.fmt == "silicon":
        f["system"] = raw["system"].astype(str)
        f["framework"] = raw["backend"].astype(str)
        f["model"] = raw["model_path"].astype(str)
        f["lengths"] = raw["isl"].astype(str) + "x" + raw["osl"].astype(str)
        f["row"] = raw["id"].astype(str) if "id" in raw.columns else raw.index.astype(str)
    else:
        f["system"] = raw["hardware"].astype(str)
        f["framework"] = raw["framework"].astype(str)
        f["model"] = raw["model"].astype(str)
        f["lengths"] = raw["isl"].astype(str) + "x" + raw["osl"].astype(str)
        f["row"] = raw["run_index"].astype(str)
    f["engine"] = n["n_engine"].astype(str)
    f["mode"] = n["n_mode"].astype(str)
    f["spec"] = np.where(pd.to_numeric(n.get("n_spec"), errors="coerce").fillna(0.0) > 0, "on", "off")
    f["conc"] = pd.to_numeric(n["n_conc"], errors="coerce")
    f["conc_band"] = pd.cut(f["conc"], CONC_BANDS[0], labels=CONC_BANDS[1])
    f["complete"] = ~n["n_workers_assumed"].astype(bool)
    f["deployment"] = np.where(~f["complete"], DEPLOYMENT_LABELS[1],
                               np.where(unsteady(n), DEPLOYMENT_LABELS[2], DEPLOYMENT_LABELS[0]))
    for key, col in (("tpot", "m_tpot"), ("ttft", "m_ttft"), ("otpg", "m_otpg")):
        f[f"measured_{key}"] = pd.to_numeric(n[col], errors="coerce")
    f["predicted_tpot"] = pred["predicted_tpot_ms"]
    f["predicted_ttft"] = pred["predicted_ttft_ms"]
    f["predicted_otpg"] = pred["predicted_output_tput_per_gpu"]
    for key, _ in METRICS:
        f[f"ape_{key}"] = ape(f[f"predicted_{key}"], f[f"measured_{key}"])
    for key, _ in TAIL_METRICS:
        if f"m_{key}" in n.columns and f"predicted_{key}_ms" in pred.columns:
            f[f"measured_{key}"] = pd.to_numeric(n[f"m_{key}"], errors="coerce")
            f[f"predicted_{key}"] = pred[f"predicted_{key}_ms"]
            f[f"ape_{key}"] = ape(f[f"predicted_{key}"], f[f"measured_{key}"])
            f[f"ratio_{key}"] = pd.to_numeric(f[f"predicted_{key}"], errors="coerce") / f[f"measured_{key}"]
    f["note"] = note if note is not None else n["reason"]
    return f


def summary_rows(frame: pd.DataFrame, by: list[str] | None) -> list[dict]:
    """Median and p90 APE of TTFT, TPOT and output throughput per GPU (where measured), overall
    (``by=None``) or per group."""
    groups = [((), frame)] if not by else list(frame.groupby(by, sort=True, observed=True))
    rows = []
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        pred_ok = g["ape_tpot"].notna() & g["ape_ttft"].notna()
        row = {k: v for k, v in zip(by or [], key, strict=False)}
        row.update(rows=int(len(g)), predicted=int(pred_ok.sum()), coverage=float(pred_ok.mean()) if len(g) else float("nan"))
        for m, _ in METRICS + TAIL_METRICS:
            if f"ape_{m}" not in g.columns and (m, _) in TAIL_METRICS:
                continue
            col = g[f"ape_{m}"] if f"ape_{m}" in g.columns else pd.Series(dtype=float)
            row[f"{m}_median_ape"] = float(col.median()) if col.notna().any() else float("nan")
            row[f"{m}_p90_ape"] = float(col.quantile(0.9)) if col.notna().any() else float("nan")
            if f"ratio_{m}" in g.columns:
                r = g[f"ratio_{m}"]
                row[f"{m}_median_ratio"] = float(r.median()) if r.notna().any() else float("nan")
        rows.append(row)
    return rows


def silicon_frame(pred_frame: pd.DataFrame) -> pd.DataFrame:
    """An evaluation frame from ``predict_frame`` output (silicon_calibration.csv columns)."""
    f = pred_frame.copy()
    f["ape_ttft"] = ape(f["predicted_ttft_ms"], f["silicon_ttft_ms"])
    f["ape_tpot"] = ape(f["predicted_tpot_ms"], f["silicon_tpot_ms"])
    f["ape_otpg"] = np.nan
    return f


def with_errors(pred_frame: pd.DataFrame) -> pd.DataFrame:
    """Silicon prediction frame with ``ape_*`` columns (kept for the report's silicon tables)."""
    return silicon_frame(pred_frame)


def validation_summary(pred_frame: pd.DataFrame) -> dict:
    """``{"overall": {...}, "by_system": [...], "by_backend": [...], "by_model": [...], "by_mode": [...]}`` of a
    silicon prediction frame."""
    if "silicon_ttft_ms" not in pred_frame or "silicon_tpot_ms" not in pred_frame:
        raise KeyError("silicon_ttft_ms")
    f = silicon_frame(pred_frame)
    out = {"overall": summary_rows(f, None)[0]}
    for name, col in (("by_system", "system"), ("by_backend", "backend"), ("by_model", "model_path"), ("by_mode", "mode")):
        out[name] = summary_rows(f, [col])
    return out


def frame_summary(frame: pd.DataFrame) -> dict:
    """The ``planner validate --json`` document for an evaluation frame."""
    out = {"overall": summary_rows(frame, None)[0]}
    for name, cols in (("by_system", ["system"]), ("by_engine", ["engine"]), ("by_framework", ["framework"]),
                       ("by_mode", ["mode"]), ("by_spec", ["spec"]), ("by_concurrency", ["conc_band"]),
                       ("by_model", ["model"]), ("by_deployment", ["deployment"])):
        out[name] = summary_rows(frame, cols)
    # ``by_backend``: the framework as the file names it, under the key earlier versions used.
    out["by_backend"] = [{("backend" if k == "framework" else k): v for k, v in r.items()} for r in out["by_framework"]]
    return out


def format_table(rows: list[dict], key_cols: list[str]) -> str:
    """Markdown table of :func:`summary_rows`; throughput columns only where some row measured them."""
    tput = any(np.isfinite(r.get("otpg_median_ape", np.nan)) for r in rows)
    head = key_cols + ["rows", "predicted", "TPOT median", "TPOT p90", "TTFT median", "TTFT p90"]
    if tput:
        head += ["tok/s/GPU median", "tok/s/GPU p90"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        vals = [str(r[k]) for k in key_cols] + [
            str(r["rows"]),
            f"{r['predicted']} ({100 * r['coverage']:.0f}%)",
            _pct(r["tpot_median_ape"]),
            _pct(r["tpot_p90_ape"]),
            _pct(r["ttft_median_ape"]),
            _pct(r["ttft_p90_ape"]),
        ]
        if tput:
            vals += [_pct(r.get("otpg_median_ape")), _pct(r.get("otpg_p90_ape"))]
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{100 * x:.1f}%"


def format_tail_table(rows: list[dict], key_cols: list[str]) -> str:
    """Markdown table of the tails' errors (median and p90 APE, and the median predicted / measured) where the
    rows carry them; empty where none does."""
    have = [(m, label) for m, label in TAIL_METRICS if any(f"{m}_median_ape" in r for r in rows)]
    if not have:
        return ""
    head = key_cols + ["rows"] + [f"{label} {x}" for _, label in have for x in ("median", "p90", "pred/meas")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        vals = [str(r[k]) for k in key_cols] + [str(r["rows"])]
        for m, _ in have:
            ratio = r.get(f"{m}_median_ratio", float("nan"))
            vals += [_pct(r.get(f"{m}_median_ape")), _pct(r.get(f"{m}_p90_ape")),
                     "n/a" if not np.isfinite(ratio) else f"{ratio:.2f}"]
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines)
