"""What one step of a model on a hardware is computed from (:class:`Setup`: dtypes, efficiency factors, speculative
decoding, the engine) and what it comes to (:class:`StepTimes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from planner.catalog.schemas import (
    DEFAULT_CHUNK_TOKENS,
    IDEAL,
    EngineEfficiency,
    EngineSpec,
    HardwareSpec,
    KernelFits,
    ModelSpec,
)
from planner.perf import params as P

MAX_SPEC_TOKENS = 16
"""Most draft tokens per step accepted as input (speculative decoding)."""


DEFAULT_ACCEPT = 0.7
"""Acceptance of every draft for a model whose catalog entry gives none (an assumption)."""


ACT_BYTES = 2.0
"""Activation bytes per element on the wire (bf16)."""


def engine_options(engine: EngineSpec | None) -> dict:
    """The features of a serving engine's catalog entry a :class:`Setup` reads (its chunk size, attention-DP prompt
    balance and sliding-window KV sizing), or the defaults where there is no entry: one place for every caller that
    builds a setup for an engine."""
    if engine is None:
        return {"prefill_chunk_tokens": DEFAULT_CHUNK_TOKENS, "adp_prefill_balance": False, "sliding_kv_share": None}
    return {"prefill_chunk_tokens": engine.prefill_chunk_tokens,
            "adp_prefill_balance": engine.features.attention_dp_prefill_balance,
            "sliding_kv_share": engine.features.sliding_kv_share}


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
    spec_accept: float | tuple[float, ...] | None = None
    """Probability that draft ``i`` is accepted given that draft ``i - 1`` was: one value for every draft,
    or one per draft position (the last repeats), as realised. None: the model's catalog acceptance
    (``speculative.acceptance``, with its source; else 0.7 for every draft, an assumption) times the
    engine's fitted ``spec_accept_scale``."""
    tbo: float = 0.0
    """Two micro-batch overlap (1: on): each step runs two half micro-batches so that one's expert
    dispatch/combine (and collectives) run under the other's compute. It costs smaller GEMMs, weights
    streamed once per micro-batch and per-layer overheads paid twice. May be an array aligned with the
    evaluated rows."""
    prefill_chunk_tokens: float = DEFAULT_CHUNK_TOKENS
    """Most prompt tokens an aggregated worker's step takes (the engine's chunked-prefill size or token
    budget per step); a longer prompt is taken in chunks of this many tokens."""
    engine: str | None = None
    """Serving engine whose kernel curves time the step (another engine's where it has none of a family)."""
    adp_prefill_balance: bool = False
    """Attention-DP ranks take their prompt chunks in the same steps (TensorRT-LLM's ``attention_dp_config.
    enable_balance``, SGLang's ``--enable-prefill-delayer``; both off by default): a chunk step then carries a chunk
    on every rank instead of one rank's chunk that the others wait for."""
    sliding_kv_share: float | None = None
    """How the engine sizes sliding-window layers' KV (``EngineFeatures.sliding_kv_share``; None: to the window)."""
    stats: P.ModelStats = field(init=False)
    wb: P.WeightBytes = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stats", P.model_stats(self.model))
        object.__setattr__(self, "wb", P.weight_bytes(self.model, self.dense_dtype, self.expert_dtype))
        if self.spec_accept is None:
            # The model's published acceptance as this engine's implementation realises it.
            spec = self.model.speculative
            acc = tuple(spec.acceptance) if spec else (DEFAULT_ACCEPT,)
            object.__setattr__(self, "spec_accept", tuple(a * self.eff.spec_accept_scale for a in acc))

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
        spec_accept: float | tuple[float, ...] | None = None,
        tbo: float = 0.0,
        expert_copies: float = 1.0,
        prefill_chunk_tokens: float = DEFAULT_CHUNK_TOKENS,
        engine: str | None = None,
        adp_prefill_balance: bool = False,
        sliding_kv_share: float | None = None,
    ) -> Setup:
        dense, expert = P.resolve_dtypes(model, weights)
        return cls(
            model, hw, eff, dense, expert, kv or "bf16", moe_imbalance, expert_copies=expert_copies,
            spec_tokens=spec_tokens, spec_accept=spec_accept, tbo=tbo, prefill_chunk_tokens=prefill_chunk_tokens,
            engine=engine, adp_prefill_balance=adp_prefill_balance, sliding_kv_share=sliding_kv_share,
        )

    @property
    def kernels(self) -> KernelFits | None:
        """The hardware's kernel curves where the step is calibrated and composed from them (``compose``); the ideal
        roofline keeps the datasheet."""
        kf = self.hw.efficiency.kernels
        if kf is None or not kf.compose or self.eff == IDEAL:
            return None
        return kf

    def term_kernels(self, term: str) -> KernelFits | None:
        """The hardware's kernel curves where they time ``term`` (``moe``, ``all_reduce``, ``exchange``) of the calibrated
        roofline step (``KernelFits.terms``; a fully composed step times every term through :attr:`kernels`)."""
        kf = self.hw.efficiency.kernels
        if kf is None or kf.compose or term not in kf.terms or self.eff == IDEAL:
            return None
        return kf

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
        """Output tokens per sequence and decode step: ``1 + a1 + a1 a2 + ... + a1...ak`` for ``k`` drafts
        (the first mismatch ends the run; the verifying pass always yields one token of its own)."""
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
    chunk_share: np.ndarray | float = 0.0
    """Share of the steps that carry a prefill chunk (aggregated serving; 0 otherwise)."""
    plain_emit_s: np.ndarray | float | None = None
    """Time of a step without a prefill chunk, drafting included: the gap between two emissions of a sequence
    (None: every step is the mean step)."""
    chunk_emit_s: np.ndarray | float | None = None
    """Time of a step that carries a prefill chunk."""

    @property
    def itl_steps(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(plain step, chunk step, share of chunk steps) in seconds per emission."""
        mean = np.asarray(self.step_s, dtype=float) * np.asarray(self.tokens_per_step, dtype=float)
        plain = mean if self.plain_emit_s is None else np.asarray(self.plain_emit_s, dtype=float)
        chunk = mean if self.chunk_emit_s is None else np.asarray(self.chunk_emit_s, dtype=float)
        return plain, chunk, np.asarray(self.chunk_share, dtype=float)

    @property
    def context_share(self) -> np.ndarray:
        """d ln(step) / d ln(context), approximately: the attention's share of the resource that binds the step
        (its KV reads of the memory time, or its FLOPs of the compute time), times that resource's share of the
        step (overheads, communication and drafting do not grow with the context)."""
        comp, mem = np.asarray(self.compute_s, dtype=float), np.asarray(self.memory_s, dtype=float)
        core = np.maximum(comp, mem)
        with np.errstate(divide="ignore", invalid="ignore"):
            att = np.where(mem >= comp, np.asarray(self.attn_memory_s, dtype=float) / mem,
                           np.asarray(self.attn_compute_s, dtype=float) / comp)
            per_step = np.asarray(self.step_s, dtype=float) * np.asarray(self.tokens_per_step, dtype=float)
            out = np.nan_to_num(att, nan=0.0) * np.clip(core / per_step, 0.0, 1.0)
        return np.clip(np.nan_to_num(out, nan=0.0), 0.0, 1.0)

    @property
    def bound(self) -> np.ndarray:
        comm = self.comm_s
        return np.where(
            comm > np.maximum(self.compute_s, self.memory_s),
            "communication",
            np.where(self.compute_s >= self.memory_s, "compute", "memory"),
        )


def accepted_tokens(spec_tokens, accept):
    """Expected output tokens per step of speculative decoding with ``spec_tokens`` drafts: the verifying
    pass yields one token, and draft ``i`` adds one more when it and every draft before it are accepted,
    ``1 + a1 + a1 a2 + ... + a1...ak``. ``accept`` is one acceptance for every draft or a sequence per draft
    position (the last repeats)."""
    k = np.asarray(spec_tokens, dtype=float)
    acc = np.atleast_1d(np.asarray(accept, dtype=float))
    n = int(np.ceil(np.max(k))) if k.size else 0
    if n <= 0:
        return np.ones_like(k) if k.ndim else 1.0
    per = np.array([acc[min(i, len(acc) - 1)] for i in range(n)])
    cum = np.concatenate([[0.0], np.cumsum(np.cumprod(per))])  # cum[j]: expected extra tokens from j drafts
    lo = np.floor(k).astype(int)
    frac = k - lo
    hi = np.minimum(lo + 1, n)
    out = 1.0 + cum[lo] + frac * (cum[hi] - cum[lo])
    return out if np.ndim(out) else float(out)
