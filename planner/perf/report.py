"""One-point roofline summary of a layout (what ``planner roofline`` prints)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from planner.perf import params as P
from planner.perf.layout import (
    Layout,
    describe_layout,
    expert_copies,
    kv_bytes_per_chip,
    kv_shard,
    runtime_reserve_bytes,
    weight_bytes_per_chip,
)
from planner.perf.roofline import Setup, decode_step, latency_floor, prefill_pass
from planner.perf.serving import usd_per_mtok


@dataclass
class RooflineResult:
    model: str
    hardware: str
    mode: str
    engine: str | None
    layout: str
    """Engine notation of the layout (``attn-DP8 EP8 +32 redundant``)."""
    tp: int
    ep: int
    pp: int
    attn_dp: int
    """Attention data-parallel ranks: attention replicated per rank, experts shared by all."""
    redundant_experts: int
    tbo: bool
    """Two micro-batch overlap."""
    chips: int
    batch: float
    context: float
    weights_dtype: str
    expert_weights_dtype: str
    kv_dtype: str
    step_time_s: float
    compute_time_s: float
    memory_time_s: float
    comm_time_s: float
    overhead_time_s: float
    bound: str
    tokens_per_s: float
    tokens_per_s_per_user: float
    weight_bytes_per_chip: float
    kv_bytes_per_chip: float
    other_bytes_per_chip: float
    hbm_bytes_per_chip: float
    fits: bool
    usd_per_hour: float | None
    usd_per_mtok: float | None
    balance_batch: float | None
    latency_floor_s: float
    weight_read_bytes_per_chip: float
    kv_read_bytes_per_chip: float
    spec_tokens: float = 0.0
    """Draft tokens per sequence and step (speculative decoding; 0: off)."""
    spec_accept: float = 0.0
    tokens_per_step: float = 1.0
    """Output tokens per sequence and step; ``step_time_s`` is the step over these."""
    draft_time_s: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def balance_batch(setup: Setup, layout: Layout, context: float) -> float | None:
    """Batch (sequences in flight per replica) at which compute time equals memory time.

    None when memory time grows at least as fast as compute time with batch (long context: the
    KV cache keeps the step memory-bound at every batch).
    """
    L = (layout.tp, layout.ep, layout.pp, layout.dp)
    copies = _copies(setup, layout)
    setup = replace(setup, expert_copies=copies)

    def gap(b: float) -> float:
        st = decode_step(setup, *L, b, context)
        return float(st.compute_s - st.memory_s)

    lo, hi = 1e-6, 1.0
    if gap(lo) >= 0:
        return float(lo)
    while gap(hi) < 0:
        hi *= 2.0
        if hi > 1e9:
            return None
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if gap(mid) < 0:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-9 * hi:
            break
    return 0.5 * (lo + hi)


def _copies(setup: Setup, layout: Layout) -> float:
    return expert_copies(setup.model, layout.redundant)


def roofline(setup: Setup, layout: Layout, batch: float, context: float, *, mode: str, engine: str | None) -> RooflineResult:
    L = (layout.tp, layout.ep, layout.pp, layout.dp)
    setup = replace(setup, expert_copies=_copies(setup, layout))
    st = decode_step(setup, *L, batch, context)
    hw = setup.hw
    w = float(weight_bytes_per_chip(setup.wb, *L, setup.expert_copies))
    kv = float(kv_bytes_per_chip(setup.model, batch, context, setup.kv_dtype, layout.tp, layout.pp, layout.dp,
                                 setup.sliding_kv_share))
    other = runtime_reserve_bytes(hw)
    step = float(st.step_s)
    tps = batch / step
    price = hw.price_usd_per_chip_hour
    usd_h = price * layout.chips if price is not None else None
    return RooflineResult(
        model=setup.model.id,
        hardware=hw.id,
        mode=mode,
        engine=engine,
        layout=describe_layout(*L, layout.redundant),
        tp=layout.tp,
        ep=layout.ep,
        pp=layout.pp,
        attn_dp=layout.dp,
        redundant_experts=layout.redundant,
        tbo=bool(float(np.max(setup.tbo)) > 0),
        chips=layout.chips,
        batch=float(batch),
        context=float(context),
        weights_dtype=setup.dense_dtype,
        expert_weights_dtype=setup.expert_dtype,
        kv_dtype=setup.kv_dtype,
        step_time_s=step,
        compute_time_s=float(st.compute_s),
        memory_time_s=float(st.memory_s),
        comm_time_s=float(st.comm_s),
        overhead_time_s=float(st.overhead_s),
        bound=str(np.asarray(st.bound).item()),
        tokens_per_s=tps,
        tokens_per_s_per_user=1.0 / step,
        weight_bytes_per_chip=w,
        kv_bytes_per_chip=kv,
        other_bytes_per_chip=other,
        hbm_bytes_per_chip=hw.hbm_bytes,
        fits=(fits := bool(w + kv + other <= hw.hbm_bytes)),
        # a layout that cannot run has no price (the CLI refuses it unless --allow-misfit)
        usd_per_hour=usd_h if fits else None,
        usd_per_mtok=float(usd_per_mtok(usd_h, tps)) if usd_h is not None and fits else None,
        balance_batch=balance_batch(setup, layout, context),
        latency_floor_s=float(latency_floor(setup, *L)),
        weight_read_bytes_per_chip=float(st.weight_read_bytes),
        kv_read_bytes_per_chip=float(st.kv_read_bytes),
        spec_tokens=float(setup.spec_tokens),
        spec_accept=float(np.atleast_1d(np.asarray(setup.spec_accept, dtype=float))[0]) if setup.spec_tokens else 0.0,
        tokens_per_step=float(st.tokens_per_step),
        draft_time_s=float(st.draft_s),
    )


@dataclass
class PrefillResult:
    """One prefill pass of a replica (what ``planner roofline --phase prefill`` prints)."""

    model: str
    hardware: str
    mode: str
    engine: str | None
    layout: str
    tp: int
    ep: int
    pp: int
    attn_dp: int
    redundant_experts: int
    chips: int
    prompts: float
    """Prompts in one pass (spread over the attention-DP ranks)."""
    prompt_tokens: float
    """New tokens per prompt (after ``prefix_tokens`` served from a cache)."""
    prefix_tokens: float
    weights_dtype: str
    expert_weights_dtype: str
    kv_dtype: str
    pass_time_s: float
    """Latency of the pass, per-layer fixed overheads included (a TTFT adds the per-request overhead and
    queueing)."""
    compute_time_s: float
    memory_time_s: float
    comm_time_s: float
    overhead_time_s: float
    bound: str
    tokens_per_s: float
    """Prompt tokens per second of the replica in steady state (``pp`` passes in flight)."""
    tokens_per_s_per_gpu: float
    model_flops_utilisation: float
    """Matmul and attention FLOPs of the pass over the replica's peak FLOP/s in the pass time."""
    kv_bytes_written_per_chip: float
    weight_bytes_per_chip: float
    fits: bool
    usd_per_hour: float | None
    usd_per_mtok_input: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def prefill_roofline(
    setup: Setup, layout: Layout, prompts: float, prompt_tokens: float, *, prefix: float = 0.0, mode: str,
    engine: str | None,
) -> PrefillResult:
    """Prefill throughput of ``prompts`` prompts of ``prompt_tokens`` new tokens in one pass of a replica."""
    L = (layout.tp, layout.ep, layout.pp, layout.dp)
    setup = replace(setup, expert_copies=_copies(setup, layout))
    t_, bound_, parts = prefill_pass(setup, *L, prompt_tokens, prompts, prefix)  # overlap with setup.tbo
    comp, mem, comm, over = (float(np.asarray(x)) for x in parts)
    t, bound = float(np.asarray(t_)), str(np.asarray(bound_))
    hw = setup.hw
    tokens = prompts * prompt_tokens
    tps = tokens * layout.pp / t
    chips = layout.chips
    flops = tokens * 2.0 * setup.stats.matmul_active_params + prompts * float(
        np.asarray(P.prefill_attention_flops(setup.model, prompt_tokens, prefix)))
    mfu = flops / (t * chips * setup.f_dense) * layout.pp
    w = float(weight_bytes_per_chip(setup.wb, *L, setup.expert_copies))
    dp_used = min(prompts, layout.dp)
    kv = float(np.asarray(P.kv_bytes_per_sequence(setup.model, prompt_tokens + prefix, setup.kv_dtype))) * prompts / dp_used
    kv = kv / float(np.asarray(kv_shard(setup.model, layout.tp))) / layout.pp
    price = hw.price_usd_per_chip_hour
    usd_h = price * chips if price is not None else None
    return PrefillResult(
        model=setup.model.id, hardware=hw.id, mode=mode, engine=engine, layout=describe_layout(*L, layout.redundant),
        tp=layout.tp, ep=layout.ep, pp=layout.pp, attn_dp=layout.dp, redundant_experts=layout.redundant, chips=chips,
        prompts=float(prompts), prompt_tokens=float(prompt_tokens), prefix_tokens=float(prefix),
        weights_dtype=setup.dense_dtype, expert_weights_dtype=setup.expert_dtype, kv_dtype=setup.kv_dtype,
        pass_time_s=t, compute_time_s=comp, memory_time_s=mem, comm_time_s=comm, overhead_time_s=over, bound=bound,
        tokens_per_s=tps, tokens_per_s_per_gpu=tps / chips, model_flops_utilisation=mfu,
        kv_bytes_written_per_chip=kv, weight_bytes_per_chip=w,
        fits=(fits := bool(w + kv + runtime_reserve_bytes(hw) <= hw.hbm_bytes)),
        usd_per_hour=usd_h if fits else None,
        usd_per_mtok_input=float(usd_per_mtok(usd_h, tps)) if usd_h is not None and fits else None,
    )


def require_fit(r, layout, hbm_bytes: float) -> None:
    """Refuse a roofline (decode step or prefill pass) whose layout does not fit in HBM: one line with the sizes
    and what to change (``planner roofline`` shows it anyway with ``--allow-misfit``, unpriced)."""
    if r.fits:
        return
    from planner.errors import InputError

    kv = getattr(r, "kv_bytes_per_chip", None)
    kv = r.kv_bytes_written_per_chip if kv is None else kv
    raise InputError(f"{r.model} {layout.describe()} on {r.hardware} does not fit: weights "
                     f"{r.weight_bytes_per_chip / 1e9:,.1f} GB and KV {kv / 1e9:,.1f} GB per chip (with the runtime "
                     f"reserve) exceed {hbm_bytes / 1e9:,.1f} GB of HBM; spread it over more chips (--tp, --pp, --ep), "
                     "lower --batch or --context, or pass --allow-misfit to see its roofline unpriced")
