"""Benchmark of `planner plan` on the bundled scenarios (figures for issue notes, never a timed test).

    python bench/bench_plan.py [SCENARIO ...] [--repeat N] [--no-floors] [--master-min-columns C]

Each scenario runs in a fresh process: candidate generation, model build and HiGHS solve to the
default gap (1e-4) are timed separately, then the analysis (binding constraints, runner-up); peak
resident memory is that process's maximum RSS. Then the command as a user runs it, ``planner plan
SCENARIO --out DIR`` (analysis, expert placement, re-check and the written plan included), ``N`` times
(default 3) in fresh processes: the CPU time (user + system) and wall of the whole process, least and
median (the host is shared: the least is the closest to the machine's own figure).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bench_fleet import solver_env  # noqa: E402

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from planner.catalog import load_catalog
from planner.catalog.scenario import load_scenario, resolve_scenario
from planner.options import PlanOptions
from planner.pipeline.plan import make_plan
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


def run(path: Path, analysis: bool, env: dict | None = None) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), "1" if analysis else "0"], capture_output=True, text=True, cwd=ROOT,
        check=True, env=env
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def cli(path: Path, repeat: int, env: dict | None = None) -> tuple[list[float], list[float]]:
    """CPU (user + system) and wall of ``planner plan PATH --out DIR``, each run a fresh process."""
    cpu, wall = [], []
    with tempfile.TemporaryDirectory() as d:
        for _ in range(repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "planner", "plan", str(path), "--out", str(Path(d) / "plan"), "--force"],
                           cwd=ROOT, capture_output=True, check=True, env=env)
            wall.append(time.perf_counter() - t)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return cpu, wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*")
    ap.add_argument("--repeat", type=int, default=3, help="runs of the whole command per scenario")
    ap.add_argument("--no-floors", action="store_true", help="solve without block floors (for the comparison)")
    ap.add_argument("--master-min-columns", type=int,
                    help="planner.solve.MASTER_MIN_COLUMNS for the comparison (0: the master on every model; 10**9: none)")
    a = ap.parse_args()
    names = a.names or [p.stem for p in sorted((ROOT / "catalogs" / "scenarios").glob("*.yaml"))]
    with tempfile.TemporaryDirectory() as d:
        env = solver_env(Path(d), floors=not a.no_floors, master_min_columns=a.master_min_columns)
        for name in names:
            report(name, a.repeat, env)


def report(name: str, repeat: int, env: dict | None) -> None:
    path = ROOT / "catalogs" / "scenarios" / f"{name}.yaml"
    r = run(path, analysis=False, env=env)
    an = run(path, analysis=True, env=env)
    cpu, wall = cli(path, max(repeat, 1), env)
    print(
        f"{name:16} rows {r['evaluated']:>9,} -> {r['kept']:>5,}  candidates {r['candidates_s']:.2f} s  build {r['build_s']:.2f} s  "
        f"solve {r['solve_s']:.2f} s  (cand+build+solve {r['candidates_s'] + r['build_s'] + r['solve_s']:.2f} s, "
        f"process {r['wall_s']:.2f} s incl. imports {r['import_load_s']:.2f} s)  {r['status']} gap {r['gap']:.1e}  "
        f"${r['usd_per_hour']:,.2f}/h  RSS {r['max_rss_mb']:.0f} MB | with analysis: +{an['analysis_s']:.1f} s, RSS {an['max_rss_mb']:.0f} MB"
        f" | planner plan: CPU {min(cpu):.2f} s least, {statistics.median(cpu):.2f} median; "
        f"wall {min(wall):.2f} / {statistics.median(wall):.2f} s ({len(cpu)} runs)"
    )


if __name__ == "__main__":
    main()
