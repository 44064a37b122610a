"""Benchmark of expert placement (issue 4): greedy EPLB vs the placement MILP.

    python bench/bench_experts.py [--seeds 20] [--time-limit 10] [--skew 1.0] [--big]

Seeded Zipf loads of 256 experts on 64 GPUs with 64 redundant slots (5 per GPU) and on 32 GPUs with
32 redundant (9 per GPU) -- 256 + 32 slots cannot fill 64 GPUs equally -- then, with ``--big``, 384
experts on 144 GPUs with 48 redundant (3 per GPU) under a 60 s limit. Prints, per instance, the
imbalance (max / mean GPU load, even split among copies) of MILP and greedy, the gap to the proven
bound and the wall time; then a summary line per configuration.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.experts import place_experts  # noqa: E402
from planner.perf.experts import zipf_loads  # noqa: E402


def run(experts: int, gpus: int, red: int, seeds: int, skew: float, limit: float) -> None:
    wins = ties = 0
    walls, gaps, ratios = [], [], []
    for seed in range(seeds):
        t = time.perf_counter()
        r = place_experts(zipf_loads(experts, skew, seed), gpus, red, time_limit_s=limit, seed=seed)
        wall = time.perf_counter() - t
        walls.append(wall)
        gaps.append(r.solver["mip_gap"])
        ratios.append(r.imbalance / r.greedy_imbalance)
        wins += r.imbalance < r.greedy_imbalance - 1e-9
        ties += abs(r.imbalance - r.greedy_imbalance) <= 1e-9
        assert r.imbalance <= r.greedy_imbalance + 1e-12
        print(f"E={experts} G={gpus} R={red} zipf {skew} seed {seed:2d}: MILP {r.imbalance:.4f} greedy "
              f"{r.greedy_imbalance:.4f} | balanced router MILP {r.imbalance_balanced:.4f} greedy "
              f"{r.greedy_imbalance_balanced:.4f} | gap {r.solver['mip_gap']:.4f} ({r.solver['bound_note']}) "
              f"{wall:.1f} s", flush=True)
    print(f"SUMMARY E={experts} G={gpus} R={red} zipf {skew}: MILP lower on {wins}/{seeds}, equal on {ties}, "
          f"worse on 0; MILP/greedy median {sorted(ratios)[len(ratios) // 2]:.4f} min {min(ratios):.4f}; "
          f"max gap {max(gaps):.4f}; wall max {max(walls):.1f} s mean {sum(walls) / len(walls):.1f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--skew", type=float, default=1.0)
    ap.add_argument("--big", action="store_true")
    a = ap.parse_args()
    run(256, 64, 64, a.seeds, a.skew, a.time_limit)
    run(256, 32, 32, a.seeds, a.skew, a.time_limit)
    if a.big:
        run(384, 144, 48, 1, a.skew, 60.0)


if __name__ == "__main__":
    main()
