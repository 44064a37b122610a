"""Checks every measured-data format shares once normalised: a batch, positive lengths, and a layout the model can
be sharded into.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from planner.catalog import Catalog
from planner.errors import InputError
from planner.perf.layout import Layout, check_layout

MAX_DEGREE = 65536
"""Largest parallel degree (or redundant expert count) a measured row may record."""


MAX_ROW_BATCH = 10_000_000
"""Largest batch or concurrency a measured row may record."""

SWEEP_DROP = 0.75
"""A concurrency sweep is inconsistent when a row's TPOT falls below this share of a lower concurrency's in the same
sweep (:func:`inconsistent_sweeps`)."""
SWEEP_KEYS = ("n_series", "n_hw", "n_engine", "n_model", "n_mode", "n_dense", "n_expert", "n_kv", "n_isl", "n_osl",
              "n_spec", "a_tp", "a_pp", "a_dp", "a_ep", "a_red", "p_tp", "p_pp", "p_dp", "p_ep", "p_red", "p_workers",
              "d_tp", "d_pp", "d_dp", "d_ep", "d_red", "d_workers")
"""What a concurrency sweep holds fixed: its series (source and engine version), model, formats, lengths and the
whole recorded deployment."""


def _whole(x) -> bool:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return False
    return bool(np.isfinite(v)) and v == int(v) and 0 <= v <= MAX_DEGREE


def finish(out: pd.DataFrame, reason: pd.Series, catalog: Catalog, *, names: dict[str, dict[str, str]]) -> pd.DataFrame:
    """Checks shared by every format: a batch, positive lengths, and a layout the model can be sharded
    into (as ``planner roofline`` checks it; ``names[role]`` maps layout fields to the file's columns)."""
    reason = reason.copy()
    is_agg = (out["n_mode"] == "agg").to_numpy()
    batch = np.where(is_agg, out["a_batch"], out["d_batch"])
    no_batch = ~np.isfinite(batch.astype(float)) | (batch <= 0)
    reason[no_batch & (reason == "")] = "no batch size or concurrency"
    bad_len = ~np.isfinite(out["n_isl"].astype(float)) | ~np.isfinite(out["n_osl"].astype(float)) | ~(out["n_isl"] > 0) | ~(out["n_osl"] > 0)
    reason[bad_len & (reason == "")] = "isl and osl must be positive, finite numbers"
    big = (batch > MAX_ROW_BATCH) & ~no_batch
    reason[big & (reason == "")] = f"batch size or concurrency above {MAX_ROW_BATCH:,}"
    # A layout the model cannot be sharded into (TP not dividing the attention heads, EP not dividing the
    # experts and redundant slots) is not one an engine runs as written, whatever was measured under that
    # label: no number for it, and the message ``planner roofline`` gives for the same layout, naming the
    # file's column.
    for i in out.index[(reason == "") & (out["n_model"] != "")]:
        m = catalog.models[out.at[i, "n_model"]]
        for role in (("a",) if out.at[i, "n_mode"] == "agg" else ("p", "d")):
            odd = [k for k in ("tp", "ep", "pp", "dp", "red") if not _whole(out.at[i, f"{role}_{k}"])]
            if odd:
                col = names[role].get({"red": "redundant"}.get(odd[0], odd[0]), odd[0])
                reason[i] = f"{col} must be a whole number from {0 if odd[0] == 'red' else 1} to {MAX_DEGREE:,}"
                break
            degrees = {k: int(out.at[i, f"{role}_{k}"]) for k in ("tp", "ep", "pp", "dp")}
            degrees["redundant"] = int(out.at[i, f"{role}_red"])
            if m.architecture.moe is None:
                degrees["ep"], degrees["redundant"] = 1, 0  # dense rows may carry an MoE field; it shards nothing
            try:
                check_layout(m, Layout(**degrees), names=names[role])
            except InputError as exc:
                reason[i] = str(exc)
                break
    out["reason"] = reason
    out["n_inconsistent"] = inconsistent_sweeps(out)
    return out


def inconsistent_sweeps(out: pd.DataFrame) -> pd.Series:
    """Rows of concurrency sweeps whose TPOT is not (nearly) non-decreasing in concurrency.

    With the deployment fixed, more clients in flight can only put more sequences into each decode step, so a
    sweep's TPOT rises with its concurrency, up to run-to-run noise. A sweep (rows that share every column of
    :data:`SWEEP_KEYS` and differ in concurrency, at least three; the deployment recorded in full) in which a
    row's TPOT falls below :data:`SWEEP_DROP` of a lower concurrency's was not measured in a steady state (one
    in the bundled silicon file goes 8, 42, 28, 42, 29 ms from 1 to 32 clients on a model whose step is ~5 ms):
    the whole sweep is flagged, and the end-to-end fit leaves it out (``planner validate`` still scores it)."""
    flag = pd.Series(False, index=out.index)
    need = [k for k in SWEEP_KEYS if k in out.columns]
    if "n_series" not in out.columns or not {"n_conc", "m_tpot"} <= set(out.columns):
        return flag
    assumed = out["n_workers_assumed"].astype(bool) if "n_workers_assumed" in out.columns else False
    ok = (out["reason"] == "") & ~assumed
    ok &= np.isfinite(out["n_conc"].astype(float)) & (out["m_tpot"].astype(float) > 0)
    rows = out.loc[ok, need + ["n_conc", "m_tpot"]].copy()
    for k in need:  # group NaN cells (not recorded) together
        rows[k] = rows[k].astype(object).where(rows[k].notna(), "")
    for _, g in rows.groupby(need, sort=False):
        if len(g) < 3 or g["n_conc"].duplicated().any():
            continue
        t = g.sort_values("n_conc")["m_tpot"].to_numpy(float)
        if float(np.min(t / np.maximum.accumulate(t))) < SWEEP_DROP:
            flag[g.index] = True
    return flag


def unsteady(norm: pd.DataFrame) -> pd.Series:
    """The rows :func:`inconsistent_sweeps` flagged (none for a frame built without them, e.g. by hand)."""
    if "n_inconsistent" in norm.columns:
        return norm["n_inconsistent"].astype(bool)
    return pd.Series(False, index=norm.index)
