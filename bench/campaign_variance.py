"""Within-file and between-file variance of TPOT residuals on the (hardware, engine) pairs that several measured
files cover: the estimate behind ``planner.calib.fit.CAMPAIGN_ROWS``.

Each file is a measurement campaign (its engine versions, its harness, its way of counting); its rows on a pair
scatter about the catalog's prediction by a within-file variance ``s_w^2`` and share an offset of their own. The
offsets' variance ``s_b^2`` is estimated by moments: for two files on a pair, ``(m1 - m2)^2 / 2`` estimates
``s_b^2 + s_w^2 (1 / n1 + 1 / n2) / 2``. ``s_w^2 / s_b^2`` is the number of a file's rows worth its offset.

Usage: ``python bench/campaign_variance.py --data FILE --data FILE [--catalog catalogs]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.calib.data import load_measured  # noqa: E402
from planner.calib.fit import prepare  # noqa: E402
from planner.calib.predict import predict_normalised  # noqa: E402
from planner.catalog import load_catalog  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", action="append", required=True, type=Path)
    ap.add_argument("--catalog", default=str(ROOT / "catalogs"))
    a = ap.parse_args(argv)
    cat = load_catalog(a.catalog)
    norm, _ = prepare([load_measured(p, cat, measured=True) for p in a.data], cat)
    pred = predict_normalised(norm, cat)
    norm = norm.assign(lr=np.log(pred["predicted_tpot_ms"].to_numpy(float) / norm["m_tpot"].to_numpy(float)))
    norm = norm[np.isfinite(norm["lr"])]
    g = norm.groupby(["n_hw", "n_engine", "src"])["lr"].agg(["mean", "var", "count"])
    print(g.round(3).to_string())
    dof = (g["count"] - 1).clip(lower=0)
    s_w2 = float((g["var"].fillna(0.0) * dof).sum() / dof.sum())
    between = []
    for pair, x in g.reset_index().groupby(["n_hw", "n_engine"]):
        if len(x) < 2:
            continue
        m, n = x["mean"].to_numpy(), x["count"].to_numpy(float)
        for i in range(len(x)):
            for j in range(i + 1, len(x)):
                between.append((pair, (m[i] - m[j]) ** 2 / 2.0 - s_w2 * (1.0 / n[i] + 1.0 / n[j]) / 2.0))
    for pair, v in between:
        print(f"{pair[0]:<12} {pair[1]:<8} offset variance {v:+.4f}")
    s_b2 = float(np.mean([v for _, v in between])) if between else float("nan")
    print(f"\nwithin-file variance {s_w2:.4f}; between-file offset variance {s_b2:.4f} over {len(between)} pairs; "
          f"rows worth a file's offset: {s_w2 / s_b2:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
