"""Is the catalog's end-to-end fit converged? Per (hardware, engine) pair with at least ``MIN_ROWS`` rows, refit the
pair once more (``planner.calib.fit.fit_group``) starting from the factors the catalog stores, with the prior the fit
uses for it (the hardware's factors for its silicon and links, the pair's own for the rest: an approximation, the
engine's pooled fit is not stored), and print the rows' robust loss (``fit.data_loss``) before and after. A pair whose
loss still falls by more than ``fit.CONVERGED`` was stopped before its optimum.

    python bench/fit_convergence.py [--data FILE ...]     (about 2 min on 2 cores)

Measured 2026-11-29 on the catalog of that day's first refit with two fixed alternations: GB200 TensorRT-LLM 57.9 ->
48.4, GB200 SGLang 10.1 -> 9.5, every other pair within 1% (MI355X SGLang 59.1 -> 61.7: the prior's pull); on the
catalog refitted with the fit run to convergence (7acaf24): every pair within +-2% (GB200 TensorRT-LLM 44.26 -> 44.40).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.calib import fit as F  # noqa: E402
from planner.calib.data import load_measured  # noqa: E402
from planner.catalog import load_catalog  # noqa: E402

DATA = [ROOT.parent / "shared/calibration/silicon_calibration.csv", ROOT.parent / "shared/calibration/inferencex/dsr1_runs.json"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, action="append", default=None)
    a = ap.parse_args(argv)
    cat = load_catalog(ROOT / "catalogs")
    norm, _ = F.prepare([load_measured(p, cat) for p in (a.data or DATA)], cat)
    fixed = bool(norm["n_hw"].map(lambda h: F.kernel_terms(cat, h)).any())  # as fit_norm sets it
    print(f"{'hardware':<14} {'engine':<8} {'rows':>5} {'loss':>8} {'refit':>8} {'change':>7}")
    for (hw, eng), g in norm.groupby(["n_hw", "n_engine"]):
        if len(g) < F.MIN_ROWS:
            continue
        cur = cat.hardware[hw].efficiency.for_engine(eng)
        prior = F.group_prior(cat.hardware[hw].efficiency.default, cur)
        t0 = time.perf_counter()
        new = F.fit_group(g, cat, cur, prior, F.has_kernels(cat, hw), fixed_share=fixed)
        before, after = F.data_loss(g, cat, cur), F.data_loss(g, cat, new)
        print(f"{hw:<14} {eng:<8} {len(g):>5} {before:>8.2f} {after:>8.2f} {after / before - 1:>+7.1%}"
              f"  ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
