"""Write ``planner/perf/mdc_table.py``: the exact M/D/c waiting ratios the percentile formulas interpolate
(``planner.perf.waits.md_c_ratios``; ~10 s). Run after changing ``MDC_SERVERS``, ``MDC_LOGIT`` or ``md_c_wait``.

``--check``: the figures docs/performance-model.md quotes. Pure M/D/c queues simulated (the simulator's first-come,
first-served queue, 3 seeds x 400,000 arrivals, the first tenth dropped) against the exact wait (``md_c_wait``,
``md_c_quantile``) and against the approximations: Erlang's C with Cosmetatos' mean, Erlang's C with the exact mean and
an exponential tail, and the formula now (the same with a gamma tail of the exact decay rate): probability of waiting,
mean wait of those who wait and p99 wait, in service times; then the p99 and p99.9 of the last two against the exact
quantiles over a grid of server counts and utilisations.

    python bench/mdc_table.py [--check]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.analysis.simulate import fcfs  # noqa: E402
from planner.perf.waits import (  # noqa: E402
    erlang_c,
    md_c_cdf,
    md_c_quantile,
    md_c_table_source,
    md_c_wait,
    mean_wait_factor,
    wait_quantile,
    wait_survival,
    wait_tail,
)

CASES = ((8, 0.79), (64, 0.79), (64, 0.85), (64, 0.9))
GRID_SERVERS = (2, 3, 4, 8, 16, 32, 64, 128, 256)
GRID_RHO = (0.5, 0.6, 0.7, 0.79, 0.85, 0.9, 0.95, 0.98)


def p99(pw: float, th: float) -> float:
    """p99 of a wait that is 0 or, with probability ``pw``, exponential of mean ``th``."""
    return th * math.log(pw / 0.01) if pw > 0.01 else 0.0


def check() -> None:
    print("| servers | utilisation | simulated P(wait) / mean of waits / p99 | exact M/D/c (p99 by md_c_quantile) | "
          "Erlang C + Cosmetatos | Erlang C + exact mean, exponential | the formula now (gamma of the exact decay) |")
    print("|---:|---:|---|---|---|---|---|")
    for c, rho in CASES:
        ws = []
        for seed in range(3):
            rng = np.random.default_rng(seed)
            n = 400_000
            arr = np.cumsum(rng.exponential(1.0 / (rho * c), size=n))
            start, _ = fcfs(arr, np.ones(n), c)
            ws.append((start - arr)[n // 10:])
        w = np.concatenate(ws)
        waited = w[w > 1e-12]
        p, m = md_c_wait(c, rho)
        pc = float(erlang_c(c, rho))
        tc = float(mean_wait_factor(c, rho, 0.0)) / (c * (1.0 - rho))
        pn, tn, kn = (float(v) for v in wait_tail(rho, c, 1.0, 0.0, shape=True))
        print(f"| {c} | {rho} | {waited.size / w.size:.4f} / {waited.mean():.4f} / {np.quantile(w, 0.99):.4f} | "
              f"{p:.4f} / {m / p:.4f} / {md_c_quantile(c, rho, 0.99):.4f} | {pc:.4f} / {tc:.4f} / {p99(pc, tc):.4f} | "
              f"{pn:.4f} / {tn:.4f} / {p99(pn, tn):.4f} | {pn:.4f} / {tn:.4f} / "
              f"{float(wait_quantile(pn, tn, kn, 0.01)):.4f} (k {kn:.2f}) |")
    # three seeds of M/D/64 can sit ~5% above the exact values: a busy period's waits come in clusters; twelve more
    p = []
    for seed in range(100, 112):
        rng = np.random.default_rng(seed)
        n = 400_000
        arr = np.cumsum(rng.exponential(1.0 / (0.79 * 64), size=n))
        start, _ = fcfs(arr, np.ones(n), 64)
        p.append(float(np.mean((start - arr)[n // 10:] > 1e-12)))
    print(f"\nM/D/64 at 0.79, twelve seeds (100-111) of 400,000 arrivals: P(wait) {np.mean(p):.4f} +- "
          f"{np.std(p) / math.sqrt(len(p)):.4f} (seeds {min(p):.4f}-{max(p):.4f}); exact {md_c_wait(64, 0.79)[0]:.4f}")
    # the grid: the p99 and p99.9 wait of the formula now and of the exponential of the same mean against the exact
    rel_now, rel_exp = [], []
    for c in GRID_SERVERS:
        for rho in GRID_RHO:
            pn, tn, kn = (float(v) for v in wait_tail(rho, c, 1.0, 0.0, shape=True))
            for q in (0.99, 0.999):
                exact = md_c_quantile(c, rho, q)
                if exact < 0.02:  # hardly a wait (under 2% of a service): relative errors mean nothing
                    continue
                rel_now.append(float(wait_quantile(pn, tn, kn, 1.0 - q)) / exact - 1.0)
                rel_exp.append(tn * math.log(pn / (1.0 - q)) / exact - 1.0 if pn > 1.0 - q else -1.0)
    # near the atom: P(W > x theta) at small x, where the gamma's flat start and Erlang's C overstate the exact wait
    print("\n| servers | utilisation | x | P(W > x theta): exact / gamma (Erlang's C) / exponential (Erlang's C) |")
    print("|---:|---:|---:|---|")
    for c, rho in ((4, 0.6), (64, 0.85)):
        pn, tn, kn = (float(v) for v in wait_tail(rho, c, 1.0, 0.0, shape=True))
        for x in (0.1, 0.5, 1.0, 2.0):
            ex = 1.0 - md_c_cdf(c, rho, x * tn)
            print(f"| {c} | {rho} | {x} | {ex:.4f} / {pn * float(wait_survival(x * tn, tn, kn)):.4f} / "
                  f"{pn * math.exp(-x):.4f} |")
    for name, r in (("the formula now (gamma)", rel_now), ("exponential of the exact mean", rel_exp)):
        a = np.abs(r)
        print(f"\n{name}: p99 and p99.9 wait against exact M/D/c over {len(r)} cases (servers {GRID_SERVERS}, "
              f"utilisation {GRID_RHO}): median |error| {np.median(a):.1%}, 90th percentile {np.quantile(a, 0.9):.1%}, "
              f"range {min(r):+.1%} to {max(r):+.1%}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="simulated M/D/c against the exact wait and the old formula")
    if ap.parse_args().check:
        check()
    else:
        out = ROOT / "planner" / "perf" / "mdc_table.py"
        tmp = out.with_suffix(".tmp")
        tmp.write_text(md_c_table_source())
        tmp.replace(out)
        print(f"wrote {out}")
