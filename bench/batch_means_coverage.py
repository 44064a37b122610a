"""How often the simulator's batch-means interval covers what it estimates, with batches of 20 equal parts or of at
least one relaxation time (``planner.analysis.simulate.share_halfwidth``, ``relaxation_s``).

Two checks:

- ``mm1``: M/M/1 at utilisation ``--rho`` (0.95), ``--seeds`` runs of ``--requests`` requests after a warm-up of a
  sixth as many; the share of waits within the time where P(wait <= t) = 0.9 exactly. Prints, per batch length (20
  batches, then 1-6 relaxation times ``rho / (1 - sqrt(rho))^2`` requests), how many intervals cover 0.9.
- ``plan``: a bundled plan's workload simulated on ``--seeds`` seeds of ``--requests`` requests; its share within TTFT
  per seed with the 20-batch and the relaxation-length interval, and how many cover the mean over the seeds.

Usage: ``python bench/batch_means_coverage.py mm1`` / ``python bench/batch_means_coverage.py plan --plan plans/multi-workload
--workload long-context --seeds 8 --requests 400000``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.analysis.simulate import fcfs, relaxation_s, share_halfwidth, simulate  # noqa: E402
from planner.export.bundle import read_plan  # noqa: E402


def mm1(rho: float, seeds: int, requests: int) -> None:
    t = math.log(rho / 0.1) / (1.0 - rho)  # 1 - rho exp(-(1 - rho) t) = 0.9
    warm = requests // 6
    corr = rho / (1.0 - math.sqrt(rho)) ** 2
    oks = []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        arrivals = np.cumsum(rng.exponential(1.0 / rho, requests + warm))
        start, _ = fcfs(arrivals, rng.exponential(1.0, requests + warm), 1)
        oks.append(((start - arrivals) <= t)[warm:])
    shares = np.array([o.mean() for o in oks])
    print(f"M/M/1 rho {rho}: {seeds} seeds of {requests:,}; share mean {shares.mean():.4f} (exact 0.9), sd across seeds "
          f"{shares.std(ddof=1):.4f}; relaxation {corr:,.0f} requests")
    for label, c in [("20 batches", 0.0)] + [(f"{m} relaxation times", m * corr) for m in range(1, 7)]:
        hw = np.array([share_halfwidth(o, correlated=c) for o in oks])
        print(f"  {label:<20} batches {requests // max(requests // 20, math.ceil(c)):>3}  mean half-width "
              f"{np.nanmean(hw):.4f}  covers 0.9 in {int(np.sum(np.abs(shares - 0.9) <= hw))} of {seeds}")


def plan_check(path: Path, workload: str, seeds: int, requests: int) -> None:
    plan = read_plan(path)
    w = next(x for x in plan.workloads if x.name == workload)
    corr = relaxation_s(plan, w) * w.requests_per_s
    oks = []
    for seed in range(seeds):
        r = simulate(plan, requests=requests, seed=seed)
        m = r.workload.astype(str) == workload
        oks.append(r.ttft[m] <= w.slo_ttft_s * (1 + 1e-9))
    shares = np.array([o.mean() for o in oks])
    mean = shares.mean()
    print(f"{path.name} / {workload}: {oks[0].size:,} requests a seed, relaxation {corr:,.0f} requests; share within "
          f"TTFT over {seeds} seeds {shares.min():.3f}-{shares.max():.3f}, mean {mean:.4f}")
    for label, c in (("20 batches", 0.0), ("relaxation", corr)):
        hw = np.array([share_halfwidth(o, correlated=c) for o in oks])
        print(f"  {label:<12} half-widths {np.round(hw, 3).tolist()}  cover the mean in "
              f"{int(np.sum(np.abs(shares - mean) <= hw))} of {seeds}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("check", choices=("mm1", "plan"))
    ap.add_argument("--rho", type=float, default=0.95)
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--plan", type=Path, default=ROOT / "plans" / "multi-workload")
    ap.add_argument("--workload", default="long-context")
    a = ap.parse_args(argv)
    if a.check == "mm1":
        mm1(a.rho, a.seeds or 80, a.requests or 60_000)
    else:
        plan_check(a.plan, a.workload, a.seeds or 8, a.requests or 400_000)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
