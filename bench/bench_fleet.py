"""Benchmark of `planner plan` at fleet scale: N workloads on one Qwen3-235B fleet (figures for issue notes,
never a timed test).

    python bench/bench_fleet.py [N ...] [--no-analysis] [--time-limit S] [--mip-gap G] [--jobs J] [--demand-scale F ...]
                                [--no-floors] [--master-min-columns C]

For each N (default 3 10 30) a scenario is generated from the three archetypes of
``catalogs/scenarios/multi-workload.yaml`` (interactive chat with prefix reuse, a batch API, long context),
each copy with its own lengths, rate and SLOs (deterministic), and planned by the CLI in a fresh process,
as a user runs it; ``--demand-scale`` plans each fleet again with every workload's request rate times each
factor given (the instances of the demand-scaling figures in docs/formulation.md). Reported: CPU time (user + system)
and wall of that process and its analysis workers, the largest peak RSS among them (each worker holds its own copy
of the model), the plan's status and MIP gap, the rows evaluated and kept, and whether the analysis was complete or
cut short by the command's --time-limit (after how many of its re-solves).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

ARCHETYPES = [
    {"name": "chat", "requests_per_s": 200, "input_tokens": 1500, "output_tokens": 400,
     "prefix_cache": {"hit_rate": 0.4, "working_set_gb": 500}, "slo": {"ttft_ms": 1000, "tpot_ms": 40}},
    {"name": "batch", "requests_per_s": 100, "input_tokens": 3000, "output_tokens": 800,
     "slo": {"ttft_ms": 60000, "tpot_ms": 200}},
    {"name": "long", "requests_per_s": 4, "input_tokens": 100000, "output_tokens": 1000,
     "prefix_cache": {"hit_rate": 0.5, "working_set_gb": 5000}, "slo": {"ttft_ms": 20000, "tpot_ms": 80}},
]
SCALE = [1.0, 0.6, 1.5, 0.8, 1.25]
"""Per copy: factors on rate, lengths and SLOs, so that no two workloads are the same problem."""


def scenario(n: int, demand_scale: float = 1.0) -> dict:
    wls = []
    for i in range(n):
        a = ARCHETYPES[i % 3]
        f = SCALE[(i // 3) % len(SCALE)]
        g = SCALE[(i // 3 + 2) % len(SCALE)]
        w = {
            "name": f"{a['name']}-{i}",
            "requests_per_s": round(a["requests_per_s"] * f * demand_scale, 3),
            "input_tokens": min(int(a["input_tokens"] * g), 120000),  # within the model's 128k context
            "output_tokens": int(a["output_tokens"] * f),
            "slo": {"ttft_ms": round(a["slo"]["ttft_ms"] * g), "tpot_ms": round(a["slo"]["tpot_ms"] * f)},
        }
        if "prefix_cache" in a:
            w["prefix_cache"] = dict(a["prefix_cache"])
        wls.append(w)
    return {
        "name": f"fleet-{n}",
        "description": f"{n} workloads on one Qwen3-235B fleet (bench/bench_fleet.py)",
        "model": "qwen3-235b-a22b",
        "weights": ["bf16", "fp8", "fp4"],
        "kv_cache": ["fp8", "bf16"],
        "hardware": ["h100-sxm", "h200-sxm", "b200-sxm", "gb200-nvl72", "mi355x"],
        "serving": ["aggregated", "disaggregated"],
        "utilisation_cap": 0.8,
        "limits": {"power_kw": 3000 * max(1, n // 3)},
        "workloads": wls,
    }


def solver_env(folder: Path, *, floors: bool = True, master_min_columns: int | None = None) -> dict | None:
    """An environment in which every planner process (analysis workers included) solves with the solver's settings
    changed, for the comparisons: a ``sitecustomize`` in ``folder`` puts ``FLOOR_MIN_BLOCKS`` out of reach (no block
    floors, ``planner.solve.floors``, and so no master) and/or sets ``MASTER_MIN_COLUMNS`` (``planner.solve``: 0 tries
    the master on every model, 10**9 on none). ``None`` where nothing changes."""
    lines = []
    if not floors:
        lines.append("import planner.solve.floors as b\nb.FLOOR_MIN_BLOCKS = 10**9\n")
    if master_min_columns is not None:
        lines.append(f"import planner.solve as s\ns.MASTER_MIN_COLUMNS = {int(master_min_columns)}\n")
    if not lines:
        return None
    (Path(folder) / "sitecustomize.py").write_text("".join(lines))
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}


def run(n: int, analysis: bool, extra: list[str], demand_scale: float = 1.0, floors: bool = True,
        master_min_columns: int | None = None) -> dict:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"fleet-{n}.yaml"
        path.write_text(yaml.safe_dump(scenario(n, demand_scale), sort_keys=False))
        out = Path(d) / "plan"
        cmd = [sys.executable, "-m", "planner", "plan", str(path), "--out", str(out), *extra]
        if not analysis:
            cmd.append("--no-analysis")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        env = solver_env(Path(d), floors=floors, master_min_columns=master_min_columns)
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        res = {"n": n, "rc": p.returncode, "wall_s": wall,
               "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
               "max_rss_mb": after.ru_maxrss / 1024, "message": (p.stdout + p.stderr).strip().splitlines()[-1:]}
        if p.returncode == 0:
            plan = json.loads((out / "plan.json").read_text())
            s = plan["solver"]
            cut = [a for a in plan.get("assumptions", []) if a.startswith("analysis not completed")]
            res.update(status=plan["status"], gap=s.get("mip_gap"), usd_per_hour=plan["objective"]["usd_per_hour"],
                       evaluated=s["candidates"]["evaluated"], kept=s["candidates"]["kept"],
                       bindings=len(plan.get("binding_constraints") or []),
                       runner_up=_runner_up(plan.get("runner_up")),
                       analysis="off" if not analysis else ("cut: " + cut[0].split(" was spent ")[1].split(" (")[0]
                                                           if cut else "complete"))
        return res


def _runner_up(ru: dict | None) -> str:
    if not ru:
        return "none"
    if ru.get("usd_per_hour") is None:
        return f"without {ru['excluded']}: {ru['status']}"
    return f"without {ru['excluded']} ${ru['usd_per_hour']:,.2f}/h ({ru['status']})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="*", type=int, default=[3, 10, 30])
    ap.add_argument("--no-analysis", action="store_true")
    ap.add_argument("--time-limit", type=float)
    ap.add_argument("--mip-gap", type=float)
    ap.add_argument("--jobs", type=int, help="planner plan --jobs (default: the planner's own choice)")
    ap.add_argument("--demand-scale", type=float, nargs="+", default=[1.0],
                    help="factors on every workload's request rate (one plan per factor)")
    ap.add_argument("--no-floors", action="store_true", help="solve without block floors (for the comparison)")
    ap.add_argument("--master-min-columns", type=int,
                    help="planner.solve.MASTER_MIN_COLUMNS for the comparison (0: the master on every model; 10**9: none)")
    a = ap.parse_args()
    extra = (["--time-limit", str(a.time_limit)] if a.time_limit else []) + (["--mip-gap", str(a.mip_gap)] if a.mip_gap else []) \
        + (["--jobs", str(a.jobs)] if a.jobs else [])
    for n, f in ((n, f) for n in a.n for f in a.demand_scale):
        r = run(n, not a.no_analysis, extra, f, floors=not a.no_floors, master_min_columns=a.master_min_columns)
        tag = f" x{f:g}" if f != 1.0 else ""
        if r["rc"] != 0:
            print(f"{n:3d} workloads{tag}: exit {r['rc']} after {r['wall_s']:.1f} s: {r['message']}")
            continue
        print(f"{n:3d} workloads{tag}: CPU {r['cpu_s']:.1f} s, wall {r['wall_s']:.1f} s, peak RSS {r['max_rss_mb']:.0f} MB, "
              f"{r['status']} gap {r['gap'] if r['gap'] is None else format(r['gap'], '.1e')}, ${r['usd_per_hour']:,.2f}/h, "
              f"rows {r['evaluated']:,} -> {r['kept']:,}, {r['bindings']} binding constraints, analysis {r['analysis']}, runner-up {r['runner_up']}")


if __name__ == "__main__":
    main()
