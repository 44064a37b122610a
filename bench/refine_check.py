"""What the refined batch rows (planner/perf/refine.py) are worth: each bundled scenario planned with them, without them
(the doubling grid alone), and with a grid of 1.5x steps instead; cost and candidate rows and time of each (figures for
issue notes, never a timed test). Each plan runs in a fresh process without the analysis.

    python bench/refine_check.py [SCENARIO ...]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys
import planner.perf.candidates as C
mode = sys.argv[2]
if mode == "grid":
    C.refine_targets = lambda levels, workloads: {}
elif mode == "1.5x":
    C.refine_targets = lambda levels, workloads: {}
    C.BATCH_PER_RANK = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
from planner.catalog import load_catalog
from planner.catalog.scenario import load_scenario, resolve_scenario
from planner.options import PlanOptions
from planner.pipeline.plan import make_plan
rs = resolve_scenario(load_scenario(sys.argv[1]), load_catalog(), sys.argv[1])
res = make_plan(rs, PlanOptions(analysis=False))
print(json.dumps({"usd_per_hour": res.plan.objective.usd_per_hour, "candidates_s": res.timings["candidates_s"],
                  "evaluated": res.plan.solver.candidates["evaluated"]}))
"""

MODES = ("refined", "grid", "1.5x")


def run(path: Path, mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), mode], capture_output=True, text=True, cwd=ROOT,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    names = sys.argv[1:] or sorted(p.stem for p in (ROOT / "catalogs" / "scenarios").glob("*.yaml"))
    print("| scenario | " + " | ".join(f"{m}: $/h, rows, candidates s" for m in MODES) + " | grid / refined cost |")
    print("|---|" + "---|" * (len(MODES) + 1))
    for name in names:
        r = {m: run(ROOT / "catalogs" / "scenarios" / f"{name}.yaml", m) for m in MODES}
        cells = [f"{r[m]['usd_per_hour']:,.2f}, {r[m]['evaluated']:,}, {r[m]['candidates_s']:.2f}" for m in MODES]
        print(f"| {name} | " + " | ".join(cells) + f" | {r['grid']['usd_per_hour'] / r['refined']['usd_per_hour']:.2f}x |")


if __name__ == "__main__":
    main()
