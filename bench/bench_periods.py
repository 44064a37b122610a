"""Benchmark of traffic profiles with price tiers (issue 19): a 24-period plan of the bundled three-model
scenario on the full catalog (every priced hardware; ``--listed-hardware`` keeps the scenario's list) with daily
curves and on-demand/spot tiers.

    python bench/bench_periods.py [--scenario catalogs/scenarios/three-models.yaml] [--periods 24] [--listed-hardware]

Prints the wall time of the whole plan (peak plan, analysis, the multi-period MILP and the re-check of every
period), the solver status of the period model, $/day against the flat peak, and the peak memory (RSS).
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.catalog import load_catalog  # noqa: E402
from planner.catalog.scenario import Scenario, resolve_scenario  # noqa: E402
from planner.options import PlanOptions
from planner.pipeline.plan import make_plan  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def day_curve(peak: float, periods: int, phase: float) -> list[float]:
    """A smooth daily curve between 15% and 100% of ``peak`` (its maximum at ``phase`` of the day)."""
    return [round(peak * (0.575 + 0.425 * math.cos(2 * math.pi * (t / periods - phase))), 3) for t in range(periods)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default=str(ROOT / "catalogs" / "scenarios" / "three-models.yaml"))
    ap.add_argument("--listed-hardware", action="store_true", help="keep the scenario's hardware list")
    ap.add_argument("--periods", type=int, default=24)
    ap.add_argument("--time-limit", type=float, default=120.0)
    a = ap.parse_args()
    doc = yaml.safe_load(Path(a.scenario).read_text())
    for k, w in enumerate(doc["workloads"]):
        w["requests_per_s"] = day_curve(float(w["requests_per_s"]), a.periods, 0.5 + 0.1 * k)
    doc["price_tiers"] = {h: {"spot": {"usd_per_chip_hour": 2.5, "preemption_rate": 0.1}} for h in ("h100-sxm", "h200-sxm")}
    if not a.listed_hardware:
        doc.pop("hardware", None)
    cat = load_catalog(ROOT / "catalogs")
    rs = resolve_scenario(Scenario.model_validate(doc), cat, Path(a.scenario))
    t0 = time.perf_counter()
    c0 = time.process_time()
    plan = make_plan(rs, PlanOptions(time_limit_s=a.time_limit)).plan
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{len(plan.periods)} periods, {len(doc['workloads'])} workloads of {len(rs.models)} models, "
          f"{len(rs.hardware)} hardware: "
          f"wall {wall:.1f} s, CPU {cpu:.1f} s, peak RSS {rss:,.0f} MB; ${plan.usd_per_day:,.0f}/day vs "
          f"${plan.flat_peak_usd_per_day:,.0f} flat at the peak; every period re-checked: "
          f"{all(p.recheck_ok for p in plan.periods)}; period solve {plan.periods_solver}")


if __name__ == "__main__":
    main()
