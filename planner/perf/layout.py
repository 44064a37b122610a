"""Parallel layouts and bytes per chip.

A replica of ``N = tp * dp * pp`` chips runs the model in ``pp`` pipeline stages of ``tp * dp``
chips. Attention and the other non-expert weights are split ``tp`` ways and replicated across the
``dp`` attention-data-parallel ranks; routed experts are spread over all ``tp * dp`` chips of a
stage, ``ep`` ways by expert and ``moe_tp = tp * dp / ep`` ways within an expert.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.catalog.schemas import HardwareSpec, ModelSpec
from planner.errors import InputError
from planner.perf.params import WeightBytes, kv_bytes_per_sequence

RUNTIME_RESERVE_FRACTION = 0.06
"""HBM kept for the runtime (CUDA context, activations, graphs, fragmentation): 6% of capacity."""
RUNTIME_RESERVE_MIN_BYTES = 2e9


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    ep: int = 1
    pp: int = 1
    dp: int = 1
    """Attention data-parallel ranks (``attn_dp``): attention replicated per rank, experts shared."""
    redundant: int = 0
    """Redundant expert slots beyond the model's experts (an expert-parallel degree must divide
    experts + redundant, e.g. EP72 with 32 redundant for DeepSeek's 256 experts)."""

    @property
    def chips(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def stage_chips(self) -> int:
        return self.tp * self.dp

    @property
    def moe_tp(self) -> int:
        return self.stage_chips // self.ep

    def describe(self) -> str:
        return describe_layout(self.tp, self.ep, self.pp, self.dp, self.redundant)


def describe_layout(tp, ep, pp, dp, redundant=0) -> str:
    """Engine notation: ``TP8``, ``TP8 EP8``, ``attn-DP8 EP8`` (attention data-parallel over 8 GPUs with
    experts split 8 ways, what SGLang calls DP attention and TRT-LLM ADP), ``+32 redundant``, ``PP2``."""
    tp, ep, pp, dp, redundant = (int(x) for x in (tp, ep, pp, dp, redundant))
    parts = []
    if dp > 1:
        parts.append(f"attn-DP{dp}" + (f" x TP{tp}" if tp > 1 else ""))
    else:
        parts.append(f"TP{tp}")
    if ep > 1:
        parts.append(f"EP{ep}" + (f" +{redundant} redundant" if redundant else ""))
    if pp > 1:
        parts.append(f"PP{pp}")
    return " ".join(parts)


def check_layout(model: ModelSpec, layout: Layout, *, names: dict[str, str] | None = None) -> None:
    """Raise :class:`InputError` naming the flag when ``layout`` cannot shard ``model``.

    Messages name the CLI flags ``--tp``, ``--ep``, ``--pp``, ``--dp``, or ``names[...]`` where given (e.g. CSV columns).
    """
    a = model.architecture
    att = a.attention
    default = {"dp": "--attn-dp", "redundant": "--redundant-experts"}
    flag = {k: (names or {}).get(k, default.get(k, f"--{k}")) for k in ("tp", "ep", "pp", "dp", "redundant")}
    for name in ("tp", "ep", "pp", "dp"):
        if getattr(layout, name) < 1:
            raise InputError(f"{flag[name]} must be a positive integer")
    if layout.redundant < 0:
        raise InputError(f"{flag['redundant']} must be 0 or more")
    if layout.tp > att.heads:
        raise InputError(
            f"{flag['tp']} {layout.tp} exceeds the {att.heads} attention heads of {model.id}; use tp <= {att.heads}"
        )
    if att.heads % layout.tp:
        raise InputError(
            f"{flag['tp']} {layout.tp} does not divide the {att.heads} attention heads of {model.id}; "
            f"use a divisor of {att.heads}"
        )
    if layout.pp > a.layers:
        raise InputError(f"{flag['pp']} {layout.pp} exceeds the {a.layers} layers of {model.id}")
    if a.moe is None:
        if layout.ep != 1:
            raise InputError(f"{flag['ep']} {layout.ep} needs a Mixture-of-Experts model; {model.id} is dense (use {flag['ep']} 1)")
        if layout.redundant:
            raise InputError(f"{flag['redundant']} needs a Mixture-of-Experts model; {model.id} is dense")
        return
    if layout.redundant and layout.ep == 1:
        raise InputError(f"{flag['redundant']} {layout.redundant} needs expert parallelism ({flag['ep']} > 1)")
    slots = a.moe.experts + layout.redundant
    if slots % layout.ep:
        if layout.redundant:
            raise InputError(
                f"{flag['ep']} {layout.ep} does not divide the {a.moe.experts} experts + {layout.redundant} redundant of "
                f"{model.id}; use {flag['redundant']} {(-a.moe.experts) % layout.ep} (or that plus a multiple of {layout.ep})"
            )
        raise InputError(
            f"{flag['ep']} {layout.ep} does not divide the {a.moe.experts} experts of {model.id}; "
            f"use a divisor of {a.moe.experts}, or redundant experts ({flag['redundant']} {(-a.moe.experts) % layout.ep}) "
            f"so that experts + redundant is a multiple of {layout.ep}"
        )
    if layout.stage_chips % layout.ep:
        raise InputError(
            f"{flag['ep']} {layout.ep} must divide tp x dp = {layout.stage_chips} (experts are spread over the "
            "chips of one pipeline stage)"
        )


def kv_shard(model: ModelSpec, tp) -> np.ndarray:
    """Ways the KV cache of one sequence is split across a tp group (the rest is replication).

    GQA splits by KV head up to ``kv_heads``; an MLA latent is whole on every TP rank.
    """
    att = model.architecture.attention
    tp = np.asarray(tp, dtype=float)
    if att.type == "mla":
        return np.ones_like(tp)
    return np.minimum(tp, att.kv_heads)


def expert_copies(model: ModelSpec, redundant) -> float:
    """Expert weights held per expert: ``(E + R) / E`` with ``R`` redundant expert slots (1 for a dense model)."""
    moe = model.architecture.moe
    return 1.0 + redundant / moe.experts if moe else 1.0


def weight_bytes_per_chip(wb: WeightBytes, tp, ep, pp, dp, expert_copies=1.0):
    """Resident weight bytes on one chip (average over pipeline stages); ``expert_copies`` is
    physical / logical experts (redundant expert slots)."""
    tp, pp, dp = (np.asarray(x, dtype=float) for x in (tp, pp, dp))
    nonexpert = (wb.nonexpert + wb.embed + wb.lm_head) / (tp * pp)
    expert = wb.expert * np.asarray(expert_copies, dtype=float) / (tp * dp * pp)
    return nonexpert + expert


def draft_bytes_per_chip(model: ModelSpec, wb: WeightBytes, tp, ep, pp, dp, expert_copies=1.0, spec_tokens=0.0):
    """Weights of the draft layers speculative decoding keeps resident (the model's multi-token-prediction
    module, one layer of the model's own shape per draft layer) on the chip that holds them, where
    ``spec_tokens > 0``: a layer's share of the non-expert weights over ``tp`` and of the expert weights
    over the stage."""
    spec = model.speculative
    layers_n = float(model.architecture.layers)
    moe = model.architecture.moe
    tp, dp = (np.asarray(x, dtype=float) for x in (tp, dp))
    per_layer = wb.nonexpert / layers_n / tp
    if moe is not None:
        per_layer = per_layer + wb.expert / moe.layers * np.asarray(expert_copies, dtype=float) / (tp * dp)
    n = float(spec.draft_layers) if spec else 1.0
    return np.where(np.asarray(spec_tokens, dtype=float) > 0, n * per_layer, 0.0)


def kv_bytes_per_chip(model: ModelSpec, batch, context, kv_dtype: str, tp, pp, dp, sliding_share: float | None = None):
    """KV bytes on one chip for ``batch`` sequences in flight per replica at mean ``context`` (``sliding_share``: see
    :func:`planner.perf.params.kv_bytes_per_sequence`)."""
    tp, pp, dp = (np.asarray(x, dtype=float) for x in (tp, pp, dp))
    per_seq = kv_bytes_per_sequence(model, context, kv_dtype, sliding_share)
    return np.asarray(batch, dtype=float) * per_seq / (dp * pp * kv_shard(model, tp))


def runtime_reserve_bytes(hw: HardwareSpec) -> float:
    return max(RUNTIME_RESERVE_MIN_BYTES, RUNTIME_RESERVE_FRACTION * hw.hbm_bytes)
