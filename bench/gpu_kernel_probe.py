"""Measure GEMMs and HBM streaming on a real GPU, at shapes the kernel data has no row for (run on a GPU machine).

The kernel curves (``planner calibrate kernels``) are fitted on AIConfigurator's measured kernels, whose GEMM
``n`` and ``k`` come from one list of sizes (32 ... 65,536). This script times GEMMs whose ``n`` or ``k`` is on
no such list (11,008, 13,824, 14,336, 18,432, 28,672, 53,248: Llama, Qwen and DeepSeek projection sizes) over
``m`` from 1 to 8,192, in bf16 (cuBLAS through PyTorch, as TensorRT-LLM's ``torch_flow`` GEMMs are) and FP8 with
per-tensor scales (``torch._scaled_mm``), and the HBM bandwidth a streaming read reaches (a reduction over a
large buffer: what a decode step does to its weights). ``bench/kernel_check.py`` compares the curves'
predictions with these numbers; nothing in the planner reads them.

Usage (needs PyTorch and a CUDA GPU): ``python bench/gpu_kernel_probe.py --out FILE.json``. Timing: CUDA
events around ``--reps`` launches after warm-up, median of ``--trials``, inputs rotated over buffers larger
than L2 so that weights come from HBM (as in a decode step).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

SHAPES = [(11008, 4096), (4096, 11008), (13824, 5120), (5120, 13824), (14336, 4096), (4096, 14336),
          (18432, 7168), (7168, 18432), (28672, 8192), (8192, 28672), (53248, 16384), (16384, 53248)]
M = [1, 4, 16, 64, 256, 1024, 4096, 8192]


def _time(fn, reps: int, trials: int) -> float:
    import torch

    for _ in range(3):
        fn(0)
    torch.cuda.synchronize()
    out = []
    for _ in range(trials):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(reps):
            fn(i)
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / reps * 1e-3)
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args()
    import torch

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    res = {"device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d"), "gemm": [], "stream": []}
    l2 = 128 << 20
    # HBM streaming read: sum over a bf16 buffer (read once, negligible write).
    for gib in (1, 4):
        n = (gib << 30) // 2
        x = torch.randn(n, device=dev, dtype=torch.bfloat16)
        t = _time(lambda i, x=x: x.sum(dtype=torch.float32), 10, args.trials)
        res["stream"].append({"bytes": n * 2, "seconds": t, "tb_s": n * 2 / t / 1e12})
        del x
    fp8 = hasattr(torch, "float8_e4m3fn") and hasattr(torch, "_scaled_mm")
    for n, k in SHAPES:
        wbytes = n * k * 2
        copies = max(2, -(-2 * l2 // wbytes))
        ws = [torch.randn(k, n, device=dev, dtype=torch.bfloat16) / k**0.5 for _ in range(copies)]
        w8 = [w.t().contiguous().to(torch.float8_e4m3fn) for w in ws] if fp8 else []
        one = torch.ones((), device=dev, dtype=torch.float32)
        for m in M:
            a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            t = _time(lambda i, a=a, ws=ws, copies=copies: a @ ws[i % copies], args.reps, args.trials)
            res["gemm"].append({"dtype": "bf16", "m": m, "n": n, "k": k, "seconds": t})
            if fp8:
                a8 = a.to(torch.float8_e4m3fn)
                try:
                    t8 = _time(lambda i, a8=a8, w8=w8, copies=copies, one=one: torch._scaled_mm(
                        a8, w8[i % copies].t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), args.reps, args.trials)
                    res["gemm"].append({"dtype": "fp8", "m": m, "n": n, "k": k, "seconds": t8})
                except RuntimeError as exc:  # a shape the FP8 kernels refuse (m not a multiple of 16 on some builds)
                    res.setdefault("skipped", []).append(f"fp8 m={m} n={n} k={k}: {exc}"[:200])
        del ws, w8
        torch.cuda.empty_cache()
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"{props.name}: {len(res['gemm'])} GEMMs; stream {[round(s['tb_s'], 2) for s in res['stream']]} TB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
