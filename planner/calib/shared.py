"""Runs recorded in two measured files: a silicon row that is an InferenceX run exported twice.

The silicon format does not record speculative decoding; InferenceX does. The fit counts such a run once, with the
copy that records its whole configuration (:func:`planner.calib.fit.prepare`), and the validation report lists the
silicon copies' errors by what InferenceX records. No prediction reads the match: a silicon row is predicted from its
own fields.
"""

from __future__ import annotations

import pandas as pd

from planner.calib.data import QUANT

SHARED_TPOT_TOL = 0.03
"""Two records are one run exported twice when their configuration and date agree and their measured TPOTs
are within 3% (repeat runs of one configuration on one date differ by more, see the repeatability tables)."""


def shared_runs(sil, ix) -> pd.DataFrame:
    """Rows of a silicon file that are also runs of an InferenceX file (same hardware, engine, precision,
    nominal lengths, concurrency, serving mode and date, and the same measured TPOT within :data:`SHARED_TPOT_TOL`),
    with the speculative decoding the InferenceX run records (``spec_method``), which the silicon format does
    not carry. Index: the silicon rows; column ``spec_method``. The fit leaves these silicon rows out (their
    InferenceX copies stand for them); no prediction reads the match."""
    def keys(m, date, prec):
        n = m.norm
        return pd.DataFrame({
            "hw": n["n_hw"].astype(str), "eng": n["n_engine"].astype(str), "prec": prec,
            "isl": pd.to_numeric(m.raw["isl"], errors="coerce").to_numpy(),
            "osl": pd.to_numeric(m.raw["osl"], errors="coerce").to_numpy(),
            "conc": pd.to_numeric(n["n_conc"], errors="coerce"), "mode": n["n_mode"].astype(str), "date": date,
            "tpot": pd.to_numeric(n["m_tpot"], errors="coerce"),
        }, index=n.index)

    if not {"silicon_data_source", "precision"} <= set(sil.raw.columns) or not {"date", "precision"} <= set(ix.raw.columns):
        return pd.DataFrame({"spec_method": pd.Series(dtype=str)})

    def prec(col):  # the number format as the normaliser reads it (nvfp4 and mxfp4 are fp4)
        low = col.astype(str).str.lower()
        return low.map(QUANT).fillna(low)

    s_date = sil.raw["silicon_data_source"].astype(str).str.extract(r"measured=(\d{4}-\d\d-\d\d)")[0]
    a = keys(sil, s_date, prec(sil.raw["precision"])).rename_axis("row").reset_index()
    b = keys(ix, ix.raw["date"].astype(str).str[:10], prec(ix.raw["precision"]))
    b["spec_method"] = ix.raw["spec_method"].astype(str).to_numpy()
    on = ["hw", "eng", "prec", "isl", "osl", "conc", "mode", "date"]
    m = a.dropna(subset=["date"]).merge(b, on=on, suffixes=("", "_ix"))
    m = m[(m["tpot_ix"] / m["tpot"] - 1.0).abs() <= SHARED_TPOT_TOL]
    m = m.drop_duplicates("row").set_index("row")
    return m[["spec_method"]]


def silicon_copies(sets) -> dict[str, pd.Index]:
    """Per silicon file of ``sets`` (:class:`planner.calib.data.Measured`), its rows that are runs of an InferenceX
    file of ``sets`` exported twice (:func:`shared_runs`): empty where ``sets`` hold no file of the other format."""
    ix = [m for m in sets if m.fmt == "inferencex"]
    out: dict[str, pd.Index] = {}
    for m in sets:
        if m.fmt != "silicon" or not ix:
            continue
        idx = pd.Index([])
        for other in ix:
            idx = idx.union(shared_runs(m, other).index)
        out[m.path.name] = idx
    return out


RECORD_ONLY = ("n_series", "n_framework", "reason", "n_inconsistent")
"""Normalised columns that say where a row was recorded, not what ran or what was measured."""


def repeated_rows(norm: pd.DataFrame) -> pd.Series:
    """Rows of one normalised file that repeat an earlier row of it in every normalised field and both measurements:
    one run recorded twice (the silicon file holds runs exported from two sources under two ids, at times under
    another checkpoint path or a layout the normaliser reads alike). The fit counts it once."""
    keys = [c for c in norm.columns if c[:2] in ("n_", "a_", "p_", "d_", "m_") and c not in RECORD_ONLY]
    return norm.duplicated(subset=keys, keep="first")
