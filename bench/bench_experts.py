"""Benchmark of expert placement (issue 4): greedy EPLB vs the placement MILP.

    python bench/bench_experts.py [--seeds 20] [--time-limit 10] [--skew 1.0] [--big] [--flat SECONDS]

Seeded Zipf loads of 256 experts on 64 GPUs with 64 redundant slots (5 per GPU) and on 32 GPUs with
32 redundant (9 per GPU) -- 256 + 32 slots cannot fill 64 GPUs equally -- then, with ``--big``, 384
experts on 144 GPUs with 48 redundant (3 per GPU) under a 60 s limit. Prints, per instance, the
imbalance (max / mean GPU load, even split among copies) of MILP and greedy, the gap to the proven
bound and the wall time; then a summary line per configuration. ``--flat S`` first runs the whole
256 x 64 problem as one MILP from the greedy placement for S seconds (the reason for the search).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.model.experts import RepackExpert, build_repack_model, repack_start  # noqa: E402
from planner.perf.experts import even_split_loads, greedy_pack, greedy_replicas, imbalance, zipf_loads  # noqa: E402
from planner.pipeline.experts import place_experts  # noqa: E402
from planner.solve import Solver  # noqa: E402


def flat(experts: int, gpus: int, red: int, limit: float) -> None:
    """The whole problem as one MILP (copy counts within +-2 of greedy's, assignment) from the greedy
    placement: why the large-neighbourhood search exists."""
    load = zipf_loads(experts, 1.0, 0)
    n = greedy_replicas(load, red)
    greedy = greedy_pack(load, n, gpus)
    w = load / load.sum() * gpus
    opts = [RepackExpert(e, float(w[e]), tuple((k, k) for k in range(max(1, n[e] - 2), min(n[e] + 2, gpus) + 1)))
            for e in range(experts)]
    m = build_repack_model(opts, list(range(gpus)), (experts + red) // gpus)
    res = Solver(time_limit_s=limit, mip_gap=1e-4).solve(m, start=repack_start(m, dict(enumerate(greedy)),
                                                                                  {e: int(n[e]) for e in range(experts)}))
    print(f"FLAT E={experts} G={gpus} R={red}: greedy {imbalance(even_split_loads(load, greedy)):.4f}, one MILP after "
          f"{res.wall_s:.0f} s: incumbent {res.objective:.4f}, bound {res.bound:.4f} ({res.termination})", flush=True)


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
    ap.add_argument("--flat", type=float, default=0.0, help="Also run the flat MILP for this many seconds.")
    a = ap.parse_args()
    if a.flat:
        flat(256, 64, 64, a.flat)
    run(256, 64, 64, a.seeds, a.skew, a.time_limit)
    run(256, 32, 32, a.seeds, a.skew, a.time_limit)
    if a.big:
        run(384, 144, 48, 1, a.skew, 60.0)


if __name__ == "__main__":
    main()
