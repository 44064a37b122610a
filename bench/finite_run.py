"""A benchmark run is ten requests a client: what InferenceX reports against the steady closed loop (issue 42).

    python bench/finite_run.py [--data FILE]

Per band of clients in flight and serving mode, the median of the measured output throughput over
``conc x O / median e2el`` (the steady closed loop at the run's own median request time; 1 when the run loses nothing
to its start and end), beside what :func:`planner.calib.predict.finite_run_share` gives for the same rows (at the
predicted TTFT share of a request and the predicted decode time the first wave leaves idle); then the median log ratio
of predicted to measured throughput with the share and without it (the steady loop alone). The figures of
``docs/validation.md`` ("A benchmark run is ten requests a client") come from here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.calib.data import load_measured  # noqa: E402
from planner.calib.predict import finite_run_share, predict_normalised  # noqa: E402
from planner.catalog import load_catalog  # noqa: E402

DATA = ROOT.parent / "shared" / "calibration" / "inferencex" / "dsr1_runs.json"
BANDS = [0, 2, 8, 32, 128, 512, 100_000]


def frame(path: Path) -> pd.DataFrame:
    cat = load_catalog()
    m = load_measured(path, cat, measured=True)
    n = m.norm
    p = predict_normalised(n, cat)
    ttft, tpot = p["predicted_ttft_ms"] / 1e3, p["predicted_tpot_ms"] / 1e3
    O = n["n_osl"].astype(float)
    e2el = ttft + (O - 1.0) * tpot
    share = finite_run_share(n["n_conc"], n["n_requests"], e2el, ttft, p["predicted_wave_idle_ms"].fillna(0.0) / 1e3)
    measured_e2el = pd.to_numeric(m.raw["metrics.median_e2el"], errors="coerce").to_numpy(float)
    out = pd.DataFrame({
        "mode": n["n_mode"], "conc": n["n_conc"].astype(float),
        "measured": n["m_otpg"] * n["n_gpus_out"] * measured_e2el / (n["n_conc"] * O),
        "model": share,
        "log_with": np.log(p["predicted_output_tput_per_gpu"] / n["m_otpg"]),
        "log_without": np.log(p["predicted_output_tput_per_gpu"] / share / n["m_otpg"]),
    })
    return out[np.isfinite(out["measured"]) & np.isfinite(out["log_with"])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    x = frame(ap.parse_args().data)
    band = pd.cut(x["conc"], BANDS)
    print("clients in flight, all modes: measured throughput / steady loop (median), the model's share (median)")
    print(x.groupby(band, observed=True)[["measured", "model"]].median().round(3).to_string())
    print("\nby mode")
    print(x.groupby(["mode", band], observed=True)[["measured", "model"]].median().round(3).to_string())
    print(f"\npredicted / measured output tok/s/GPU, median log ratio: {x['log_without'].median():+.3f} steady loop, "
          f"{x['log_with'].median():+.3f} with the run's share ({len(x)} runs)")


if __name__ == "__main__":
    main()
