"""The prefill's attention rate: measured context-MLA kernels against what the catalog charges.

The catalog times a prefill pass's attention at ``prefill_compute`` of the chip's attention peak
(``planner.perf.roofline.prefill_parts``), one factor for every prompt length. The kernel files measure DeepSeek's
context MLA (``SYSTEM/mla/ENGINE/context_mla_perf.parquet``: one layer, one prompt of ``isl`` tokens, 128 heads, BF16).
This prints, per system and engine, the share of the BF16 peak those kernels reach by prompt length (FLOPs of
decompressed causal MLA, ``2 heads (qk_dim + v_dim)`` a query-key pair, over the measured latency) beside the
catalog's ``prefill_compute`` for that hardware and engine.

Usage: ``python bench/context_attention_rate.py [--data DIR]`` (default ``../shared/calibration/kernels``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.calib.kernels import system_hardware  # noqa: E402
from planner.catalog.loader import load_catalog  # noqa: E402

LENGTHS = (1024, 2048, 4096, 8192, 16384)
HEADS, QK, V = 128, 192, 128
"""DeepSeek-V3's attention heads and decompressed query-key and value dimensions (prefill runs MLA decompressed)."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "calibration" / "kernels")
    args = ap.parse_args()
    cat = load_catalog()
    recs = []
    for path in sorted(args.data.glob("*/mla/*/context_mla_perf.parquet")):
        system, engine = path.parts[-4], path.parts[-2]
        hw = system_hardware(cat, system)
        if hw is None:
            continue
        d = pd.read_parquet(path)
        d = d[(d["num_heads"] == HEADS) & (d["batch_size"] == 1) & d["mla_dtype"].astype(str).str.startswith("bf")]
        if d.empty:
            continue
        flops = 2.0 * HEADS * (QK + V) * d["isl"] * (d["isl"] + 1) / 2.0
        share = (flops / (d["latency"] * 1e-3) / hw.flops("bf16")).groupby(d["isl"]).median()
        row = {"system": system, "engine": engine}
        row.update({f"{n // 1024}K": round(float(share[n]), 3) for n in LENGTHS if n in share.index})
        eff = hw.efficiency.for_engine(engine) if engine in hw.efficiency.by_engine else hw.efficiency.default
        row["catalog prefill_compute"] = round(eff.prefill_compute, 3)
        recs.append(row)
    if not recs:
        print(f"{args.data}: no context_mla_perf files", file=sys.stderr)
        return 1
    print("Context MLA (DeepSeek, one prompt, BF16): share of the BF16 peak by prompt length, and the catalog's factor\n")
    print(pd.DataFrame(recs).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
