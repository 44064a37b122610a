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
    admission_wait,
    agg_decode,
    closed_loop_ttft,
    disagg_decode,
    kv_capacity_sequences,
    kv_transfer_time,
    prefill_capacity_rps,
    ttft,
)

EffFor = Callable[[str, str], EngineEfficiency]

ADMIT_OUTPUT_SHARE = {"trtllm": 1.0}
"""Share of the output length an engine reserves in KV when it admits a request (default 0.5: the mean
in-flight context of a closed loop, for engines that allocate as tokens arrive and preempt when full,
as SGLang and vLLM do). TensorRT-LLM's default capacity scheduler (GUARANTEED_NO_EVICT) admits a
request only when its whole prompt and output fit."""


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
        held = I + ADMIT_OUTPUT_SHARE.get(eng, 0.5) * O
        if mode == "agg":
            L = [g[f"a_{k}"].to_numpy(float) for k in ("tp", "ep", "pp", "dp")]
            C = g["a_batch"].to_numpy(float)
            # Admission follows the engine's policy (``held``). The planner itself reserves I + O per
            # sequence, so its plans never preempt.
            cap = kv_capacity_sequences(setup, *L, held)
            B = np.minimum(C, np.maximum(cap, 1.0))
            st = agg_decode(setup, *L, B, I, O)
            per_rank = B / L[3]
            t1 = ttft(setup, *L, I, per_rank, step_s=st.step_s) + admission_wait(C, cap, O, st.step_s)
        else:
            Ld = [g[f"d_{k}"].to_numpy(float) for k in ("tp", "ep", "pp", "dp")]
            Lp = [g[f"p_{k}"].to_numpy(float) for k in ("tp", "ep", "pp", "dp")]
            Bd = g["d_batch"].to_numpy(float)
            kv_cap = kv_capacity_sequences(setup, *Ld, held)
            # Rows without worker counts: assume as many decode workers as it takes to hold the
            # concurrency in KV memory (nobody deploys fewer).
            assumed = g["n_workers_assumed"].to_numpy(bool)
            need = np.maximum(np.ceil(Bd / np.maximum(kv_cap, 1.0)), 1.0)
            Bd = np.where(assumed, Bd / need, Bd)
            B = np.minimum(Bd, np.maximum(kv_cap, 1.0))
            st = disagg_decode(setup, *Ld, B, I, O)
            d_workers = np.where(assumed, need, g["d_workers"].to_numpy(float))
            conc = g["n_conc"].fillna(pd.Series(Bd * d_workers, index=g.index)).to_numpy(float)
            cap1 = prefill_capacity_rps(setup, *Lp, I, 1.0)
            # Without recorded worker counts, also assume the prefill pool matches the decode pool's
            # request rate (a balanced deployment, as the planner itself would size it).
            rate = d_workers * B / (O * st.step_s)
            p_workers = np.where(assumed, np.maximum(np.ceil(rate / cap1), 1.0), g["p_workers"].to_numpy(float))
            cap = cap1 * p_workers
            per_rank = conc / (p_workers * Lp[3])
            same = setup.hw.scale_up_domain_chips >= 72
            t1 = ttft(setup, *Lp, I, per_rank, transfer_s=kv_transfer_time(setup, I, same))
            t1 = closed_loop_ttft(t1, conc, O, st.step_s, cap) + admission_wait(Bd, kv_cap, O, st.step_s)
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
    note = norm["reason"].copy()
    assumed = (note == "") & norm["n_workers_assumed"]
    note[assumed] = "worker counts not recorded: assumed decode workers to hold the concurrency and rate-matched prefill"
    out["prediction_note"] = note
    return out
