"""Benchmark of `planner sweep` (issue 5): a 200-point traffic x TPOT sweep of deepseek-chat.

    python bench/bench_sweep.py [--jobs 2] [--points-traffic 20] [--points-tpot 10]

Runs the same code path as the CLI (no tornado) and prints wall time and per-point build, update
and solve times (means over points; build is paid once per model structure).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.catalog import load_catalog  # noqa: E402
from planner.catalog.loader import read_yaml  # noqa: E402
from planner.planning import PlanOptions  # noqa: E402
from planner.sweep import Vary, parse_values, run_sweep  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--points-traffic", type=int, default=20)
    ap.add_argument("--points-tpot", type=int, default=10)
    a = ap.parse_args()
    path = ROOT / "catalogs" / "scenarios" / "deepseek-chat.yaml"
    varies = [Vary("workloads.chat.requests_per_s", parse_values(f"50:2000:log:{a.points_traffic}")),
              Vary("workloads.chat.slo.tpot_ms", parse_values(f"20:80:lin:{a.points_tpot}"))]
    t = time.perf_counter()
    df = run_sweep(read_yaml(path), path, varies, load_catalog(None), jobs=a.jobs, opts=PlanOptions(analysis=False))
    wall = time.perf_counter() - t
    n = len(df)
    built = int((df["build_s"] > 0).sum())
    print(f"{n} points, --jobs {a.jobs}: wall {wall:.1f} s ({wall / n * 1e3:.0f} ms per point)")
    print(f"status: {df['status'].value_counts().to_dict()}")
    print(f"models built {built} (mean build {df.loc[df['build_s'] > 0, 'build_s'].mean():.2f} s incl. candidate "
          f"evaluation where first in a worker); per point: update {df['update_s'].mean() * 1e3:.1f} ms, "
          f"solve {df['solve_s'].mean() * 1e3:.0f} ms (median {df['solve_s'].median() * 1e3:.0f} ms, "
          f"max {df['solve_s'].max():.2f} s)")


if __name__ == "__main__":
    main()
