"""The economics of serving one model on one hardware, computed by the project's performance model.

Every number comes from ``planner.perf`` (and the price curve of ``planner.studies.pricing``); nothing is
typed in. Sections follow the serving-economics effects planners know (docs/insights.md):

1. cost per token against batch, ideal and calibrated; balance batch next to the rule of thumb;
2. latency floor and the cost-latency frontier with speed tiers;
3. KV-cache against weight memory time over context, for this model and for GQA / MLA / sliding
   window / top-k sparse attention;
4. pipeline stages: weights and KV per chip, TPOT;
5. expert parallelism inside one scale-up domain against across domains;
6. output-vs-input and cached-vs-fresh input cost ratios;
7. cost per token against context length, and where a flat price stops covering it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from planner.catalog.loader import Catalog
from planner.catalog.schemas import IDEAL, HardwareSpec, ModelSpec
from planner.errors import InputError
from planner.perf import params as P
from planner.perf.candidates import layouts
from planner.perf.layout import (
    Layout,
    describe_layout,
    kv_bytes_per_chip,
    runtime_reserve_bytes,
    weight_bytes_per_chip,
)
from planner.perf.report import balance_batch
from planner.perf.roofline import Setup, decode_step, prefill_time
from planner.units import HOUR_S, MTOK, dtype_bytes

BATCHES = tuple(2**i for i in range(0, 14))
CONTEXTS = tuple(512 * 2**i for i in range(12))
KV_BATCH = 64
"""Sequences per replica at which KV and weight memory time are compared (section 3)."""
MICRO_BATCH = 32
"""Sequences per pipeline stage in section 4 (the batch grows with the stages to keep them busy)."""
EP_BATCH_PER_GPU = 64
"""Sequences per GPU in section 5."""
PRICE_MARGIN = 2.0
"""Section 7: a flat price set at this multiple of the cost at the reference context."""
REFERENCE_CONTEXT = 8192
WEIGHT_SHARE = 0.6
"""The reference layout is the smallest whose weights take at most this share of HBM."""

# Standard attention configurations compared in section 3 (per layer, per token, KV bytes read).
VARIANTS = {
    "GQA (8 KV heads x 128)": lambda s, b: 2 * 8 * 128 * b * s,
    "MLA (512 latent + 64 RoPE)": lambda s, b: (512 + 64) * b * s,
    "sliding window 4,096 (GQA 8 x 128)": lambda s, b: 2 * 8 * 128 * b * np.minimum(s, 4096),
    "top-k sparse 2,048 (MLA + 128-dim FP8 indexer)": lambda s, b: (512 + 64) * b * np.minimum(s, 2048) + 128 * 1 * s,
}


@dataclass
class Insights:
    model: str
    hardware: str
    context: int
    price: float
    layout: Layout
    weights_dtype: str
    kv_dtype: str
    batch: dict = field(default_factory=dict)
    latency: dict = field(default_factory=dict)
    kv: dict = field(default_factory=dict)
    pipeline: list = field(default_factory=list)
    expert_parallel: dict = field(default_factory=dict)
    ratios: dict = field(default_factory=dict)
    long_context: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "hardware": self.hardware,
            "context": self.context,
            "usd_per_chip_hour": self.price,
            "layout": self.layout.describe(),
            "unbatched_to_best_cost_ratio": self.batch["unbatched_to_best_cost_ratio"],
            "balance_batch": self.batch["balance_batch"],
            "balance_batch_rule": self.batch["balance_batch_rule"],
            "latency_floor_s": self.latency["latency_floor_s"],
            "kv_crossover_context": self.kv["crossover_context"],
            "output_to_input_cost_ratio": self.ratios["output_to_input_cost_ratio"],
            "cache_hit_to_prefill_cost_ratio": self.ratios["cache_hit_to_prefill_cost_ratio"],
            "pipeline": self.pipeline,
            "speed_tiers": self.latency["tiers"],
            "long_context_price_step_context": self.long_context["price_step_context"],
        }


def _usd_per_mtok(chips: float, price: float, tokens_per_s) -> np.ndarray:
    return chips * price / (np.asarray(tokens_per_s, dtype=float) * HOUR_S) * MTOK


def reference_layout(model: ModelSpec, hw: HardwareSpec, wb) -> Layout:
    """Smallest layout (pp = 1; expert parallel where the model is MoE) whose weights take at most
    60% of HBM, leaving room for the KV cache."""
    lay = layouts(model, hw)
    lay = lay[(lay["pp"] == 1) & (lay["tp"] * lay["attn_dp"] <= hw.scale_up_domain_chips)]
    if model.is_moe:
        stage = lay["tp"] * lay["attn_dp"]
        lay = lay[((lay["ep"] == stage) & (model.architecture.moe.experts % stage == 0)) | (stage == 1)]
    rows = []
    for r in lay.itertuples(index=False):
        w = float(weight_bytes_per_chip(wb, r.tp, r.ep, r.pp, r.attn_dp))
        if w <= WEIGHT_SHARE * hw.hbm_bytes:
            rows.append((r.tp * r.attn_dp, r.attn_dp, Layout(int(r.tp), int(r.ep), 1, int(r.attn_dp))))
    if not rows:
        raise InputError(f"--model {model.id} does not fit on {hw.id} within one scale-up domain; pick larger hardware")
    return min(rows, key=lambda t: (t[0], t[1]))[2]


def fits(setup: Setup, lay: Layout, batch, context) -> np.ndarray:
    L = (lay.tp, lay.ep, lay.pp, lay.dp)
    used = weight_bytes_per_chip(setup.wb, *L) + kv_bytes_per_chip(setup.model, batch, context, setup.kv_dtype,
                                                                     lay.tp, lay.pp, lay.dp, setup.sliding_kv_share)
    return used + runtime_reserve_bytes(setup.hw) <= setup.hw.hbm_bytes


def compute(catalog: Catalog, model_id: str, hw_id: str, *, context: int = 2048, engine: str | None = None) -> Insights:
    model = catalog.get_model(model_id)
    hw = catalog.get_hardware(hw_id)
    price = hw.price_usd_per_chip_hour
    if price is None:
        raise InputError(f"--hardware {hw.id} has no catalog price; pick priced hardware")
    kv_dtype = "fp8" if "fp8" in hw.dense_tflops else "bf16"
    eff = hw.efficiency.for_engine(engine)
    cal = Setup.make(model, hw, kv=kv_dtype, eff=eff, engine=engine)
    ideal = Setup.make(model, hw, kv=kv_dtype, eff=IDEAL)
    lay = reference_layout(model, hw, cal.wb)
    L = (lay.tp, lay.ep, lay.pp, lay.dp)
    chips = lay.chips
    ins = Insights(model.id, hw.id, context, float(price), lay, cal.dense_dtype, kv_dtype)
    ins.batch = _batch_section(cal, ideal, lay, L, chips, price, context)
    ins.latency = _latency_section(catalog, model, hw, ideal, engine, context)
    ins.kv = _kv_section(ideal, lay, L, context)
    ins.pipeline = _pipeline_section(cal, lay, context)
    ins.expert_parallel = _ep_section(cal, hw, price, context)
    ins.ratios = _ratio_section(cal, lay, L, chips, price, context, ins.batch["best_batch"])
    ins.long_context = _long_context_section(cal, lay, L, chips, price)
    return ins


def _batch_section(cal, ideal, lay, L, chips, price, context) -> dict:
    B = np.array(BATCHES, dtype=float)
    ok = fits(cal, lay, B, context)
    out = {"batches": list(BATCHES), "fits": ok.tolist()}
    for name, s in (("calibrated", cal), ("ideal", ideal)):
        st = decode_step(s, *L, B, context)
        out[f"usd_per_mtok_{name}"] = _usd_per_mtok(chips, price, B / st.step_s).tolist()
        out[f"bound_{name}"] = np.where(st.compute_s >= st.memory_s, "compute", "memory").tolist()
    cost = np.array(out["usd_per_mtok_calibrated"])
    best = int(np.argmin(np.where(ok, cost, np.inf)))
    out["best_batch"] = int(B[best])
    out["unbatched_to_best_cost_ratio"] = float(cost[0] / cost[best])
    out["balance_batch"] = balance_batch(ideal, lay, 1.0)
    out["balance_batch_at_context"] = balance_batch(ideal, lay, context)
    s = ideal.stats
    machine = ideal.f_expert if s.experts else ideal.f_dense
    bytes_per_weight = ideal.wb.expert_bytes_per_weight if s.experts else ideal.wb.dense_bytes_per_weight
    out["machine_balance_flop_per_byte"] = machine / ideal.hbm_bw
    out["bytes_per_weight"] = bytes_per_weight
    out["sparsity"] = s.total_params / s.active_params
    out["balance_batch_rule"] = machine / ideal.hbm_bw * bytes_per_weight / 2.0 * out["sparsity"]
    return out


def _latency_section(catalog, model, hw, ideal, engine, context) -> dict:
    from planner.studies.pricing import price_curve

    lay = layouts(model, hw)
    lay = lay[(lay["pp"] == 1) & (lay["tp"] * lay["attn_dp"] <= max(hw.scale_up_domain_chips, 64))]
    floors = [float(weight_bytes_per_chip(ideal.wb, r.tp, r.ep, 1, r.attn_dp)) / ideal.hbm_bw for r in lay.itertuples(index=False)]
    i = int(np.argmin(floors))
    r = lay.iloc[i]
    pc = price_curve(catalog, model.id, [hw.id], input_tokens=context, output_tokens=max(context // 4, 1), engine=engine)
    front = pc.points
    return {
        "latency_floor_s": floors[i],
        "floor_layout": describe_layout(r.tp, r.ep, 1, r.attn_dp),
        "max_tokens_per_s_per_user": 1.0 / floors[i],
        "frontier": {"tokens_per_s_per_user": front["tokens_per_s_per_user"].tolist(),
                     "usd_per_mtok_output": front["usd_per_mtok_output"].tolist()},
        "fastest_reached": float(front["tokens_per_s_per_user"].max()),
        "tiers": pc.tiers,
    }


def _crossing(f, lo: float, hi: float) -> float | None:
    """Smallest x in [lo, hi] with f(x) >= 0 (f increasing), by bisection in log space."""
    if f(lo) >= 0:
        return lo
    if f(hi) < 0:
        return None
    a, b = math.log(lo), math.log(hi)
    for _ in range(80):
        m = 0.5 * (a + b)
        if f(math.exp(m)) >= 0:
            b = m
        else:
            a = m
    return math.exp(b)


def _kv_section(ideal, lay, L, context) -> dict:
    S = np.array(CONTEXTS, dtype=float)
    st = decode_step(ideal, *L, KV_BATCH, S)
    weights_t = np.asarray(st.gemm_memory_s * np.ones_like(S))
    kv_t = np.asarray(st.attn_memory_s)
    cross = _crossing(lambda s: float(decode_step(ideal, *L, KV_BATCH, s).attn_memory_s
                                      - decode_step(ideal, *L, KV_BATCH, s).gemm_memory_s), 1.0, 1e8)
    # Variants: KV read time for the same layers and batch, same sharding as this model's cache.
    layers = ideal.model.architecture.layers
    kvb = dtype_bytes(ideal.kv_dtype)
    own = P.kv_read_bytes_per_sequence(ideal.model, S, ideal.kv_dtype)
    scale = kv_t / np.maximum(own, 1e-30)  # seconds per byte read per sequence, for this layout and batch
    variants = {}
    per_byte = float(scale[0])
    for name, f in VARIANTS.items():
        t = f(S, kvb) * layers * scale
        c = _crossing(lambda s, f=f: float(f(np.array(s), kvb) * layers * per_byte - weights_t[0]), 1.0, 1e8)
        variants[name] = {"kv_memory_s": t.tolist(), "crossover_context": c}
    return {"contexts": list(CONTEXTS), "batch": KV_BATCH, "weights_memory_s": weights_t.tolist(),
            "kv_memory_s": kv_t.tolist(), "crossover_context": cross, "variants": variants,
            "attention": ideal.model.architecture.attention.type}


def _pipeline_section(cal, lay, context) -> list:
    out = []
    for pp in (1, 2, 4, 8):
        if pp > cal.model.architecture.layers:
            continue
        B = MICRO_BATCH * pp * lay.dp
        st = decode_step(cal, lay.tp, lay.ep, pp, lay.dp, B, context)
        out.append({
            "pp": pp,
            "chips": lay.tp * lay.dp * pp,
            "batch": B,
            "weight_bytes_per_chip": float(weight_bytes_per_chip(cal.wb, lay.tp, lay.ep, pp, lay.dp)),
            "kv_bytes_per_chip": float(kv_bytes_per_chip(cal.model, B, context, cal.kv_dtype, lay.tp, pp, lay.dp,
                                                                   cal.sliding_kv_share)),
            "tpot_s": float(st.step_s),
        })
    return out


def _ep_section(cal, hw, price, context) -> dict:
    if not cal.model.is_moe:
        return {}
    D = hw.scale_up_domain_chips
    inside = sorted({g for g in (8, 16, 32, 64, D) if g <= D and g > 1})
    across = [g for g in (2 * D, 4 * D) if g <= 512]
    rows = []
    for g in inside + across:
        B = EP_BATCH_PER_GPU * g
        st = decode_step(cal, 1, g, 1, g, B, context)
        rows.append({"gpus": g, "domain": "inside" if g <= D else "across", "a2a_s": float(st.comm_s),
                     "step_s": float(st.step_s), "usd_per_mtok": float(_usd_per_mtok(g, price, B / st.step_s))})
    return {"scale_up_domain": D, "batch_per_gpu": EP_BATCH_PER_GPU, "rows": rows}


def _ratio_section(cal, lay, L, chips, price, context, best_batch) -> dict:
    usd_s = chips * price / HOUR_S
    st = decode_step(cal, *L, best_batch, context)
    out_cost = usd_s * st.step_s / best_batch
    prompts = max(lay.dp, 8)
    t_pf = float(prefill_time(cal, *L, context, prompts))
    in_cost = usd_s * t_pf / (prompts * context)
    per_tok = P.kv_bytes_per_token(cal.model, cal.kv_dtype)
    # loading a cached token's KV into the replica: the bytes over each tier's bandwidth, all chips in parallel
    tiers = {"hbm": cal.hw.hbm_bw, "host_dram": cal.hw.host_link_bw, "nvme": cal.hw.nvme_bw}
    hit = {k: float(usd_s * per_tok / (chips * max(bw, 1.0)) / in_cost) for k, bw in tiers.items()}
    return {
        "output_to_input_cost_ratio": float(out_cost / in_cost),
        "usd_per_mtok_output": float(out_cost * MTOK),
        "usd_per_mtok_input": float(in_cost * MTOK),
        "cache_hit_to_prefill_cost_ratio": hit,
        "batch": best_batch,
        "prefill_prompts": prompts,
    }


def _long_context_section(cal, lay, L, chips, price) -> dict:
    S = np.array(CONTEXTS, dtype=float)
    B = np.array(BATCHES, dtype=float)
    costs, best_b = [], []
    for s in S:
        ok = fits(cal, lay, B, s)
        if not ok.any():
            costs.append(math.nan)
            best_b.append(0)
            continue
        st = decode_step(cal, *L, B[ok], s)
        c = _usd_per_mtok(chips, price, B[ok] / st.step_s)
        i = int(np.argmin(c))
        costs.append(float(c[i]))
        best_b.append(int(B[ok][i]))
    ref = float(np.interp(math.log(REFERENCE_CONTEXT), np.log(S), np.array(costs)))
    flat = ref * PRICE_MARGIN
    step = next((int(s) for s, c in zip(S, costs, strict=True) if not math.isnan(c) and c > flat), None)
    first_nofit = next((int(s) for s, c in zip(S, costs, strict=True) if math.isnan(c)), None)
    if step is None and first_nofit is not None:
        step = first_nofit
    return {"contexts": list(CONTEXTS), "usd_per_mtok_output": costs, "best_batch": best_b,
            "reference_context": REFERENCE_CONTEXT, "reference_cost": ref, "flat_price": flat,
            "price_step_context": step, "max_context_fitting": int(S[~np.isnan(costs)].max()) if not all(
                math.isnan(c) for c in costs) else None}
