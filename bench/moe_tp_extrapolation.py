"""How the fused-MoE curve extrapolates over expert slicing to a model whose shapes it has not seen.

Fits the catalog's MoE curve form (``planner.perf.kernels.moe_time``) on one system's ``moe_perf`` rows of one engine
and format without DeepSeek-V3's and Qwen3-235B's expert shapes (the held-out split ``planner calibrate kernels``
scores), then prints predicted / measured latency of DeepSeek-V3's held-out layer (hidden 7,168, 256 experts of
2,048 columns, top 8, balanced routing, no expert parallelism) by expert tensor parallelism (the columns each GPU
holds: 2,048 / TP) and tokens. A curve that extrapolates well is flat across TP; a trend says the form charges
slicing for what the kernels do not pay.

Usage: ``python bench/moe_tp_extrapolation.py SYSTEM ENGINE FORMAT [--data DIR]`` (e.g. ``h200_sxm trtllm
fp8_block``; ``--data`` defaults to ``../shared/calibration/kernels``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.calib import kernels as KC  # noqa: E402
from planner.catalog.loader import load_catalog  # noqa: E402
from planner.errors import InputError  # noqa: E402

TOKENS = (8, 64, 512, 4096)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("system")
    ap.add_argument("engine")
    ap.add_argument("format")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "calibration" / "kernels")
    args = ap.parse_args()
    cat = load_catalog()
    hw = KC.system_hardware(cat, args.system)
    path = args.data / args.system / "moe" / args.engine / "moe_perf.parquet"
    if hw is None or not path.is_file():
        print(f"{path}: no such system or kernel file", file=sys.stderr)
        return 1
    try:
        rows = KC.read_moe(path, hw).get(args.format)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if rows is None:
        print(f"{path}: no {args.format} rows", file=sys.stderr)
        return 1
    curve, (_, _, hold_ratio, _) = KC.fit_rows("moe", KC._predict_moe, rows)
    held = {k: v[rows.hold] for k, v in rows.x.items()}
    ds = (held["hidden"] == 7168) & (held["experts"] == 256) & (held["local"] == held["experts"])
    if "copies" in held:  # balanced rows only: their copies are the uniform tokens x top-k
        ds &= np.isclose(held["copies"], held["tokens"] * held["top_k"])
    df = pd.DataFrame({"tp": np.round(2048.0 / held["inter"][ds]).astype(int), "tokens": held["tokens"][ds],
                       "ratio": hold_ratio[ds]})
    df = df[df["tokens"].isin(TOKENS)]
    print(f"{path}: {args.format}, fitted on {int((~rows.hold).sum())} rows without {rows.holdout}: fit median APE "
          f"{curve.fit_mape:.1%} (all rows), held out {curve.holdout_mape:.1%}; parameters {curve.params}\n")
    print("DeepSeek-V3's layer, predicted / measured, by expert TP (columns) and tokens:\n")
    print(df.pivot_table(index="tokens", columns="tp", values="ratio").round(2).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
