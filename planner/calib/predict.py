"""Predict TTFT and TPOT of measured rows from physics and the catalog's efficiency factors.

Predictions never look at the measured columns: each row is turned into a model, a hardware, number
formats, a layout and a load, and evaluated with ``perf/``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from planner.catalog import Catalog, EngineEfficiency
from planner.perf.roofline import Setup
from planner.perf.serving import (
    agg_decode,
    closed_loop_ttft,
    disagg_decode,
    kv_transfer_time,
    prefill_capacity_rps,
    ttft,
)

EffFor = Callable[[str, str], EngineEfficiency]


def catalog_efficiency(catalog: Catalog) -> EffFor:
    def eff_for(hw_id: str, engine: str) -> EngineEfficiency:
        return catalog.hardware[hw_id].efficiency.for_engine(engine)

    return eff_for


def predict_normalised(norm: pd.DataFrame, catalog: Catalog, eff_for: EffFor | None = None) -> pd.DataFrame:
    """Return ``predicted_ttft_ms`` and ``predicted_tpot_ms`` (NaN where ``reason`` is set)."""
    eff_for = eff_for or catalog_efficiency(catalog)
    ttft_ms = pd.Series(np.nan, index=norm.index)
    tpot_ms = pd.Series(np.nan, index=norm.index)
    ok = norm[norm["reason"] == ""]
    keys = ["n_model", "n_hw", "n_engine", "n_dense", "n_expert", "n_kv", "n_mode"]
    for key, g in ok.groupby(keys, sort=False):
        mid, hid, eng, dd, ed, kd, mode = key
        setup = Setup(catalog.models[mid], catalog.hardware[hid], eff_for(hid, eng), dd, ed, kd)
        I = g["n_isl"].to_numpy(float)
        O = g["n_osl"].to_numpy(float)
        if mode == "agg":
            L = [g[f"a_{k}"].to_numpy(float) for k in ("tp", "ep", "pp", "dp")]
            B = g["a_batch"].to_numpy(float)
            st = agg_decode(setup, *L, B, I, O)
            per_rank = B / L[3]
            t1 = ttft(setup, *L, I, per_rank, step_s=st.step_s)
        else:
            Ld = [g[f"d_{k}"].to_numpy(float) for k in ("tp", "ep", "pp", "dp")]
            Lp = [g[f"p_{k}"].to_numpy(float) for k in ("tp", "ep", "pp", "dp")]
            B = g["d_batch"].to_numpy(float)
            st = disagg_decode(setup, *Ld, B, I, O)
            conc = g["n_conc"].fillna(pd.Series(B * g["d_workers"].to_numpy(float), index=g.index)).to_numpy(float)
            per_rank = conc / (g["p_workers"].to_numpy(float) * Lp[3])
            same = setup.hw.scale_up_domain_chips >= 72
            t1 = ttft(setup, *Lp, I, per_rank, transfer_s=kv_transfer_time(setup, I, same))
            cap = prefill_capacity_rps(setup, *Lp, I, g["p_workers"].to_numpy(float))
            t1 = closed_loop_ttft(t1, conc, O, st.step_s, cap)
        tpot_ms.loc[g.index] = st.step_s * 1e3
        ttft_ms.loc[g.index] = t1 * 1e3
    return pd.DataFrame({"predicted_ttft_ms": ttft_ms, "predicted_tpot_ms": tpot_ms})


def predict_frame(df: pd.DataFrame, catalog: Catalog, eff_for: EffFor | None = None) -> pd.DataFrame:
    """The input rows with ``predicted_ttft_ms``, ``predicted_tpot_ms`` and ``prediction_note`` added."""
    from planner.calib.data import normalise

    norm = normalise(df, catalog)
    pred = predict_normalised(norm, catalog, eff_for)
    out = df.copy()
    out["predicted_ttft_ms"] = pred["predicted_ttft_ms"]
    out["predicted_tpot_ms"] = pred["predicted_tpot_ms"]
    out["prediction_note"] = norm["reason"]
    return out
