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

from dataclasses import dataclass, field

import numpy as np

from planner.catalog.schemas import IDEAL, EngineEfficiency, HardwareSpec, ModelSpec
from planner.perf import params as P
from planner.perf.layout import kv_shard, weight_bytes_per_chip
from planner.units import US

MAX_SPEC_TOKENS = 16
"""Most draft tokens per step accepted as input (speculative decoding)."""

ACT_BYTES = 2.0
"""Activation bytes per element on the wire (bf16)."""


@dataclass(frozen=True)
class Setup:
    """A model on a hardware with number formats and efficiency factors (everything but the layout)."""

    model: ModelSpec
    hw: HardwareSpec
    eff: EngineEfficiency = IDEAL
    dense_dtype: str = "bf16"
    expert_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    moe_imbalance: float = 1.0
    """Max / mean expert load per GPU (from expert placement); multiplies expert compute. May be an
    array aligned with the evaluated rows."""
    expert_copies: float = 1.0
    """Physical / logical experts, ``(E + R) / E`` with ``R`` redundant slots: expert weights held and
    streamed per chip scale by it. May be an array aligned with the evaluated rows."""
    spec_tokens: float = 0.0
    """Draft tokens proposed per sequence and decode step by speculative decoding (0: off). Drafting
    runs the model's multi-token-prediction layers (one layer where the model has none, an EAGLE-style
    head); the step then verifies ``1 + spec_tokens`` tokens per sequence. May be an array aligned with
    the evaluated rows."""
    spec_accept: float = 0.7
    """Probability that each further draft token is accepted, given the ones before it were. The default
    is an assumption for a chain of drafts: DeepSeek-V3's report gives 85-90% for its first MTP draft,
    and later drafts in a chain accept less; pass the measured rate where it is known."""
    stats: P.ModelStats = field(init=False)
    wb: P.WeightBytes = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stats", P.model_stats(self.model))
        object.__setattr__(self, "wb", P.weight_bytes(self.model, self.dense_dtype, self.expert_dtype))

    @classmethod
    def make(
        cls,
        model: ModelSpec,
        hw: HardwareSpec,
        *,
        weights: str | None = None,
        kv: str | None = None,
        eff: EngineEfficiency = IDEAL,
        moe_imbalance: float = 1.0,
        spec_tokens: float = 0.0,
        spec_accept: float = 0.7,
    ) -> Setup:
        dense, expert = P.resolve_dtypes(model, weights)
        return cls(
            model, hw, eff, dense, expert, kv or "bf16", moe_imbalance, spec_tokens=spec_tokens, spec_accept=spec_accept
        )

    # peaks ----------------------------------------------------------------------------------
    @property
    def f_dense(self) -> float:
        return self.hw.flops(self.dense_dtype)

    @property
    def f_expert(self) -> float:
        return self.hw.flops(self.expert_dtype)

    @property
    def f_attn(self) -> float:
        return self.hw.flops("bf16")

    @property
    def hbm_bw(self) -> float:
        return self.hw.hbm_bw

    @property
    def tokens_per_step(self):
        """Output tokens per sequence and decode step: ``1 + a + a^2 + ... + a^k`` for ``k`` draft tokens
        accepted with probability ``a`` each (the first mismatch ends the run; the verifying pass always
        yields one token of its own)."""
        return accepted_tokens(self.spec_tokens, self.spec_accept)

    @property
    def nonexpert_matmul_params(self) -> float:
        s = self.stats
        return s.matmul_active_params - s.moe_layers * s.top_k * s.expert_params

    @property
    def expert_active_params(self) -> float:
        s = self.stats
        return s.moe_layers * s.top_k * s.expert_params

    @property
    def streamed_nonexpert_bytes(self) -> float:
        """Non-expert weight bytes a step streams (all but the input embedding, gathered by row)."""
        wb = self.wb
        tied = self.stats.lm_head_params == 0
        return wb.nonexpert + (wb.embed if tied else wb.lm_head)


@dataclass
class StepTimes:
    """Per-replica decode step breakdown (arrays; seconds unless stated)."""

    step_s: np.ndarray
    """Time per output token (all stages; with speculative decoding the step, drafting included, over
    the tokens it yields)."""
    compute_s: np.ndarray
    memory_s: np.ndarray
    comm_s: np.ndarray
    overhead_s: np.ndarray
    gemm_compute_s: np.ndarray
    gemm_memory_s: np.ndarray
    attn_compute_s: np.ndarray
    attn_memory_s: np.ndarray
    weight_read_bytes: np.ndarray
    """Weight bytes one chip reads per token step (all its stages' share)."""
    kv_read_bytes: np.ndarray
    draft_s: np.ndarray | float = 0.0
    """Drafting time per step (speculative decoding; 0 without it)."""
    tokens_per_step: np.ndarray | float = 1.0
    """Output tokens per sequence and step (1 without speculative decoding)."""

    @property
    def bound(self) -> np.ndarray:
        comm = self.comm_s
        return np.where(
            comm > np.maximum(self.compute_s, self.memory_s),
            "communication",
            np.where(self.compute_s >= self.memory_s, "compute", "memory"),
        )


def accepted_tokens(spec_tokens, accept):
    """Expected output tokens per step of speculative decoding with ``spec_tokens`` drafts, each
    accepted with probability ``accept`` given its predecessors: ``sum_{i=0..k} a^i``."""
    k = np.asarray(spec_tokens, dtype=float)
    a = float(accept)
    if a >= 1.0:
        return 1.0 + k
    return (1.0 - a ** (k + 1.0)) / (1.0 - a)


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


def moe_exchange_time(setup: Setup, ep, dp, stage, tokens, count, alpha_s, share=1.0):
    """Token exchange of the MoE layers of one stage pass over ``tokens`` (all attention-DP ranks).

    Only attention data parallelism (``dp > 1``) spreads the tokens over the stage's chips. Then, with
    expert parallelism (``ep > 1``), an all-to-all dispatch and combine, each chip sending its
    ``tokens / stage`` tokens to ``top_k`` experts; with expert tensor parallelism (``ep = 1``) every
    chip needs every token of the stage (all-gather) and returns a slice of every output
    (reduce-scatter), ``tokens x hidden`` each way whatever the top-k. With tensor-parallel attention
    (``dp = 1``) every chip already holds every token, so experts sharded by EP or TP alike run on
    them locally and the output rides an all-reduce (what TensorRT-LLM, SGLang and vLLM do without
    attention DP), charged by the callers; nothing is exchanged here.
    """
    s = setup.stats
    h = float(s.hidden)
    a2a = all_to_all_time(
        setup, stage, tokens / stage * s.top_k * h * (dispatch_bytes(setup) + ACT_BYTES), count, alpha_s, share
    )
    etp = all_to_all_time(setup, stage, tokens * h * ACT_BYTES, count, alpha_s, share)
    return np.where(dp > 1, np.where(ep > 1, a2a, etp), 0.0)


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
) -> StepTimes:
    """Decode step of ``batch`` sequences in flight at mean ``context`` tokens (see module docstring).

    ``prefill_tokens_per_step`` adds prompt tokens processed in the same steps (aggregated serving
    with chunked prefill); their work is weighted by the efficiency block's ``interference``.
    """
    m_ = setup.model
    s = setup.stats
    e = setup.eff
    tp, ep, pp, dp = (np.asarray(x, dtype=float) for x in (tp, ep, pp, dp))
    B = np.asarray(batch, dtype=float)
    S = np.asarray(context, dtype=float)
    X = np.asarray(prefill_tokens_per_step, dtype=float) * e.interference
    I = np.asarray(prefill_context, dtype=float)
    stage = tp * dp
    k = np.asarray(setup.spec_tokens, dtype=float)
    mb = B / pp  # sequences per micro-batch
    mq = mb * (1.0 + k)  # decode tokens per micro-batch (each sequence verifies its drafts too)
    xb = X / pp  # prefill tokens per micro-batch
    tok_rank = (mq + xb) / dp  # tokens one attention-DP rank carries through a stage

    # GEMMs -----------------------------------------------------------------------------------
    ne_flops = 2.0 * setup.nonexpert_matmul_params * tok_rank / tp / pp
    ex_flops = 2.0 * setup.expert_active_params * (mq + xb) / stage / pp * setup.moe_imbalance
    gemm_c = ne_flops / (setup.f_dense * e.compute) + ex_flops / (setup.f_expert * e.compute)
    if s.experts:
        touched = P.expected_experts_touched(s.experts, s.top_k, mq + xb) / s.experts
    else:
        touched = np.zeros_like(mq)
    w_bytes = setup.streamed_nonexpert_bytes / (tp * pp) + setup.wb.expert * setup.expert_copies * touched / (stage * pp)
    gemm_m = w_bytes / (setup.hbm_bw * e.memory)

    # Attention -------------------------------------------------------------------------------
    att_flops = P.attention_flops_per_token(m_, S) * (mq / dp) / tp / pp
    if np.any(X > 0):
        pre_att = np.where(I > 0, P.prefill_attention_flops(m_, np.maximum(I, 1.0)) / np.maximum(I, 1.0), 0.0)
        att_flops = att_flops + pre_att * (xb / dp) / tp / pp
    kv_bytes = P.kv_read_bytes_per_sequence(m_, S, setup.kv_dtype) * (mb / dp) / kv_shard(m_, tp) / pp
    attn_c = att_flops / (setup.f_attn * e.compute)
    attn_m = kv_bytes / (setup.hbm_bw * e.memory)

    # Communication ---------------------------------------------------------------------------
    alpha = e.collective_latency_us * US
    h = float(s.hidden)
    layers_stage = m_.architecture.layers / pp
    moe_layers_stage = s.moe_layers / pp
    dense_layers_stage = layers_stage - moe_layers_stage
    ar_per_layer = 1.0 if m_.architecture.parallel_blocks else 2.0
    msg = tok_rank * h * ACT_BYTES
    attn_dp = dp > 1
    # Dense layers: all-reduces inside the tp group. MoE layers: with attention DP, the attention
    # all-reduce and an exchange across the stage; with TP attention, two all-reduces as a dense layer.
    comm = all_reduce_time(setup, tp, msg, ar_per_layer * dense_layers_stage, alpha)
    if s.moe_layers:
        comm = comm + all_reduce_time(setup, tp, msg, np.where(attn_dp, 1.0, ar_per_layer) * moe_layers_stage, alpha)
        comm = comm + moe_exchange_time(setup, ep, dp, stage, mq + xb, 2.0 * moe_layers_stage, alpha)
    if np.any(pp > 1):
        send = msg / _group_bw(setup, tp * dp * pp) + _alpha(setup, tp * dp * pp, alpha)
        comm = comm + np.where(pp > 1, send * (pp - 1.0) / pp, 0.0)

    overhead = (
        e.layer_overhead_us * US * layers_stage
        + e.moe_layer_overhead_us * US * moe_layers_stage
        + e.step_overhead_us * US / pp
        + e.seq_overhead_us * US * mb / dp
    )
    hidden = e.comm_overlap * np.minimum(comm, gemm_c + attn_c)
    stage_t = np.maximum(gemm_c, gemm_m) + np.maximum(attn_c, attn_m) + comm - hidden + overhead
    step = pp * stage_t
    draft = _draft_time(setup, tp, ep, pp, dp, B, S) if np.any(k > 0) else 0.0
    per_step = setup.tokens_per_step
    return StepTimes(
        step_s=(step + draft) / per_step,
        compute_s=pp * (gemm_c + attn_c),
        memory_s=pp * (gemm_m + attn_m),
        comm_s=pp * comm,
        overhead_s=pp * overhead,
        gemm_compute_s=pp * gemm_c,
        gemm_memory_s=pp * gemm_m,
        attn_compute_s=pp * attn_c,
        attn_memory_s=pp * attn_m,
        weight_read_bytes=pp * w_bytes,
        kv_read_bytes=pp * kv_bytes,
        draft_s=np.broadcast_to(np.asarray(draft, dtype=float), np.shape(step)).copy(),
        tokens_per_step=np.broadcast_to(np.asarray(per_step, dtype=float), np.shape(step)).copy(),
    )


def _draft_time(setup: Setup, tp, ep, pp, dp, batch, context):
    """Drafting of speculative decoding per step: ``spec_tokens`` sequential passes of the draft layers
    (the model's multi-token-prediction layers, or one layer) at one token per sequence, each ending
    in the LM head. A pass of one layer costs a layer's share of a plain decode step."""
    from dataclasses import replace

    plain = decode_step(replace(setup, spec_tokens=0.0), tp, ep, pp, dp, batch, context)
    layers = float(setup.model.architecture.layers)
    per_layer = (plain.step_s - plain.overhead_s) / layers
    head = setup.wb.lm_head if setup.wb.lm_head else setup.wb.embed
    head_s = head / np.asarray(tp, dtype=float) / (setup.hbm_bw * setup.eff.memory)
    draft_layers = float(max(setup.model.architecture.mtp_layers, 1))
    layer_fixed = setup.eff.layer_overhead_us + (setup.eff.moe_layer_overhead_us if setup.stats.moe_layers else 0.0)
    per_draft = draft_layers * (per_layer + layer_fixed * US) + head_s
    return np.asarray(setup.spec_tokens, dtype=float) * per_draft


def prefill_time(setup: Setup, tp, ep, pp, dp, new_tokens, requests=1.0, prefix=0.0):
    """Latency of one prefill forward pass (parts in :func:`prefill_parts`)."""
    comp, mem, comm, overhead = prefill_parts(setup, tp, ep, pp, dp, new_tokens, requests, prefix)
    return np.maximum(comp, mem) + comm + overhead


def prefill_bound(setup: Setup, tp, ep, pp, dp, new_tokens, requests=1.0, prefix=0.0) -> np.ndarray:
    """Which resource bounds a prefill pass: ``compute``, ``memory`` or ``communication``."""
    comp, mem, comm, _ = prefill_parts(setup, tp, ep, pp, dp, new_tokens, requests, prefix)
    return np.where(comm > np.maximum(comp, mem), "communication", np.where(comp >= mem, "compute", "memory"))


def prefill_parts(setup: Setup, tp, ep, pp, dp, new_tokens, requests=1.0, prefix=0.0):
    """Compute, memory, communication and fixed-overhead seconds of one prefill forward pass over
    ``requests`` prompts of ``new_tokens`` each (latency = max(compute, memory) + comm + overhead).

    Compute-bound in practice: ``2 * P_active * tokens`` plus causal attention over
    ``F * prefill_compute``. With attention data parallelism the prompts spread over ``min(requests,
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
    ex_flops = 2.0 * setup.expert_active_params * tokens / stage * setup.moe_imbalance
    att_flops = P.prefill_attention_flops(m_, n, prefix) * (r / dp_used) / tp
    comp = (
        ne_flops / (setup.f_dense * e.prefill_compute)
        + ex_flops / (setup.f_expert * e.prefill_compute)
        + att_flops / (setup.f_attn * e.prefill_compute)
    )
    if s.experts:
        touched = P.expected_experts_touched(s.experts, s.top_k, tokens) / s.experts
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
        comm = comm + moe_exchange_time(setup, ep, dp, stage, tokens, 2.0 * moe_layers, alpha, bw)
    send = np.where(
        pp > 1, (pp - 1.0) * (msg / _group_bw(setup, stage * pp, bw) + _alpha(setup, stage * pp, alpha)), 0.0
    )
    overhead = e.layer_overhead_us * US * layers + e.moe_layer_overhead_us * US * moe_layers + e.step_overhead_us * US
    return comp, mem, comm + send, overhead


def latency_floor(setup: Setup, tp, ep, pp, dp):
    """Resident weight bytes per chip / HBM bandwidth (ideal): no batch size or budget beats it."""
    return weight_bytes_per_chip(setup.wb, tp, ep, pp, dp) / setup.hbm_bw
