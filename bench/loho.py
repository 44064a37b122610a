"""Leave one hardware out, with the transfer a catalog applies to hardware without measured rows (issue 42).

Each fold refits the end-to-end factors without one hardware's rows (both files together, as
``planner calibrate report --folds hardware`` does) and predicts that hardware's rows twice from the same fit:

- ``sibling``: the factors of its nearest measured relative (``planner.calib.fit.relative``: the same architecture,
  else the same vendor, nearest by datasheet), the catalog's rule;
- ``all-hardware``: the fit over every other hardware, the rule before relatives were found by architecture (the
  hand-kept list named only H800, B300, GB300 and MI325X, so every measured chip held out fell back to it).

    python bench/loho.py [--data FILE ...] [--jobs 2] [--systems b200-sxm,h100-sxm] [--engines]

Prints, per file, the TPOT / TTFT (and output tokens/s per GPU where recorded) median and p90 APE of both, overall
and per held-out system, and the wall time. ``--engines``: leave one serving engine out instead (its rows predicted
with the factors fitted on the other engines' rows: each hardware's default block).
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.calib import fit as F  # noqa: E402
from planner.calib.data import Measured, load_measured  # noqa: E402
from planner.calib.metrics import evaluation_frame, format_table, summary_rows  # noqa: E402
from planner.calib.report import _predict_with, held_out  # noqa: E402
from planner.catalog.loader import load_catalog  # noqa: E402

SHARED = ROOT.parent / "shared" / "calibration"
DATA = [SHARED / "silicon_calibration.csv", SHARED / "inferencex" / "dsr1_runs.json"]


def _fold(args):
    norm, catalog, hw = args
    res = F.fit_norm(norm[norm["n_hw"] != hw], catalog)
    test = norm[norm["n_hw"] == hw]
    sibling = _predict_with(F.efficiency_blocks(res, catalog, "loho"), catalog, test)
    keep = F.relative
    F.relative = lambda *_a, **_k: None  # the all-hardware fit for every held-out chip
    try:
        allhw = _predict_with(F.efficiency_blocks(res, catalog, "loho"), catalog, test)
    finally:
        F.relative = keep
    return hw, test.index, sibling, allhw, F.relative(catalog, hw, [h for h in res.by_hw])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", action="append", type=Path)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--systems", default=None, help="held-out hardware ids, comma-separated (default: every one)")
    ap.add_argument("--engines", action="store_true", help="leave one engine out instead of one hardware")
    a = ap.parse_args()
    cat = load_catalog()
    sets = [load_measured(p, cat, measured=True) for p in (a.data or DATA)]
    if a.engines:
        t0 = time.perf_counter()
        frames = held_out(sets, cat, "n_engine", jobs=a.jobs)
        print(f"leave one engine out in {time.perf_counter() - t0:.0f} s")
        for name, f in frames.items():
            print(f"\n## {name}, leave one engine out\n")
            print(format_table(summary_rows(f, None), []))
            print()
            print(format_table(summary_rows(f, ["engine"]), ["engine"]))
        return
    norm, _ = F.prepare(sets, cat)
    systems = a.systems.split(",") if a.systems else sorted(norm["n_hw"].unique())
    t0 = time.perf_counter()
    args = [(norm, cat, h) for h in systems]
    if a.jobs > 1:
        with ProcessPoolExecutor(max_workers=a.jobs) as ex:
            results = list(ex.map(_fold, args))
    else:
        results = [_fold(x) for x in args]
    print(f"{len(systems)} folds in {time.perf_counter() - t0:.0f} s")
    for hw, _, _, _, rel in results:
        print(f"  {hw} held out: inherits from {rel or 'the all-hardware fit'}")
    for rule, k in (("sibling", 2), ("all-hardware", 3)):
        pred = pd.concat([r[k].set_axis(r[1]) for r in results])
        for m in sets:
            mine = norm.loc[pred.index][norm.loc[pred.index, "src"] == m.path.name]
            if mine.empty:
                continue
            rows = mine["row_in_file"].to_numpy()
            sub = Measured(m.path, m.fmt, m.raw.loc[rows], m.norm.loc[rows])
            f = evaluation_frame(sub, pred.loc[mine.index].set_axis(rows))
            print(f"\n## {m.path.name}, leave one hardware out, transfer: {rule}\n")
            print(format_table(summary_rows(f, None), []))
            print()
            print(format_table(summary_rows(f, ["system"]), ["system"]))


if __name__ == "__main__":
    main()
