"""Does a (hardware, engine) pair's own fit predict runs it has not seen better with every factor its rows inform
free (~9-16) or with at most ``PAIR_FREE`` (8) of its own (issue 42, Deliver 2), and which 8: those with whose refit
the others' return to the prior costs least (``cut``, the profile rule, the catalog's since 2026-12-07) or those
whose return alone costs most (``cut_alone``, the rule before)?

Group K-fold over measurement series (``n_series``: the silicon file's source export and engine version, InferenceX's
framework and date): each fold refits everything (``planner.calib.fit.fit_norm``) without one group of series and
predicts that group's rows three times from the same pooled fits (overall, per engine, per hardware): with each pair's
fit cut to ``PAIR_FREE`` factors by either rule and with the pair's uncut fit (every informed factor free). Rows of
pairs that keep fewer than ``MIN_ROWS`` training rows are predicted from the hardware's block in all three. Prints
TPOT and TTFT median / p90 APE per file, each rule, and per pair.

    python bench/pair_cv.py [--folds 4] [--jobs 2] [--data FILE ...] [--cache DIR]
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.calib import fit as F  # noqa: E402
from planner.calib.data import load_measured  # noqa: E402
from planner.calib.report import _predict_with  # noqa: E402
from planner.catalog.loader import load_catalog  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from loho import map_folds  # noqa: E402

SHARED = ROOT.parent / "shared" / "calibration"
DATA = [SHARED / "silicon_calibration.csv", SHARED / "inferencex" / "dsr1_runs.json"]


def folds_of(norm: pd.DataFrame, k: int) -> np.ndarray:
    """Fold of each row: whole series to one fold, series dealt largest first to the fold with fewest rows."""
    sizes = norm.groupby("n_series").size().sort_values(ascending=False)
    load, fold = np.zeros(k), {}
    for s, n in sizes.items():
        i = int(np.argmin(load))
        fold[s] = i
        load[i] += n
    return norm["n_series"].map(fold).to_numpy(int)


def _fold(args):
    norm, catalog, fold, i, cache = args
    path = cache / f"fold{i}.pkl" if cache else None
    if path is not None and path.exists():
        res, full, alone = pickle.loads(path.read_bytes())
    else:
        full, alone = {}, {}
        orig = F.restrict

        def keep_full(g, cat, eff, prior, *a, **kw):
            key = (g["n_hw"].iloc[0], g["n_engine"].iloc[0])
            full[key] = eff
            alone[key] = orig(g, cat, eff, prior, *a, **{**kw, "rule": "alone"})[0]
            return orig(g, cat, eff, prior, *a, **kw)

        F.restrict = keep_full
        try:
            res = F.fit_norm(norm[fold != i], catalog)
        finally:
            F.restrict = orig
        if path is not None:
            path.write_bytes(pickle.dumps((res, full, alone)))
    test = norm[fold == i]
    cut = _predict_with(F.efficiency_blocks(res, catalog, "cv"), catalog, test)
    res_full = F.FitResult(**{**res.__dict__, "by_group": {**res.by_group, **full}})
    uncut = _predict_with(F.efficiency_blocks(res_full, catalog, "cv"), catalog, test)
    res_alone = F.FitResult(**{**res.__dict__, "by_group": {**res.by_group, **alone}})
    cut_alone = _predict_with(F.efficiency_blocks(res_alone, catalog, "cv"), catalog, test)
    return test.index, cut, uncut, cut_alone


def ape(pred, meas):
    return (pred / meas - 1.0).abs()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", action="append", type=Path)
    ap.add_argument("--folds", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=None)
    a = ap.parse_args()
    cat = load_catalog()
    sets = [load_measured(p, cat, measured=True) for p in (a.data or DATA)]
    norm, _ = F.prepare(sets, cat)
    fold = folds_of(norm, a.folds)
    if a.cache:
        a.cache.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = map_folds(_fold, [(norm, cat, fold, i, a.cache) for i in range(a.folds)], a.jobs)
    print(f"{a.folds} folds over {norm['n_series'].nunique()} series in {time.perf_counter() - t0:.0f} s")
    rows = []
    for idx, cut, uncut, cut_alone in results:
        for rule, p in (("cut", cut), ("uncut", uncut), ("cut_alone", cut_alone)):
            f = norm.loc[idx, ["src", "n_hw", "n_engine", "m_tpot", "m_ttft"]].copy()
            f["rule"] = rule
            f["tpot"] = ape(p["predicted_tpot_ms"].set_axis(idx), f["m_tpot"])
            f["ttft"] = ape(p["predicted_ttft_ms"].set_axis(idx), f["m_ttft"])
            rows.append(f)
    d = pd.concat(rows).dropna(subset=["tpot"])
    q = {"tpot_median": ("tpot", "median"), "tpot_p90": ("tpot", lambda x: x.quantile(0.9)),
         "ttft_median": ("ttft", "median"), "ttft_p90": ("ttft", lambda x: x.quantile(0.9)), "rows": ("tpot", "size")}
    pd.set_option("display.width", 200)
    print("\nrows of series held out, per file (APE):\n")
    print((d.groupby(["src", "rule"]).agg(**q)).round(3).to_string())
    print("\nper pair:\n")
    print((d.groupby(["src", "n_hw", "n_engine", "rule"]).agg(**q)).round(3).to_string())


if __name__ == "__main__":
    main()
