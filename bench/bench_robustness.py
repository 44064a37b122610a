"""Benchmark of the robustness issue's limits: time limits honoured and work bounded at scale.

    python bench/bench_robustness.py [--gpus 1024 4096] [--limits 2 5]

1. ``experts`` with ``--redundant auto`` (four redundancy levels placed) on DeepSeek-V3's 256 experts over
   G GPUs under a time limit: wall time of the placement against the limit (the process start, ~1 s of
   imports and catalog, is not part of the limit).
2. A sweep of 10^9 points is refused before any work: time to the refusal.
3. Huge demand: the plan of 10^7 req/s (linear packing): wall time and the units bought.

The property-based campaign (>= 2,000 generated cases) runs with pytest:
``PLANNER_PROPERTY_EXAMPLES=1000 python -m pytest tests/test_properties.py`` (the seed is in the module).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.catalog import load_catalog  # noqa: E402
from planner.errors import InputError  # noqa: E402
from planner.perf.experts import zipf_loads  # noqa: E402
from planner.pipeline.experts import choose_redundant  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def experts(gpus: list[int], limits: list[float]) -> None:
    cat = load_catalog(ROOT / "catalogs")
    m = cat.models["deepseek-v3"]
    load = {0: zipf_loads(m.architecture.moe.experts, 1.0, 0)}
    for g in gpus:
        for lim in limits:
            t0 = time.perf_counter()
            ch = choose_redundant(load, g, model=m, time_limit_s=lim)
            wall = time.perf_counter() - t0
            print(f"experts G={g:5d} limit {lim:4.1f} s: wall {wall:5.2f} s ({wall / lim:.2f}x), "
                  f"R={ch.chosen.results[0].redundant}, imbalance {ch.chosen.imbalance:.4f} "
                  f"(greedy {ch.chosen.greedy_imbalance:.4f})")


def sweep_refusal() -> None:
    import yaml

    from planner.sweep import check_sweep, parse_vary

    base = yaml.safe_load((ROOT / "catalogs" / "scenarios" / "llama-70b-chat.yaml").read_text())
    varies = [parse_vary(f"workloads.chat.{k}=1:1000:lin:1000") for k in ("requests_per_s", "input_tokens", "output_tokens")]
    t0 = time.perf_counter()
    try:
        check_sweep(base, Path("llama-70b-chat.yaml"), varies, load_catalog(ROOT / "catalogs"))
    except InputError as err:
        print(f"sweep of 10^9 points refused in {time.perf_counter() - t0:.3f} s: {err}")


def huge_demand() -> None:
    import yaml

    from planner.catalog.scenario import Scenario, resolve_scenario
    from planner.options import PlanOptions
    from planner.pipeline.plan import make_plan

    doc = yaml.safe_load((ROOT / "catalogs" / "scenarios" / "llama-70b-chat.yaml").read_text())
    doc["workloads"][0]["requests_per_s"] = 1e7
    cat = load_catalog(ROOT / "catalogs")
    t0 = time.perf_counter()
    plan = make_plan(resolve_scenario(Scenario.model_validate(doc), cat, Path("huge.yaml")),
                     PlanOptions(analysis=False, time_limit_s=60)).plan
    units = ", ".join(f"{g.count:,} {g.hardware}" for g in plan.units)
    print(f"plan of 1e7 req/s: {plan.status}, ${plan.objective.usd_per_hour:,.0f}/h, {units}; "
          f"{len(plan.placement)} placement runs; {time.perf_counter() - t0:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--limits", type=float, nargs="+", default=[2.0, 5.0])
    a = ap.parse_args()
    experts(a.gpus, a.limits)
    sweep_refusal()
    huge_demand()


if __name__ == "__main__":
    main()
