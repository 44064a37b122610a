"""Where the kernel curves contradict the end-to-end rows: the fused-MoE curve's time for a decode step against the
measured TPOT of the same step.

For every aggregated measured row on hardware whose catalog entry times the MoE by its own kernel curves
(``KernelFits.terms`` holds ``moe``), the curve the step takes (:func:`planner.perf.compose.moe_gemm_time`, the
format and engine it would pick) is evaluated for the row's decode batch (tokens per step: the worker's batch, times
``1 + draft tokens`` where the row records speculative decoding), balanced routing, no redundant experts, over the
model's MoE layers per pipeline stage, against the measured step (TPOT times ``1 + draft tokens``, the most tokens a
step can yield, so that the step is bounded from above whatever the drafts' acceptance), twice: with the curve's fixed latency (``fixed=1``) and without it
(``fixed=0``, the streaming and maths alone). A step does at least this work, so where the MoE alone takes longer than
the whole measured step (``share > 1``) the curve is not what the engine ran for that row, or the row ran something
it does not record (speculative decoding the silicon format has no column for).

Then the same for the non-expert GEMMs (attention projections, dense and shared FFNs, LM head) of every measured row,
timed by the GEMM curve the ``gemm`` term would take (``planner.calib.consistency.gemm_shares``, the term put on every
kernel block for the table though the catalog keeps it off), per group the median and p90 share.

Also checks each disaggregated row that records its deployment against Little's law (the request rate its closed
loop completed, which its prefill pool sustained, over the catalog's prefill capacity), and every aggregated row
against the HBM floor of its decode step (the weights its batch touches and its KV
cache read once per GPU at the datasheet bandwidth): a row whose measured step is shorter cannot be what it says.

Prints, per (system, engine, model, expert format, curve, speculative decoding), the rows, the median share with and
without the fixed latency, how many rows exceed 1 without it, and the catalog's median predicted / measured TPOT of
those rows (``pred_meas``). Usage: ``python bench/kernel_vs_e2e.py [--data FILE ...]`` (default:
both calibration files under ``../shared/calibration``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.calib import fit as F  # noqa: E402
from planner.calib.consistency import gemm_shares, moe_shares, with_term  # noqa: E402
from planner.calib.data import load_measured  # noqa: E402
from planner.calib.predict import (  # noqa: E402
    _role_setup,
    catalog_efficiency,
    predict_normalised,  # noqa: E402
)
from planner.catalog.loader import load_catalog  # noqa: E402
from planner.errors import InputError  # noqa: E402
from planner.perf.roofline import Setup, decode_step  # noqa: E402
from planner.perf.serving import prefill_capacity_rps  # noqa: E402
from planner.perf.setup import engine_options  # noqa: E402

SHARED = ROOT.parent / "shared" / "calibration"
DATA = [SHARED / "silicon_calibration.csv", SHARED / "inferencex" / "dsr1_runs.json"]


def bandwidth_floors(norm: pd.DataFrame, cat) -> pd.DataFrame:
    """Per aggregated row without pipeline stages: the HBM floor of its decode step (the weights its batch touches
    and its KV cache read once, per GPU, at the datasheet bandwidth) over the measured step (TPOT times
    ``1 + draft tokens``). Above 1 the row's numbers cannot all be true: no engine streams faster than the HBM."""
    rows = []
    agg = norm[(norm["n_mode"] == "agg") & (norm["reason"] == "") & (norm["m_tpot"] > 0) & (norm["a_pp"] == 1)]
    for (mid, hid, eng, dd, ed, kd), g in agg.groupby(["n_model", "n_hw", "n_engine", "n_dense", "n_expert", "n_kv"]):
        hw = cat.hardware[hid]
        setup = Setup(cat.models[mid], hw, hw.efficiency.for_engine(eng), dd, ed, kd, engine=eng, tbo=0.0)
        tp, ep, pp, dp = (g[f"a_{k}"].to_numpy(float) for k in ("tp", "ep", "pp", "dp"))
        st = decode_step(setup, tp, ep, pp, dp, g["a_batch"].to_numpy(float),
                         g["n_isl"].to_numpy(float) + g["n_osl"].to_numpy(float) / 2.0)
        floor = (np.asarray(st.weight_read_bytes) + np.asarray(st.kv_read_bytes)) / setup.hbm_bw
        spec = g["n_spec"].fillna(0.0).to_numpy(float) if "n_spec" in g.columns else 0.0
        meas = g["m_tpot"].to_numpy(float) / 1e3 * (1.0 + spec)
        rows.append(pd.DataFrame({"system": hid, "engine": eng, "model": mid, "floor_share": floor / meas},
                                 index=g.index))
    return pd.concat(rows) if rows else pd.DataFrame()


def prefill_shortfalls(norm: pd.DataFrame, cat) -> pd.DataFrame:
    """Per disaggregated row that records its deployment: the request rate its closed loop completed (Little's law,
    ``conc / (TTFT + (O - 1) TPOT)``) over the catalog's prefill capacity of its recorded prefill pool. Above 1 the
    model's prefill is too slow for what the row measured: the pool sustained that rate."""
    rows = []
    eff_for = catalog_efficiency(cat)
    dis = norm[(norm["n_mode"] == "disagg") & (norm["reason"] == "") & ~norm["n_workers_assumed"].astype(bool)]
    for (mid, hid, eng, dd, ed, kd), g in dis.groupby(["n_model", "n_hw", "n_engine", "n_dense", "n_expert", "n_kv"]):
        setup = Setup(cat.models[mid], cat.hardware[hid], eff_for(hid, eng), dd, ed, kd, engine=eng,
                      **engine_options(cat.engines.get(eng)))
        pre = _role_setup(setup, g, "p")
        O = g["n_osl"].to_numpy(float)
        cap = prefill_capacity_rps(pre, *(g[f"p_{k}"].to_numpy(float) for k in ("tp", "ep", "pp", "dp")),
                                   g["n_isl"].to_numpy(float), g["p_workers"].to_numpy(float))
        e2el = (g["m_ttft"].to_numpy(float) + np.maximum(O - 1.0, 0.0) * g["m_tpot"].to_numpy(float)) / 1e3
        rows.append(pd.DataFrame({"system": hid, "engine": eng, "rate_share": g["n_conc"].to_numpy(float) / e2el / cap},
                                 index=g.index))
    return pd.concat(rows) if rows else pd.DataFrame()


def _above(frame: pd.DataFrame, col: str, by: list[str], what: str, rows: str, meaning: str) -> None:
    """Print how many rows of ``frame`` have ``col`` above 1, and their groups' counts and range."""
    if frame.empty:
        return
    over = frame[frame[col] > 1.0]
    print(f"{what}: {len(over)} of {len(frame)} {rows} rows above 1 ({meaning})")
    if len(over):
        print(over.groupby(by)[col].agg(["size", "min", "max"]).round(2).to_string())
    print()


def _gemm_table(norm: pd.DataFrame, cat) -> None:
    """Print the non-expert GEMM curve's time of a decode step over the measured step per group, as the ``gemm`` term
    would take it (on every kernel block here, whatever the catalog says): a p90 above 1 over at least
    ``OVERRULE_MIN_ROWS`` rows is what ``planner calibrate fit`` overrules where the term is on."""
    g = gemm_shares(norm, with_term(cat, "gemm"))
    if g.empty:
        return
    t = g.groupby(["hw", "engine", "model", "dense", "fmt", "spec"]).agg(
        rows=("share", "size"), share=("share", "median"), p90=("share", lambda x: x.quantile(0.9)))
    print("non-expert GEMM curve time of a decode step / measured TPOT x (1 + drafts) (all rows, the gemm term as it "
          "would time them)\n")
    print(t.round(2).to_string())
    print()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, action="append")
    args = ap.parse_args()
    cat = load_catalog()
    for path in args.data or DATA:
        try:
            norm, _ = F.prepare([load_measured(path, cat, measured=True)], cat)
        except InputError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        s = moe_shares(norm, cat, modes=("agg",)).rename(columns={"hw": "system", "curve": "key", "fmt": "curve"})
        if s.empty:
            print(f"{path.name}: no aggregated rows with a kernel-timed MoE\n")
        else:
            pred = predict_normalised(norm.loc[s.index], cat)
            s["pred_meas"] = pred["predicted_tpot_ms"] / norm.loc[s.index, "m_tpot"]
            t = s.groupby(["system", "engine", "model", "expert", "curve", "spec"]).agg(
                rows=("share", "size"), share=("share", "median"), share_no_fixed=("share_no_fixed", "median"),
                above_1=("share_no_fixed", lambda x: int((x > 1.0).sum())), pred_meas=("pred_meas", "median"))
            print(f"{path.name}: fused-MoE curve time of a decode step / measured TPOT (aggregated rows, median)\n")
            print(t.round(2).to_string())
            print(f"\n{int((s['share_no_fixed'] > 1).sum())} of {len(s)} rows: the MoE curve alone, without its fixed "
                  "latency, takes longer than the measured step\n")
        _gemm_table(norm, cat)
        _above(bandwidth_floors(norm, cat), "floor_share", ["system", "engine", "model"],
               "HBM floor of the decode step / measured step", "aggregated",
               "the row measured a step faster than its weights and KV cache can stream")
        _above(prefill_shortfalls(norm, cat), "rate_share", ["system", "engine"],
               "measured request rate / predicted prefill capacity", "disaggregated",
               "the model's prefill pool is slower than the rate the row completed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
