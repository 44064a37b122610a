"""Prediction error as data: quantiles of measured / predicted TPOT per hardware and (engine, serving mode)
class, stored in each hardware's efficiency block so a scenario's ``margin: {quantile: q}`` can derate
capacity by the error the model has shown on measured rows.

TPOT is the quantity decode capacity scales with (a replica's requests/s is its batch over the time a
request spends decoding), so ``measured / predicted TPOT`` at quantile ``q`` is the factor by which a
replica's capacity may be overstated with probability ``1 - q``. The quantiles are in-sample (the rows the
factors were fitted on); ``docs/validation.md`` gives the cross-validated error for comparison.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from planner.calib.checks import unsteady
from planner.catalog.loader import Catalog
from planner.catalog.schemas import Efficiency

QUANTILES = {"q50": 0.50, "q75": 0.75, "q90": 0.90, "q95": 0.95, "q99": 0.99}
MIN_ROWS = 30
"""Rows a class needs for its own quantiles (else the hardware's ``all`` class stands in): a 90th
percentile of fewer rows is mostly noise."""


def _table(ratio: np.ndarray) -> dict[str, float]:
    return {k: float(round(np.quantile(ratio, q), 4)) for k, q in QUANTILES.items()}


def error_quantiles(norm: pd.DataFrame, pred: pd.DataFrame) -> dict[str, dict[str, dict[str, float]]]:
    """Per hardware id: ``{ENGINE/MODE: {q50: ..., ...}, all: {...}}`` from normalised rows and their
    predictions (rows without a prediction or a measurement are left out)."""
    r = (norm["m_tpot"] / pred["predicted_tpot_ms"]).astype(float)
    # the rows a fit uses: disaggregated rows that do not record their worker counts are guesses, and sweeps not
    # measured in a steady state are the measurement's errors, not the model's
    assumed = norm["n_workers_assumed"].astype(bool) if "n_workers_assumed" in norm else False
    ok = np.isfinite(r) & (r > 0) & ~assumed & ~unsteady(norm)
    frame = pd.DataFrame({"hw": norm["n_hw"], "eng": norm["n_engine"], "mode": norm["n_mode"], "r": r})[ok]
    out: dict[str, dict[str, dict[str, float]]] = {}
    for hw, g in frame.groupby("hw"):
        if not hw or len(g) < MIN_ROWS:
            continue
        classes = {"all": _table(g["r"].to_numpy())}
        for (eng, mode), h in g.groupby(["eng", "mode"]):
            if len(h) >= MIN_ROWS:
                classes[f"{eng}/{mode}"] = _table(h["r"].to_numpy())
        out[str(hw)] = classes
    return out


def with_quantiles(blocks: dict[str, Efficiency], quantiles: dict[str, dict[str, dict[str, float]]],
                   catalog: Catalog) -> dict[str, Efficiency]:
    """The efficiency blocks with their error quantiles: measured hardware its own; hardware whose factors
    are transferred its relative's classes if it has them, else the widest class measured anywhere."""
    widest = None
    for classes in quantiles.values():
        t = classes["all"]
        if widest is None or t["q90"] > widest["q90"]:
            widest = t
    out = {}
    for hid, b in blocks.items():
        q = quantiles.get(hid) or (quantiles.get(b.transferred_from) if b.transferred_from else None)
        if q is None and widest is not None:
            q = {"all": widest}
        out[hid] = b.model_copy(update={"error_quantiles": q or {}})
    return out


def measured_quantiles(sets, catalog: Catalog, eff_for=None) -> dict[str, dict[str, dict[str, float]]]:
    """Error quantiles of the measured files ``sets`` predicted with the catalog's factors (or ``eff_for``)."""
    from planner.calib.predict import predict_normalised

    frames = []
    for m in sets:
        pred = predict_normalised(m.norm, catalog, eff_for) if eff_for else predict_normalised(m.norm, catalog)
        frames.append((m.norm, pred))
    norm = pd.concat([f[0] for f in frames], ignore_index=True)
    pred = pd.concat([f[1] for f in frames], ignore_index=True)
    return error_quantiles(norm, pred)
