"""The silicon factors each kernel-measured system's curves set (``planner.calib.silicon``), and what they change.

Prints, per system and engine, the kernel fractions of ``compute`` (bf16), ``compute_fp8``, ``compute_fp4`` and
``memory`` (share of the datasheet peak the fitted kernel curves reach on the reference shapes); then the effective
FP4 rate (factor x datasheet peak) of B300 and GB300 against B200 and GB200 as the catalog has them, beside the
datasheet ratio; then the FP4 factor of H100/H200 (w4a16 experts) fitted on their rows against their kernels'.
Reproduces the figures quoted in docs/performance-model.md ("Silicon factors from a system's own kernels").

    python bench/kernel_silicon.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.calib.silicon import SILICON_FACTORS, kernel_fractions  # noqa: E402
from planner.catalog import load_catalog  # noqa: E402

SYSTEMS = ("h100-sxm", "h200-sxm", "b200-sxm", "b300-sxm", "gb200-nvl72", "gb300-nvl72")
ENGINES = ("trtllm", "sglang", "vllm")


def main() -> int:
    cat = load_catalog(ROOT / "catalogs")
    print("| system | engine | " + " | ".join(SILICON_FACTORS) + " |")
    print("|---|---|" + "---:|" * len(SILICON_FACTORS))
    for hid in SYSTEMS:
        for eng in ENGINES:
            f = kernel_fractions(cat.hardware[hid], eng)
            print(f"| {hid} | {eng} | " + " | ".join(f"{f[k]:.3f}" if k in f else "" for k in SILICON_FACTORS) + " |")
    print("\nFP4, new chip against its relative: measured kernels (per engine), datasheet, catalog factors")
    for new, rel in (("b300-sxm", "b200-sxm"), ("gb300-nvl72", "gb200-nvl72")):
        a, b = cat.hardware[new], cat.hardware[rel]
        kern = [kernel_fractions(a, e)["compute_fp4"] * a.flops("fp4") / (kernel_fractions(b, e)["compute_fp4"] * b.flops("fp4"))
                for e in ENGINES]
        cat_ratio = a.efficiency.default.compute_fp4 * a.flops("fp4") / (b.efficiency.default.compute_fp4 * b.flops("fp4"))
        print(f"  {new} / {rel}: kernels {min(kern):.2f}-{max(kern):.2f}x, datasheet {a.flops('fp4') / b.flops('fp4'):.2f}x, "
              f"catalog {cat_ratio:.2f}x (compute_fp4 {a.efficiency.default.compute_fp4} against "
              f"{b.efficiency.default.compute_fp4})")
    print("\nFP4 (w4a16) experts on Hopper: compute_fp4 fitted on the rows against the kernels' fraction of bf16 peak")
    for hid in ("h100-sxm", "h200-sxm"):
        h = cat.hardware[hid]
        for eng in ENGINES:
            print(f"  {hid} {eng}: fitted {h.efficiency.for_engine(eng).compute_fp4:.3f}, kernels "
                  f"{kernel_fractions(h, eng)['compute_fp4']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
