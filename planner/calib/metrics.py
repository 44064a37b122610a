"""Error metrics of predictions against measured rows: absolute percentage error |pred/meas - 1|."""

from __future__ import annotations

import numpy as np
import pandas as pd


def ape(pred: pd.Series, meas: pd.Series) -> pd.Series:
    return (pd.to_numeric(pred, errors="coerce") / pd.to_numeric(meas, errors="coerce") - 1.0).abs()


def summary_rows(frame: pd.DataFrame, by: list[str] | None) -> list[dict]:
    """Median and p90 APE of TTFT and TPOT, overall (``by=None``) or per group."""
    groups = [((), frame)] if not by else list(frame.groupby(by, sort=True))
    rows = []
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        pred_ok = g["ape_tpot"].notna() & g["ape_ttft"].notna()
        row = {k: v for k, v in zip(by or [], key, strict=False)}
        row.update(
            rows=int(len(g)),
            predicted=int(pred_ok.sum()),
            coverage=float(pred_ok.mean()) if len(g) else float("nan"),
            tpot_median_ape=float(g["ape_tpot"].median()),
            tpot_p90_ape=float(g["ape_tpot"].quantile(0.9)),
            ttft_median_ape=float(g["ape_ttft"].median()),
            ttft_p90_ape=float(g["ape_ttft"].quantile(0.9)),
        )
        rows.append(row)
    return rows


def with_errors(pred_frame: pd.DataFrame) -> pd.DataFrame:
    f = pred_frame.copy()
    f["ape_ttft"] = ape(f["predicted_ttft_ms"], f["silicon_ttft_ms"])
    f["ape_tpot"] = ape(f["predicted_tpot_ms"], f["silicon_tpot_ms"])
    return f


def validation_summary(pred_frame: pd.DataFrame) -> dict:
    """``{"overall": {...}, "by_system": [...], "by_backend": [...], "by_model": [...], "by_mode": [...]}``."""
    f = with_errors(pred_frame)
    if "silicon_ttft_ms" not in f or "silicon_tpot_ms" not in f:
        raise KeyError("silicon_ttft_ms")
    out = {"overall": summary_rows(f, None)[0]}
    for name, col in (("by_system", "system"), ("by_backend", "backend"), ("by_model", "model_path"), ("by_mode", "mode")):
        out[name] = summary_rows(f, [col])
    return out


def format_table(rows: list[dict], key_cols: list[str]) -> str:
    head = key_cols + ["rows", "predicted", "TPOT median", "TPOT p90", "TTFT median", "TTFT p90"]
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
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines)


def _pct(x: float) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{100 * x:.1f}%"
