"""Parameter counts, weight bytes and KV-cache bytes of a model (counts, bytes; no hardware).

Counting convention (matches the published totals to <1%): per layer, attention projections and
two norms; a dense FFN of ``3 * h * I`` (gated) or ``2 * h * I``; a MoE layer of
``E * 3 * h * I_e`` routed plus the shared experts plus a ``h * E`` router; the input embedding and
an untied LM head count in totals. FLOPs use the matmul parameters a token passes through, which
exclude the input embedding (a row gather, not a matmul).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.catalog.schemas import ModelSpec
from planner.units import dtype_bytes

EMBED_DTYPE = "bf16"
"""Embeddings and LM head stay in bf16 in every quantised checkpoint we know of."""


@dataclass(frozen=True)
class ModelStats:
    """Derived sizes of one model; parameter counts in parameters, not bytes."""

    layers: int
    hidden: int
    attn_params_per_layer: float
    """Attention projections of one softmax-attention layer (full or sliding)."""
    linear_attn_params_per_layer: float
    dense_ffn_params: float
    """FFN of one dense layer."""
    expert_params: float
    """One routed expert."""
    shared_params: float
    """The shared expert(s) of one MoE layer, together."""
    router_params: float
    embed_params: float
    lm_head_params: float
    norm_params_per_layer: float
    total_params: float
    active_params: float
    expert_total_params: float
    """All routed experts of all MoE layers."""
    experts: int
    top_k: int
    moe_layers: int

    @property
    def nonexpert_params(self) -> float:
        return self.total_params - self.expert_total_params

    @property
    def matmul_active_params(self) -> float:
        """Parameters a decoded token multiplies (active, without the input-embedding gather)."""
        tied = self.lm_head_params == 0
        return self.active_params - (0.0 if tied else self.embed_params)

    @property
    def sparsity(self) -> float:
        """Total / active parameters (1 for a dense model)."""
        return self.total_params / self.active_params


def per_entry(fn):
    """Memoise ``fn(entry)`` per catalog entry object (entries are frozen but not hashable: keyed by identity, the
    entry kept alive beside its value so an id is never reused for another)."""
    memo: dict[int, tuple] = {}

    def get(entry):
        hit = memo.get(id(entry))
        if hit is not None and hit[0] is entry:
            return hit[1]
        out = fn(entry)
        memo[id(entry)] = (entry, out)
        return out

    get.__doc__ = fn.__doc__
    return get


def model_stats(m: ModelSpec) -> ModelStats:
    """Derived sizes of ``m`` (memoised per entry object)."""
    return _model_stats_memo(m)


@per_entry
def _model_stats_memo(m: ModelSpec) -> ModelStats:
    return _model_stats(m)


def _model_stats(m: ModelSpec) -> ModelStats:
    a = m.architecture
    att = a.attention
    h = a.hidden_size
    if att.type == "mla":
        nope = att.head_dim - (att.qk_rope_head_dim or 0)
        rope = att.qk_rope_head_dim or 0
        qk = nope + rope
        q = (h * att.q_lora_rank + att.q_lora_rank * att.heads * qk) if att.q_lora_rank else h * att.heads * qk
        kv_a = h * (att.kv_lora_rank + rope)
        kv_b = att.kv_lora_rank * att.heads * (nope + att.v_head_dim)
        o = att.heads * att.v_head_dim * h
        attn = q + kv_a + kv_b + o + (att.q_lora_rank or 0) + att.kv_lora_rank
        if att.sparse_topk_tokens:
            qin = att.q_lora_rank or h
            attn += qin * att.indexer_heads * att.indexer_head_dim + h * att.indexer_head_dim + h * att.indexer_heads
    else:
        q = h * att.heads * att.head_dim * (2 if att.output_gate else 1)
        kv = 2 * h * att.kv_heads * att.head_dim
        o = att.heads * att.head_dim * h
        attn = q + kv + o
    lin = 0.0
    if att.linear_layers:
        nk, nv = att.linear_key_heads, att.linear_value_heads
        dk, dv = att.linear_key_head_dim, att.linear_value_head_dim
        conv_dim = 2 * nk * dk + nv * dv
        lin = h * (2 * nk * dk + 2 * nv * dv) + h * 2 * nv + nv * dv * h + conv_dim * (att.linear_conv_kernel or 4)
    mats = 3 if a.ffn_gated else 2
    dense_ffn = mats * h * a.dense_intermediate
    moe = a.moe
    expert = mats * h * moe.expert_intermediate if moe else 0.0
    shared = mats * h * moe.shared_intermediate if moe else 0.0
    router = h * moe.experts if moe else 0.0
    embed = a.vocab_size * h
    lm_head = 0.0 if a.tie_embeddings else a.vocab_size * h
    norms = 2 * h
    n_soft = att.full_layers + att.sliding_layers
    layer_params = n_soft * attn + att.linear_layers * lin + a.layers * norms
    ffn_params = a.dense_layers * dense_ffn
    expert_total = 0.0
    active_moe = 0.0
    if moe:
        expert_total = moe.layers * moe.experts * expert
        ffn_params += moe.layers * (shared + router)
        active_moe = moe.layers * moe.top_k * expert
    total = embed + lm_head + layer_params + ffn_params + expert_total
    active = embed + lm_head + layer_params + ffn_params + active_moe
    return ModelStats(
        layers=a.layers,
        hidden=h,
        attn_params_per_layer=float(attn),
        linear_attn_params_per_layer=float(lin),
        dense_ffn_params=float(dense_ffn),
        expert_params=float(expert),
        shared_params=float(shared),
        router_params=float(router),
        embed_params=float(embed),
        lm_head_params=float(lm_head),
        norm_params_per_layer=float(norms),
        total_params=float(total),
        active_params=float(active),
        expert_total_params=float(expert_total),
        experts=moe.experts if moe else 0,
        top_k=moe.top_k if moe else 0,
        moe_layers=moe.layers if moe else 0,
    )


@dataclass(frozen=True)
class WeightBytes:
    """Weight bytes of the whole model split the way sharding treats them."""

    nonexpert: float
    """Attention, dense FFN, shared experts, router, norms (sharded by tp, replicated across dp)."""
    embed: float
    """Input embedding (resident, gathered by row, not streamed per step)."""
    lm_head: float
    expert: float
    """All routed experts (sharded over every chip of a stage)."""
    expert_bytes_per_weight: float
    dense_bytes_per_weight: float

    @property
    def total(self) -> float:
        return self.nonexpert + self.embed + self.lm_head + self.expert


def resolve_dtypes(m: ModelSpec, weights: str | None) -> tuple[str, str]:
    """(dense dtype, expert dtype): ``weights`` overrides both; None keeps the native formats."""
    if weights and weights != "native":
        return weights, weights
    return m.weights_dtype, m.expert_weights_dtype or m.weights_dtype


def weight_bytes(m: ModelSpec, dense_dtype: str, expert_dtype: str | None = None) -> WeightBytes:
    s = model_stats(m)
    bd = dtype_bytes(dense_dtype)
    be = dtype_bytes(expert_dtype or dense_dtype)
    # Quantised checkpoints keep embeddings and LM head in bf16; wider models keep their own format.
    be_embed = max(bd, dtype_bytes(EMBED_DTYPE))
    nonexpert_params = s.total_params - s.expert_total_params - s.embed_params - s.lm_head_params
    return WeightBytes(
        nonexpert=nonexpert_params * bd,
        embed=s.embed_params * be_embed,
        lm_head=s.lm_head_params * be_embed,
        expert=s.expert_total_params * be,
        expert_bytes_per_weight=be,
        dense_bytes_per_weight=bd,
    )


# --------------------------------------------------------------------------------------------------
# KV cache
# --------------------------------------------------------------------------------------------------


def kv_bytes_per_token_layer(m: ModelSpec, kv_dtype: str) -> float:
    """KV bytes one token adds to one softmax-attention layer (GQA: K and V; MLA: latent + rope key)."""
    att = m.architecture.attention
    b = dtype_bytes(kv_dtype)
    if att.type == "mla":
        per = (att.kv_lora_rank + att.qk_rope_head_dim) * b
        if att.sparse_topk_tokens:
            per += att.indexer_head_dim * dtype_bytes("fp8")  # indexer keys are kept in fp8
        return float(per)
    return float(2 * att.kv_heads * att.head_dim * b)


def linear_state_bytes(m: ModelSpec) -> float:
    """Recurrent state of one sequence in one linear-attention layer (state + conv window)."""
    att = m.architecture.attention
    if not att.linear_layers:
        return 0.0
    nk, nv = att.linear_key_heads, att.linear_value_heads
    dk, dv = att.linear_key_head_dim, att.linear_value_head_dim
    state = nv * dk * dv * dtype_bytes(att.linear_state_dtype)
    conv = (2 * nk * dk + nv * dv) * ((att.linear_conv_kernel or 4) - 1) * dtype_bytes("bf16")
    return float(state + conv)


def kv_bytes_per_token(m: ModelSpec, kv_dtype: str = "bf16") -> float:
    """KV bytes per token over all softmax-attention layers (short context: sliding layers count)."""
    att = m.architecture.attention
    return kv_bytes_per_token_layer(m, kv_dtype) * (att.full_layers + att.sliding_layers)


def kv_growth_bytes_per_token(m: ModelSpec, kv_dtype: str = "bf16") -> float:
    """KV bytes per extra token at long context (sliding layers have stopped growing)."""
    return kv_bytes_per_token_layer(m, kv_dtype) * m.architecture.attention.full_layers


def kv_bytes_per_sequence(m: ModelSpec, context, kv_dtype: str = "bf16", sliding_share: float | None = None):
    """KV (and recurrent state) bytes one sequence holds at ``context`` tokens (array-friendly).

    ``sliding_share``: how the engine sizes the sliding-window layers' KV (``EngineFeatures.sliding_kv_share``):
    ``None``, to the window; a share ``r``, a pool of ``r`` tokens per token of the full layers' pool, so that a
    sequence costs ``(full + r sliding)`` token-layers per token of the larger of its context and ``min(S,
    window) / r`` (the sliding pool binds where the context is shorter than the window)."""
    att = m.architecture.attention
    s = np.asarray(context, dtype=float)
    per = kv_bytes_per_token_layer(m, kv_dtype)
    if att.sliding_layers and sliding_share is not None:
        held = np.maximum(s, np.minimum(s, att.sliding_window_tokens) / sliding_share)
        out = per * (att.full_layers + sliding_share * att.sliding_layers) * held
    else:
        out = per * att.full_layers * s
        if att.sliding_layers:
            out = out + per * att.sliding_layers * np.minimum(s, att.sliding_window_tokens)
    if att.linear_layers:
        out = out + att.linear_layers * linear_state_bytes(m)
    return out


def kv_read_bytes_per_sequence(m: ModelSpec, context, kv_dtype: str = "bf16"):
    """KV bytes one decode step reads for one sequence at ``context`` tokens.

    Top-k sparse attention reads the indexer keys of every token but the latent of ``topk`` only;
    linear-attention state is read and written once per step.
    """
    att = m.architecture.attention
    s = np.asarray(context, dtype=float)
    per = kv_bytes_per_token_layer(m, kv_dtype)
    if att.sparse_topk_tokens:
        idx = att.indexer_head_dim * dtype_bytes("fp8")
        full = (per - idx) * np.minimum(s, att.sparse_topk_tokens) + idx * s
    else:
        full = per * s
    out = full * att.full_layers
    if att.sliding_layers:
        out = out + per * att.sliding_layers * np.minimum(s, att.sliding_window_tokens)
    if att.linear_layers:
        out = out + 2 * att.linear_layers * linear_state_bytes(m)
    return out


def attention_flops_per_token(m: ModelSpec, context):
    """Attention-score and value FLOPs of one decoded token at ``context`` (all layers).

    GQA: ``4 * heads * head_dim * S`` per layer. MLA, absorbed: ``2 * heads * (2 * kv_lora + rope) * S``.
    """
    att = m.architecture.attention
    s = np.asarray(context, dtype=float)
    if att.type == "mla":
        per_ctx = 2 * att.heads * (2 * att.kv_lora_rank + att.qk_rope_head_dim)
        eff = np.minimum(s, att.sparse_topk_tokens) if att.sparse_topk_tokens else s
        full = per_ctx * eff
        if att.sparse_topk_tokens:
            full = full + 2 * att.indexer_heads * att.indexer_head_dim * s
    else:
        per_ctx = 4 * att.heads * att.head_dim
        full = per_ctx * s
    out = full * att.full_layers
    if att.sliding_layers:
        out = out + per_ctx * att.sliding_layers * np.minimum(s, att.sliding_window_tokens)
    if att.linear_layers:
        out = out + 6 * att.linear_layers * att.linear_value_heads * att.linear_key_head_dim * att.linear_value_head_dim
    return out


def prefill_attention_flops(m: ModelSpec, new_tokens, prefix=0.0):
    """Attention FLOPs to prefill ``new_tokens`` after ``prefix`` cached tokens (causal, all layers).

    Prefill runs MLA decompressed: ``2 * heads * (qk_dim + v_dim)`` per query-key pair and layer.
    """
    att = m.architecture.attention
    n = np.asarray(new_tokens, dtype=float)
    p = np.asarray(prefix, dtype=float)
    pairs = n * p + n * (n + 1) / 2.0  # sum over new tokens of their context length
    if att.type == "mla":
        per_pair = 2 * att.heads * (att.head_dim + att.v_head_dim)
        if att.sparse_topk_tokens:
            k = att.sparse_topk_tokens
            capped = np.where(p + n <= k, pairs, np.minimum(pairs, n * k))
            full = per_pair * capped + 2 * att.indexer_heads * att.indexer_head_dim * pairs
        else:
            full = per_pair * pairs
    else:
        per_pair = 4 * att.heads * att.head_dim
        full = per_pair * pairs
    out = full * att.full_layers
    if att.sliding_layers:
        w = att.sliding_window_tokens
        out = out + per_pair * att.sliding_layers * np.minimum(pairs, n * w)
    return out + linear_prefill_flops(m, n)


def linear_prefill_flops(m: ModelSpec, new_tokens):
    """FLOPs of the linear-attention layers' state updates and reads over ``new_tokens`` prompt tokens."""
    att = m.architecture.attention
    n = np.asarray(new_tokens, dtype=float)
    if not att.linear_layers:
        return 0.0 * n
    return 6 * att.linear_layers * att.linear_value_heads * att.linear_key_head_dim * att.linear_value_head_dim * n


def expected_experts_touched(experts: int, top_k: int, tokens):
    """Distinct experts a MoE layer touches when ``tokens`` tokens each pick ``top_k`` of ``experts``.

    ``E * (1 - (1 - k/E)^T)`` for uniform routing; 0 for a dense model.
    """
    t = np.asarray(tokens, dtype=float)
    if experts == 0:
        return np.zeros_like(t)
    return experts * (1.0 - np.power(1.0 - top_k / experts, t))
