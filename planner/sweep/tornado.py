"""The tornado: each input swung up and down on its own, what the plan's cost does.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from planner.catalog.loader import Catalog
from planner.catalog.scenario import ResolvedScenario
from planner.errors import InfeasibleError, InputError
from planner.options import PlanOptions
from planner.perf.candidates import prefix_shares
from planner.sweep.points import (
    set_path,
    validate_point,
)
from planner.sweep.solving import (
    clear_groups,
    solve_point,
)


def tornado_inputs(base: dict, rs: ResolvedScenario, hardware_used: list[str]) -> list[tuple[str, float]]:
    """(path, base value) of the inputs a tornado moves: per workload traffic, prompt and output
    length and both SLOs; the price of every hardware the base plan buys."""
    out = []
    for w in rs.scenario.workloads:
        out += [
            (f"workloads.{w.name}.requests_per_s", w.requests_per_s),
            (f"workloads.{w.name}.input_tokens", w.input_tokens),
            (f"workloads.{w.name}.output_tokens", w.output_tokens),
            (f"workloads.{w.name}.slo.ttft_ms", w.slo.ttft_ms),
            (f"workloads.{w.name}.slo.tpot_ms", w.slo.tpot_ms),
        ]
    out += [(f"prices.{h}", rs.prices[h]) for h in hardware_used]
    return out


def tornado(base: dict, path: Path, catalog: Catalog, *, swing: float = 0.2, opts: PlanOptions | None = None,
            progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """$/M tokens at the base point and with each input moved by ``-swing`` and ``+swing``."""
    opts = opts or PlanOptions(analysis=False)
    clear_groups()
    rs = validate_point(base, catalog, path, {})
    if opts.prefix_shares is None:  # demand moves by +-swing on the base point's model
        opts = dataclasses.replace(opts, prefix_shares=prefix_shares(rs.scenario.workloads, low=1 / (1 + swing),
                                                                     high=1 / max(1 - swing, 1e-9)))
    row = solve_point(rs, base, opts)
    if row["status"] not in ("optimal", "feasible"):
        raise InfeasibleError(f"{path}: the base scenario has no plan ({row['diagnosis']})")
    used = sorted({h for k, v in row.items() if k.endswith(".hardware") for h in str(v).split("+") if h})
    inputs = tornado_inputs(base, rs, used)
    out = []
    for n, (p, v0) in enumerate(inputs, start=1):
        res = {}
        for side, f in (("low", 1 - swing), ("high", 1 + swing)):
            doc = copy.deepcopy(base)
            val = v0 * f
            if p.endswith("_tokens"):
                val = max(1, round(val))
            set_path(doc, p, val)
            try:
                r = solve_point(validate_point(doc, catalog, path, {p: val}), doc, opts)
            except InputError as err:
                r = {"status": "error", "diagnosis": str(err)}
            res[side] = (val, r.get("usd_per_mtok", math.nan), r["status"])
        out.append({"input": p, "base_value": v0, "low_value": res["low"][0], "high_value": res["high"][0],
                    "usd_per_mtok_base": row["usd_per_mtok"], "usd_per_mtok_low": res["low"][1],
                    "usd_per_mtok_high": res["high"][1], "status_low": res["low"][2], "status_high": res["high"][2]})
        if progress:
            progress(n, len(inputs))
    df = pd.DataFrame(out)
    span = (df["usd_per_mtok_high"] - df["usd_per_mtok_low"]).abs()
    return df.assign(swing_usd_per_mtok=span).sort_values("swing_usd_per_mtok", ascending=False, na_position="last")

