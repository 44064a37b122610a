"""Benchmark of candidate-table generation for the bundled scenarios (figures for issue notes).

    python bench/bench_candidates.py

Prints rows evaluated, rows kept, drop counts and wall time (best of 3) per scenario.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.catalog import load_catalog  # noqa: E402
from planner.catalog.scenario import load_scenario, resolve_scenario  # noqa: E402
from planner.perf.candidates import build_candidates  # noqa: E402


def main() -> None:
    cat = load_catalog()
    for path in sorted((ROOT / "catalogs" / "scenarios").glob("*.yaml")):
        rs = resolve_scenario(load_scenario(path), cat, path)
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            ct = build_candidates(rs)
            best = min(best, time.perf_counter() - t)
        print(f"{path.stem:16} evaluated {ct.evaluated:7d}  kept {len(ct.rows):4d}  dropped {ct.dropped}  {best:.2f} s")


if __name__ == "__main__":
    main()
