"""Benchmark of candidate-table generation for the bundled scenarios (figures for issue notes).

    python bench/bench_candidates.py [SCENARIO ...] [--fleet N ...] [--worker] [--check-search]

Prints rows evaluated, rows kept, drop counts and wall time (best of 3) per scenario: the table alone
(``build_candidates``) and the pool as ``planner plan`` streams it with the analysis's SLO levels and prefix
ranges (``evaluate_candidates``, what a plan pays; the rows it holds). ``--fleet N``: the N-workload scenario of ``bench_fleet.py``.
``--worker``: also the pool evaluated here and on one worker started with it, as a plan of several workloads does
(``planner.analysis.workers.evaluate_beside``; the worker's start-up included).
``--check-search``: also the pool with every row's load searched (``planner.perf.pruning.bound_dominated`` made to
skip nothing), its time, and whether its rows and drop counts are the same as the plan's pool's (they must be: the
rows whose search is skipped are rows the dominance test drops whatever their load); exit 1 naming the scenarios where
it is not.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.catalog import load_catalog  # noqa: E402
from planner.catalog.scenario import Scenario, load_scenario, resolve_scenario  # noqa: E402
from planner.options import PlanOptions  # noqa: E402
from planner.perf.candidates import build_candidates, evaluate_candidates, scenario_slos  # noqa: E402
from planner.pipeline.plan import analysis_shares, slo_levels  # noqa: E402


def _best(f) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(3):
        t = time.perf_counter()
        out = f()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", nargs="*", type=Path)
    ap.add_argument("--fleet", type=int, action="append", default=[])
    ap.add_argument("--worker", action="store_true", help="also time the pool evaluated with a worker beside")
    ap.add_argument("--check-search", action="store_true", help="also the pool with every load searched, compared")
    a = ap.parse_args()
    cat = load_catalog()
    differ = []
    cases = []
    for path in a.scenario or ([] if a.fleet else sorted((ROOT / "catalogs" / "scenarios").glob("*.yaml"))):
        cases.append((path.stem, resolve_scenario(load_scenario(path), cat, path)))
    if a.fleet:
        sys.path.insert(0, str(ROOT / "bench"))
        from bench_fleet import scenario

        cases += [(f"fleet-{n}", resolve_scenario(Scenario.model_validate(scenario(n)), cat)) for n in a.fleet]
    for name, rs in cases:
        table_s, ct = _best(lambda rs=rs: build_candidates(rs))
        levels = slo_levels(scenario_slos(rs.scenario.workloads), True)
        shares = analysis_shares(rs, PlanOptions())
        pool_s, pool = _best(lambda rs=rs, levels=levels, shares=shares: evaluate_candidates(rs, None, levels, shares))
        beside = f"  with a worker {_best(lambda rs=rs, levels=levels, shares=shares: _beside(rs, levels, shares))[0]:.2f} s" \
            if a.worker else ""
        check = ""
        if a.check_search:
            all_s, ref = _best(lambda rs=rs, levels=levels, shares=shares: _search_all(rs, levels, shares))
            same = ref.rows.equals(pool.rows) and ref.base_slo_drops == pool.base_slo_drops
            check = f"  every load searched {all_s:.2f} s, {'the same pool' if same else 'A DIFFERENT POOL'}"
            if not same:
                differ.append(name)
        print(f"{name:16} evaluated {ct.evaluated:9,d}  kept {len(ct.rows):5d}  dropped {ct.dropped}  table {table_s:.2f} s"
              f"  plan's streamed pool {pool_s:.2f} s ({len(pool.rows):,d} rows){beside}{check}")
    if differ:
        raise SystemExit(f"--check-search: the pool with every load searched differs for {', '.join(differ)}")


def _search_all(rs, levels, shares):
    """The plan's streamed pool with every row's load searched: no row is skipped as beaten."""
    import numpy as np

    from planner.perf import candidates as C

    skip = C.bound_dominated
    C.bound_dominated = lambda groups, *_: np.zeros(len(groups), dtype=bool)
    try:
        return evaluate_candidates(rs, None, levels, shares)
    finally:
        C.bound_dominated = skip


def _beside(rs, levels, shares):
    """The pool evaluated here and on one worker started now (as ``planner plan`` starts it, with the candidates)."""
    from planner.analysis.workers import Workers, evaluate_beside

    workers = Workers(1)
    try:
        return evaluate_beside(workers, rs, None, levels, shares)
    finally:
        workers.close()


if __name__ == "__main__":
    main()
