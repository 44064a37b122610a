"""Benchmark of re-planning growth from a deployed fleet (issue 47): the bundled 12-month growth scenario (three
workloads of three models, demand doubling over the year, a deployed fleet with reservations ending mid-year,
the full priced catalog, a 30-day lead time).

    python bench/bench_growth.py [--scenario catalogs/scenarios/growth-year.yaml] [--repeat 3]

Prints, per run, the wall time of the whole plan (candidates, the peak brownfield plan and its comparisons, the
12-month MILP and the re-check of every month), the 12-month model's solver status, gap and wall time, the
horizon's dollars against reserving the peak fleet from the first month, and the peak memory (RSS).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner import load_scenario  # noqa: E402
from planner.options import PlanOptions  # noqa: E402
from planner.pipeline.plan import make_plan  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default=str(ROOT / "catalogs" / "scenarios" / "growth-year.yaml"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--analysis", action="store_true", help="also price binding constraints and the runner-up")
    args = ap.parse_args()
    for k in range(args.repeat):
        rs = load_scenario(args.scenario)
        t0 = time.perf_counter()
        res = make_plan(rs, PlanOptions(analysis=args.analysis, jobs=1))
        wall = time.perf_counter() - t0
        g = res.plan.growth
        print(f"run {k + 1}: plan {wall:.2f} s; months MILP {g.status} gap {g.mip_gap if g.mip_gap is not None else float('nan'):.1e} "
              f"in {g.wall_s:.2f} s; ${g.usd_total:,.0f} over {g.months} months against ${g.peak_reserved_usd_total:,.0f} "
              f"holding the peak fleet; candidates {res.timings['candidates_s']:.2f} s")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
