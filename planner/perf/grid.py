"""The layouts a candidate table enumerates: tensor, expert, pipeline and attention data parallel degrees that fit
a scale-up domain, expert options and the chips each replica occupies in whole packing domains.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from planner.catalog.schemas import (
    EngineSpec,
    HardwareSpec,
    ModelSpec,
)
from planner.perf.experts import heuristic_placement
from planner.perf.layout import (
    expert_copies,
)

MAX_CHIPS_PER_REPLICA = 576


PIPELINE = (1, 2, 4, 8)


WIDE_EP = (72, 96, 128, 144, 192, 256, 288, 320)
"""Expert-parallel group sizes beyond one scale-up domain (and beyond 64 GPUs), as production
deployments run them (DeepSeek: EP144 decode on 18 H800 nodes; LMSYS: EP72 on 9 H100 nodes; EP320, one
expert per GPU, in the DeepSeek-V3 report). Kept where they are whole packing domains and no larger than
experts x 1.25."""


def _divisors(n: int, cap: int) -> list[int]:
    return [d for d in range(1, min(n, cap) + 1) if n % d == 0]


def packing_domain(hw: HardwareSpec) -> int:
    """Chips of one packing bin: a scale-up domain, or a purchase unit where units are smaller
    (TPU slices)."""
    return min(hw.scale_up_domain_chips, hw.purchase_unit.chips_per_unit)


def slots_per_replica(hw: HardwareSpec, group_chips, pp) -> np.ndarray:
    """Chips of purchase-unit capacity one replica occupies.

    A replica is ``pp`` stages of one TP x EP group (``group_chips = tp * attn_dp`` chips) each. A group
    must sit inside one packing bin of ``D`` chips, so at most ``floor(D / g)`` groups share a bin
    and each takes ``D / floor(D / g)`` chips of it (exact for groups of one size, conservative when
    sizes mix). A group larger than a bin (a scale-out group, or a multi-slice TPU group) takes whole
    bins.
    """
    D = float(packing_domain(hw))
    g = np.asarray(group_chips, dtype=float)
    per = np.where(g <= D, D / np.floor(D / np.minimum(g, D)), np.ceil(g / D) * D)
    return per * np.asarray(pp, dtype=float)


def layouts(model: ModelSpec, hw: HardwareSpec, engine: EngineSpec | None = None) -> pd.DataFrame:
    """:func:`layout_tuples` as a frame with columns ``tp``, ``ep``, ``pp``, ``attn_dp``."""
    return pd.DataFrame(layout_tuples(model, hw, engine), columns=["tp", "ep", "pp", "attn_dp"])


def layout_tuples(model: ModelSpec, hw: HardwareSpec, engine: EngineSpec | None = None) -> list[tuple[int, int, int, int]]:
    """Valid (tp, ep, pp, attn_dp) for ``model`` on ``hw`` run by ``engine`` (every technique when None):
    tp divides the heads; MoE experts spread over a stage either by expert (ep = stage) or by tensor (ep = 1);
    attention data parallelism only for MoE models and engines that implement it; expert-parallel groups
    beyond a scale-up domain only where the engine runs expert parallelism across nodes, with the wide
    sizes of :data:`WIDE_EP` (attention data-parallel, one pipeline stage)."""
    att = model.architecture.attention
    moe = model.architecture.moe
    f = engine.features if engine is not None else None
    attn_dp_ok = moe is not None and (f is None or f.attention_dp)
    ep_ok = moe is not None and (f is None or f.expert_parallel)
    wide_ok = f is None or f.scale_out_expert_parallel
    dom = hw.scale_up_domain_chips
    tps = [t for t in _divisors(att.heads, 64) if t & (t - 1) == 0 or t <= dom]
    out = []
    for tp, pp in itertools.product(tps, PIPELINE):
        if pp > model.architecture.layers:
            continue
        # Pipelining serves models whose weights do not fit a tensor-parallel group; with attention data
        # parallelism the expert-parallel stage already spreads them, so stages are not combined with it.
        dps = (1, 2, 4, 8, 16, 32, 64) if attn_dp_ok and pp == 1 else (1,)
        for dp in dps:
            if dp > 1 and tp > 1 and f is not None and not f.attention_dp_tensor_parallel:
                continue
            stage = tp * dp
            if stage * pp > MAX_CHIPS_PER_REPLICA or stage > max(dom, 64):
                continue
            eps = {1}
            if ep_ok and (stage <= dom or wide_ok):
                eps.add(stage)
            for ep in eps:
                out.append((tp, ep, pp, dp))
    if attn_dp_ok and ep_ok and moe is not None:
        pack = packing_domain(hw)
        for g in WIDE_EP:
            if g <= max(dom, 64) or g % pack or g > 1.25 * moe.experts or (g > dom and not wide_ok):
                continue
            out.append((1, g, 1, g))
    return list(dict.fromkeys(out))  # unique, in order


def expert_options(model: ModelSpec, lay: pd.DataFrame, load: np.ndarray | None, engine: EngineSpec | None = None) -> pd.DataFrame:
    """:func:`expert_rows` of the layouts in ``lay`` as a frame (columns of ``lay``, then ``redundant``,
    ``expert_copies``, ``moe_imbalance``)."""
    rows = expert_rows(model, list(lay.itertuples(index=False, name=None)), load, engine)
    return pd.DataFrame(rows, columns=[*lay.columns, "redundant", "expert_copies", "moe_imbalance"])


def expert_rows(model: ModelSpec, lay: list[tuple[int, int, int, int]], load: np.ndarray | None,
                engine: EngineSpec | None = None) -> list[tuple]:
    """Redundant expert slots per expert-parallel layout ``(tp, ep, pp, attn_dp)``, with the copies factor and
    the imbalance of a placement of the scenario's expert load (uniform when it gives none): rows ``(tp, ep, pp,
    attn_dp, redundant, expert_copies, moe_imbalance)``. ``R = -E mod G`` fills the ``G`` GPUs of a stage
    equally; with a skewed load also ``R + G`` (one more slot per GPU). An engine without redundant experts gets
    only the layouts whose EP divides the experts."""
    moe = model.architecture.moe
    red_ok = engine is None or engine.features.redundant_experts
    out = []
    vec = None
    for row in lay:
        tp, ep, _, dp = row
        stage = tp * dp
        if not moe or ep == 1 or stage == 1:
            out.append((*row, 0, 1.0, 1.0))
            continue
        r0 = (-moe.experts) % stage
        if r0 and not red_ok:
            continue
        rs = [r0]
        if load is not None and red_ok and (moe.experts + r0) // stage < moe.experts:
            rs.append(r0 + stage)
        if vec is None:
            vec = np.ones(moe.experts) if load is None else load
        for r in rs:
            _, imb = heuristic_placement(vec, stage, r)
            out.append((*row, r, expert_copies(model, r), imb))
    return out


def decode_options(model: ModelSpec, engine: EngineSpec | None) -> tuple[tuple[int, ...], bool]:
    """(draft-token counts, micro-batch overlap offered) for the decode and aggregated rows of ``engine``:
    speculative decoding with 1 to ``max_drafts`` drafts where the model has a published draft method the
    engine implements; two micro-batch overlap where the engine implements it (expert-parallel layouts with
    attention data parallelism only)."""
    spec = model.speculative
    drafts: tuple[int, ...] = (0,)
    if spec is not None and (engine is None or spec.method in engine.features.speculative):
        drafts = tuple(range(0, spec.max_drafts + 1))
    tbo = model.is_moe and (engine is None or engine.features.micro_batch_overlap)
    return drafts, tbo
