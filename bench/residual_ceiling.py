"""How far could any correction built on the recorded columns take the performance model?

Fits a gradient-boosted correction of ``log(measured / predicted)`` on the calibration rows from the
columns a row records (model, hardware, engine, formats, lengths, concurrency, layouts, worker counts)
plus the model's own prediction, and scores it out of fold:

- ``random``: 5-fold over rows. Lenient: the other load points of a row's own sweep are in training,
  so the learner can come close to looking rows up.
- ``series``: 5-fold over sweeps (rows that differ only in concurrency stay together): what a
  correction would do for a configuration it has not seen.

If even the lenient score misses a target, no function of the recorded columns meets it on this file:
what is left depends on things the rows do not record. Diagnostic only (the planner never applies
such a correction); needs scikit-learn: ``pip install -e '.[diagnostics]'``.

Usage: ``python bench/residual_ceiling.py [--data ../shared/calibration/silicon_calibration.csv]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from planner.calib.data import normalise, read_rows
from planner.calib.predict import predict_normalised
from planner.catalog import load_catalog
from planner.errors import InputError

TARGETS = {"tpot": 0.50, "ttft": 0.60}  # p90 targets of issue 2 (medians: 15% and 25%)


def features(norm: pd.DataFrame) -> pd.DataFrame:
    agg = norm["n_mode"] == "agg"

    def pick(a: str, d: str) -> pd.Series:
        return np.log(norm[a].where(agg, norm[d]).astype(float))

    conc = norm["n_conc"].fillna(norm["a_batch"].where(agg, norm["d_batch"] * norm["d_workers"]))
    cats = {c: norm[c].astype("category").cat.codes for c in ("n_model", "n_hw", "n_engine", "n_dense", "n_kv")}
    return pd.DataFrame({
        "conc": np.log(conc.astype(float)), "isl": np.log(norm["n_isl"]), "osl": np.log(norm["n_osl"]),
        "tp": pick("a_tp", "p_tp"), "dp": pick("a_dp", "p_dp"), "ep": pick("a_ep", "p_ep"),
        "d_tp": pick("a_tp", "d_tp"), "d_dp": pick("a_dp", "d_dp"), "d_ep": pick("a_ep", "d_ep"),
        "p_workers": np.log(norm["p_workers"].where(~agg, 1.0)), "d_workers": np.log(norm["d_workers"].where(~agg, 1.0)),
        "agg": agg.astype(int), "open": norm["n_workers_assumed"].astype(int), **cats,
    }, index=norm.index)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/calibration/silicon_calibration.csv"))
    args = ap.parse_args()
    try:
        from sklearn.ensemble import GradientBoostingRegressor
        from sklearn.model_selection import GroupKFold, KFold, cross_val_predict
    except ImportError:
        sys.exit("error: scikit-learn is missing; install it with: python -m pip install -e '.[diagnostics]'")
    catalog = load_catalog()
    try:
        df = read_rows(args.data, measured=True)
    except InputError as exc:
        sys.exit(f"error: {exc}")
    norm = normalise(df, catalog)
    pred = predict_normalised(norm, catalog)
    ok = pred["predicted_tpot_ms"].notna() & (df["silicon_ttft_ms"] > 0) & (df["silicon_tpot_ms"] > 0)
    norm, pred, df = norm[ok], pred[ok], df[ok]
    X = features(norm)
    series = X.drop(columns=["conc"]).astype(str).agg("|".join, axis=1).astype("category").cat.codes
    print(f"{len(X)} predicted rows, {series.nunique()} sweeps")
    for name, tol in TARGETS.items():
        y = np.log(df[f"silicon_{name}_ms"] / pred[f"predicted_{name}_ms"]).to_numpy()
        Xt = X.assign(pred=np.log(pred[f"predicted_{name}_ms"]))
        base = np.abs(np.exp(-y) - 1)
        line = [f"{name.upper()} physics: median {100 * np.median(base):.1f}% p90 {100 * np.quantile(base, 0.9):.1f}% "
                f"(> {100 * tol:.0f}%: {int((base > tol).sum())})"]
        for label, cv, groups in (("random", KFold(5, shuffle=True, random_state=0), None), ("series", GroupKFold(5), series)):
            model = GradientBoostingRegressor(max_depth=4, n_estimators=300, learning_rate=0.05, subsample=0.8,
                                              loss="huber", random_state=0)
            corr = cross_val_predict(model, Xt, y, cv=cv, groups=groups)
            err = np.abs(np.exp(corr - y) - 1)
            line.append(f"+ correction ({label} folds): median {100 * np.median(err):.1f}% p90 "
                        f"{100 * np.quantile(err, 0.9):.1f}% (> {100 * tol:.0f}%: {int((err > tol).sum())})")
        print("\n  ".join(line))


if __name__ == "__main__":
    main()
