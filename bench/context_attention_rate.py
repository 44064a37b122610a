"""The prefill's attention rate: measured context-MLA kernels against what the catalog charges.

The catalog times a prefill pass's attention at ``prefill_compute`` of the chip's attention peak
(``planner.perf.roofline.prefill_parts``), one factor for every prompt length. The kernel files measure DeepSeek's
context MLA (``SYSTEM/mla/ENGINE/context_mla_perf.parquet``: one layer, one prompt of ``isl`` tokens, 128 heads, BF16), each
row at the FLOPs of the form it measures (SGLang's Hopper rows are the absorbed form: 3.4x a decompressed pair's).
This prints, per system and engine, the share of the BF16 peak those kernels reach by prompt length (one layer's FLOPs
of decompressed causal MLA, :func:`planner.perf.params.prefill_attention_flops` over the model's layers, over the
measured latency) beside the catalog's ``prefill_compute`` for that hardware and engine and their ratio at 8K, then
the attention's share of DeepSeek-V3's prefill FLOPs by prompt length.

Usage: ``python bench/context_attention_rate.py [--data DIR]`` (default ``../shared/calibration/kernels``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.calib.kernels import ABSORBED_CONTEXT_MLA, system_hardware  # noqa: E402
from planner.catalog.loader import load_catalog  # noqa: E402
from planner.perf import params as P  # noqa: E402

LENGTHS = (1024, 2048, 4096, 8192, 16384)
MODEL = "deepseek-v3"
DECOMPRESSED_PAIR, ABSORBED_PAIR = 2.0 * (192 + 128), 2.0 * (576 + 512)
"""FLOPs per query-key pair and head of DeepSeek's MLA in prefill's decompressed form and in the absorbed form that
SGLang's collector times on Hopper (``planner.calib.kernels.ABSORBED_CONTEXT_MLA``): each form's own work."""
"""The model whose context MLA the kernel files measure (128 heads)."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "calibration" / "kernels")
    args = ap.parse_args()
    cat = load_catalog()
    model = cat.models[MODEL]
    a = model.architecture
    recs = []
    for path in sorted(args.data.glob("*/mla/*/context_mla_perf.parquet")):
        system, engine = path.parts[-4], path.parts[-2]
        hw = system_hardware(cat, system)
        if hw is None:
            continue
        try:
            d = pd.read_parquet(path)
            d = d[(d["num_heads"] == a.attention.heads) & (d["batch_size"] == 1)
                  & d["mla_dtype"].astype(str).str.startswith("bf")]
        except (OSError, ValueError, KeyError) as e:
            print(f"{path}: skipped ({type(e).__name__}: {e})", file=sys.stderr)
            continue
        if d.empty:
            continue
        flops = P.prefill_attention_flops(model, d["isl"].to_numpy(float)) / a.layers
        absorbed = d["kernel_source"].astype(str).isin(ABSORBED_CONTEXT_MLA).to_numpy() if "kernel_source" in d else False
        flops = flops * (1.0 + np.asarray(absorbed, dtype=float) * (ABSORBED_PAIR / DECOMPRESSED_PAIR - 1.0))
        share = (flops / (d["latency"].to_numpy(float) * 1e-3) / hw.flops("bf16"))
        share = pd.Series(share, index=d.index).groupby(d["isl"]).median()
        row = {"system": system, "engine": engine, "form": "absorbed" if np.any(absorbed) else "decompressed"}
        row.update({f"{n // 1024}K": round(float(share[n]), 3) for n in LENGTHS if n in share.index})
        row["catalog prefill_compute"] = pf = round(hw.efficiency.for_engine(engine).prefill_compute, 3)
        if 8192 in share.index:
            row["catalog / kernels at 8K"] = round(pf / float(share[8192]), 2)
        recs.append(row)
    if not recs:
        print(f"{args.data}: no context_mla_perf files", file=sys.stderr)
        return 1
    print("Context MLA (DeepSeek, one prompt, BF16): share of the BF16 peak by prompt length, and the catalog's factor\n")
    print(pd.DataFrame(recs).to_string(index=False))
    n = pd.Series(LENGTHS, dtype=float)
    att = P.prefill_attention_flops(model, n.to_numpy()) / n.to_numpy()
    gemm = 2.0 * P.model_stats(model).active_params
    print(f"\nAttention's share of {MODEL}'s prefill FLOPs a token (attention + 2 x active parameters): " + ", ".join(
        f"{int(k) // 1024}K {v:.0%}" for k, v in zip(n, att / (att + gemm), strict=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
