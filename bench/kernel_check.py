"""The catalog's kernel curves against GEMMs we measured ourselves at shapes the kernel data has no row for.

``bench/data/h200_gemm_probe.json`` was measured by ``bench/gpu_kernel_probe.py`` on an NVIDIA H200 (the file
records the device, PyTorch version and date): bf16 GEMMs through cuBLAS and FP8 per-tensor GEMMs
(``torch._scaled_mm``) with ``n`` or ``k`` in 11,008 ... 53,248, none on the kernel data's list of sizes, and the
HBM bandwidth a streaming read reaches. This script predicts each GEMM with the hardware's fitted curve
(``gemm/trtllm/bf16`` and ``gemm/trtllm/fp8``: TensorRT-LLM's torch-flow GEMMs are cuBLAS through PyTorch) and
prints the median and p90 absolute percentage error per format and ``m`` band, and the streaming bandwidth
beside the curves' fitted HBM fraction.

Usage: ``python bench/kernel_check.py [--probe FILE] [--hardware h200-sxm] [--engine trtllm] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.calib.kernels import GEMM_FORMATS  # noqa: E402
from planner.catalog import load_catalog  # noqa: E402
from planner.perf.kernels import gemm_time  # noqa: E402


def check(probe: dict, hw, engine: str) -> dict:
    kf = hw.efficiency.kernels
    if kf is None:
        raise SystemExit(f"{hw.id} has no kernel curves: run `planner calibrate kernels --write` first")
    out = {"device": probe["device"], "hardware": hw.id, "engine": engine, "formats": {}}
    for fmt, data_name in (("bf16", "bfloat16"), ("fp8", "fp8")):
        rows = [g for g in probe["gemm"] if g["dtype"] == fmt]
        p = kf.curve("gemm", engine, fmt)
        if not rows or p is None:
            continue
        _, wb, maths = GEMM_FORMATS[data_name]
        m, n, k, y = (np.array([g[c] for g in rows], dtype=float) for c in ("m", "n", "k", "seconds"))
        pred = gemm_time(p, m, n, k, hw.flops(maths), hw.hbm_bw, wb)
        ape = np.abs(pred / y - 1.0)
        bands = {}
        for lo, hi in ((1, 16), (17, 512), (513, 1 << 20)):
            sel = (m >= lo) & (m <= hi)
            if sel.any():
                bands[f"m {lo}-{hi}"] = {"rows": int(sel.sum()), "median_ape": float(np.median(ape[sel])),
                                         "median_ratio": float(np.median(pred[sel] / y[sel]))}
        out["formats"][fmt] = {"rows": len(rows), "median_ape": float(np.median(ape)),
                               "p90_ape": float(np.quantile(ape, 0.9)), "median_ratio": float(np.median(pred / y)),
                               "bands": bands}
    stream = max(s["tb_s"] for s in probe["stream"]) * 1e12
    out["stream_fraction_of_datasheet"] = stream / hw.hbm_bw
    out["gemm_curve_memory"] = {f: kf.curve("gemm", engine, f)["memory"] for f in ("bf16", "fp8")
                                if kf.curve("gemm", engine, f)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe", type=Path, default=ROOT / "bench" / "data" / "h200_gemm_probe.json")
    ap.add_argument("--hardware", default="h200-sxm")
    ap.add_argument("--engine", default="trtllm")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    probe = json.loads(args.probe.read_text())
    res = check(probe, load_catalog(ROOT / "catalogs").get_hardware(args.hardware), args.engine)
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    print(f"{res['device']} measured vs {res['hardware']} curves ({res['engine']}):")
    for fmt, r in res["formats"].items():
        print(f"  {fmt}: {r['rows']} GEMMs, median APE {r['median_ape']:.1%}, p90 {r['p90_ape']:.1%}, "
              f"median predicted/measured {r['median_ratio']:.2f}")
        for band, b in r["bands"].items():
            print(f"    {band}: {b['rows']} rows, median APE {b['median_ape']:.1%}, ratio {b['median_ratio']:.2f}")
    print(f"  streaming read: {res['stream_fraction_of_datasheet']:.1%} of the datasheet HBM bandwidth; "
          f"GEMM curves' fitted HBM fraction {res['gemm_curve_memory']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
