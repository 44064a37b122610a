"""The TTFT quantiles of ``perf/latency.py`` against a simulated queue (``analysis/simulate.fcfs``).

M/D/c (fixed prompt lengths) and M/G/c (lognormal prompts, p90 = 2 x mean) at 1-64 servers and utilisation
0.3-0.9, TTFT = base + the prompt's extra prefill + the wait, base 1.5 x the mean prefill work (a pool's base
always holds its own prefill): predicted / simulated p50, p90 and p99, and the share within 15%.

    python bench/queue_check.py [--arrivals 300000] [--seed 1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.analysis.simulate import _lengths, fcfs  # noqa: E402
from planner.catalog.scenario import LengthSpread  # noqa: E402
from planner.perf.latency import length_nodes, ttft_quantile  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arrivals", type=int, default=300_000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    ratios = []
    print("| lengths | servers | utilisation | p50 pred/sim | p90 pred/sim | p99 pred/sim |")
    print("|---|---:|---:|---:|---:|---:|")
    for spread in (None, LengthSpread(mean=1000, p90=2000)):
        x, p = length_nodes(spread)
        cs2 = float(np.sum(p * x * x) - 1.0)
        for c in (1, 2, 4, 8, 16, 64):
            for rho in (0.3, 0.6, 0.8, 0.9):
                n, work, base = a.arrivals, 1.0, 1.5
                arr = np.cumsum(rng.exponential(work / (rho * c), size=n))
                xs = np.ones(n) if spread is None else _lengths(rng, spread, n)
                start, _ = fcfs(arr, work * xs, c)
                t = ((start - arr) + base + work * (xs - 1.0))[n // 10:]
                row = []
                for q in (0.5, 0.9, 0.99):
                    r = float(ttft_quantile(q, base, work, rho, c, x, p, cs2)[0]) / float(np.quantile(t, q))
                    ratios.append(r)
                    row.append(f"{r:.3f}")
                print(f"| {'lognormal' if spread else 'fixed'} | {c} | {rho} | " + " | ".join(row) + " |")
    err = np.abs(np.asarray(ratios) - 1.0)
    print(f"\n{len(ratios)} quantiles: within 15% {np.mean(err <= 0.15):.0%}, median |error| {100 * np.median(err):.1f}%, "
          f"worst {100 * err.max():.1f}%")


if __name__ == "__main__":
    main()
