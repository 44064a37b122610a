"""How much of the p99 TTFT error of the InferenceX runs is their own scatter, and what the first wave costs (issue 46).

Three figures quoted in ``docs/validation.md`` (Tails section):

1. **Repeats**: configurations run more than once with identical settings, how far their p99 TPOT and p99 TTFT
   scatter, and the *stall runs*: more than 3x and 5 s above their configuration's fastest run's p99 TTFT.
2. **Leave one hardware out without the stall runs** (``--cache DIR``: the fold fits ``bench/loho.py --cache DIR``
   keeps; folds missing there are fitted, 29 min for all): the p99 TTFT median APE with and without them.
3. **The first wave**: for aggregated runs with at least 8 clients per attention rank, the per-prompt cost at which
   the wave drains, measured (``(p99 - median TTFT) / (0.9 (clients per rank - 1))``) against the model's, per hardware,
   engine and prompt length; and for every run whose p99 TTFT is a first-wave drain (at least 8 s and 5x the median),
   the model's wave (``predicted_ttft_wave_ms``, without the one-time delay) over the measured p99, per hardware and mode
   (the 0.78 of ``bench/data/prefill_term_experiment.txt``).

``--fit-p99 HW,ENGINE`` also refits that pair's TTFT factors on its InferenceX rows with and without the p99 TTFT
residuals beside the medians, and prints both fits' p99 TTFT median APE (does a different split of the fitted factors
explain the first wave?).

``--by-date``: the first wave's delay (``planner.calib.wave``) against the runs' dates: the in-sample shortfall at
<= 16 clients per engine, hardware and month, and (with ``--cache``) the leave-one-hardware-out p99 TTFT median APE per
vendor and era with the delay and without (the figures docs/validation.md quotes for it).

``--router``: the runs whose router places requests on decode workers at random (MoRI-SGLang, two decode workers):
predicted / measured p99-to-median TPOT ratio, median and median APE, with the router's spread
(``calib/predict.py::_routing_excess``) and without, with and without drafts (in sample; held out with ``--cache``).

    python bench/tail_scatter.py [--data FILE] [--cache DIR] [--fit-p99 b200-sxm,sglang] [--by-date] [--router]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from planner.calib import fit as F  # noqa: E402
from planner.calib.data import load_measured  # noqa: E402
from planner.calib.predict import predict_normalised  # noqa: E402
from planner.catalog.loader import load_catalog  # noqa: E402

DATA = ROOT.parent / "shared" / "calibration" / "inferencex" / "dsr1_runs.json"
SETTINGS = ("hardware", "framework", "precision", "spec_method", "disagg", "isl", "osl", "conc", "prefill_tp",
            "prefill_ep", "prefill_num_workers", "decode_tp", "decode_ep", "decode_num_workers", "decode_dp_attention")


def repeats(raw: list[dict]) -> pd.DataFrame:
    """Per run: its configuration key, p99 TTFT and TPOT (ms), and whether it is a stall run."""
    d = pd.DataFrame({"key": [tuple(r[k] for k in SETTINGS) for r in raw],
                      "ttft99": [r["metrics"]["p99_ttft"] * 1e3 for r in raw],
                      "tpot99": [r["metrics"]["p99_tpot"] * 1e3 for r in raw]})
    g = d.groupby("key")
    d["n"] = g["ttft99"].transform("size")
    fastest = g["ttft99"].transform("min")
    d["stall"] = (d["n"] >= 2) & (d["ttft99"] > 3.0 * fastest) & (d["ttft99"] - fastest > 5000.0)
    return d


def first_wave(norm: pd.DataFrame, pred: pd.DataFrame) -> pd.DataFrame:
    a = norm[(norm["n_mode"] == "agg") & pred["predicted_ttft_p99_ms"].notna()].copy()
    a["per_rank"] = a["a_batch"] / a["a_dp"]
    a = a[a["per_rank"] >= 8]
    p = pred.loc[a.index]
    scale = 0.9 * (a["per_rank"] - 1.0)
    a["measured_ms"] = (a["m_ttft_p99"] - a["m_ttft"]) / scale
    a["model_ms"] = (p["predicted_ttft_p99_ms"] - p["predicted_ttft_ms"]) / scale
    a["isl"] = a["n_isl"].round(-2)
    out = a.groupby(["n_hw", "n_engine", "isl"])[["measured_ms", "model_ms"]].median()
    out["ratio"] = out["measured_ms"] / out["model_ms"]
    return out.round(2)


def wave_drain(norm: pd.DataFrame, pred: pd.DataFrame, min_ms: float = 8000.0, dominant: float = 5.0) -> pd.DataFrame:
    """Runs whose measured p99 TTFT is at least ``min_ms`` and ``dominant`` times the median (the clients' first wave
    draining through the prefill ranks): the model's wave over the measured p99, median per hardware and mode."""
    p99 = norm["m_ttft_p99"]
    sel = p99.notna() & (p99 >= min_ms) & (p99 >= dominant * norm["m_ttft"])
    r = (pred.loc[sel[sel].index, "predicted_ttft_wave_ms"] / p99[sel]).rename("wave / measured p99")
    out = r.groupby([norm.loc[r.index, "n_hw"], norm.loc[r.index, "n_mode"]]).agg(["size", "median"])
    out.loc[("all", ""), :] = [len(r), r.median()]
    return out.round(3)


def loho_without_stalls(norm, cat, cache: Path, stall_rows: set[int]) -> tuple[float, float]:
    import loho

    parts = []
    for hw in sorted(norm["n_hw"].unique()):
        _, idx, _, allhw, _, _ = loho._fold((norm, cat, hw, cache))
        parts.append(allhw.set_axis(idx))
    p = pd.concat(parts)
    ape = (p["predicted_ttft_p99_ms"] / norm.loc[p.index, "m_ttft_p99"] - 1.0).abs().dropna()
    keep = ~norm.loc[ape.index, "row_in_file"].isin(stall_rows)
    return float(ape.median()), float(ape[keep].median())


def delay_by_date(norm, raw: list[dict], pred: pd.DataFrame, cat, cache: Path | None) -> None:
    """The first wave's delay against the runs' dates (``planner.calib.wave``): in sample, the median shortfall of the
    measured p99 TTFT under the model's without the delay at <= 16 clients, per engine, hardware and month; with
    ``cache``, the leave-one-hardware-out p99 TTFT median APE per vendor and era, with the delay and without."""
    month = norm["row_in_file"].map(lambda i: raw[int(i)]["date"][:7])
    bare = np.maximum(pred["predicted_ttft_steady_ms"], pred["predicted_ttft_wave_ms"])
    low = (norm["n_conc"] <= 16) & bare.notna()
    short = ((norm["m_ttft_p99"] - bare) / 1e3)[low].groupby([norm["n_engine"], norm["n_hw"], month]).agg(["size", "median"])
    print("\nFirst wave's delay: measured p99 TTFT minus the model's without it (s), <= 16 clients, in sample:\n")
    print(short.round(2).to_string())
    if cache is None:
        return
    import loho

    parts = []
    for hw in sorted(norm["n_hw"].unique()):
        _, idx, _, allhw, _, _ = loho._fold((norm, cat, hw, cache))
        parts.append(allhw.set_axis(idx))
    p = pd.concat(parts)
    m = norm.loc[p.index, "m_ttft_p99"]
    era = np.where(month.loc[p.index] >= "2026-03", "2026-03 on", "before 2026-03")
    vendor = norm.loc[p.index, "n_hw"].map(lambda h: cat.hardware[h].vendor)
    with_ = (p["predicted_ttft_p99_ms"] / m - 1.0).abs()
    without = (np.maximum(p["predicted_ttft_steady_ms"], p["predicted_ttft_wave_ms"]) / m - 1.0).abs()
    t = pd.DataFrame({"with delay": with_, "without": without}).groupby([vendor, era]).median()
    print("\nLeave one hardware out, p99 TTFT median APE by vendor and run date:\n")
    print((100 * t).round(1).to_string())


def router_tails(norm, cat, cache: Path | None) -> None:
    """Predicted / measured p99-to-median TPOT of the randomly routed multi-worker runs, with the router's spread and
    without (see the module docstring)."""
    import loho

    from planner.calib import predict as PR
    from planner.calib.inferencex import random_decode_route

    rows = norm[norm["n_framework"].map(random_decode_route) & (norm["d_workers"] > 1)]
    measured = rows["m_tpot_p99"] / rows["m_tpot"]
    real = PR._routing_excess
    print(f"\nRandomly routed runs of several decode workers ({len(rows)}), predicted / measured p99-to-median TPOT "
          f"({'held out' if cache else 'in sample'}):\n")
    for label, excess in (("with the router's spread", real), ("without", lambda *a, **k: 0.0)):
        PR._routing_excess = excess
        try:
            if cache:
                parts = [loho._fold((norm, cat, hw, cache)) for hw in sorted(rows["n_hw"].unique())]
                p = pd.concat([allhw.set_axis(idx) for _, idx, _, allhw, _, _ in parts]).loc[rows.index]
            else:
                p = predict_normalised(rows, cat)
        finally:
            PR._routing_excess = real
        r = p["predicted_tpot_p99_ms"] / p["predicted_tpot_ms"] / measured
        for drafts, sel in (("without drafts", rows["n_spec"] == 0), ("with drafts", rows["n_spec"] > 0)):
            print(f"  {label}, {drafts} ({int(sel.sum())}): median {r[sel].median():.3f}, "
                  f"APE {100 * (r[sel] - 1).abs().median():.1f}%")


def fit_p99(norm, cat, hw: str, eng: str) -> None:
    g = norm[(norm["n_hw"] == hw) & (norm["n_engine"] == eng)]
    base = cat.hardware[hw].efficiency.for_engine(eng)
    plain = F._residuals

    def with_p99(rows, catalog, eff, target, weighted=True):
        r = plain(rows, catalog, eff, target, weighted)
        if target != "ttft":
            return r
        p = predict_normalised(rows, catalog, lambda _h, _e: eff)
        x = np.nan_to_num(np.log(p["predicted_ttft_p99_ms"].to_numpy(float) / rows["m_ttft_p99"].to_numpy(float)),
                          nan=0.0, posinf=5.0, neginf=-5.0)
        return np.concatenate([r, x * np.sqrt(rows["w"].to_numpy(float)) if weighted else x])

    for name, res in (("medians only", plain), ("medians and p99 TTFT", with_p99)):
        F._residuals = res
        try:
            eff = F._fit_stage(g, cat, base, F.TTFT_PARAMS, "ttft", base)
        finally:
            F._residuals = plain
        p = predict_normalised(g, cat, lambda _h, _e, eff=eff: eff)
        ape = (p["predicted_ttft_p99_ms"] / g["m_ttft_p99"] - 1.0).abs().median()
        print(f"  {hw} {eng}, TTFT factors fitted on {name}: p99 TTFT median APE {100 * ape:.1f}% "
              f"(prefill_compute {eff.prefill_compute:.3f}, first_token_steps {eff.first_token_steps:.2f})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--cache", type=Path, default=None)
    ap.add_argument("--fit-p99", default=None, help="HW,ENGINE: refit that pair's TTFT factors with p99 TTFT too")
    ap.add_argument("--by-date", action="store_true",
                    help="the first wave's delay against the runs' dates (in sample; per vendor and era with --cache)")
    ap.add_argument("--router", action="store_true",
                    help="the randomly routed runs' p99-to-median TPOT with the router's spread and without")
    a = ap.parse_args()
    cat = load_catalog()
    raw = json.loads(a.data.read_text())
    rep = repeats(raw)
    multi = rep[rep["n"] >= 2]
    dev = {m: (multi[m] / multi.groupby("key")[m].transform("median") - 1.0).abs().median() for m in ("ttft99", "tpot99")}
    spread = multi.groupby("key")["ttft99"].agg(lambda x: x.max() / x.min())
    print(f"{len(multi)} of {len(rep)} runs repeat one of {multi['key'].nunique()} configurations: p99 TPOT within "
          f"{100 * dev['tpot99']:.1f}% of the configuration's median, p99 TTFT within {100 * dev['ttft99']:.1f}% (medians); "
          f"p99 TTFT max/min across reruns: median {spread.median():.2f}, p90 {spread.quantile(0.9):.2f}; "
          f"stall runs: {int(rep['stall'].sum())}")
    sets = [load_measured(a.data, cat, measured=True)]
    norm, _ = F.prepare(sets, cat)
    pred = predict_normalised(norm, cat)
    print("\nFirst wave, per-prompt drain (ms), aggregated runs with >= 8 clients per rank (in sample):\n")
    print(first_wave(norm, pred).to_string())
    print("\nFirst-wave drains (p99 TTFT >= 8 s and >= 5x the median), the model's wave / measured p99 (in sample):\n")
    print(wave_drain(norm, pred).to_string())
    if a.cache:
        stalls = set(np.flatnonzero(rep["stall"].to_numpy()))
        with_, without = loho_without_stalls(norm, cat, a.cache, stalls)
        print(f"\nleave one hardware out, p99 TTFT median APE: {100 * with_:.1f}% with the stall runs, "
              f"{100 * without:.1f}% without")
    if a.fit_p99:
        fit_p99(norm, cat, *a.fit_p99.split(","))
    if a.by_date:
        delay_by_date(norm, raw, pred, cat, a.cache)
    if a.router:
        router_tails(norm, cat, a.cache)


if __name__ == "__main__":
    main()
