"""Percentiles against measured runs and against simulation (issue 46's targets).

1. InferenceX runs (closed-loop benchmark, p99 recorded beside the median): p99 TTFT, p99 TPOT and median/p99 ITL
   predicted by the catalog's factors (in sample) and with each hardware left out of the fit (``--loho``: the
   factors refitted without that hardware's rows, as ``planner calibrate report --folds hardware`` does).
2. Every bundled plan simulated with 100,000 requests (fixed seed): per pool, predicted / simulated p90 and p99
   TTFT where the pool runs at utilisation <= 0.9, and each workload's simulated attainment against its quantile.

    python bench/percentiles.py [--loho] [--jobs 2] [--plans-only | --runs-only]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.calib.data import load_measured  # noqa: E402
from planner.calib.metrics import evaluation_frame, format_tail_table, summary_rows  # noqa: E402
from planner.calib.predict import notes, predict_normalised  # noqa: E402
from planner.catalog.loader import load_catalog  # noqa: E402

RUNS = ROOT.parent / "shared" / "calibration" / "inferencex" / "dsr1_runs.json"


def runs(loho: bool, jobs: int) -> None:
    cat = load_catalog()
    meas = load_measured(RUNS, cat, measured=True)
    pred = predict_normalised(meas.norm, cat)
    f = evaluation_frame(meas, pred, notes(meas.norm, pred, cat, meas.fmt))
    print("## InferenceX runs, in sample\n")
    print(format_tail_table(summary_rows(f, None), []))
    print()
    print(format_tail_table(summary_rows(f, ["mode"]), ["mode"]))
    print()
    print(format_tail_table(summary_rows(f, ["spec"]), ["spec"]))
    if not loho:
        return
    from planner.calib.report import held_out

    t0 = time.perf_counter()
    frames = held_out([meas], cat, "n_hw", jobs=jobs)
    g = frames[RUNS.name]
    print(f"\n## InferenceX runs, leave one hardware out ({time.perf_counter() - t0:.0f} s)\n")
    print(format_tail_table(summary_rows(g, None), []))
    print()
    print(format_tail_table(summary_rows(g, ["system"]), ["system"]))
    print()
    print(format_tail_table(summary_rows(g, ["spec"]), ["spec"]))
    s = summary_rows(g, None)[0]
    print(f"\nmedians beside them (LOHO): TPOT {100 * s['tpot_median_ape']:.1f}%, TTFT {100 * s['ttft_median_ape']:.1f}%")


def plans() -> None:
    from planner.analysis.simulate import simulate, summary
    from planner.export.bundle import read_plan

    print("\n## Bundled plans, 100,000 simulated requests each (seed 0)\n")
    print("| plan | pool | queue utilisation | p90 TTFT pred / sim | p99 TTFT pred / sim | workload | within TTFT (q) "
          "| within TPOT (q) | goodput | wall s |")
    print("|---|---|---:|---:|---:|---|---|---|---|---:|")
    ratios = []
    for folder in sorted((ROOT / "plans").iterdir()):
        if not (folder / "plan.json").exists():
            continue
        plan = read_plan(folder)
        t0 = time.perf_counter()
        rows = summary(plan, simulate(plan, requests=100_000, seed=0))
        wall = time.perf_counter() - t0
        pools = {p.id: p for p in plan.pools}
        for r in rows:
            if r["pool"] == "(all)":
                q_t, q_p = r["slo_ttft_quantile"], r["slo_tpot_quantile"]
                print(f"| {folder.name} | (all) | | | | {r['workload']} | {r['ttft_within']:.2%} ({q_t}) | "
                      f"{r['tpot_within']:.2%} ({q_p}) | {r['goodput']:.2%} | {wall:.1f} |")
                continue
            p = pools[r["pool"]]
            if r.get("ttft_p90_ms") is None or p.role == "decode":
                continue
            # the queues' utilisation: the prefill ranks', and (aggregated) the batch slots'
            lt, pr = p.predicted.latency, p.predicted
            lam = pr.requests_per_s_per_replica * pr.utilisation
            u = lam * lt.prefill_work_s / max(lt.prefill_servers, 1.0)
            if p.role == "aggregated":
                hold = lt.ttft_base_s + next(w.output_tokens for w in plan.workloads if w.name == p.workload) * pr.tpot_s
                u = max(u, lam * hold / max(p.batch, 1))
            a90 = r["pred_ttft_p90_ms"] / r["ttft_p90_ms"]
            a99 = r["pred_ttft_p99_ms"] / r["ttft_p99_ms"]
            if u <= 0.9 and r["requests"] >= 2000:
                ratios += [a90, a99]
            print(f"| {folder.name} | {r['pool']} | {u:.2f} | {r['pred_ttft_p90_ms']:,.0f} / {r['ttft_p90_ms']:,.0f} "
                  f"| {r['pred_ttft_p99_ms']:,.0f} / {r['ttft_p99_ms']:,.0f} | | | | | |")
    ratios = np.asarray(ratios)
    if ratios.size:
        err = np.abs(ratios - 1.0)
        print(f"\npools at utilisation <= 0.9 with >= 2,000 simulated requests: {ratios.size // 2}; predicted / "
              f"simulated p90 and p99 TTFT within 15% in {np.mean(err <= 0.15):.0%} (median |error| "
              f"{100 * np.median(err):.1f}%, worst {100 * err.max():.1f}%)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loho", action="store_true", help="Also leave each hardware out of the fit (minutes).")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--plans-only", action="store_true")
    ap.add_argument("--runs-only", action="store_true")
    a = ap.parse_args()
    if not a.plans_only:
        if not RUNS.exists():
            sys.exit(f"{RUNS}: not found (the measured runs live in ../shared)")
        runs(a.loho, a.jobs)
    if not a.runs_only:
        plans()


if __name__ == "__main__":
    main()
