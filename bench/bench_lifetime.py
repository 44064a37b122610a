"""Benchmark of ``planner lifetime`` (issue 48): 20 lifetime volumes for a dense and a MoE family on a traffic
scenario (the target: both in under 60 s on 2 cores).

    python bench/bench_lifetime.py [--scenario catalogs/scenarios/llama-70b-chat.yaml] [--families llama3,qwen3-moe]

Prints per family the wall time of the sweep (14 sizes: each size's candidates evaluated once, its plan re-solved
per volume), the compute-optimal size, and the optimum at the lowest and highest volume.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner import load_scenario  # noqa: E402
from planner.catalog import load_catalog  # noqa: E402
from planner.pipeline.lifetime import LifetimeInputs, lifetime  # noqa: E402
from planner.studies.scaling import LAWS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default=str(ROOT / "catalogs" / "scenarios" / "llama-70b-chat.yaml"))
    ap.add_argument("--families", default="llama3,qwen3-moe")
    ap.add_argument("--reference", default="70.6e9,15e12", help="N,D of the model whose loss is the target")
    args = ap.parse_args()
    cat = load_catalog()
    rs = load_scenario(args.scenario, cat)
    n, d = (float(v) for v in args.reference.split(","))
    volumes = [0.0] + list(np.geomspace(1e8, 1e13, 19))
    t_all = time.perf_counter()
    for fam in args.families.split(","):
        loss = LAWS["epoch"].loss(n, d)
        t0 = time.perf_counter()
        points, choices = lifetime(LifetimeInputs(fam, "epoch", loss, volumes, 365.0, "h100-sxm", 0.4), rs, cat)
        wall = time.perf_counter() - t0
        lo, hi = choices[1], choices[-1]
        def size(p) -> str:
            return f"{p.params / 1e9:,.1f}B" + (f" ({p.active / 1e9:,.1f}B active)" if p.active < p.params else "")

        print(f"{fam}: {len(volumes)} volumes x {len(points)} sizes in {wall:.1f} s; compute-optimal "
              f"{size(choices[0].point)}; at {lo.volume:.0e} tok/day {size(lo.point)} "
              f"({lo.point.tokens / lo.point.optimal_tokens:,.1f}x); at {hi.volume:.0e} tok/day "
              f"{size(hi.point)} ({hi.point.tokens / hi.point.optimal_tokens:,.1f}x)")
    print(f"total {time.perf_counter() - t_all:.1f} s")


if __name__ == "__main__":
    main()
