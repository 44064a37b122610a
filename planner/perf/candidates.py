"""Candidate table for the planner: every (workload, role, hardware, layout, batch, dtype) evaluated
by the performance model, filtered by memory and SLOs, and pruned of dominated rows (pandas/NumPy,
no Pyomo).

Roles: ``aggregated`` replicas serve whole requests; disaggregated serving pairs ``prefill`` and
``decode`` replicas. Each row carries the request rate one replica sustains at the scenario's
utilisation cap, its chips and dollars per hour, and its predicted TTFT/TPOT.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from planner.catalog.scenario import ResolvedScenario, Workload
from planner.catalog.schemas import HardwareSpec, ModelSpec
from planner.perf.layout import kv_bytes_per_chip, runtime_reserve_bytes, weight_bytes_per_chip
from planner.perf.roofline import Setup, prefill_time
from planner.perf.serving import agg_decode, disagg_decode, kv_transfer_time, prefill_capacity_rps, ttft

BATCH_PER_RANK = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
PIPELINE = (1, 2, 4, 8)
MAX_CHIPS_PER_REPLICA = 576


@dataclass
class CandidateTable:
    rows: pd.DataFrame
    dropped: dict[str, int] = field(default_factory=dict)
    """Why rows were dropped: ``memory``, ``tpot_slo``, ``ttft_slo``, ``dominated``."""
    evaluated: int = 0


def _divisors(n: int, cap: int) -> list[int]:
    return [d for d in range(1, min(n, cap) + 1) if n % d == 0]


def layouts(model: ModelSpec, hw: HardwareSpec) -> pd.DataFrame:
    """Valid (tp, ep, pp, dp) for ``model`` on ``hw``: tp divides the heads; MoE experts spread over a
    stage either by expert (ep = stage) or by tensor (ep = 1); attention DP only for MoE models."""
    att = model.architecture.attention
    moe = model.architecture.moe
    dom = hw.scale_up_domain_chips
    tps = [t for t in _divisors(att.heads, 64) if t & (t - 1) == 0 or t <= dom]
    out = []
    for tp, pp in itertools.product(tps, PIPELINE):
        if pp > model.architecture.layers:
            continue
        dps = (1, 2, 4, 8, 16, 32, 64) if moe else (1,)
        for dp in dps:
            stage = tp * dp
            if stage * pp > MAX_CHIPS_PER_REPLICA or stage > max(dom, 64):
                continue
            eps = {1}
            if moe and moe.experts % stage == 0:
                eps.add(stage)
            for ep in eps:
                out.append((tp, ep, pp, dp))
    return pd.DataFrame(out, columns=["tp", "ep", "pp", "dp"]).drop_duplicates()


def _grid(model: ModelSpec, hw: HardwareSpec) -> pd.DataFrame:
    lay = layouts(model, hw)
    b = pd.DataFrame({"b_rank": BATCH_PER_RANK})
    g = lay.merge(b, how="cross")
    g["batch"] = g["b_rank"] * g["dp"]
    g["chips"] = g["tp"] * g["dp"] * g["pp"]
    return g


def _prune(df: pd.DataFrame, keys: list[str]) -> tuple[pd.DataFrame, int]:
    """Keep, per ``keys`` group, the Pareto front of (chips per replica, $/h per request/s).

    Every row left already meets its SLOs and fits in memory, so its latencies no longer change the
    cost; what the MILP still needs is the granularity (chips, for packing replicas into purchase
    units) and the price of capacity. A row with at least as many chips and no lower $/(request/s)
    than another is never needed.
    """
    if df.empty:
        return df, 0
    d = df.sort_values(keys + ["chips", "usd_per_rps", "tpot_s"], kind="mergesort")
    best_before = d.groupby(keys, sort=False)["usd_per_rps"].transform(lambda s: s.cummin().shift(1, fill_value=np.inf))
    first_of_chips = ~d.duplicated(keys + ["chips"], keep="first")
    keep = first_of_chips & (d["usd_per_rps"] < best_before)
    out = d[keep]
    return out, len(df) - len(out)


def build_candidates(rs: ResolvedScenario, engine: str | None = None, *, prune: bool = True) -> CandidateTable:
    sc = rs.scenario
    engine = engine or sc.engine
    frames = []
    dropped = {"memory": 0, "tpot_slo": 0, "ttft_slo": 0, "dominated": 0}
    evaluated = 0
    cap = sc.utilisation_cap
    for hw in rs.hardware:
        grid = _grid(rs.model, hw)
        eff = hw.efficiency.for_engine(engine)
        for wdt, kdt in itertools.product(rs.weights, sc.kv_cache):
            setup = Setup.make(rs.model, hw, weights=wdt, kv=kdt, eff=eff)
            for w in sc.workloads:
                for role in _roles(sc.serving):
                    df = _evaluate(setup, grid, w, role, cap, rs.prices[hw.id])
                    evaluated += len(df)
                    df["workload"] = w.name
                    df["role"] = role
                    df["hardware"] = hw.id
                    df["weights_dtype"] = wdt
                    df["kv_dtype"] = kdt
                    for reason in ("memory", "tpot_slo", "ttft_slo"):
                        bad = ~df[f"ok_{reason}"]
                        dropped[reason] += int(bad.sum())
                        df = df[~bad]
                    frames.append(df)
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if prune:
        rows, n_dom = _prune(rows, ["workload", "role", "hardware"])
        dropped["dominated"] = n_dom
    rows = rows.drop(columns=[c for c in rows.columns if c.startswith("ok_")]).reset_index(drop=True)
    return CandidateTable(rows, dropped, evaluated)


def _roles(serving) -> list[str]:
    roles = []
    if "aggregated" in serving:
        roles.append("aggregated")
    if "disaggregated" in serving:
        roles += ["prefill", "decode"]
    return roles


def _evaluate(setup: Setup, grid: pd.DataFrame, w: Workload, role: str, cap: float, price: float) -> pd.DataFrame:
    g = grid.copy()
    L = [g[k].to_numpy(float) for k in ("tp", "ep", "pp", "dp")]
    B = g["batch"].to_numpy(float)
    hit = w.prefix_cache.hit_rate
    I = float(w.input_tokens)
    I_new = I * (1.0 - hit)
    O = float(w.output_tokens)
    hw = setup.hw
    wchip = weight_bytes_per_chip(setup.wb, *L)
    reserve = runtime_reserve_bytes(hw)
    if role == "prefill":
        kv = kv_bytes_per_chip(setup.model, L[3], I, setup.kv_dtype, L[0], L[2], L[3])
        t_pf = prefill_time(setup, *L, I_new, 1.0, prefix=I * hit)
        rate = prefill_capacity_rps(setup, *L, I_new) * cap
        rho = cap
        ttft_s = t_pf * (1.0 + rho / (2.0 * (1.0 - rho))) + kv_transfer_time(setup, I, hw.scale_up_domain_chips >= 72)
        tpot_s = np.zeros_like(B)
    else:
        kv = kv_bytes_per_chip(setup.model, B, I + O, setup.kv_dtype, L[0], L[2], L[3])
        st = (agg_decode if role == "aggregated" else disagg_decode)(setup, *L, B, I_new, O)
        tpot_s = st.step_s
        if role == "aggregated":
            ttft_s = ttft(setup, *L, I_new, B / L[3] * cap, step_s=tpot_s)
        else:
            ttft_s = np.zeros_like(B)
        rate = B / (ttft_s + O * tpot_s) * cap
    g["weight_bytes_per_chip"] = wchip
    g["kv_bytes_per_chip"] = kv
    g["other_bytes_per_chip"] = reserve
    g["hbm_bytes_per_chip"] = hw.hbm_bytes
    g["tpot_s"] = tpot_s
    g["ttft_s"] = ttft_s
    g["requests_per_s"] = rate
    g["usd_per_hour"] = g["chips"] * price
    g["usd_per_rps"] = g["usd_per_hour"] / np.maximum(rate, 1e-12)
    g["ok_memory"] = (wchip + kv + reserve) <= hw.hbm_bytes
    g["ok_tpot_slo"] = (tpot_s <= w.slo.tpot_ms / 1e3) if role != "prefill" else True
    g["ok_ttft_slo"] = (ttft_s <= w.slo.ttft_ms / 1e3) if role != "decode" else True
    if role == "prefill":
        g = g[g["b_rank"] == 1]
    return g
