"""One layout and batch of a model on a hardware evaluated in every variant the engine offers (weight and KV
dtypes, KV and prefix tiers, speculative decoding, two-batch overlap): memory per chip, step and prefill times,
latencies and the rate a replica carries (:func:`variants`), and one named point of them (:func:`evaluate_point`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from planner.catalog.scenario import Workload
from planner.catalog.schemas import (
    DEFAULT_CHUNK_TOKENS,
    EngineEfficiency,
    HardwareSpec,
    ModelSpec,
)
from planner.perf import params as P
from planner.perf.latency import context_cv, spec_request_cv, spec_step_spread, tpot_cv, workload_tail
from planner.perf.layout import (
    draft_bytes_per_chip,
    expert_copies,
    kv_bytes_per_chip,
    kv_shard,
    runtime_reserve_bytes,
    weight_bytes_per_chip,
)
from planner.perf.roofline import Setup, prefill_pass, prefill_time
from planner.perf.serving import (
    agg_decode,
    disagg_decode,
    kv_transfer_time,
    plain_decode,
    prefill_capacity_rps,
    ttft_base,
)
from planner.units import MS, US

PREFIX_TIERS = ("hbm", "host", "nvme")


def variants(setup: Setup, grid: dict[str, np.ndarray], w: Workload, role: str, memo: dict | None = None):
    """Evaluated rows of one (setup, workload, role): ``(labels, columns, rows)`` per (prefix tier, KV tier),
    each column over the grid's ``rows`` (an index array; ``None``: the whole grid), or a scalar. ``memo``: one
    dict per (setup, workload, grid) across its roles, holding what they share (the disaggregated decode step,
    which aggregated rows need for their input share).

    The performance model runs only on the grid rows that can fit in memory (in HBM, or spilling KV to host
    DRAM): the others (40% of deepseek-chat's) are left out of ``rows`` (they do not fit: ``ok_memory`` would be
    False)."""
    mem = _memory(setup, grid, w, role)
    shape = grid["batch"].shape
    need = np.broadcast_to(mem[2] >= 0, shape)
    if role != "prefill":
        need = need | _spill_fits(setup.hw, mem[0], mem[2])
    if need.all() or not need.any():
        for tags, var in _variants_of(setup, grid, w, role, memo, b"", mem):
            yield tags, var, None
        return
    idx = np.flatnonzero(need)
    sub = {k: v[idx] for k, v in grid.items()}
    sub_mem = tuple(np.broadcast_to(v, shape)[idx] for v in mem)
    for tags, var in _variants_of(setup, sub, w, role, memo, need.tobytes(), sub_mem):
        yield tags, var, idx


def _tails(setup: Setup, tpot, step, itl, cv) -> dict:
    """A decode or aggregated row's spread columns: its TPOT's coefficient of variation, and the gap between
    emissions of a plain step and of one carrying a prefill chunk, with the share of chunk steps (host-spilled KV
    adds ``tpot - step`` per token to both)."""
    extra = (tpot - step) * np.asarray(setup.tokens_per_step, dtype=float)
    return {"tpot_s": tpot, "tpot_cv": cv, "itl_plain_s": itl[0] + extra, "itl_chunk_s": itl[1] + extra,
            "chunk_share": np.broadcast_to(itl[2], np.shape(tpot))}


def spec_spread(setup: Setup, spec: np.ndarray, O: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, variance) of the tokens a step yields per sequence (1 and 0 without drafts), and their mean's
    coefficient of variation across requests (:func:`planner.perf.latency.spec_request_cv`)."""
    if not np.any(spec > 0):
        return np.ones_like(spec), np.zeros_like(spec), np.zeros_like(spec)
    m, v, r = {}, {}, {}
    for k in np.unique(spec):
        m[k], v[k] = spec_step_spread(k, setup.spec_accept)
        r[k] = spec_request_cv(k, setup.spec_accept)
    return tuple(np.vectorize(d.__getitem__, otypes=[float])(spec) for d in (m, v, r))


def _memory(setup: Setup, grid: dict[str, np.ndarray], w: Workload, role: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per grid row: weight (with drafts) and KV bytes per chip, and HBM left free (negative: does not fit)."""
    L = [grid[k].astype(float) for k in ("tp", "ep", "pp", "attn_dp")]
    B = grid["batch"].astype(float)
    spec = grid["spec"].astype(float) if role != "prefill" else np.zeros_like(B)
    model, copies = setup.model, grid["expert_copies"]
    wchip = weight_bytes_per_chip(setup.wb, *L, copies) + draft_bytes_per_chip(model, setup.wb, *L, copies, spec)
    I, O = float(w.input_tokens), float(w.output_tokens)
    if role == "prefill":
        kv = kv_bytes_per_chip(model, L[3], I, setup.kv_dtype, L[0], L[2], L[3], setup.sliding_kv_share)
    else:
        kv = kv_bytes_per_chip(model, B, I + O, setup.kv_dtype, L[0], L[2], L[3], setup.sliding_kv_share)
    return wchip, kv, setup.hw.hbm_bytes - wchip - kv - runtime_reserve_bytes(setup.hw)


def _spill_fits(hw, wchip, free) -> np.ndarray:
    """Rows whose KV does not fit in HBM (``free`` < 0) but whose weights do, with the KV left over within the
    host DRAM it spills to (decode and aggregated rows read it over the host link every step)."""
    over = -free
    return (over > 0) & (hw.hbm_bytes - wchip - runtime_reserve_bytes(hw) > 0) & (over <= hw.host_dram_bytes)


def _variants_of(setup: Setup, grid: dict[str, np.ndarray], w: Workload, role: str, memo: dict | None,
                 key: bytes, mem: tuple):
    """:func:`variants` on the rows of ``grid`` (``key``: which rows, for the memo; ``mem``: their
    :func:`_memory`)."""
    L = [grid[k].astype(float) for k in ("tp", "ep", "pp", "attn_dp")]
    B = grid["batch"].astype(float)
    spec = grid["spec"].astype(float) if role != "prefill" else np.zeros_like(B)
    tbo = grid["tbo"].astype(float)  # prefill passes overlap too (see ``roofline.prefill_time``)
    setup = dataclasses.replace(setup, moe_imbalance=grid["moe_imbalance"], expert_copies=grid["expert_copies"],
                                spec_tokens=spec, tbo=tbo)
    chips = grid["chips"].astype(float)
    I, O = float(w.input_tokens), float(w.output_tokens)
    hw, model = setup.hw, setup.model
    wchip, kv, free = mem
    reserve = runtime_reserve_bytes(hw)
    hit = w.prefix_cache.hit_rate
    tiers: list[tuple[str, float]] = [("none", 0.0)]
    if role != "decode" and hit > 0:
        tiers += [(t, hit) for t in (PREFIX_TIERS if w.prefix_cache.working_set_gb > 0 else ("hbm",))]
    # KV of the cached prefix one request loads, per chip of its rank (sharded like the KV cache).
    prefix_bytes_chip = P.kv_bytes_per_sequence(model, I * hit, setup.kv_dtype) / (kv_shard(model, L[0]) * L[2])
    tier_bw = {"host": hw.host_link_bw, "nvme": hw.nvme_bw}
    tier_cap = {"host": hw.host_dram_bytes, "nvme": hw.nvme_bytes}
    decode_only = plain = None
    if role != "prefill":
        memo = {} if memo is None else memo
        if ("decode_only", key) not in memo:
            # the draft-free step both roles price their drafts from, then the disaggregated step
            memo["plain", key] = plain_decode(setup, *L, B, I, O) if np.any(spec > 0) else None
            memo["decode_only", key] = disagg_decode(setup, *L, B, I, O, plain=memo["plain", key])
        decode_only, plain = memo["decode_only", key], memo["plain", key]
    by_hit: dict[float, tuple] = {}
    tail = workload_tail(w)
    cv2_in, spread = tail.cs2, None
    t_prompt: dict[float, np.ndarray] = {}  # an aggregated row's own prefill per new-token count (tiers share it)
    e = setup.eff
    fixed = e.ttft_overhead_ms * MS + e.prefill_expert_overhead_us * US * setup.stats.moe_layers * setup.stats.experts
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
            t_pf, pf_bound, _ = prefill_pass(setup, *L, I_new, 1.0, prefix=I * h)
            rate_pf = prefill_capacity_rps(setup, *L, I_new)
            load_rps = np.where(t_load > 0, L[3] * L[2] / np.maximum(t_load, 1e-30), np.inf)
            t_req = np.maximum(t_pf, t_load)
            transfer = kv_transfer_time(setup, I, hw.scale_up_domain_chips >= 72)
            # The first token then joins the decode pool's running batch ``first_token_steps`` of its steps later;
            # the decode pool is another row, so its step is bounded by the workload's TPOT target (conservative).
            join = e.first_token_steps * w.slo.tpot_ms * MS
            var = {
                **base,
                "ttft_base_s": fixed + t_req + transfer + join,
                "queue_work_s": t_req,
                "queue_servers": L[3] * L[2],
                "capacity_rps": np.minimum(rate_pf, load_rps),
                "tpot_s": 0.0,
                "tpot_cv": 0.0,
                "itl_plain_s": 0.0,
                "itl_chunk_s": 0.0,
                "chunk_share": 0.0,
                "input_share": 1.0,
                "ok_memory": free >= 0,
            }
            yield {"prefix_tier": tier, "kv_tier": "hbm", "bound": pf_bound}, var
            continue
        if h not in by_hit:
            st = agg_decode(setup, *L, B, I, O, new_tokens=I_new, plain=plain) if role == "aggregated" else decode_only
            by_hit[h] = (st.step_s, np.asarray(st.bound), st.itl_steps,
                         st.context_share * context_cv(I, O, cv2_in, tail.cv2_out))
        step, bound, itl, ctx = by_hit[h]
        variants = [("hbm", step, free >= 0, 0.0)]
        if tier in ("none", "nvme"):
            # Spill what does not fit to host DRAM; every step reads it over the host link.
            over = -free
            fits = _spill_fits(hw, wchip, free)
            if fits.any():
                spill = np.where(fits, over, 0.0)
                variants.append(("hbm+host", step + spill / max(hw.host_link_bw, 1.0), fits, spill))
        for kv_tier, tpot, ok, spill in variants:
            if role == "aggregated":
                if I_new not in t_prompt:
                    t_prompt[I_new] = prefill_time(setup, *L, I_new, 1.0)
                tb, work = ttft_base(setup, *L, I_new, tpot, t_pf=t_prompt[I_new])
                tb = tb + t_load
                share = np.clip(1.0 - decode_only.step_s / tpot, 0.0, 1.0)
                servers = L[3]
            else:
                tb, work, servers = np.zeros_like(B), np.zeros_like(B), np.ones_like(B)
                share = 0.0
            if spread is None:
                spread = spec_spread(setup, spec, O)
            var = {
                **base,
                "host_kv_bytes_per_chip": spill,
                "kv_bytes_per_chip": kv - spill,
                **_tails(setup, tpot, step, itl, tpot_cv(share, B, cv2_in, O, *spread[:2], request_cv=spread[2],
                                                         context=ctx)),
                "ttft_base_s": tb,
                "queue_work_s": work,
                "queue_servers": servers,
                "capacity_rps": B / (tb + O * tpot),
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
    eff: EngineEfficiency,
    kv_tier: str = "hbm",
    prefix_tier: str = "none",
    spec_tokens: int = 0,
    tbo: bool = False,
    moe_imbalance: float = 1.0,
    prefill_chunk_tokens: float = DEFAULT_CHUNK_TOKENS,
    engine: str | None = None,
    adp_prefill_balance: bool = False,
    sliding_kv_share: float | None = None,
) -> dict[str, float] | None:
    """One deployment evaluated by the performance model (the scalar twin of a candidate row, before the
    SLO sets its load), or ``None`` when it does not fit in memory with these tiers."""
    g = {
        "tp": np.array([layout.tp]), "ep": np.array([layout.ep]), "pp": np.array([layout.pp]),
        "attn_dp": np.array([layout.dp]), "batch": np.array([batch]),
        "chips": np.array([layout.tp * layout.dp * layout.pp]),
        "moe_imbalance": np.array([moe_imbalance]),
        "expert_copies": np.array([expert_copies(model, layout.redundant)]),
        "spec": np.array([spec_tokens]), "tbo": np.array([1 if tbo else 0]),
    }
    setup = Setup.make(model, hw, weights=weights, kv=kv, eff=eff, prefill_chunk_tokens=prefill_chunk_tokens,
                       engine=engine, adp_prefill_balance=adp_prefill_balance, sliding_kv_share=sliding_kv_share)
    for tags, var, _ in variants(setup, g, workload, role):
        if tags["kv_tier"] == kv_tier and tags["prefix_tier"] == prefix_tier:
            if not bool(np.broadcast_to(var["ok_memory"], (1,))[0]):
                return None
            return {k: float(np.broadcast_to(v, (1,))[0]) for k, v in var.items() if k != "ok_memory"}
    return None
