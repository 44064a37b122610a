"""Benchmarks of the foundation issue (figures go in the closing note, never into timed tests).

    python bench/bench_perf.py [--data ../shared/calibration/silicon_calibration.csv]

Reports: wall time of `planner roofline` as a fresh process (median of 5), and of `planner predict`
on the calibration rows (median of 3), plus the in-process prediction time.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def wall(cmd: list[str], n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "calibration" / "silicon_calibration.csv"))
    args = ap.parse_args()
    py = sys.executable
    roof = [py, "-m", "planner", "roofline", "--model", "deepseek-v3", "--hardware", "gb200-nvl72", "--batch", "4096",
            "--context", "4096", "--tp", "1", "--dp", "32", "--ep", "32", "--json"]
    print(f"planner roofline (fresh process, median of 5): {wall(roof, 5):.3f} s")
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "pred.csv"
        pred = [py, "-m", "planner", "predict", "--data", args.data, "--out", str(out), "--force"]
        print(f"planner predict on {args.data} (fresh process, median of 3): {wall(pred, 3):.3f} s")
    sys.path.insert(0, str(ROOT))
    from planner.calib.data import read_rows
    from planner.calib.predict import predict_frame
    from planner.catalog import load_catalog

    cat = load_catalog()
    df = read_rows(args.data)
    t = time.perf_counter()
    res = predict_frame(df, cat)
    dt = time.perf_counter() - t
    print(f"predict_frame in process: {dt:.3f} s for {len(df)} rows ({res['predicted_tpot_ms'].notna().sum()} predicted)")


if __name__ == "__main__":
    main()
