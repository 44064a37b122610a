"""Benchmark of `planner sweep` (issues 5 and 18): a traffic x TPOT sweep of deepseek-chat.

    python bench/bench_sweep.py [--jobs 2] [--points-traffic 20] [--points-tpot 10] [--backend local|dask]
    python bench/bench_sweep.py --points-traffic 100 --backend dask --kill-after 60

The first form runs the library's sweep (no tornado) and prints wall time and per-point build, update and
solve times (means over points; build is paid once per model structure). With ``--kill-after S`` it runs
the CLI (``planner sweep ... --out DIR``) as a process, kills it (SIGKILL, the whole process group) after S
seconds, then re-runs it with ``--resume`` and prints the points the parts kept, the points the resume
solved and both wall times.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.catalog import load_catalog  # noqa: E402
from planner.catalog.loader import read_yaml  # noqa: E402
from planner.options import PlanOptions  # noqa: E402
from planner.sweep import Vary, parse_values, run_sweep  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--points-traffic", type=int, default=20)
    ap.add_argument("--points-tpot", type=int, default=10)
    ap.add_argument("--backend", default="local", choices=["local", "dask"])
    ap.add_argument("--kill-after", type=float, default=None, help="seconds; then resume (CLI mode)")
    a = ap.parse_args()
    path = ROOT / "catalogs" / "scenarios" / "deepseek-chat.yaml"
    traffic, tpot = f"50:2000:log:{a.points_traffic}", f"20:80:lin:{a.points_tpot}"
    if a.kill_after is not None:
        kill_and_resume(path, traffic, tpot, a)
        return
    varies = [Vary("workloads.chat.requests_per_s", parse_values(traffic)),
              Vary("workloads.chat.slo.tpot_ms", parse_values(tpot))]
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


def kill_and_resume(path: Path, traffic: str, tpot: str, a) -> None:
    import pandas as pd

    out = Path(tempfile.mkdtemp(prefix="bench-sweep-")) / "sw"
    cmd = [sys.executable, "-m", "planner", "sweep", str(path), "--vary", f"workloads.chat.requests_per_s={traffic}",
           "--vary", f"workloads.chat.slo.tpot_ms={tpot}", "--out", str(out), "--no-tornado", "--jobs", str(a.jobs),
           "--backend", a.backend]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        p.wait(timeout=a.kill_after)
        print("the sweep finished before the kill; raise --points-traffic or lower --kill-after")
        return
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    killed_at = time.perf_counter() - t
    parts = sorted((out / "parts").glob("part-*.parquet"))
    kept = set(pd.concat([pd.read_parquet(f) for f in parts])["point"]) if parts else set()
    t = time.perf_counter()
    r = subprocess.run([*cmd, "--resume"], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    df = pd.read_csv(out / "sweep.csv")
    total = len(df)
    print(f"{total} points, --backend {a.backend} --jobs {a.jobs}: killed after {killed_at:.0f} s with "
          f"{len(kept)} points in {len(parts)} part files; --resume solved {total - len(kept)} points in {wall:.1f} s "
          f"(exit {r.returncode}); status {df['status'].value_counts().to_dict()}")
    print(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "")


if __name__ == "__main__":
    main()
