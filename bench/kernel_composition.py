"""The step composed from kernel curves, measured end to end: fit, in-sample error, held-out hardware, production.

The catalog stores each NVIDIA system's kernel curves (``planner calibrate kernels``) with ``compose: false``: the
planner's step keeps the datasheet roofline with its ~25 fitted factors per (hardware, engine), because that
predicts the measured serving rows and the published deployments better today. This script turns composition on
in memory for every hardware with curves, refits the end-to-end factors the composed step leaves free (8 per
hardware and engine; ``calib/fit.py``: ``KERNEL_TPOT_PARAMS``, ``KERNEL_TTFT_PARAMS``), and prints, beside the
catalog's current model:

- in-sample TPOT / TTFT / output-throughput errors on both measured files (median and p90 APE);
- ``--loho HW`` (repeatable): leave that hardware's rows out of the end-to-end fit and predict them with its own
  kernel curves and the factors transferred from the other kernel-composed hardware;
- ``bench/production_check.py``'s published deployments with the refitted factors.

Nothing is written. Runtime: one end-to-end fit (~20 min on 2 cores), plus one per ``--loho`` hardware.

Usage: ``python bench/kernel_composition.py [--silicon FILE] [--inferencex FILE] [--loho h200-sxm ...] [--json]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.calib.data import Measured, load_measured  # noqa: E402
from planner.calib.fit import efficiency_blocks, fit_norm, prepare  # noqa: E402
from planner.calib.predict import predict_normalised  # noqa: E402
from planner.catalog import load_catalog  # noqa: E402

SHARED = ROOT.parent / "shared" / "calibration"


def composed(catalog):
    """A copy of ``catalog`` whose kernel blocks compose the step."""
    hw = {}
    for hid, h in catalog.hardware.items():
        kf = h.efficiency.kernels
        if kf is not None:
            h = h.model_copy(update={"efficiency": h.efficiency.model_copy(update={"kernels": kf.model_copy(update={"compose": True})})})
        hw[hid] = h
    return replace(catalog, hardware=hw)


def with_blocks(catalog, blocks):
    return replace(catalog, hardware={hid: h.model_copy(update={"efficiency": blocks[hid]}) for hid, h in catalog.hardware.items()})


def errors(sets, catalog, eff_for=None) -> dict:
    out = {}
    for m in sets:
        p = predict_normalised(m.norm, catalog, eff_for)
        row = {}
        for key, col, meas in (("tpot", "predicted_tpot_ms", "m_tpot"), ("ttft", "predicted_ttft_ms", "m_ttft"),
                               ("otpg", "predicted_output_tput_per_gpu", "m_otpg")):
            if meas not in m.norm.columns:
                continue
            a = np.abs(p[col].to_numpy(float) / m.norm[meas].to_numpy(float) - 1.0)
            a = a[np.isfinite(a)]
            if len(a):
                row[key] = {"median": float(np.median(a)), "p90": float(np.quantile(a, 0.9)), "rows": len(a)}
        out[m.path.name] = row
    return out


def production(catalog) -> dict:
    spec = importlib.util.spec_from_file_location("production_check", ROOT / "bench" / "production_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    res = mod.cases(catalog)
    return {"summary": mod.summary(res), "ratios": {c["case"]: round(c["ratio"], 3) for c in res}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--silicon", type=Path, default=SHARED / "silicon_calibration.csv")
    ap.add_argument("--inferencex", type=Path, default=SHARED / "inferencex" / "dsr1_runs.json")
    ap.add_argument("--loho", action="append", default=[], help="hardware id to hold out of the end-to-end fit")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    base = load_catalog(ROOT / "catalogs")
    sets = [load_measured(p, base, measured=True) for p in (args.silicon, args.inferencex)]
    res = {"catalog": {"errors": errors(sets, base), "production": production(base)}}
    cat = composed(base)
    t = time.time()
    norm, dropped = prepare(sets, cat)
    fitted = fit_norm(norm, cat, dropped)
    blocks = efficiency_blocks(fitted, cat, "bench")
    cat_fit = with_blocks(cat, blocks)
    res["composed"] = {"fit_s": round(time.time() - t, 1), "errors": errors(sets, cat_fit),
                       "production": production(cat_fit)}
    for hid in args.loho:
        train = norm[norm["n_hw"] != hid]
        b = efficiency_blocks(fit_norm(train, cat), cat, "bench")
        mine = with_blocks(cat, b)
        errs = {}
        for m in sets:
            sub = m.norm[m.norm["n_hw"] == hid]
            if sub.empty:
                continue
            errs.update(errors([Measured(m.path, m.fmt, m.raw.loc[sub.index], sub)], mine))
        res.setdefault("loho", {})[hid] = errs
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    for name, r in res.items():
        print(f"== {name}")
        if name == "loho":
            for hid, e in r.items():
                print(f"  {hid}: {json.dumps(e)}")
            continue
        for f, e in r["errors"].items():
            print(f"  {f}: " + "; ".join(f"{k} median {v['median']:.1%} p90 {v['p90']:.1%}" for k, v in e.items()))
        s = r["production"]["summary"]
        print(f"  production: median error factor {s['median_error_factor']:.3f}, {s['within_15pct']:.0%} within 15%, "
              f"{s['outside_0.67_1.5']} outside [0.67, 1.5]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
