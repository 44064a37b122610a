"""The batch-slot wait of ``perf/waits.slot_tail`` and the slot + prefill tandem of ``perf/latency.ttft_quantile``
against simulation (``analysis/simulate``), long runs of one replica (issue 46).

1. Slots alone: Poisson arrivals at ``B`` slots each held a fixed ``hold`` (M/D/B), utilisation 0.6-0.85: the
   simulated probability of waiting, p90 and p99 wait beside the formula's.
2. Tandem: a replica that admits a request to one of ``B`` slots, then prefills it FCFS on ``c`` ranks (the
   simulator's aggregated replica), with the numbers of bundled pools; simulated p50/p90/p99 TTFT beside
   :func:`ttft_quantile`'s.

    python bench/slot_check.py [--arrivals 400000] [--seed 1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.analysis.simulate import fcfs, slot_wait  # noqa: E402
from planner.perf.latency import ttft_quantile  # noqa: E402
from planner.perf.waits import slot_tail, wait_quantile  # noqa: E402

HOLD_S = 9.4
TANDEM = {  # (batch, prefill ranks, prefill work s, TTFT base s, prefill utilisation, slot hold s)
    "three-models chat-aggregated-1": (64, 1, 0.101, 0.208, 0.55, 9.34),
    "three-models chat-aggregated-2": (32, 1, 0.163, 0.243, 0.44, 9.39),
    "three-models classify-aggregated-2": (32, 1, 0.010, 0.053, 0.65, 0.38),
}
"""The pools' numbers as their plan.json records them (``predicted.latency``, the workload's output x TPOT)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arrivals", type=int, default=400_000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    n = a.arrivals
    print("| slots | utilisation | P(wait) sim / formula | p90 wait s sim / formula | p99 wait s sim / formula |")
    print("|---:|---:|---:|---:|---:|")
    for b in (32, 64, 128):
        for rho in (0.6, 0.7, 0.8, 0.85):
            arr = np.cumsum(rng.exponential(HOLD_S / (rho * b), n))
            w = (slot_wait(arr, np.full(n, HOLD_S), b) - arr)[n // 10:]
            pw, th, k = slot_tail(rho, b, HOLD_S, 0.0)
            q = [float(wait_quantile(pw, th, k, 1 - x)) for x in (0.9, 0.99)]
            print(f"| {b} | {rho} | {np.mean(w > 1e-9):.3f} / {float(pw):.3f} | {np.quantile(w, 0.9):.3f} / {q[0]:.3f} | "
                  f"{np.quantile(w, 0.99):.3f} / {q[1]:.3f} |")
    print("\n| pool | TTFT p50 / p90 / p99 s simulated | formula |")
    print("|---|---|---|")
    qs = np.array([0.5, 0.9, 0.99])
    for name, (b, c, work, base, rho_p, hold) in TANDEM.items():
        lam = rho_p * c / work
        arr = np.cumsum(rng.exponential(1 / lam, n))
        start, _ = fcfs(arr, np.full(n, work), c, slots=b, hold=np.full(n, hold - work))
        ttft = (start + base - arr)[n // 10:]
        f = ttft_quantile(qs, np.full(3, base), np.full(3, work), np.full(3, rho_p), np.full(3, float(c)),
                          slots=(np.full(3, b), np.full(3, hold), np.zeros(3)))
        sim = " / ".join(f"{v:.3f}" for v in np.quantile(ttft, qs))
        print(f"| {name} | {sim} | {' / '.join(f'{v:.3f}' for v in f)} |")


if __name__ == "__main__":
    main()
