"""Attention-DP aggregated rows against the others: how the catalog predicts measured TPOT where one rank's prompt
chunk can stall the others (``planner.perf.roofline._chunk_steps``).

For each measured file, rows split into aggregated attention-DP (``a_dp > 1``), other aggregated and disaggregated:
count, median TPOT APE and median signed error ``log(predicted / measured)`` (negative: predicted too fast).

    python bench/adp_rows.py [--data FILE ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.calib import fit as F  # noqa: E402
from planner.calib.data import load_measured  # noqa: E402
from planner.calib.predict import predict_normalised  # noqa: E402
from planner.catalog.loader import load_catalog  # noqa: E402

SHARED = ROOT.parent / "shared" / "calibration"
DATA = [SHARED / "silicon_calibration.csv", SHARED / "inferencex" / "dsr1_runs.json"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", action="append", type=Path)
    a = ap.parse_args()
    cat = load_catalog(ROOT / "catalogs")
    norm, _ = F.prepare([load_measured(p, cat, measured=True) for p in (a.data or DATA)], cat)
    r = np.log(predict_normalised(norm, cat)["predicted_tpot_ms"].to_numpy(float) / norm["m_tpot"].to_numpy(float))
    group = np.where(norm["n_mode"] != "agg", "disaggregated",
                     np.where(norm["a_dp"].to_numpy(float) > 1, "aggregated, attention DP", "aggregated, no attention DP"))
    print("| file | rows | n | TPOT median APE | median log(pred / meas) |")
    print("|---|---|---|---|---|")
    for src in sorted(norm["src"].unique()):
        for g in ("aggregated, attention DP", "aggregated, no attention DP", "disaggregated"):
            m = (norm["src"].to_numpy() == src) & (group == g) & np.isfinite(r)
            if m.any():
                ape = np.median(np.abs(np.exp(r[m]) - 1.0))
                print(f"| {src} | {g} | {int(m.sum())} | {100 * ape:.1f}% | {np.median(r[m]):+.3f} |")


if __name__ == "__main__":
    main()
