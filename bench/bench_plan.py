"""Benchmark of `planner plan` on the bundled scenarios (figures for issue notes, never a timed test).

    python bench/bench_plan.py [SCENARIO ...]

Each scenario runs in a fresh process: candidate generation, model build and HiGHS solve to the
default gap (1e-4) are timed separately, then the analysis (binding constraints, runner-up); peak
resident memory is that process's maximum RSS.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from planner.catalog import load_catalog
from planner.catalog.scenario import load_scenario, resolve_scenario
from planner.planning import PlanOptions, make_plan
path = sys.argv[1]
rs = resolve_scenario(load_scenario(path), load_catalog(), path)
t1 = time.perf_counter()
res = make_plan(rs, PlanOptions(analysis=sys.argv[2] == "1"))
t2 = time.perf_counter()
p = res.plan
print(json.dumps({
    "import_load_s": t1 - t0, **res.timings, "wall_s": t2 - t0,
    "evaluated": p.solver.candidates["evaluated"], "kept": p.solver.candidates["kept"],
    "status": p.status, "gap": p.solver.mip_gap, "usd_per_hour": p.objective.usd_per_hour,
    "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""


def run(path: Path, analysis: bool) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), "1" if analysis else "0"], capture_output=True, text=True, cwd=ROOT, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    names = sys.argv[1:] or [p.stem for p in sorted((ROOT / "catalogs" / "scenarios").glob("*.yaml"))]
    for name in names:
        path = ROOT / "catalogs" / "scenarios" / f"{name}.yaml"
        r = run(path, analysis=False)
        a = run(path, analysis=True)
        print(
            f"{name:16} rows {r['evaluated']:>9,} -> {r['kept']:>5,}  candidates {r['candidates_s']:.2f} s  build {r['build_s']:.2f} s  "
            f"solve {r['solve_s']:.2f} s  (cand+build+solve {r['candidates_s'] + r['build_s'] + r['solve_s']:.2f} s, "
            f"process {r['wall_s']:.2f} s incl. imports {r['import_load_s']:.2f} s)  {r['status']} gap {r['gap']:.1e}  "
            f"${r['usd_per_hour']:,.2f}/h  RSS {r['max_rss_mb']:.0f} MB | with analysis: +{a['analysis_s']:.1f} s, RSS {a['max_rss_mb']:.0f} MB"
        )


if __name__ == "__main__":
    main()
