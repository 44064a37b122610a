"""Benchmark of expert placement (issue 4 groundwork): greedy (EPLB) vs the placement MILP.

    python bench/bench_experts.py [--seeds N] [--time-limit S]

Seeded Zipf(1.0) loads of 256 experts on (32 GPUs, 32 redundant) and (64 GPUs, 64 redundant);
prints imbalance (max / mean GPU load) under the balancing router and under even split, for the
MILP and for greedy, with the solver's gap and wall time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.experts import place_experts  # noqa: E402
from planner.perf.experts import zipf_loads  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=10.0)
    a = ap.parse_args()
    for gpus, red in ((32, 32), (64, 64)):
        for seed in range(a.seeds):
            t = time.perf_counter()
            r = place_experts(zipf_loads(256, 1.0, seed), gpus, red, time_limit_s=a.time_limit)
            print(
                f"E=256 G={gpus} R={red} seed {seed}: balanced MILP {r.imbalance:.4f} greedy {r.greedy_imbalance:.4f} | "
                f"even split MILP {r.imbalance_even:.4f} greedy {r.greedy_imbalance_even:.4f} | kept {r.source}, "
                f"gap {r.solver['mip_gap']:.4f}, {time.perf_counter() - t:.1f} s"
            )


if __name__ == "__main__":
    main()
