"""Candidate table for the planner: every (workload, role, hardware, layout, batch, dtype, memory tier)
evaluated by the performance model, filtered by memory and SLOs, and pruned of dominated rows
(pandas/NumPy, no Pyomo).

Roles: ``aggregated`` replicas serve whole requests; disaggregated serving pairs ``prefill`` and
``decode`` replicas. Memory tiers:

- ``kv_tier``: ``hbm`` (the running sequences' KV cache lives in HBM) or ``hbm+host`` (what does not
  fit spills to host DRAM and crosses the host link on every decode step);
- ``prefix_tier``: where the reusable prompt prefixes of a workload live (``none``: no reuse, every
  prompt is prefilled in full; ``hbm``: HBM left free; ``host``: host DRAM; ``nvme``: local flash).
  A prefix hit skips the prefill of the cached tokens but loads their KV from the tier, overlapped
  layer by layer with the prefill of the new tokens.

Evaluation (:func:`evaluate_candidates`) does not depend on the SLOs; :func:`select_candidates`
applies them and prunes, so a different SLO costs a filter, not a re-evaluation.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from planner.catalog.scenario import ResolvedScenario, Workload
from planner.catalog.schemas import HardwareSpec, ModelSpec
from planner.perf import params as P
from planner.perf.experts import heuristic_placement
from planner.perf.layout import kv_bytes_per_chip, kv_shard, runtime_reserve_bytes, weight_bytes_per_chip
from planner.perf.roofline import Setup, prefill_bound, prefill_time
from planner.perf.serving import agg_decode, disagg_decode, kv_transfer_time, prefill_capacity_rps, ttft

BATCH_PER_RANK = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
PIPELINE = (1, 2, 4, 8)
MAX_CHIPS_PER_REPLICA = 576
PREFIX_TIERS = ("hbm", "host", "nvme")
ROLES = ("aggregated", "prefill", "decode")


@dataclass
class CandidatePool:
    """Every evaluated row that fits in memory, before SLO filtering and pruning."""

    rows: pd.DataFrame
    evaluated: int
    dropped_memory: int


@dataclass
class CandidateTable:
    rows: pd.DataFrame
    dropped: dict[str, int] = field(default_factory=dict)
    """Why rows were dropped: ``memory``, ``tpot_slo``, ``ttft_slo``, ``dominated``."""
    evaluated: int = 0


def _divisors(n: int, cap: int) -> list[int]:
    return [d for d in range(1, min(n, cap) + 1) if n % d == 0]


def packing_domain(hw: HardwareSpec) -> int:
    """Chips of one packing bin: a scale-up domain, or a purchase unit where units are smaller
    (TPU slices)."""
    return min(hw.scale_up_domain_chips, hw.purchase_unit.chips_per_unit)


def slots_per_replica(hw: HardwareSpec, group_chips, pp) -> np.ndarray:
    """Chips of purchase-unit capacity one replica occupies.

    A replica is ``pp`` stages of one TP x EP group (``group_chips = tp * dp`` chips) each. A group
    must sit inside one packing bin of ``D`` chips, so at most ``floor(D / g)`` groups share a bin
    and each takes ``D / floor(D / g)`` chips of it (exact for groups of one size, conservative when
    sizes mix). A group larger than a bin (a scale-out group, or a multi-slice TPU group) takes whole
    bins.
    """
    D = float(packing_domain(hw))
    g = np.asarray(group_chips, dtype=float)
    per = np.where(g <= D, D / np.floor(D / np.minimum(g, D)), np.ceil(g / D) * D)
    return per * np.asarray(pp, dtype=float)


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
            if moe and stage <= moe.experts:  # expert parallel; redundant slots fill the GPUs equally
                eps.add(stage)
            for ep in eps:
                out.append((tp, ep, pp, dp))
    return pd.DataFrame(out, columns=["tp", "ep", "pp", "dp"]).drop_duplicates()


def expert_options(model: ModelSpec, lay: pd.DataFrame, load: np.ndarray | None) -> pd.DataFrame:
    """Redundant expert slots per expert-parallel layout, with the copies factor and the imbalance of
    a placement of the scenario's expert load (uniform when it gives none). ``R = -E mod G`` fills the
    ``G`` GPUs of a stage equally; with a skewed load also ``R + G`` (one more slot per GPU)."""
    moe = model.architecture.moe
    out = []
    for row in lay.itertuples(index=False):
        stage = row.tp * row.dp
        if not moe or row.ep == 1 or stage == 1:
            out.append((*row, 0, 1.0, 1.0))
            continue
        r0 = (-moe.experts) % stage
        rs = [r0] + ([r0 + stage] if load is not None and (moe.experts + r0) // stage < moe.experts else [])
        vec = np.ones(moe.experts) if load is None else load
        for r in rs:
            _, imb = heuristic_placement(vec, stage, r)
            out.append((*row, r, (moe.experts + r) / moe.experts, imb))
    return pd.DataFrame(out, columns=[*lay.columns, "redundant", "expert_copies", "moe_imbalance"])


def _grid(model: ModelSpec, hw: HardwareSpec, load: np.ndarray | None = None) -> pd.DataFrame:
    lay = expert_options(model, layouts(model, hw), load)
    b = pd.DataFrame({"b_rank": BATCH_PER_RANK})
    g = lay.merge(b, how="cross")
    g["batch"] = g["b_rank"] * g["dp"]
    g["chips"] = g["tp"] * g["dp"] * g["pp"]
    g["group_chips"] = g["tp"] * g["dp"]
    g["slots"] = slots_per_replica(hw, g["group_chips"], g["pp"])
    g["scale_out"] = g["group_chips"] > hw.scale_up_domain_chips
    return g


def roles_for(serving) -> list[str]:
    roles = []
    if "aggregated" in serving:
        roles.append("aggregated")
    if "disaggregated" in serving:
        roles += ["prefill", "decode"]
    return roles


def evaluate_candidates(rs: ResolvedScenario, engine: str | None = None) -> CandidatePool:
    """Evaluate every role x hardware x layout x batch x dtype x tier row of a scenario; keep those
    that fit in memory."""
    sc = rs.scenario
    engine = engine or sc.engine
    cols: dict[str, list] = {}
    labels: dict[str, list] = {k: [] for k in LABELS}
    categories: dict[str, list] = {"bound": list(BOUNDS)}
    evaluated = dropped = 0
    for hw in rs.hardware:
        grid = _grid(rs.model, hw, rs.expert_load)
        gcols = {k: grid[k].to_numpy() for k in grid.columns}
        prefill_rows = gcols["b_rank"] == 1
        eff = hw.efficiency.for_engine(engine)
        for wdt, kdt in itertools.product(rs.weights, sc.kv_cache):
            setup = Setup.make(rs.model, hw, weights=wdt, kv=kdt, eff=eff)
            for w in sc.workloads:
                for role in roles_for(sc.serving):
                    for tags, var in _variants(setup, gcols, w, role, sc.utilisation_cap):
                        ok = np.broadcast_to(var.pop("ok_memory"), prefill_rows.shape)
                        evaluated += int(prefill_rows.sum()) if role == "prefill" else len(ok)
                        if role == "prefill":
                            dropped += int((prefill_rows & ~ok).sum())
                            ok = ok & prefill_rows
                        else:
                            dropped += int((~ok).sum())
                        n = int(ok.sum())
                        if n == 0:
                            continue
                        for k, v in {**gcols, **var}.items():
                            cols.setdefault(k, []).append(np.broadcast_to(v, ok.shape)[ok])
                        tags = {**tags, "workload": w.name, "role": role, "hardware": hw.id,
                                "weights_dtype": wdt, "kv_dtype": kdt}
                        for k in LABELS:
                            if k == "bound":
                                b = np.broadcast_to(tags[k], ok.shape)[ok]
                                labels[k].append((b == "memory") * 1 + (b == "communication") * 2)
                            else:
                                cats = categories.setdefault(k, [])
                                if tags[k] not in cats:
                                    cats.append(tags[k])
                                labels[k].append(np.full(n, cats.index(tags[k]), dtype=np.int16))
                        cols.setdefault("usd_per_hour", []).append(gcols["chips"][ok] * rs.prices[hw.id])
    if not cols:
        return CandidatePool(pd.DataFrame(), evaluated, dropped)
    data = {k: np.concatenate(v) for k, v in cols.items()}
    data.update({k: pd.Categorical.from_codes(np.concatenate(v), categories[k]) for k, v in labels.items()})
    rows = pd.DataFrame(data)
    rows["usd_per_rps"] = rows["usd_per_hour"] / np.maximum(rows["requests_per_s"], 1e-12)
    return CandidatePool(rows, evaluated, dropped)


BOUNDS = ("compute", "memory", "communication")
LABELS = ("workload", "role", "hardware", "weights_dtype", "kv_dtype", "kv_tier", "prefix_tier", "bound")


def select_candidates(pool: CandidatePool, slos: dict[str, tuple[float, float]], *, prune: bool = True) -> CandidateTable:
    """Rows meeting each workload's ``(ttft_s, tpot_s)`` SLO, pruned of dominated rows."""
    r = pool.rows
    dropped = {"memory": pool.dropped_memory, "tpot_slo": 0, "ttft_slo": 0, "dominated": 0}
    if r.empty:
        return CandidateTable(r, dropped, pool.evaluated)
    wl = r["workload"].cat
    codes = wl.codes.to_numpy()
    ttft_lim = np.array([slos[k][0] for k in wl.categories], dtype=float)[codes]
    tpot_lim = np.array([slos[k][1] for k in wl.categories], dtype=float)[codes]
    bad_tpot = r["tpot_s"].to_numpy() > tpot_lim
    bad_ttft = ~bad_tpot & (r["ttft_s"].to_numpy() > ttft_lim)
    dropped["tpot_slo"] = int(bad_tpot.sum())
    dropped["ttft_slo"] = int(bad_ttft.sum())
    rows = r[~(bad_tpot | bad_ttft)]
    if prune:
        rows, dropped["dominated"] = prune_dominated(rows)
    return CandidateTable(rows.reset_index(drop=True), dropped, pool.evaluated)


def build_candidates(rs: ResolvedScenario, engine: str | None = None, *, prune: bool = True) -> CandidateTable:
    """Evaluate, filter by the scenario's SLOs and prune (see :func:`select_candidates`)."""
    pool = evaluate_candidates(rs, engine)
    return select_candidates(pool, scenario_slos(rs.scenario.workloads), prune=prune)


def scenario_slos(workloads: list[Workload]) -> dict[str, tuple[float, float]]:
    return {w.name: (w.slo.ttft_ms / 1e3, w.slo.tpot_ms / 1e3) for w in workloads}


PRUNE_KEYS = ["workload", "role", "hardware", "prefix_tier"]


def prune_dominated(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Drop rows the MILP never needs.

    In the MILP a row is only its packing footprint ``slots``, its request rate and its prefix-cache
    capacity (every row left meets its SLOs and fits in memory). Row B is dominated by row A of the
    same (workload, role, hardware, prefix tier) when ``k = slots_B / slots_A`` is a whole number and
    ``k`` replicas of A give at least B's rate and prefix capacity: any plan using B is matched, at
    the same units, power and cost, by one using A. Ties keep the first row (fastest TPOT).
    """
    if df.empty:
        return df, 0
    d = df.sort_values(
        PRUNE_KEYS + ["slots", "requests_per_s", "prefix_bytes_per_replica", "tpot_s"],
        ascending=[True] * len(PRUNE_KEYS) + [True, False, False, True],
        kind="mergesort",
    )
    # Within one footprint: the Pareto front of (rate, capacity); rows are sorted by rate descending.
    gid = d.groupby(PRUNE_KEYS + ["slots"], observed=True, sort=False).ngroup()
    cap = d["prefix_bytes_per_replica"]
    prev_cap = cap.groupby(gid).cummax().groupby(gid).shift(1).fillna(-np.inf)
    d = d[cap > prev_cap]
    keep: list[int] = []
    for _, g in d.groupby(PRUNE_KEYS, observed=True, sort=False):
        s = g["slots"].to_numpy()
        q = g["requests_per_s"].to_numpy()
        c = g["prefix_bytes_per_replica"].to_numpy()
        kept: list[int] = []
        for i in range(len(g)):
            dominated = False
            for j in kept:
                if s[j] >= s[i]:
                    continue
                k = s[i] / s[j]
                kr = round(k)
                if abs(k - kr) < 1e-9 and kr * q[j] >= q[i] * (1 - 1e-12) and kr * c[j] >= c[i] * (1 - 1e-12):
                    dominated = True
                    break
            if not dominated:
                kept.append(i)
        keep.extend(g.index[kept])
    out = df.loc[sorted(keep)]
    return out, len(df) - len(out)


def _variants(setup: Setup, grid: dict[str, np.ndarray], w: Workload, role: str, cap: float):
    """Evaluated rows of one (setup, workload, role): ``(labels, columns)`` per (prefix tier, KV tier)."""
    L = [grid[k].astype(float) for k in ("tp", "ep", "pp", "dp")]
    B = grid["batch"].astype(float)
    if "moe_imbalance" in grid:
        setup = dataclasses.replace(setup, moe_imbalance=grid["moe_imbalance"], expert_copies=grid["expert_copies"])
    chips = grid["chips"].astype(float)
    I, O = float(w.input_tokens), float(w.output_tokens)
    hw, model = setup.hw, setup.model
    wchip = weight_bytes_per_chip(setup.wb, *L, setup.expert_copies)
    reserve = runtime_reserve_bytes(hw)
    hit = w.prefix_cache.hit_rate
    tiers: list[tuple[str, float]] = [("none", 0.0)]
    if role != "decode" and hit > 0:
        tiers += [(t, hit) for t in (PREFIX_TIERS if w.prefix_cache.working_set_gb > 0 else ("hbm",))]
    # KV of the cached prefix one request loads, per chip of its rank (sharded like the KV cache).
    prefix_bytes_chip = P.kv_bytes_per_sequence(model, I * hit, setup.kv_dtype) / (kv_shard(model, L[0]) * L[2])
    tier_bw = {"host": hw.host_link_bw, "nvme": hw.nvme_bw}
    tier_cap = {"host": hw.host_dram_bytes, "nvme": hw.nvme_bytes}
    if role == "prefill":
        kv = kv_bytes_per_chip(model, L[3], I, setup.kv_dtype, L[0], L[2], L[3])
    else:
        kv = kv_bytes_per_chip(model, B, I + O, setup.kv_dtype, L[0], L[2], L[3])
    free = hw.hbm_bytes - wchip - kv - reserve
    decode_only = disagg_decode(setup, *L, B, I, O) if role != "prefill" else None
    by_hit: dict[float, tuple] = {}
    for tier, h in tiers:
        I_new = I * (1.0 - h)
        t_load = np.zeros_like(B) if tier in ("none", "hbm") else prefix_bytes_chip / max(tier_bw[tier], 1.0)
        if tier in ("none", "hbm"):
            pcap = np.maximum(free, 0.0) * chips if tier == "hbm" else np.zeros_like(B)
        else:
            pcap = tier_cap[tier] * chips
        base = {
            "prefix_bytes_per_replica": pcap,
            "weight_bytes_per_chip": wchip,
            "kv_bytes_per_chip": kv,
            "other_bytes_per_chip": reserve,
            "hbm_bytes_per_chip": hw.hbm_bytes,
            "host_kv_bytes_per_chip": 0.0,
        }
        if role == "prefill":
            t_pf = prefill_time(setup, *L, I_new, 1.0, prefix=I * h)
            rate_pf = prefill_capacity_rps(setup, *L, I_new)
            load_rps = np.where(t_load > 0, L[3] * L[2] / np.maximum(t_load, 1e-30), np.inf)
            rho = cap
            t_req = np.maximum(t_pf, t_load)
            transfer = kv_transfer_time(setup, I, hw.scale_up_domain_chips >= 72)
            var = {
                **base,
                "ttft_s": t_req * (1.0 + rho / (2.0 * (1.0 - rho))) + transfer,
                "tpot_s": 0.0,
                "requests_per_s": cap * np.minimum(rate_pf, load_rps),
                "input_share": 1.0,
                "ok_memory": free >= 0,
            }
            yield {"prefix_tier": tier, "kv_tier": "hbm", "bound": prefill_bound(setup, *L, I_new, 1.0, prefix=I * h)}, var
            continue
        if h not in by_hit:
            st = agg_decode(setup, *L, B, I, O, new_tokens=I_new) if role == "aggregated" else decode_only
            by_hit[h] = (st.step_s, np.asarray(st.bound))
        step, bound = by_hit[h]
        variants = [("hbm", step, free >= 0, 0.0)]
        if tier in ("none", "nvme"):
            # Spill what does not fit to host DRAM; every step reads it over the host link.
            over = -free
            fits = (over > 0) & (hw.hbm_bytes - wchip - reserve > 0) & (over <= hw.host_dram_bytes)
            if fits.any():
                spill = np.where(fits, over, 0.0)
                variants.append(("hbm+host", step + spill / max(hw.host_link_bw, 1.0), fits, spill))
        for kv_tier, tpot, ok, spill in variants:
            if role == "aggregated":
                tt = ttft(setup, *L, I_new, B / L[3] * cap, step_s=tpot) + t_load
                share = np.clip(1.0 - decode_only.step_s / tpot, 0.0, 1.0)
            else:
                tt = np.zeros_like(B)
                share = 0.0
            var = {
                **base,
                "host_kv_bytes_per_chip": spill,
                "kv_bytes_per_chip": kv - spill,
                "tpot_s": tpot,
                "ttft_s": tt,
                "requests_per_s": B / (tt + O * tpot) * cap,
                "input_share": share,
                "ok_memory": ok,
            }
            yield {"prefix_tier": tier, "kv_tier": kv_tier, "bound": bound}, var


def evaluate_point(
    model: ModelSpec,
    hw: HardwareSpec,
    layout,
    batch: int,
    workload: Workload,
    role: str,
    *,
    weights: str,
    kv: str,
    kv_tier: str = "hbm",
    prefix_tier: str = "none",
    utilisation_cap: float = 0.8,
    engine: str | None = None,
    redundant_experts: int = 0,
    moe_imbalance: float = 1.0,
) -> dict[str, float] | None:
    """One deployment evaluated by the performance model (the scalar twin of a candidate row), or
    ``None`` when it does not fit in memory with these tiers."""
    g = {
        "tp": np.array([layout.tp]), "ep": np.array([layout.ep]), "pp": np.array([layout.pp]),
        "dp": np.array([layout.dp]), "batch": np.array([batch]),
        "chips": np.array([layout.tp * layout.dp * layout.pp]),
        "moe_imbalance": np.array([moe_imbalance]),
        "expert_copies": np.array([1.0 + redundant_experts / model.architecture.moe.experts if model.is_moe else 1.0]),
    }
    setup = Setup.make(model, hw, weights=weights, kv=kv, eff=hw.efficiency.for_engine(engine))
    for tags, var in _variants(setup, g, workload, role, utilisation_cap):
        if tags["kv_tier"] == kv_tier and tags["prefix_tier"] == prefix_tier:
            if not bool(np.broadcast_to(var["ok_memory"], (1,))[0]):
                return None
            return {k: float(np.broadcast_to(v, (1,))[0]) for k, v in var.items() if k != "ok_memory"}
    return None
