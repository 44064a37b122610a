"""Price curves: the cheapest $/M output tokens at each interactivity level, and speed tiers.

Every aggregated-serving candidate (hardware x layout x batch x formats x KV tier) of the model is
evaluated by the performance model for one request shape; its cost per million output tokens is the
replica's $/h times its share of time spent generating (the rest is prompt work) over the output
tokens it produces per hour, at scale (whole replicas, no idle purchase units). Interactivity is
output tokens/s per user, ``1 / TPOT``. The curve is the Pareto frontier of (interactivity up,
cost down), from the cost-optimal point to the fastest reachable one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from planner.catalog.loader import Catalog
from planner.catalog.scenario import Scenario, resolve_scenario
from planner.errors import InfeasibleError, InputError
from planner.perf.candidates import evaluate_candidates, select_candidates
from planner.perf.layout import describe_layout

SPEED_MULTIPLES = (1.0, 1.5, 2.0, 2.5, 3.0)


@dataclass
class PriceCurve:
    points: pd.DataFrame
    """The frontier, by increasing interactivity."""
    tiers: list[dict]
    rows_evaluated: int

    def to_json(self) -> dict:
        pts = [
            {
                "tokens_per_s_per_user": float(r.tokens_per_s_per_user),
                "usd_per_mtok_output": float(r.usd_per_mtok_output),
                "hardware": str(r.hardware),
                "layout": {"tp": int(r.tp), "ep": int(r.ep), "pp": int(r.pp), "attn_dp": int(r.attn_dp),
                           "redundant_experts": int(r.redundant),
                           "notation": describe_layout(r.tp, r.ep, r.pp, r.attn_dp, r.redundant)},
                "engine": str(r.engine),
                "spec_tokens": int(r.spec),
                "two_batch_overlap": bool(int(r.tbo)),
                "batch": int(r.batch),
                "weights_dtype": str(r.weights_dtype),
                "kv_dtype": str(r.kv_dtype),
                "ttft_s": float(r.ttft_s),
                "tpot_s": float(r.tpot_s),
            }
            for r in self.points.itertuples(index=False)
        ]
        return {"points": pts, "tiers": self.tiers, "rows_evaluated": self.rows_evaluated}


def frontier(df: pd.DataFrame) -> pd.DataFrame:
    """Rows no other row beats on both interactivity (higher) and cost (lower), slowest first."""
    d = df.sort_values(["tokens_per_s_per_user", "usd_per_mtok_output"], ascending=[False, True], kind="stable")
    keep, best = [], math.inf
    for idx, cost in zip(d.index, d["usd_per_mtok_output"], strict=True):
        if cost < best * (1 - 1e-12):
            keep.append(idx)
            best = cost
    return df.loc[keep].sort_values("tokens_per_s_per_user", kind="stable").reset_index(drop=True)


def speed_tiers(front: pd.DataFrame, multiples=SPEED_MULTIPLES) -> list[dict]:
    """For each multiple of the cost-optimal point's interactivity: the cheapest price multiple that
    reaches it, or ``unreachable`` past the fastest point (the latency floor)."""
    base = front.iloc[0]
    out = []
    for m in multiples:
        reach = front[front["tokens_per_s_per_user"] >= m * base["tokens_per_s_per_user"] * (1 - 1e-9)]
        if reach.empty:
            out.append({"speed_multiple": m, "price_multiple": "unreachable"})
        else:
            r = reach.iloc[0]
            out.append({"speed_multiple": m, "price_multiple": float(r["usd_per_mtok_output"] / base["usd_per_mtok_output"]),
                        "tokens_per_s_per_user": float(r["tokens_per_s_per_user"]), "hardware": str(r["hardware"])})
    return out


def price_curve(catalog: Catalog, model: str, hardware: list[str] | None = None, *, input_tokens: int = 2000,
                output_tokens: int = 500, ttft_ms: float = 5000.0, engine: str | None = None,
                weights: list[str] | None = None, kv: list[str] | None = None,
                margin_quantile: float | None = None) -> PriceCurve:
    """``weights``: weight formats a point may serve (default: the model's native format); ``kv``: KV-cache
    formats (default fp8 and bf16). ``margin_quantile``: price each point at the capacity that holds when the performance model errs as it
    did at that quantile of its class's measured rows (a scenario's ``margin.quantile``)."""
    if input_tokens < 1 or output_tokens < 1:
        raise InputError("--input-tokens and --output-tokens must be at least 1")
    if margin_quantile is not None and not 0.0 < margin_quantile < 1.0:
        raise InputError(f"--margin-quantile: {margin_quantile:g} is not a quantile; give a value in (0, 1), e.g. 0.9")
    doc = {
        "name": "price-curve",
        "model": model,
        "kv_cache": list(kv) if kv else ["fp8", "bf16"],
        "serving": ["aggregated"],
        "workloads": [{"name": "api", "requests_per_s": 1.0, "input_tokens": input_tokens,
                       "output_tokens": output_tokens, "slo": {"ttft_ms": ttft_ms, "tpot_ms": 1e9}}],
    }
    if hardware:
        doc["hardware"] = list(hardware)
    if weights:
        doc["weights"] = list(weights)
    if margin_quantile is not None:
        doc["margin"] = {"quantile": margin_quantile}
    from pydantic import ValidationError

    from planner.catalog.loader import format_validation_error

    try:
        sc = Scenario.model_validate(doc)
    except ValidationError as err:
        first = err.errors()[0]
        flag = {"weights": "--weights", "kv_cache": "--kv"}.get(str(first["loc"][0]))
        if flag is None:
            raise InputError(format_validation_error("price-curve", err)) from None
        raise InputError(f"{flag} {first.get('input')!r}: {first['msg']}") from None
    rs = resolve_scenario(sc, catalog, None)
    pool = evaluate_candidates(rs, engine)
    if pool.rows.empty:
        raise InfeasibleError(f"--model {model}: no layout fits in memory on the chosen hardware")
    df = select_candidates(pool, {"api": (ttft_ms / 1e3, np.inf)}, prune=False).rows
    df = df[df["tpot_s"] > 0].copy()
    if df.empty:
        raise InfeasibleError(f"--ttft-ms {ttft_ms:g}: no layout reaches it; raise it")
    out_tok_h = df["requests_per_s"] * output_tokens * 3600.0
    df["usd_per_mtok_output"] = df["usd_per_hour"] * (1.0 - df["input_share"]) / out_tok_h * 1e6
    df["tokens_per_s_per_user"] = 1.0 / df["tpot_s"]
    df = df[np.isfinite(df["usd_per_mtok_output"]) & (df["usd_per_mtok_output"] > 0)]
    front = frontier(df)
    return PriceCurve(front, speed_tiers(front), pool.evaluated)
