"""Leave one model out for a few models: the factors refitted without every row of each named model (both files
together), then its rows predicted (issue 42: do the physics carry to a model the fit has not seen?).

``planner calibrate report --folds model`` holds out every model (14 folds, over an hour on 2 cores); this runs the
named ones only, the same fold as ``planner.calib.report.held_out``.

    python bench/lomo.py [--models gpt-oss-120b,qwen3-235b-a22b] [--jobs 2] [--data FILE ...]

Prints, per file, the TPOT / TTFT median and p90 APE over the held-out rows, per model and per system.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.loho import DATA  # noqa: E402  (the two measured files beside the repository)
from planner.calib.data import load_measured  # noqa: E402
from planner.calib.metrics import format_table, summary_rows  # noqa: E402
from planner.calib.report import held_out  # noqa: E402
from planner.catalog.loader import load_catalog  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt-oss-120b,qwen3-235b-a22b", help="catalog model ids, comma-separated")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--data", action="append", type=Path)
    a = ap.parse_args()
    cat = load_catalog()
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in cat.models]
    if unknown:
        sys.exit(f"--models {unknown[0]}: not a catalog model id")
    sets = [load_measured(p, cat, measured=True) for p in (a.data or DATA)]
    t0 = time.perf_counter()
    frames = held_out(sets, cat, "n_model", values=models, jobs=a.jobs)
    print(f"{len(models)} folds in {time.perf_counter() - t0:.0f} s")
    for name, f in frames.items():
        print(f"\n## {name}, leave one model out\n")
        print(format_table(summary_rows(f, None), []))
        print()
        print(format_table(summary_rows(f, ["model"]), ["model"]))
        print()
        print(format_table(summary_rows(f, ["system"]), ["system"]))


if __name__ == "__main__":
    main()
