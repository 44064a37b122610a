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
    return out

