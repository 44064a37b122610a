"""Roofline step times: decode steps and prefill passes of one replica (array-friendly).

Every function takes NumPy arrays (or scalars) for the layout (``tp``, ``ep``, ``pp``, ``dp``), the
batch and the context, and broadcasts, so a whole candidate table is evaluated in one call.

Decode step of ``B`` sequences in flight per replica, run as ``pp`` micro-batches of ``m = B / pp``:
per pipeline stage and chip,

* GEMMs: ``max(flops / (F * compute), weight bytes / (W * memory))`` where the weight bytes count
  non-expert weights ``/ tp`` and only the routed experts a step touches ``/ (tp * dp)``;
* attention: ``max(attention flops / (F_bf16 * compute), KV bytes / (W * memory))``;
* communication: tensor-parallel all-reduces (two per layer), and with attention data parallelism
  an expert all-to-all (dispatch and combine per MoE layer, over the scale-up fabric while the
  stage fits in one domain and over scale-out for the share that leaves it), pipeline sends; each collective also pays a latency.
  Communication is assumed not to overlap with compute in decode (conservative; engines that
  overlap show it as a lower fitted ``collective_latency_us``);
* fixed overheads per step and per layer from the efficiency block.

The time per output token is ``pp`` times the stage time (a token passes every stage). Units: SI.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from planner.catalog.schemas import (
    EngineEfficiency,
)
from planner.perf import compose as C
from planner.perf import params as P
from planner.perf.layout import kv_shard, weight_bytes_per_chip
from planner.perf.setup import ACT_BYTES, DEFAULT_ACCEPT, MAX_SPEC_TOKENS, Setup, StepTimes, accepted_tokens  # noqa: F401  (re-exported)
from planner.units import US

_INV_NORMAL = NormalDist().inv_cdf


def expected_max_normal(n):
    """Expected largest of ``n`` standard normal draws (Blom's approximation, within 1% for n >= 2). The
    inverse normal CDF comes from the standard library, once per distinct ``n`` (group sizes repeat)."""
    n = np.maximum(np.asarray(n, dtype=float), 1.0)
    k = n.astype(np.intp)
    if n.size and (k == n).all() and k.max() < len(_Z_MAX):
        return _Z_MAX[k]
    sizes, where = np.unique(n, return_inverse=True)
    z = np.array([_blom(s) for s in sizes])
    return z[where].reshape(n.shape)


def _blom(n: float) -> float:
    return _INV_NORMAL((n - 0.375) / (n + 0.25)) if n > 1 else 0.0


_Z_MAX = np.array([_blom(float(i)) for i in range(1025)])


def expert_load_imbalance(setup: Setup, ep, tokens):
    """Max over mean routed load of the ``ep`` expert-parallel ranks when ``tokens`` tokens each pick
    ``top_k`` experts: the placement's imbalance (``setup.moe_imbalance``, from the expert-load model) plus
    the fluctuation of random routing, the expected largest of ``ep`` binomial counts of ``tokens * top_k``
    activations, ``z_ep * sigma / mu`` (normal approximation; at most all activations on one rank). Large
    batches average it away; at a few tokens per step it makes expert parallelism slower than experts
    split by tensor parallelism, whose ranks share every expert."""
    g = np.maximum(np.asarray(ep, dtype=float), 1.0)
    n = np.maximum(np.asarray(tokens, dtype=float) * setup.stats.top_k, 1e-9)
    mu = n / g
    sigma = np.sqrt(n / g * (1.0 - 1.0 / g))
    excess = np.minimum(expected_max_normal(g) * sigma / mu, g - 1.0)
    return np.asarray(setup.moe_imbalance, dtype=float) + np.where(g > 1, excess, 0.0)


FORMAT_FACTOR = {"fp8": "compute_fp8", "int8": "compute_fp8", "fp4": "compute_fp4"}
"""The efficiency factor of each maths format with a factor of its own (every other format: ``compute``)."""


def factor_dtype(hw, weight_dtype: str) -> str:
    """The format whose compute factor times a GEMM on ``weight_dtype`` weights: the maths format, except that FP4
    weights keep ``compute_fp4`` on chips without FP4 maths (H100/H200 dequantise MXFP4 experts in the kernel, a
    w4a16 kernel of its own efficiency, ~0.4 of bf16 peak in TensorRT-LLM's measured fused MoE against ~0.75 for
    bf16 GEMMs)."""
    return "fp4" if weight_dtype == "fp4" else hw.compute_dtype(weight_dtype)


def gemm_efficiency(eff: EngineEfficiency, compute_dtype: str, tokens, *, prefill: bool = False):
    """Achieved fraction of peak FLOP/s of a GEMM over ``tokens`` rows in ``compute_dtype`` maths:
    ``peak * M / (M + gemm_half_tokens)`` with the format's large-shape fraction as ``peak`` (the prefill
    fraction for a prefill pass)."""
    if prefill:
        peak = eff.prefill_compute
    else:
        peak = getattr(eff, FORMAT_FACTOR.get(compute_dtype, "compute")) or eff.compute
    t = np.maximum(np.asarray(tokens, dtype=float), 1e-9)
    h = eff.gemm_half_tokens
    if h <= 0:
        return peak + np.zeros_like(t)
    return peak * np.where(np.isfinite(t), t / (t + h), 1.0)


def _group_bw(setup: Setup, chips, share=1.0):
    """Per-chip bandwidth of a collective over ``chips`` chips: scale-up inside a domain, else scale-out,
    at ``share`` of the link rate."""
    chips = np.asarray(chips, dtype=float)
    bw = np.where(chips <= setup.hw.scale_up_domain_chips, setup.hw.scale_up_bw, setup.hw.scale_out_bw)
    return bw * share


def _alpha(setup: Setup, group, alpha_s):
    """Latency of one collective over ``group`` chips: ``alpha_s``, plus the efficiency block's
    ``scale_out_latency_us`` when the group spans more than one scale-up domain (network round trips
    and cross-node synchronisation)."""
    g = np.asarray(group, dtype=float)
    return alpha_s + np.where(g > setup.hw.scale_up_domain_chips, setup.eff.scale_out_latency_us * US, 0.0)


def all_reduce_time(setup: Setup, group, msg_bytes, count, alpha_s, share=1.0):
    """``count`` ring all-reduces of ``msg_bytes`` each over ``group`` chips: ``2 (g-1)/g * bytes / bw``
    (``bw`` at ``share`` of the link rate)."""
    g = np.asarray(group, dtype=float)
    t = 2.0 * (g - 1.0) / g * msg_bytes / _group_bw(setup, g, share) + _alpha(setup, g, alpha_s)
    return np.where(g > 1, count * t, 0.0)


def all_to_all_time(setup: Setup, group, bytes_per_chip, count, alpha_s, share=1.0):
    """``count`` all-to-alls where each chip sends ``bytes_per_chip`` spread over ``group`` chips.

    Inside one scale-up domain the traffic rides the scale-up fabric; for a group larger than a domain,
    the share ``1 - D / group`` leaves the domain over scale-out, and the slower path sets the time.
    """
    g = np.asarray(group, dtype=float)
    d = float(setup.hw.scale_up_domain_chips)
    remote = np.clip(1.0 - d / np.maximum(g, 1.0), 0.0, 1.0)
    frac = (g - 1.0) / np.maximum(g, 1.0)
    b = bytes_per_chip * frac
    up, out = (bw * share for bw in (setup.hw.scale_up_bw, setup.hw.scale_out_bw))
    t = np.maximum(b * (1.0 - remote) / up, b * remote / out) + _alpha(setup, g, alpha_s)
    return np.where(g > 1, count * t, 0.0)


def dispatch_bytes(setup: Setup) -> float:
    """Bytes per element of the expert dispatch: quantised models dispatch FP8 activations (DeepEP);
    the combine returns in bf16."""
    return 1.0 if setup.expert_dtype in ("fp8", "fp4", "int4", "int8") else ACT_BYTES


def routed_nodes(setup: Setup, nodes):
    """Expected distinct nodes a token's ``top_k`` experts sit on when expert parallelism spans ``nodes``
    scale-up domains, with node-limited routing: a model with group-limited routing (``groups`` expert
    groups, ``groups_per_token`` of them per token; DeepSeek-V3: 8 and 4) whose experts are placed group by
    group reaches at most ``groups_per_token * max(1, nodes / groups)`` nodes."""
    moe = setup.model.architecture.moe
    n = np.maximum(np.asarray(nodes, dtype=float), 1.0)
    k = float(setup.stats.top_k)
    if moe is not None and moe.groups > 1:
        reach = np.minimum(n, moe.groups_per_token * np.maximum(1.0, n / moe.groups))
    else:
        reach = n
    return reach * (1.0 - np.power(1.0 - 1.0 / reach, k))


def ep_exchange_time(setup: Setup, stage, tokens, layers, alpha_s, share=1.0, per_copy=False, up_share=1.0):
    """Expert-parallel dispatch and combine of ``layers`` MoE layers over ``stage`` GPUs, each GPU
    sending its ``tokens / stage`` tokens to their ``top_k`` experts (dispatch in the expert format's
    activations, FP8 for quantised models as DeepEP does; combine in bf16), two collective latencies a layer.

    Inside one scale-up domain every copy rides the scale-up fabric. Across domains two kernels differ:

    - throughput kernels (DeepEP's normal mode, prefill): a token crosses the scale-out network once per
      remote node it is routed to, not once per expert, and is forwarded to its experts inside the node over
      the scale-up fabric; node-limited routing (:func:`routed_nodes`) bounds the remote nodes;
    - latency kernels (``per_copy``; DeepEP's low-latency mode, MoRI's, what decode steps run): every copy is
      written point to point into its expert's GPU over RDMA, no forwarding, so each of the ``top_k`` copies
      whose expert sits on another node, ``1 - d / G`` of them under uniform placement, crosses the scale-out
      network; copies to the node's own GPUs ride the scale-up fabric.

    The slower fabric sets the time. ``up_share``: the achieved share of the scale-up bandwidth on top of ``share``
    (the efficiency an exchange kernel measured inside one node reaches, where a hardware has that curve).
    """
    s = setup.stats
    g = np.asarray(stage, dtype=float)
    d = float(setup.hw.scale_up_domain_chips)
    per_tok = float(s.hidden) * (dispatch_bytes(setup) + ACT_BYTES)
    gs = np.maximum(g, 1.0)
    t_chip = tokens / gs
    multi = g > d
    if per_copy:
        up_frac = np.where(multi, (d - 1.0) / gs, (g - 1.0) / gs)
        remote = s.top_k * (1.0 - np.minimum(d, gs) / gs)
    else:
        nodes = np.maximum(np.ceil(g / d), 1.0)
        up_frac = np.where(multi, (d - 1.0) / d, (g - 1.0) / gs)
        remote = routed_nodes(setup, nodes) * (1.0 - 1.0 / nodes)
    up = t_chip * s.top_k * per_tok * up_frac / (setup.hw.scale_up_bw * share * up_share)
    out = np.where(multi, t_chip * remote * per_tok / (setup.hw.scale_out_bw * share), 0.0)
    t = np.maximum(up, out) + 2.0 * _alpha(setup, g, alpha_s)
    return np.where(g > 1, layers * t, 0.0)


def moe_exchange_time(setup: Setup, ep, dp, stage, tokens, layers, alpha_s, share=1.0, per_copy=False, up_share=1.0):
    """Token exchange of ``layers`` MoE layers of one stage pass over ``tokens`` (all attention-DP ranks).

    Only attention data parallelism (``dp > 1``) spreads the tokens over the stage's chips. Then, with
    expert parallelism (``ep > 1``), the dispatch and combine of :func:`ep_exchange_time`; with expert
    tensor parallelism (``ep = 1``) every chip needs every token of the stage (all-gather) and returns a
    slice of every output (reduce-scatter), ``tokens x hidden`` each way whatever the top-k. With
    tensor-parallel attention (``dp = 1``) every chip already holds every token, so experts sharded by EP or
    TP alike run on them locally and the output rides an all-reduce (what TensorRT-LLM, SGLang and vLLM do
    without attention DP), charged by the callers; nothing is exchanged here.
    """
    s = setup.stats
    h = float(s.hidden)
    a2a = ep_exchange_time(setup, stage, tokens, layers, alpha_s, share, per_copy, up_share)
    etp = all_to_all_time(setup, stage, tokens * h * ACT_BYTES, 2.0 * layers, alpha_s, share)
    return np.where(dp > 1, np.where(ep > 1, a2a, etp), 0.0)


@dataclass
class _Parts:
    """One pipeline stage's pass over one micro-batch (seconds, bytes per chip)."""

    gemm_c: np.ndarray
    gemm_m: np.ndarray
    attn_c: np.ndarray
    attn_m: np.ndarray
    comm: np.ndarray
    layer_overhead: np.ndarray
    w_bytes: np.ndarray
    kv_bytes: np.ndarray
    expert: np.ndarray | float = 0.0
    """Of the GEMM time, the routed experts' (what :func:`_overlapped_pass` cannot hide a transfer behind)."""
    exchange: np.ndarray | float = 0.0
    """Of the communication, the expert dispatch and combine (what two micro-batch overlap hides)."""


def _attention_parts(setup: Setup, tp, pp, dp, mq, mb, S, xb, I, xr):
    """(compute s, memory s, KV bytes) of one stage pass's attention on the busiest rank: ``mq / dp`` decode queries
    over ``S`` tokens of context plus ``xr`` interleaved prompt tokens of ``I``-token prompts (see
    :func:`_stage_parts`), on the roofline or, where the kernel block times them, the decode and context curves."""
    m_, e, a = setup.model, setup.eff, setup.model.architecture
    dec_flops = P.attention_flops_per_token(m_, S) * (mq / dp) / tp / pp
    att_flops = dec_flops
    if np.any(xb > 0):
        pre_att = np.where(I > 0, P.prefill_attention_flops(m_, np.maximum(I, 1.0)) / np.maximum(I, 1.0), 0.0)
        att_flops = att_flops + pre_att * xr / tp / pp
    kv_bytes = P.kv_read_bytes_per_sequence(m_, S, setup.kv_dtype) * (mb / dp) / kv_shard(m_, tp) / pp
    a_peak = setup.f_attn * (e.attention_compute or e.compute)
    attn_c = att_flops / a_peak
    attn_m = kv_bytes / (setup.hbm_bw * e.memory)
    chunk_c = (att_flops - dec_flops) / a_peak
    pk = setup.term_kernels("prefill_attention")
    if pk is not None and np.any(xb > 0):
        # Interleaved prompt chunks' attention from the system's context-attention curve: the busiest rank's ``xr``
        # prompt tokens as ``xr / I`` prompts of ``I`` tokens (each its share of one kernel call per layer).
        one = np.maximum(np.asarray(I, dtype=float), 1.0)
        soft = C.prefill_attention_time(pk, setup.engine, m_, setup.hw, setup.kv_dtype, 1.0, one, 0.0, tp,
                                        e.kernel_fixed_share)
        if soft is not None:
            chunk_c = np.where(xb > 0, (soft + P.linear_prefill_flops(m_, one) / tp / a_peak) * xr / one / pp, 0.0)
            attn_c = dec_flops / a_peak + chunk_c
    # The decode attention from the system's own curve (MLA or the engine's GQA kernel at this KV format): a partial
    # composition's ``attention`` term (prompt chunks as above), or a composed step's (its FLOPs with the chunks').
    soft_layers = a.layers / pp * (1.0 - a.attention.linear_layers / a.layers)
    for kf, flops, chunks in ((setup.term_kernels("attention"), dec_flops, chunk_c), (setup.kernels, att_flops, 0.0)):
        at = None if kf is None else C.attention_time(kf, setup.engine, m_, setup.hw, setup.kv_dtype, mq / dp,
                                                        kv_bytes, flops, tp, soft_layers, e.kernel_fixed_share)
        if at is not None:
            attn_c = at + chunks
            attn_m = np.minimum(attn_m, attn_c)
    return attn_c, attn_m, kv_bytes


def _stage_parts(setup: Setup, tp, ep, pp, dp, mb, S, xb, I, xr=None) -> _Parts:
    """Parts of one stage pass over ``mb`` sequences (each verifying ``spec_tokens`` drafts) at mean
    context ``S`` plus ``xb`` interleaved prompt tokens of prompts of ``I`` tokens (weighted already), of which the
    busiest attention-DP rank carries ``xr`` (default ``xb / dp``, spread evenly): the step waits for that rank."""
    m_ = setup.model
    s = setup.stats
    e = setup.eff
    k = np.asarray(setup.spec_tokens, dtype=float)
    stage = tp * dp
    mq = mb * (1.0 + k)  # decode tokens (each sequence verifies its drafts too)
    tokens = mq + xb
    xr = xb / dp if xr is None else xr
    tok_rank = mq / dp + xr  # tokens the busiest attention-DP rank carries through a stage

    # GEMMs: efficiency follows the GEMM's rows (tokens per rank; tokens per expert for routed experts), the
    # interleaved prompt tokens riding the same GEMMs as the decode tokens (chunked prefill).
    ne_flops = 2.0 * setup.nonexpert_matmul_params * tok_rank / tp / pp
    imb = expert_load_imbalance(setup, ep, tokens) if s.experts else 1.0
    ex_flops = 2.0 * setup.expert_active_params * tokens / stage / pp * imb
    hw = setup.hw
    eff_ne = gemm_efficiency(e, factor_dtype(hw, setup.dense_dtype), tok_rank)
    ne_c = ne_flops / (setup.f_dense * eff_ne)
    gemm_c = ne_c
    if s.experts:
        per_expert = tokens * s.top_k / s.experts
        eff_ex = gemm_efficiency(e, factor_dtype(hw, setup.expert_dtype), per_expert)
        gemm_c = gemm_c + ex_flops / (setup.f_expert * eff_ex)
        # The busiest rank streams the experts its tokens touch, at most all it holds.
        touched = np.minimum(P.expected_experts_touched(s.experts, s.top_k, tokens) / s.experts * imb, 1.0)
    else:
        touched = np.zeros_like(tokens)
    w_bytes = setup.streamed_nonexpert_bytes / (tp * pp) + setup.wb.expert * setup.expert_copies * touched / (stage * pp)
    gemm_m = w_bytes / (setup.hbm_bw * e.memory)
    # the routed experts' share of the GEMM time: their FLOPs or their weights, whichever binds them
    expert_t = (np.maximum(gemm_c - ne_c, setup.wb.expert * setup.expert_copies * touched / (stage * pp)
                           / (setup.hbm_bw * e.memory)) if s.experts else 0.0)

    # Attention.
    attn_c, attn_m, kv_bytes = _attention_parts(setup, tp, pp, dp, mq, mb, S, xb, I, xr)

    # Communication.
    alpha = e.collective_latency_us * US
    h = float(s.hidden)
    layers_stage = m_.architecture.layers / pp
    moe_layers_stage = s.moe_layers / pp
    dense_layers_stage = layers_stage - moe_layers_stage
    ar_per_layer = 1.0 if m_.architecture.parallel_blocks else 2.0
    msg = tok_rank * h * ACT_BYTES
    attn_dp = dp > 1
    kf = setup.kernels
    if kf is not None:
        # The terms measured kernel by kernel on this system: the model's own GEMM shapes, its fused MoE (its
        # attention in :func:`_attention_parts`); each curve's time replaces the datasheet roofline of that term (its memory floor stays
        # below it, for the bound).
        fx = e.kernel_fixed_share
        ne = C.dense_gemm_time(kf, setup.engine, m_, hw, setup.dense_dtype, tok_rank, tp, layers_stage,
                               moe_layers_stage, 1.0 / pp, fx)
        ex = (C.moe_gemm_time(kf, setup.engine, m_, hw, setup.expert_dtype, tokens, ep, stage, moe_layers_stage,
                              imb, setup.expert_copies, fx, dp) if s.experts else 0.0)
        if ne is not None and ex is not None:
            gemm_c = ne + ex
            gemm_m = np.minimum(gemm_m, gemm_c)
            expert_t = ex
    # A partial composition (``KernelFits.terms``): the fused MoE layers and the non-expert GEMMs from the system's
    # own curves where the block names them, the rest on the roofline.
    gemm_c, gemm_m, expert_t, moe_timed = C.partial_gemm_terms(
        setup, tokens, tok_rank, tp, ep, pp, dp, imb, layers_stage, moe_layers_stage, ne_c, gemm_c, gemm_m, expert_t)
    # Dense layers: all-reduces inside the tp group. MoE layers: with attention DP, the attention
    # all-reduce and an exchange across the stage; with TP attention, two all-reduces as a dense layer.
    comm = _all_reduce(setup, kf, tp, msg, ar_per_layer * dense_layers_stage, alpha)
    if s.moe_layers:
        comm = comm + _all_reduce(setup, kf, tp, msg, np.where(attn_dp, 1.0, ar_per_layer) * moe_layers_stage, alpha)
        # Decode steps dispatch with latency kernels (point-to-point, a copy per expert; see ep_exchange_time).
        exchange = _decode_exchange(setup, kf, ep, dp, stage, tokens, moe_layers_stage, alpha)
        comm = comm + exchange
    else:
        exchange = 0.0
    if np.any(pp > 1):
        send = msg / _group_bw(setup, tp * dp * pp) + _alpha(setup, tp * dp * pp, alpha)
        comm = comm + np.where(pp > 1, send * (pp - 1.0) / pp, 0.0)
    moe_over = 0.0 if moe_timed else e.moe_layer_overhead_us
    layer_over = e.layer_overhead_us * US * layers_stage + moe_over * US * moe_layers_stage
    return _Parts(gemm_c, gemm_m, attn_c, attn_m, comm, layer_over + 0.0 * tokens, w_bytes, kv_bytes,
                  np.minimum(expert_t, np.maximum(gemm_c, gemm_m)), exchange)



def _measured_group(setup: Setup, group):
    """Where a collective's group lies within what the kernel collectives were measured on (one node)."""
    return np.asarray(group, dtype=float) <= min(C.MAX_MEASURED_GPUS, setup.hw.scale_up_domain_chips)


def _all_reduce(setup: Setup, kf, group, msg, count, alpha):
    """All-reduces of a decode step: the fitted collective curve for groups inside one measured node, the
    datasheet physics with the end-to-end latency beyond."""
    phys = all_reduce_time(setup, group, msg, count, alpha)
    kf = kf if kf is not None else setup.term_kernels("all_reduce")
    if kf is None:
        return phys
    fit = C.all_reduce(kf, setup.engine, setup.hw, group, msg, count, setup.eff.kernel_fixed_share)
    return phys if fit is None else np.where(_measured_group(setup, group), fit, phys)


def _decode_exchange(setup: Setup, kf, ep, dp, stage, tokens, layers, alpha):
    """Expert dispatch and combine of a decode step (attention DP with expert parallelism). Where the step is composed
    from kernel curves, or times this term by them (``KernelFits.terms``: ``exchange``), DeepEP low-latency's fitted
    curve inside one measured node; beyond it (a wider NVLink domain, scale-out) :func:`moe_exchange_time` on the
    datasheet links, its scale-up bandwidth at the share the curve reached inside the node (the kernels' measured
    link efficiency as the prior where no row exists). Without a curve, :func:`moe_exchange_time` at the datasheet.
    With the ``trtllm_exchange`` term as well, TensorRT-LLM exchanges as its MoE chooses
    (:func:`planner.perf.compose.trtllm_exchange`; its all-to-all, where a system has no ``alltoall`` curve, as above)."""
    kf = kf if kf is not None else setup.term_kernels("exchange")
    g = np.maximum(np.asarray(stage, dtype=float), 1.0)
    trt = None
    if kf is not None and setup.engine == "trtllm" and setup.term_kernels("trtllm_exchange") is not None:
        trt = C.trtllm_exchange(kf, setup.hw, tokens / g, float(setup.stats.hidden), float(setup.stats.top_k),
                                float(setup.stats.experts) * setup.expert_copies, g, ep, layers, setup.expert_dtype,
                                setup.eff.kernel_fixed_share)
        if trt is not None and (trt[1] is not None or not np.any(trt[2])):  # no DeepEP fallback needed
            return np.where((dp > 1) & (ep > 1), trt[0] if trt[1] is None else np.where(trt[2], trt[1], trt[0]), 0.0)
    p = C.deepep_curve(kf) if kf is not None else None
    if p is None:
        return moe_exchange_time(setup, ep, dp, stage, tokens, layers, alpha, per_copy=True)
    phys = moe_exchange_time(setup, ep, dp, stage, tokens, layers, alpha, per_copy=True, up_share=min(p["bus_eff"], 1.0))
    fit = C.deepep(kf, setup.hw, tokens / g, float(setup.stats.hidden), float(setup.stats.top_k), g, layers,
                   dispatch_bytes(setup), setup.eff.kernel_fixed_share,
                   experts=float(setup.stats.experts) * setup.expert_copies)
    out = np.where((dp > 1) & (ep > 1) & _measured_group(setup, g), fit, phys)
    return out if trt is None else np.where((dp > 1) & (ep > 1) & ~trt[2], trt[0], out)


def _part_arrays(f: _Parts) -> tuple:
    """The fields of ``f`` in declaration order."""
    return (f.gemm_c, f.gemm_m, f.attn_c, f.attn_m, f.comm, f.layer_overhead, f.w_bytes, f.kv_bytes)


def _stage_time(setup: Setup, tp, ep, pp, dp, mb, S, xb, I, xr=None):
    """(parts, time) of one stage pass over ``mb`` sequences and ``xb`` prompt tokens (``xr`` of them on the busiest
    attention-DP rank), with step and per-sequence overheads; two micro-batch overlap where ``setup.tbo`` asks for it."""
    e = setup.eff
    f = _stage_parts(setup, tp, ep, pp, dp, mb, S, xb, I, xr)
    hidden = e.comm_overlap * np.minimum(f.comm, f.gemm_c + f.attn_c)
    stage_t = np.maximum(f.gemm_c, f.gemm_m) + np.maximum(f.attn_c, f.attn_m) + f.comm - hidden + f.layer_overhead
    tbo = np.asarray(setup.tbo, dtype=float)
    if np.any(tbo > 0):
        half = None if xr is None else np.asarray(xr, dtype=float) / 2.0
        hf = _stage_parts(setup, tp, ep, pp, dp, mb / 2.0, S, np.asarray(xb, dtype=float) / 2.0, I, half)
        stage_t = np.where(tbo > 0, 2.0 * _overlapped_pass(setup, hf), stage_t)
    return f, stage_t + e.step_overhead_us * US / pp + e.seq_overhead_us * US * mb / dp


def _o_proj_share(setup: Setup) -> float:
    """Share of the non-expert GEMM parameters that is the attention output projection (``heads x v_head_dim x
    hidden`` per softmax-attention layer): the part of a layer's GEMMs that runs after the attention core."""
    arch = setup.model.architecture
    at = arch.attention
    v = at.v_head_dim or at.head_dim
    o = float(at.heads) * float(v) * float(arch.hidden_size) * float(arch.layers - at.linear_layers)
    return float(np.clip(o / max(setup.nonexpert_matmul_params, 1.0), 0.0, 1.0))


def _overlapped_pass(setup: Setup, hf: _Parts):
    """One micro-batch's share of a stage pass under two micro-batch overlap (decode), following the stage schedule
    of SGLang's DeepSeek decode strategy (``operations_strategy._compute_moe_deepseek_blog_decode``: five stages a
    layer, the second micro-batch two stages behind). A micro-batch's dispatch is in flight while its shared experts
    and the other's attention preparation (the projections before the attention core) run, its combine while the other
    runs its attention core and output projection; its routed experts run with nothing in flight. A pass is
    therefore ``experts + max(dispatch, other GEMMs) + max(combine, attention + o_proj)`` plus the collectives and
    fixed costs no stage hides, not ``max(compute, communication)``: overlap needs each transfer balanced against its
    own window, not the totals. Dispatch and combine split the exchange by their bytes (FP8 or bf16 out, bf16 back)."""
    gemm = np.maximum(hf.gemm_c, hf.gemm_m)
    expert = np.minimum(np.asarray(hf.expert, dtype=float), gemm)
    non_expert = gemm - expert
    o_proj = non_expert * _o_proj_share(setup)
    attention = np.maximum(hf.attn_c, hf.attn_m) + o_proj
    exchange = np.asarray(hf.exchange, dtype=float)
    db = dispatch_bytes(setup)
    dispatch = exchange * db / (db + ACT_BYTES)
    combine = exchange - dispatch
    serial = hf.comm - exchange + hf.layer_overhead
    return expert + np.maximum(dispatch, non_expert - o_proj) + np.maximum(combine, attention) + serial


def _chunk_steps(X, unit, dp, balanced: bool = False):
    """(prompt tokens of a step that carries prompt work, of them on the busiest attention-DP rank, share of steps
    that carry any) when ``X`` prompt tokens a step are due on average, taken in chunks of ``unit`` (a prompt's
    chunk: the engine's chunk size or the whole prompt).

    Each attention-DP rank schedules its own requests, so a prompt's chunk runs on one rank while the others wait for
    it at the next expert exchange (the step is the busiest rank's). A rank carries a chunk in a share
    ``p = min(X / (dp unit), 1)`` of the steps, of ``max(X / dp, unit)`` tokens; some rank does in ``1 - (1 - p)^dp``
    of them, with ``dp p`` chunks in flight over those steps. Without attention DP (``dp`` 1) this is the replica's
    own chunking: ``X / unit`` of the steps carry ``max(X, unit)`` tokens. ``balanced``: the ranks take their chunks
    in the same steps (``Setup.adp_prefill_balance``), a share ``p`` of the steps with a chunk on every rank."""
    X = np.asarray(X, dtype=float)
    d = np.maximum(np.asarray(dp, dtype=float), 1.0)
    unit = np.asarray(unit, dtype=float)
    per_rank = X / d
    p = np.clip(per_rank / unit, 0.0, 1.0)
    share = np.where(X > 0, p if balanced else 1.0 - np.power(1.0 - p, d), 0.0)
    rank_chunk = np.maximum(per_rank, unit)
    # all ranks' chunks of a chunk step: dp p chunks over the share of steps that carry any
    chunk = np.where(share > 0, d * p * rank_chunk / np.maximum(share, 1e-12), rank_chunk)
    return chunk, rank_chunk, share


def decode_step(
    setup: Setup,
    tp,
    ep,
    pp,
    dp,
    batch,
    context,
    *,
    prefill_tokens_per_step=0.0,
    prefill_context=0.0,
    prefill_prompt_tokens=None,
    plain: StepTimes | None = None,
) -> StepTimes:
    """Decode step of ``batch`` sequences in flight at mean ``context`` tokens (see module docstring).

    ``prefill_tokens_per_step`` adds prompt tokens processed in the same steps (aggregated serving): a prompt of
    ``prefill_context`` tokens, of which ``prefill_prompt_tokens`` are new (default all; fewer behind a cached
    prefix), rides whole, or in chunks of ``setup.prefill_chunk_tokens``, so a share of the steps
    carries a chunk and the rest are plain; the mean of the two is returned, the chunk steps' extra time weighted
    by the efficiency block's ``interference``. With
    two micro-batch overlap (``setup.tbo``) a stage pass is two half micro-batches whose communication
    runs under the other's compute: ``2 max(compute_half + layer overheads, comm_half)``.

    ``plain``: the step of the same rows without drafts and without prompt tokens (``decode_step`` with
    ``spec_tokens`` 0 at this batch and context), where the caller has it: drafting is priced from it
    (:func:`_draft_time`), else it is computed.
    """
    e = setup.eff
    tp, ep, pp, dp = (np.asarray(x, dtype=float) for x in (tp, ep, pp, dp))
    B = np.asarray(batch, dtype=float)
    S = np.asarray(context, dtype=float)
    X = np.asarray(prefill_tokens_per_step, dtype=float)
    I = np.asarray(prefill_context, dtype=float)
    mb = B / pp  # sequences per micro-batch
    if np.any(X > 0):
        # Prompts are not spread evenly over the steps: an engine takes a prompt in chunks of up to
        # ``prefill_chunk_tokens`` (whole when shorter), so a share ``X / chunk`` of the steps carries a chunk
        # and the rest are plain decode steps. The mean step mixes the two; a chunk step streams the experts
        # its chunk touches once, where tokens averaged over every step would touch them in every step.
        P = I if prefill_prompt_tokens is None else np.asarray(prefill_prompt_tokens, dtype=float)
        chunk, rank_chunk, share = _chunk_steps(X, np.minimum(setup.prefill_chunk_tokens, np.maximum(P, 1.0)), dp,
                                              setup.adp_prefill_balance)
        share = share * e.interference
        # Both passes in one evaluation: the plain and the chunk step stacked on a leading axis.
        shape = np.broadcast(tp, ep, pp, dp, mb, S, chunk, I, *(np.asarray(v, dtype=float) for v in (
            setup.moe_imbalance, setup.expert_copies, setup.spec_tokens, setup.tbo))).shape
        c = np.broadcast_to(chunk / pp, shape)
        zero = np.zeros(shape)
        both, stage2 = _stage_time(setup, tp, ep, pp, dp, mb, S, np.stack([zero, c]), I,
                                   np.stack([zero, np.broadcast_to(rank_chunk / pp, shape)]))
        stage_t = stage2[0] + share * (stage2[1] - stage2[0])
        stages = (stage2[0], stage2[1], share)
        f = _Parts(*(a[0] + share * (a[1] - a[0]) for a in (np.broadcast_to(v, (2, *shape)) for v in _part_arrays(both))))
    else:
        f, stage_t = _stage_time(setup, tp, ep, pp, dp, mb, S, 0.0, I)
        stages = None
    tbo = np.asarray(setup.tbo, dtype=float)
    k = np.asarray(setup.spec_tokens, dtype=float)
    overhead = f.layer_overhead + e.step_overhead_us * US / pp + e.seq_overhead_us * US * mb / dp
    step = pp * stage_t
    draft = _draft_time(setup, tp, ep, pp, dp, B, S, plain) if np.any(k > 0) else 0.0
    per_step = setup.tokens_per_step
    return StepTimes(
        step_s=(step + draft) / per_step,
        compute_s=pp * (f.gemm_c + f.attn_c),
        memory_s=pp * (f.gemm_m + f.attn_m),
        comm_s=pp * f.comm,
        overhead_s=pp * overhead,
        gemm_compute_s=pp * f.gemm_c,
        gemm_memory_s=pp * f.gemm_m,
        attn_compute_s=pp * f.attn_c,
        attn_memory_s=pp * f.attn_m,
        weight_read_bytes=pp * f.w_bytes * np.where(tbo > 0, 2.0, 1.0),
        kv_read_bytes=pp * f.kv_bytes,
        draft_s=np.broadcast_to(np.asarray(draft, dtype=float), np.shape(step)).copy(),
        tokens_per_step=np.broadcast_to(np.asarray(per_step, dtype=float), np.shape(step)).copy(),
        **({} if stages is None else {"plain_emit_s": pp * stages[0] + draft, "chunk_emit_s": pp * stages[1] + draft,
                                      "chunk_share": stages[2]}),
    )


def _draft_time(setup: Setup, tp, ep, pp, dp, batch, context, plain: StepTimes | None = None):
    """Drafting of speculative decoding per step: ``spec_tokens`` sequential passes of the draft layers
    (the model's multi-token-prediction layers, or one layer) at one token per sequence, each ending
    in the LM head. A pass of one layer costs a layer's share of a plain decode step (``plain``, computed
    where not given)."""
    from dataclasses import replace

    if plain is None:
        plain = decode_step(replace(setup, spec_tokens=0.0), tp, ep, pp, dp, batch, context)
    layers = float(setup.model.architecture.layers)
    per_layer = (plain.step_s - plain.overhead_s) / layers
    head = setup.wb.lm_head if setup.wb.lm_head else setup.wb.embed
    head_s = head / np.asarray(tp, dtype=float) / (setup.hbm_bw * setup.eff.memory)
    spec = setup.model.speculative
    draft_layers = float(spec.draft_layers if spec else max(setup.model.architecture.mtp_layers, 1))
    moe_fixed = setup.stats.moe_layers and setup.term_kernels("moe") is None
    layer_fixed = setup.eff.layer_overhead_us + (setup.eff.moe_layer_overhead_us if moe_fixed else 0.0)
    per_draft = draft_layers * (per_layer + layer_fixed * US) + head_s + setup.eff.draft_overhead_us * US
    return np.asarray(setup.spec_tokens, dtype=float) * per_draft


def prefill_pass(setup: Setup, tp, ep, pp, dp, new_tokens, requests=1.0, prefix=0.0):
    """(latency, bound, parts) of one prefill forward pass; ``parts`` are :func:`prefill_parts`'
    (compute, memory, communication, fixed overhead).

    Without overlap the expert exchange follows the compute: ``max(compute, memory) + comm + overhead``.
    With two micro-batch overlap (``setup.tbo``; expert-parallel layouts with attention data parallelism)
    one micro-batch's dispatch and combine run under the other's compute. A prefill pass is long, so both
    halves are about half of each part and the pass takes ``max(compute, memory, comm)`` plus twice the
    fixed overheads (two micro-batches launch their kernels). The bound is the largest of compute, memory
    and communication."""
    parts = prefill_parts(setup, tp, ep, pp, dp, new_tokens, requests, prefix)
    comp, mem, comm, overhead = parts
    work = np.maximum(comp, mem)
    tbo = _prefill_tbo(setup, ep, dp)
    t = np.where(tbo, np.maximum(work, comm) + 2.0 * overhead, work + comm + overhead)
    bound = np.where(comm > work, "communication", np.where(comp >= mem, "compute", "memory"))
    return t, bound, parts


def prefill_time(setup: Setup, tp, ep, pp, dp, new_tokens, requests=1.0, prefix=0.0):
    """Latency of one prefill forward pass (see :func:`prefill_pass`)."""
    return prefill_pass(setup, tp, ep, pp, dp, new_tokens, requests, prefix)[0]


def _prefill_tbo(setup: Setup, ep, dp) -> np.ndarray:
    """Where two micro-batch overlap applies to a prefill pass: asked for, with EP and attention DP."""
    return (np.asarray(setup.tbo, dtype=float) > 0) & (np.asarray(ep, dtype=float) > 1) & (np.asarray(dp, dtype=float) > 1)


def prefill_parts(setup: Setup, tp, ep, pp, dp, new_tokens, requests=1.0, prefix=0.0):
    """Compute, memory, communication and fixed-overhead seconds of one prefill forward pass over
    ``requests`` prompts of ``new_tokens`` each (latency = max(compute, memory) + comm + overhead).

    Compute-bound in practice: ``2 * P_active * tokens`` plus causal attention over
    ``F * prefill_compute`` (on hardware whose kernel block times ``prefill_attention``: the system's
    context-attention curve, :func:`planner.perf.compose.prefill_attention_time`). With attention data parallelism the prompts spread over ``min(requests,
    dp)`` ranks; non-expert work of a rank runs on its ``tp`` chips only. A pass crosses the ``pp``
    stages one after another, so pipelining does not shorten a single prefill.
    """
    m_ = setup.model
    s = setup.stats
    e = setup.eff
    tp, ep, pp, dp = (np.asarray(x, dtype=float) for x in (tp, ep, pp, dp))
    n = np.asarray(new_tokens, dtype=float)
    r = np.maximum(np.asarray(requests, dtype=float), 1.0)
    stage = tp * dp
    dp_used = np.minimum(r, dp)
    tokens = r * n
    tok_rank = tokens / dp_used
    ne_flops = 2.0 * setup.nonexpert_matmul_params * tok_rank / tp
    imb = expert_load_imbalance(setup, ep, tokens) if s.experts else 1.0
    ex_flops = 2.0 * setup.expert_active_params * tokens / stage * imb
    att_flops = P.prefill_attention_flops(m_, n, prefix) * (r / dp_used) / tp
    hw = setup.hw
    eff_ne = gemm_efficiency(e, factor_dtype(hw, setup.dense_dtype), tok_rank, prefill=True)
    per_expert = tokens * s.top_k / s.experts if s.experts else tokens
    eff_ex = gemm_efficiency(e, factor_dtype(hw, setup.expert_dtype), per_expert, prefill=True)
    att_t = att_flops / (setup.f_attn * e.prefill_compute)
    pk = setup.term_kernels("prefill_attention") or setup.kernels
    if pk is not None:
        # The softmax attention from this system's context-attention curve (a partial composition's
        # ``prefill_attention`` term, or a composed step); linear-attention layers stay on the roofline.
        soft = C.prefill_attention_time(pk, setup.engine, m_, hw, setup.kv_dtype, r / dp_used, n, prefix, tp,
                                        e.kernel_fixed_share)
        if soft is not None:
            lin = P.linear_prefill_flops(m_, n) * (r / dp_used) / tp
            att_t = soft + lin / (setup.f_attn * e.prefill_compute)
    comp = ne_flops / (setup.f_dense * eff_ne) + ex_flops / (setup.f_expert * eff_ex) + att_t
    kf = setup.kernels
    if kf is not None:
        # GEMMs and fused MoE of the pass from this system's kernel curves.
        fx = e.kernel_fixed_share
        ne = C.dense_gemm_time(kf, setup.engine, m_, hw, setup.dense_dtype, tok_rank, tp, float(m_.architecture.layers),
                               float(s.moe_layers), 0.0, fx)
        ex = (C.moe_gemm_time(kf, setup.engine, m_, hw, setup.expert_dtype, tokens, ep, stage, float(s.moe_layers),
                              imb, setup.expert_copies, fx, dp_used) if s.experts else 0.0)
        if ne is not None and ex is not None:
            comp = ne + ex + att_t
    if s.experts:
        touched = np.minimum(P.expected_experts_touched(s.experts, s.top_k, tokens) / s.experts * imb, 1.0)
    else:
        touched = np.zeros_like(tokens)
    w_bytes = setup.streamed_nonexpert_bytes / tp + setup.wb.expert * setup.expert_copies * touched / stage
    kv_write = P.kv_bytes_per_sequence(m_, n, setup.kv_dtype) * (r / dp_used) / kv_shard(m_, tp)
    mem = (w_bytes + kv_write) / (setup.hbm_bw * e.memory)
    alpha = e.collective_latency_us * US
    h = float(s.hidden)
    msg = tok_rank * h * ACT_BYTES
    layers = float(m_.architecture.layers)
    moe_layers = float(s.moe_layers)
    ar_per_layer = 1.0 if m_.architecture.parallel_blocks else 2.0
    attn_dp = dp > 1
    bw = e.prefill_comm_bandwidth
    comm = all_reduce_time(setup, tp, msg, ar_per_layer * (layers - moe_layers), alpha, bw)
    if s.moe_layers:
        comm = comm + all_reduce_time(setup, tp, msg, np.where(attn_dp, 1.0, ar_per_layer) * moe_layers, alpha, bw)
        comm = comm + moe_exchange_time(setup, ep, dp, stage, tokens, moe_layers, alpha, bw)
    send = np.where(
        pp > 1, (pp - 1.0) * (msg / _group_bw(setup, stage * pp, bw) + _alpha(setup, stage * pp, alpha)), 0.0
    )
    overhead = e.layer_overhead_us * US * layers + e.moe_layer_overhead_us * US * moe_layers + e.step_overhead_us * US
    return comp, mem, comm + send, overhead


def latency_floor(setup: Setup, tp, ep, pp, dp):
    """Resident weight bytes per chip / HBM bandwidth (ideal): no batch size or budget beats it."""
    return weight_bytes_per_chip(setup.wb, tp, ep, pp, dp) / setup.hbm_bw
