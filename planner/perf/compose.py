"""A step composed from kernel curves: per layer, the model's own GEMMs, its fused MoE, its attention or MLA
and its collectives, each timed by the curve fitted on that system's measured kernels
(:mod:`planner.perf.kernels`, parameters in the hardware's ``efficiency.kernels``).

Used by :mod:`planner.perf.roofline` where the hardware has kernel curves and the step is calibrated (the
``--ideal`` roofline keeps the datasheet); hardware without kernel rows keeps the datasheet path with its
end-to-end factors. Everything is NumPy over the candidate rows: a handful of array operations per GEMM
shape of the model (a few per layer kind), never a loop over rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from planner.catalog.schemas import KernelFits, ModelSpec
from planner.perf import kernels as K
from planner.perf import params as P
from planner.units import dtype_bytes

if TYPE_CHECKING:
    from planner.perf.setup import Setup

GEMM_FORMAT = {"bf16": ("bf16",), "fp16": ("bf16",), "fp8": ("fp8_block", "fp8"), "int8": ("fp8", "fp8_block"),
               "fp4": ("fp4",), "int4": ("fp8_block", "bf16")}
"""Kernel curve used for a dense GEMM in each weight format, in order of preference (FP8 checkpoints of the
models served here use 128x128 block scales; INT4 dense layers are dequantised)."""
MOE_FORMAT = {"bf16": ("bf16",), "fp16": ("bf16",), "fp8": ("fp8_block", "fp8"), "int8": ("fp8", "fp8_block"),
              "fp4": ("fp4", "mxfp4_w4a16"), "int4": ("int4_w4a16", "mxfp4_w4a16")}
MATHS = {"bf16": "bf16", "fp8_block": "fp8", "fp8": "fp8", "fp4": "fp4", "mxfp4_w4a16": "bf16", "int4_w4a16": "bf16",
         "mxfp4_w4a8": "fp8", "int4_w4a8": "fp8"}
"""Maths format of each curve's tensor-core operations (its peak FLOP/s)."""


def formats(table: dict[str, tuple[str, ...]], m: ModelSpec, dtype: str) -> tuple[str, ...]:
    """Curve formats for ``dtype`` weights of model ``m`` in order of preference: ``table``'s, with an FP8 model whose
    checkpoint scales whole tensors (``ModelSpec.fp8_scales``) timed by the per-tensor curve first."""
    fmts = table.get(dtype, ("bf16",))
    if dtype == "fp8" and m.fp8_scales == "tensor":
        fmts = ("fp8", *(f for f in fmts if f != "fp8"))
    return fmts


@dataclass(frozen=True)
class Gemm:
    """One dense GEMM of a layer: ``n`` x ``k`` weights, ``split`` by tensor parallelism along ``n`` (column
    parallel), ``k`` (row parallel) or not at all (replicated), ``count`` of them per layer."""

    n: float
    k: float
    split: str
    count: float = 1.0
    kv: bool = False
    """Key/value projection columns: split at most ``kv_heads`` ways (replicated beyond)."""


@dataclass(frozen=True)
class Shapes:
    attention: tuple[Gemm, ...]
    """Per softmax-attention layer (full or sliding)."""
    linear: tuple[Gemm, ...]
    """Per linear-attention layer."""
    dense_ffn: tuple[Gemm, ...]
    """Per dense layer's FFN."""
    moe_dense: tuple[Gemm, ...]
    """Per MoE layer, outside the routed experts (shared experts, router)."""
    head: tuple[Gemm, ...]
    """Once per step (LM head)."""


@P.per_entry
def _shapes(m: ModelSpec) -> Shapes:
    """The model's GEMM shapes (memoised per entry object)."""
    a = m.architecture
    at = a.attention
    h = float(a.hidden_size)
    s = P.model_stats(m)
    if at.type == "mla":
        dqk = float(at.head_dim)
        dv = float(at.v_head_dim or at.head_dim)
        kvl = float(at.kv_lora_rank or 0)
        rope = float(at.qk_rope_head_dim or 0)
        heads = float(at.heads)
        attn = [Gemm(kvl + rope, h, "none")]
        if at.q_lora_rank:
            attn += [Gemm(float(at.q_lora_rank), h, "none"), Gemm(heads * dqk, float(at.q_lora_rank), "n")]
        else:
            attn += [Gemm(heads * dqk, h, "n")]
        # Absorbed decode: q_nope into the latent and the latent out to values, batched over the heads.
        attn += [Gemm(heads * kvl, dqk - rope, "n"), Gemm(heads * dv, kvl, "n"), Gemm(h, heads * dv, "k")]
    else:
        d = float(at.head_dim)
        dv = float(at.v_head_dim or at.head_dim)
        attn = [Gemm(at.heads * d, h, "n"), Gemm(2.0 * at.kv_heads * d, h, "n", kv=True), Gemm(h, at.heads * dv, "k")]
        if at.output_gate:
            attn.append(Gemm(at.heads * dv, h, "n"))
    linear = (Gemm(max(s.linear_attn_params_per_layer / h, 1.0), h, "n"),) if at.linear_layers else ()
    mats = 2.0 if a.ffn_gated else 1.0
    ffn = ()
    if a.dense_layers:
        inter = float(a.dense_intermediate)
        ffn = (Gemm(mats * inter, h, "n"), Gemm(h, inter, "k"))
    moe_dense: tuple[Gemm, ...] = ()
    if s.moe_layers:
        moe_dense = (Gemm(float(s.experts), h, "none"),)
        if s.shared_params:
            inter_s = s.shared_params / ((mats + 1.0) * h)
            moe_dense += (Gemm(mats * inter_s, h, "n"), Gemm(h, inter_s, "k"))
    head = (Gemm(float(a.vocab_size), h, "n"),)
    return Shapes(tuple(attn), linear, ffn, moe_dense, head)


def _per_rank(g: Gemm, tp, kv_heads: float):
    """(n, k) one tensor-parallel rank multiplies."""
    if g.split == "n":
        if g.kv:
            return g.n / np.minimum(tp, kv_heads), g.k
        return g.n / tp, g.k
    if g.split == "k":
        return g.n, g.k / tp
    return g.n + 0.0 * tp, g.k


def on_unique(fn, outputs: int, *arrays):
    """``fn(*arrays)``, which returns ``outputs`` arrays stacked on a leading axis, evaluated once per distinct
    combination of the (broadcast) inputs and spread back: a candidate table repeats the same few (tokens,
    parallelism) combinations over thousands of rows."""
    arrs = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in arrays))
    shape = arrs[0].shape
    flat = np.stack([a.reshape(-1) for a in arrs])
    if flat.shape[1] > 64:
        # One 64-bit key per row from the inputs' bit patterns (a multiplicative hash), its distinct values by a
        # sort; the representatives are checked to reproduce every row exactly, so a hash collision only costs
        # the shortcut, never a wrong value.
        bits = np.ascontiguousarray(flat).view(np.uint64)
        key = np.zeros(flat.shape[1], dtype=np.uint64)
        with np.errstate(over="ignore"):
            for row in bits:
                key = (key ^ row) * np.uint64(0x100000001B3)
        _, first, inv = np.unique(key, return_index=True, return_inverse=True)
        uniq = flat[:, first]
        if uniq.shape[1] * 2 <= flat.shape[1] and np.array_equal(uniq[:, inv.reshape(-1)], flat):
            out = np.broadcast_to(np.asarray(fn(*uniq), dtype=float), (outputs, uniq.shape[1]))
            return out[:, inv.reshape(-1)].reshape((outputs, *shape))
    return np.broadcast_to(np.asarray(fn(*flat), dtype=float), (outputs, flat.shape[1])).reshape((outputs, *shape))


def pick_exact(kf: KernelFits, family: str, engine: str, fmts: tuple[str, ...]):
    """(params, format) of this engine's own curve in the first format of ``fmts`` that it has."""
    for f in fmts:
        c = kf.curves.get(f"{family}/{engine}/{f}")
        if c is not None:
            return c.params, f
    return None, None


def pick(kf: KernelFits, family: str, engine: str | None, fmts: tuple[str, ...]):
    """(params, format) of the first format in ``fmts`` with a curve (this engine's, else another's)."""
    for f in fmts:
        p = kf.curve(family, engine, f)
        if p is not None:
            return p, f
    return None, None


def dense_gemm_time(kf: KernelFits, engine: str | None, m: ModelSpec, hw, dense_dtype: str, tokens, tp, layers,
                    moe_layers, stage_has_head, fixed=1.0):
    """Seconds of the non-expert GEMMs one chip runs in one stage pass over ``tokens`` rows (tokens per attention
    rank): per softmax-attention, linear-attention, dense-FFN and
    MoE layer of the stage (``layers`` in all, ``moe_layers`` of them MoE) and the LM head where the stage
    holds it (``stage_has_head``: 1 on one stage of ``pp``, as a fraction ``1 / pp`` on average)."""
    sh = _shapes(m)
    a = m.architecture
    at = a.attention
    p, fmt = pick(kf, "gemm", engine, formats(GEMM_FORMAT, m, dense_dtype))
    pb, _ = pick(kf, "gemm", engine, ("bf16",))
    if p is None or pb is None or f"gemm/{engine}/{fmt}" in kf.overruled:
        # no curve, or one this engine's measured steps contradict (``KernelFits.overruled``): the roofline
        return None
    wb = dtype_bytes(dense_dtype)
    F = hw.flops(MATHS[fmt])
    Fb = hw.flops("bf16")
    W = hw.hbm_bw
    share_att = (at.full_layers + at.sliding_layers) / a.layers
    share_lin = at.linear_layers / a.layers
    kvh = float(at.kv_heads)

    def run(tokens, tp, layers, moe_layers, stage_has_head, fixed):
        dense_layers = layers - moe_layers
        total = 0.0
        for gemms, count, prm, f, b in (
            (sh.attention, layers * share_att, p, F, wb),
            (sh.linear, layers * share_lin, p, F, wb),
            (sh.dense_ffn, dense_layers, p, F, wb),
            (sh.moe_dense, moe_layers, p, F, wb),
            (sh.head, stage_has_head, pb, Fb, 2.0),
        ):
            for g in gemms:
                n, k = _per_rank(g, tp, kvh)
                total = total + count * g.count * K.gemm_time(prm, tokens, n, k, f, W, b, fixed)
        return total

    return on_unique(run, 1, tokens, tp, layers, moe_layers, stage_has_head, fixed)[0]


def moe_gemm_time(kf: KernelFits, engine: str | None, m: ModelSpec, hw, expert_dtype: str, tokens, ep, stage,
                  moe_layers, imbalance, copies, fixed=1.0, dp=1.0):
    """Seconds of the fused MoE layers of one stage pass on one chip: ``tokens`` tokens of the stage routed over
    the experts, ``E * copies / ep`` experts held per chip with ``inter / (stage / ep)`` columns each. With
    attention data parallelism (``dp`` ranks) a chip routes its own rank's ``tokens / dp`` tokens only (the
    dispatch brings it the copies for its experts); with tensor-parallel attention every chip routes them all."""
    s = P.model_stats(m)
    fmts = formats(MOE_FORMAT, m, expert_dtype)
    p, fmt = pick(kf, "moe", engine, fmts)
    if p is None or f"moe/{engine}/{fmt}" in kf.overruled:
        # no curve, or one this engine's measured steps contradict (``KernelFits.overruled``): the roofline
        return None
    # Attention data parallelism with expert parallelism runs the dispatch-fed grouped GEMMs (DeepEP + DeepGEMM),
    # measured as their own curve (``ENGINE-deepep``) where the system has it; elsewhere the fused MoE's.
    pd_, fd_ = pick_exact(kf, "moe", f"{engine}-deepep", fmts) if engine else (None, None)
    if pd_ is None:
        pd_, fd_ = pick_exact(kf, "moe", "sglang-deepep", fmts)
    a = m.architecture
    mats = 3.0 if a.ffn_gated else 2.0
    inter = s.expert_params / (mats * a.hidden_size)
    F, W, wb = hw.flops(MATHS[fmt]), hw.hbm_bw, dtype_bytes(expert_dtype)

    Fd = hw.flops(MATHS[fd_]) if fd_ else F

    def run(tokens, ep, stage, moe_layers, imbalance, copies, fixed, dp):
        moe_tp = np.maximum(stage / ep, 1.0)
        local = s.experts * copies / ep
        args = (tokens, float(a.hidden_size), inter / moe_tp, float(s.top_k), float(s.experts), local)
        kw = dict(gated=a.ffn_gated, imbalance=imbalance, fixed=fixed, routed_tokens=tokens / np.maximum(dp, 1.0))
        t = K.moe_time(p, *args, F, W, wb, **kw)
        if pd_ is not None:
            t = np.where((dp > 1) & (ep > 1), K.moe_time(pd_, *args, Fd, W, wb, **kw), t)
        return moe_layers * t

    return on_unique(run, 1, tokens, ep, stage, moe_layers, imbalance, copies, fixed, dp)[0]


def attention_time(kf: KernelFits, engine: str | None, m: ModelSpec, hw, kv_dtype: str, seqs, kv_bytes, flops,
                   tp, layers, fixed=1.0):
    """Seconds of the decode attention of one stage pass on one chip: ``seqs`` sequences per rank, ``kv_bytes``
    and ``flops`` of all the stage's layers on this chip (counted by the caller), ``layers`` kernel calls. GQA
    takes the curve of the kernel the engine runs for the query-head group on one GPU
    (:func:`planner.perf.kernels.decode_attention_kernel`), its main kernel's where that path has no curve."""
    at = m.architecture.attention
    fam = "mla_decode" if at.type == "mla" else "attn_decode"
    fmt = "fp8" if kv_dtype in ("fp8", "int8", "fp4", "int4") else "bf16"
    fmts: tuple[str, ...] = (fmt, "bf16", "fp8")
    if fam == "attn_decode":  # a curve per head dimension: the model's, else the nearest measured
        fmts = K.head_dim_formats({k.split("/", 2)[2] for k in kf.curves if k.startswith(fam + "/")}, fmts,
                                  at.head_dim)
    p = pick_exact(kf, fam, engine, fmts)[0] if engine else None
    if p is None:
        p, _ = pick(kf, fam, engine, fmts)
    if p is None:
        return None
    calls = np.maximum(np.asarray(layers, dtype=float), 1e-9)
    kv_rank = np.maximum(at.kv_heads / np.asarray(tp, dtype=float), 1.0)
    units = seqs if at.type == "mla" else seqs * kv_rank
    # One kernel call per layer: fixed and per-unit costs per call, the streaming over all of them.
    args = (seqs, np.asarray(kv_bytes) / calls, np.asarray(flops) / calls, hw.flops("bf16"), hw.hbm_bw, units, fixed)
    per_call = K.attn_decode_time(p, *args)
    if at.type != "mla" and engine:
        path = K.decode_attention_kernel(engine, at.heads / np.asarray(tp, dtype=float) / kv_rank)
        for kernel in set(np.atleast_1d(path)) - {""}:
            alt, _ = pick_exact(kf, fam, engine + kernel, fmts)
            if alt is not None:
                per_call = np.where(path == kernel, K.attn_decode_time(alt, *args), per_call)
    return calls * per_call


def prefill_attention_time(kf: KernelFits, engine: str | None, m: ModelSpec, hw, kv_dtype: str, prompts,
                           new_tokens, prefix, tp, fixed=1.0):
    """Seconds of the softmax attention of one prefill pass on one chip, all layers: ``prompts`` prompts of
    ``new_tokens`` each after ``prefix`` cached tokens on this chip's attention rank, its ``heads / tp`` query heads,
    full layers over the whole context and sliding layers over their window, each layer one call of the system's
    context-MLA or context-GQA curve (the engine's own, else another engine's) at the KV cache's format. None where
    no curve applies or the model's attention is not plain softmax over its context (sparse MLA's top-k selection:
    the caller keeps its FLOPs on the roofline)."""
    at = m.architecture.attention
    if at.sparse_topk_tokens:
        return None
    mla = at.type == "mla"
    fam = "mla_context" if mla else "attn_context"
    fmt = "fp8" if kv_dtype in ("fp8", "int8", "fp4", "int4") else "bf16"
    fmts: tuple[str, ...] = (fmt, "bf16", "fp8")
    if not mla:
        fmts = K.head_dim_formats({k.split("/", 2)[2] for k in kf.curves if k.startswith(fam + "/")}, fmts,
                                  at.head_dim)
    p, _ = pick(kf, fam, engine, fmts)
    if p is None:
        return None
    qk = float(at.head_dim)
    v = float(at.v_head_dim or at.head_dim)
    F, W = hw.flops("bf16"), hw.hbm_bw

    def run(prompts, new_tokens, prefix, tp, fixed):
        heads = np.maximum(at.heads / tp, 1.0)
        kvh = heads if mla else np.maximum(at.kv_heads / tp, 1.0)
        total = 0.0
        for layers, window in ((at.full_layers, 0.0), (at.sliding_layers, float(at.sliding_window_tokens or 0))):
            if layers:
                shape = K.context_attention_shape(prompts, new_tokens, prefix, heads, kvh, qk, v, window, mla)
                total = total + layers * K.attn_context_time(p, *shape, F, W, fixed)
        return total

    return on_unique(run, 1, prompts, new_tokens, prefix, tp, fixed)[0]


def all_reduce(kf: KernelFits, engine: str | None, hw, gpus, msg_bytes, count, fixed=1.0):
    """``count`` all-reduces of ``msg_bytes`` over ``gpus`` GPUs: the engine's own all-reduce where fitted, else
    NCCL's; None where the group exceeds what the curves were measured on (one node, 8 GPUs)."""
    p = kf.curve("collective", engine, "all_reduce") if engine else None
    if p is None:
        p = kf.curve("collective", "nccl", "all_reduce")
    if p is None:
        return None
    return count * K.collective_time(p, "all_reduce", gpus, msg_bytes, hw.scale_up_bw, fixed)


def deepep_curve(kf: KernelFits) -> dict[str, float] | None:
    """The DeepEP low-latency dispatch/combine curve (measured under SGLang, FP8 dispatch), None where not fitted."""
    return kf.curve("deepep", "sglang", "fp8")


def deepep(kf: KernelFits, hw, tokens_per_rank, hidden, top_k, gpus, layers, dispatch_bytes, fixed=1.0, *,
           experts):
    p = deepep_curve(kf)
    if p is None:
        return None
    return layers * K.deepep_time(p, tokens_per_rank, hidden, top_k, gpus, hw.scale_up_bw, dispatch_bytes, fixed,
                                  experts=experts)


TRTLLM_FP4_DISPATCH = 0.5 + 1.0 / 16.0
"""Bytes per hidden element of TensorRT-LLM's expert dispatch with NVFP4 experts (quantised before it, one scale per
16); other formats move bf16 activations (DeepSeek's FP8 block scales quantise inside the MoE kernel)."""


def trtllm_exchange(kf: KernelFits, hw, tokens_per_rank, hidden, top_k, experts, gpus, ep, layers, expert_dtype: str,
                    fixed=1.0):
    """Expert dispatch and combine of ``layers`` MoE layers as TensorRT-LLM runs them with attention data parallelism
    (``select_alltoall_method_type``, NVIDIA/TensorRT-LLM ``fused_moe_wide_ep.py``): its NVLink all-to-all where the
    expert parallelism exceeds ``top_k`` on a multi-node NVLink domain (GB200, GB300: the scale-up domain is larger
    than one host), timed by the system's ``alltoall`` curve with the token's real fan-out over ranks
    (:func:`planner.perf.kernels.rank_fanout`); otherwise an all-gather of every rank's tokens before the experts
    and a reduce-scatter of their outputs after (NCCL's fitted curves inside the measured node, their parameters on
    the datasheet link beyond it). Returns (all-gather path, all-to-all path or None where the system has no
    ``alltoall`` curve, where TensorRT-LLM takes the all-to-all), or None without NCCL's curves."""
    g = np.maximum(np.asarray(gpus, dtype=float), 1.0)
    n = np.asarray(tokens_per_rank, dtype=float)
    per_el = TRTLLM_FP4_DISPATCH if expert_dtype == "fp4" else 2.0
    host = float(hw.purchase_unit.host_chips)
    domain = float(hw.scale_up_domain_chips)
    a2a_p = kf.curve("alltoall", "trtllm", "nvlink")
    ag_p, rs_p = kf.curve("collective", "nccl", "all_gather"), kf.curve("collective", "nccl", "reduce_scatter")
    if ag_p is None or rs_p is None:
        return None
    inside = g <= min(MAX_MEASURED_GPUS, domain)
    link = np.where(g <= domain, hw.scale_up_bw, hw.scale_out_bw)

    def coll(p, op, buf):
        fit = K.collective_time(p, op, g, buf, hw.scale_up_bw, fixed)
        phys = K.collective_time(K.PRIOR["collective"], op, g, buf, link, fixed)
        return np.where(inside, fit, phys)

    gather = coll(ag_p, "all_gather", g * n * hidden * per_el) + coll(rs_p, "reduce_scatter", g * n * hidden * 2.0)
    use = (np.asarray(ep, dtype=float) > top_k) & (g <= domain) & (domain > host)
    if a2a_p is None:
        return layers * gather, None, use
    d = K.rank_fanout(experts, top_k, g)
    a2a = (K.alltoall_time(a2a_p, n, hidden * per_el, d, g, host, fixed)
           + K.alltoall_time(a2a_p, n, hidden * 2.0, d, g, host, fixed))
    return layers * gather, layers * a2a, use


MAX_MEASURED_GPUS = 8
"""Largest group the kernel collectives were measured on (one node); larger groups keep datasheet physics."""


def partial_gemm_terms(setup: Setup, tokens, tok_rank, tp, ep, pp, dp, imb, layers, moe_layers, ne_c, gemm_c, gemm_m,
                       expert_t):
    """(GEMM compute, GEMM memory, routed experts' time, whether the MoE curve timed them) of a decode stage pass under
    a partial composition (``KernelFits.terms``), from the roofline's (``ne_c``: its non-expert GEMM compute).
    ``moe``: the fused MoE layers from the system's curve at the stage's ``tokens``, in place of the expert GEMMs'
    roofline and the fitted per-MoE-layer overhead (the curve's fixed latency stands for it), the non-expert GEMMs
    at ``max(compute, memory)`` of the roofline. ``gemm``: those non-expert GEMMs (attention projections, dense and
    shared FFNs, LM head) from the GEMM curve at the model's shapes and the busiest rank's ``tok_rank`` rows instead,
    their weights streamed inside it (added to the routed experts' roofline compute where no MoE curve times them)."""
    e, m, s = setup.eff, setup.model, setup.stats
    moe_timed = False
    mk = setup.term_kernels("moe") if s.experts else None
    if mk is not None:
        ex = moe_gemm_time(mk, setup.engine, m, setup.hw, setup.expert_dtype, tokens, ep, tp * dp, moe_layers, imb,
                           setup.expert_copies, e.kernel_fixed_share, dp)
        if ex is not None:
            ne_m = setup.streamed_nonexpert_bytes / (tp * pp) / (setup.hbm_bw * e.memory)
            gemm_c = np.maximum(ne_c, ne_m) + ex
            gemm_m = np.minimum(gemm_m, gemm_c)
            expert_t, moe_timed = ex, True
    gk = setup.term_kernels("gemm")
    ne = None if gk is None else dense_gemm_time(gk, setup.engine, m, setup.hw, setup.dense_dtype, tok_rank, tp, layers,
                                                 moe_layers, 1.0 / pp, e.kernel_fixed_share)
    if ne is not None:
        if s.experts and not moe_timed:
            gemm_c = ne + (gemm_c - ne_c)
        else:
            gemm_c = ne + (expert_t if moe_timed else 0.0)
            gemm_m = np.minimum(gemm_m, gemm_c)
    return gemm_c, gemm_m, expert_t, moe_timed
