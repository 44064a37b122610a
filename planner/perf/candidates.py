"""Candidate table for the planner: every (workload, role, hardware, engine, layout, batch, dtype, memory tier,
speculative decoding, micro-batch overlap) evaluated by the performance model, filtered by memory and SLOs,
and pruned of dominated rows (pandas/NumPy, no Pyomo).

Roles: ``aggregated`` replicas serve whole requests; disaggregated serving pairs ``prefill`` and
``decode`` replicas. Each row names its serving engine: only engines that run on the hardware, only the
weight formats the engine serves there (natively, or weight-only where the hardware lacks the format's
units), only the layouts and techniques the engine implements (attention data parallelism, expert
parallelism across nodes, redundant experts, two micro-batch overlap, speculative decoding). Memory tiers:

- ``kv_tier``: ``hbm`` (the running sequences' KV cache lives in HBM) or ``hbm+host`` (what does not
  fit spills to host DRAM and crosses the host link on every decode step);
- ``prefix_tier``: where the reusable prompt prefixes of a workload live (``none``: no reuse, every
  prompt is prefilled in full; ``hbm``: HBM left free; ``host``: host DRAM; ``nvme``: local flash).
  A prefix hit skips the prefill of the cached tokens but loads their KV from the tier, overlapped
  layer by layer with the prefill of the new tokens.

Load and TTFT: a production pool sees open (Poisson) arrivals, not a benchmark's closed loop. A row
records its TTFT without queueing (``ttft_base_s``), the prefill work one request puts on its pool
(``queue_work_s``, on ``queue_servers`` parallel prefill ranks) and its capacity at full batch; the
request rate it is planned for is the highest that keeps ``ttft_base + Wq`` within the workload's TTFT
target (``Wq``: the M/D/c waiting time, Sakasegawa's approximation) and its utilisation within the
scenario's cap. Evaluation (:func:`evaluate_candidates`) does not depend on the SLOs;
:func:`select_candidates` applies them and prunes, so a different SLO costs a filter, not a re-evaluation.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from planner.catalog.scenario import ResolvedScenario, Workload
from planner.catalog.schemas import (
    DEFAULT_CHUNK_TOKENS,
    EngineEfficiency,
    EngineSpec,
    HardwareSpec,
    ModelSpec,
)
from planner.perf import params as P
from planner.perf.experts import heuristic_placement
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
from planner.units import GB, MS, US

BATCH_PER_RANK = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
PIPELINE = (1, 2, 4, 8)
MAX_CHIPS_PER_REPLICA = 576
WIDE_EP = (72, 96, 128, 144, 192, 256, 288, 320)
"""Expert-parallel group sizes beyond one scale-up domain (and beyond 64 GPUs), as production
deployments run them (DeepSeek: EP144 decode on 18 H800 nodes; LMSYS: EP72 on 9 H100 nodes; EP320, one
expert per GPU, in the DeepSeek-V3 report). Kept where they are whole packing domains and no larger than
experts x 1.25."""
PREFIX_TIERS = ("hbm", "host", "nvme")
ROLES = ("aggregated", "prefill", "decode")


@dataclass
class CandidatePool:
    """Every evaluated row that fits in memory, before SLO filtering and pruning."""

    rows: pd.DataFrame
    evaluated: int
    dropped_memory: int
    utilisation_cap: float = 0.8
    levels: tuple[dict[str, tuple[float, float]], ...] = ()
    """The SLO levels the pool was streamed for (see :func:`evaluate_candidates`); empty: every row that fits."""
    fit: int = 0
    """Rows that fit in memory, kept or not."""
    base_slo_drops: dict[str, int] = field(default_factory=dict)
    """Rows that fit in memory but miss the first level's TPOT (``tpot_slo``) or TTFT (``ttft_slo``)."""
    shares: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per workload, the range of prefix bytes per request/s (working set / demand) its pruning answers for
    (see :func:`prefix_shares`); a workload not listed: any."""
    mixes: bool = False
    """Whether pruning may drop a row that a mix of other rows beats (:func:`mix_kept`): only where the scenario
    allows it (:func:`mixes_allowed`, which :func:`evaluate_candidates` asks), so off unless said."""


@dataclass
class CandidateTable:
    rows: pd.DataFrame
    dropped: dict[str, int] = field(default_factory=dict)
    """Why rows were dropped: ``memory``, ``tpot_slo``, ``ttft_slo``, ``dominated``."""
    evaluated: int = 0


@dataclass(frozen=True)
class EngineChoice:
    """An engine offered on a hardware with the efficiency factors its rows are priced with."""

    engine: EngineSpec
    eff: EngineEfficiency
    fitted: bool
    """Whether this (hardware, engine) pair has factors fitted on its own measured rows."""


def engine_choices(rs: ResolvedScenario, hw: HardwareSpec, engine: str | None = None) -> list[EngineChoice]:
    """Engines a pool on ``hw`` may run. With ``engine`` (``--engine`` or the scenario's) only that one, with
    its fitted factors or the hardware's default. Otherwise every engine with factors fitted on this
    hardware, or, where none has, the first engine that runs on it (catalog order) with the default."""
    engines = [e for e in rs.engines if e.runs_on(hw) and (engine is None or e.id == engine)]
    fitted = [e for e in engines if e.id in hw.efficiency.by_engine]
    if engine is None and fitted:
        engines = fitted
    elif engine is None:
        engines = engines[:1]
    return [EngineChoice(e, hw.efficiency.for_engine(e.id), e.id in hw.efficiency.by_engine) for e in engines]


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


GRID_COLUMNS = ("tp", "ep", "pp", "attn_dp", "redundant", "expert_copies", "moe_imbalance", "spec", "tbo", "b_rank",
                "batch", "chips", "group_chips", "slots", "scale_out")


def _grid(model: ModelSpec, hw: HardwareSpec, engine: EngineSpec | None, load: np.ndarray | None = None) -> pd.DataFrame:
    """:func:`grid_arrays` as a frame."""
    return pd.DataFrame(grid_arrays(model, hw, engine, load), columns=list(GRID_COLUMNS))


def grid_arrays(model: ModelSpec, hw: HardwareSpec, engine: EngineSpec | None,
                load: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Every (layout, redundant experts, drafts, micro-batch overlap, batch per rank) ``engine`` may run ``model``
    on ``hw`` with: one array per column of :data:`GRID_COLUMNS`, rows in that nesting order (layouts outermost,
    batch innermost). Micro-batch overlap only where it splits an expert exchange (attention data parallelism
    with expert parallelism)."""
    lay = np.array(expert_rows(model, layout_tuples(model, hw, engine), load, engine), dtype=float).reshape(-1, 7)
    drafts, tbo_ok = decode_options(model, engine)
    var = np.array(list(itertools.product(drafts, (0, 1) if tbo_ok else (0,))), dtype=np.int64).reshape(-1, 2)
    li = np.repeat(np.arange(len(lay)), len(var))
    vi = np.tile(np.arange(len(var)), len(lay))
    ints = lay[:, :5].astype(np.int64)
    keep = (var[vi, 1] == 0) | ((ints[li, 3] > 1) & (ints[li, 1] > 1))
    li, vi = li[keep], vi[keep]
    nb = len(BATCH_PER_RANK)
    li, vi = np.repeat(li, nb), np.repeat(vi, nb)
    b_rank = np.tile(np.asarray(BATCH_PER_RANK, dtype=np.int64), len(keep.nonzero()[0]))
    g = {k: ints[li, j] for j, k in enumerate(("tp", "ep", "pp", "attn_dp", "redundant"))}
    g["expert_copies"], g["moe_imbalance"] = lay[li, 5], lay[li, 6]
    g["spec"], g["tbo"], g["b_rank"] = var[vi, 0], var[vi, 1], b_rank
    g["batch"] = b_rank * g["attn_dp"]
    g["chips"] = g["tp"] * g["attn_dp"] * g["pp"]
    g["group_chips"] = g["tp"] * g["attn_dp"]
    g["slots"] = slots_per_replica(hw, g["group_chips"], g["pp"])
    g["scale_out"] = g["group_chips"] > hw.scale_up_domain_chips
    return g


def roles_for(serving) -> list[str]:
    roles = []
    if "aggregated" in serving:
        roles.append("aggregated")
    if "disaggregated" in serving:
        roles += ["prefill", "decode"]
    return roles


def weight_options(rs: ResolvedScenario, model: ModelSpec, hw: HardwareSpec, engine: EngineSpec) -> list[tuple[str, str]]:
    """(weight format, mode) pairs of the scenario that ``engine`` serves ``model`` in on ``hw``: ``native``
    where the hardware has units for the format, ``weight-only`` where the engine dequantises it into bf16
    maths."""
    out = []
    for w in rs.weights_for(model):
        dense, expert = P.resolve_dtypes(model, w)
        modes = {engine.weight_mode(hw, d) for d in {dense, expert}}
        if None in modes:
            continue
        out.append((w, "weight-only" if "weight-only" in modes else "native"))
    return out


def kv_options(allowed, engine: EngineSpec) -> list[str]:
    """The KV-cache format to evaluate among the scenario's ``allowed`` ones that ``engine`` offers: the
    narrowest. Attention runs in bf16 maths whatever the cache format, so a narrower cache is never slower and
    never holds fewer sequences: a row with it dominates the same row with a wider one for every SLO (list
    only the formats whose quality is acceptable)."""
    from planner.units import dtype_bytes

    ok = [k for k in allowed if k in engine.kv_cache]
    return [min(ok, key=dtype_bytes)] if ok else []


def evaluate_candidates(rs: ResolvedScenario, engine: str | None = None,
                        levels: list[dict[str, tuple[float, float]]] | None = None,
                        shares: dict[str, tuple[float, float]] | None = None,
                        hardware: list[str] | None = None) -> CandidatePool:
    """Evaluate every role x hardware x engine x layout x batch x dtype x tier x decoding row of a
    scenario; keep those that fit in memory.

    With ``levels`` (SLO sets, ``{workload: (ttft_s, tpot_s)}``, the first the scenario's own) the rows are
    filtered and pruned as they are evaluated, chunk by chunk (a chunk: one workload's rows of one role and prefix
    tier on one hardware and engine, of every weight and KV format and KV tier; part of one group of
    :data:`PRUNE_KEYS`): a row is kept when some level admits it and it is not dominated
    (:func:`prune_dominated`) among the chunk's rows that level admits, or when it is a chunk's fastest (TPOT,
    and TTFT within the first level's TPOT: what a diagnosis of an impossible SLO names).
    :func:`select_candidates` at any of those levels then returns exactly the rows it returns from the whole pool (dominance is transitive, so a row dominated in its chunk is dominated in the whole),
    and memory follows the rows kept, not the rows evaluated.

    ``shares``: per workload, the range of prefix working set per request/s the MILP built from the pool may
    be given (:func:`prefix_shares`; default: the scenario's own demand and working sets): pruning keeps what
    any value in it needs.

    ``hardware``: evaluate only these of the scenario's hardware (ids; a part of the pool that
    :func:`merge_pools` joins to the others)."""
    sc = rs.scenario
    shares = prefix_shares(sc.workloads) if shares is None else shares
    engine = engine or sc.engine
    cols: dict[str, list] = {}
    labels: dict[str, list] = {k: [] for k in LABELS}
    categories: dict[str, list] = {"bound": list(BOUNDS)}
    evaluated = dropped = fit = 0
    slo_drops = {"tpot_slo": 0, "ttft_slo": 0}
    groups = [(m, [w for w in sc.workloads if rs.model_for(w.name).id == m.id]) for m in rs.models]
    mine = [h for h in rs.hardware if hardware is None or h.id in hardware]
    for hw, choice, (model, wls) in ((h, c, g) for h in mine for c in engine_choices(rs, h, engine) for g in groups):
        gcols = grid_arrays(model, hw, choice.engine, rs.expert_load_for(model))
        # A prefill pass is one prompt per rank without drafts: only those grid rows are prefill candidates (the
        # others differ in decode batch and drafts alone), so only they are evaluated for that role.
        one = (gcols["b_rank"] == 1) & (gcols["spec"] == 0)
        by_role = {"prefill": {k: v[one] for k, v in gcols.items()}}
        # each row's footprint as a small integer, for the dominance test's per-footprint maxima
        foot = np.unique(gcols["slots"], return_inverse=True)[1].reshape(-1)
        foot_of = {"prefill": foot[one]}
        setups = [(wdt, mode, kdt, Setup.make(model, hw, weights=wdt, kv=kdt, eff=choice.eff,
                                              prefill_chunk_tokens=choice.engine.prefill_chunk_tokens,
                                              engine=choice.engine.id))
                  for (wdt, mode), kdt in itertools.product(weight_options(rs, model, hw, choice.engine),
                                                            kv_options(sc.kv_cache, choice.engine))]
        roles = roles_for(sc.serving)
        done: list[_Part] = []  # this grid's evaluated rows, emitted below in the loops' order
        for wi, w in enumerate(wls):
            parts: list[_Part] = []
            for si, (wdt, mode, kdt, setup) in enumerate(setups):
                memo: dict = {}  # the disaggregated decode step, shared by the aggregated and decode roles
                for ri, role in enumerate(roles):
                    g = by_role.get(role, gcols)
                    size = len(g["batch"])
                    for vi, (tags, var, rows) in enumerate(_variants(setup, g, w, role, memo)):
                        m = size if rows is None else len(rows)  # var's columns are over the grid's ``rows``
                        ok = np.broadcast_to(var.pop("ok_memory"), (m,))
                        evaluated += size
                        n = int(ok.sum())
                        dropped += size - n
                        fit += n
                        if n == 0:
                            continue
                        at = np.flatnonzero(ok)  # positions in var's columns
                        gat = at if rows is None else rows[at]  # the same rows' positions in the grid
                        tags = {**tags, "workload": w.name, "model": model.id, "role": role, "hardware": hw.id,
                                "engine": choice.engine.id, "weights_dtype": wdt, "weights_mode": mode,
                                "kv_dtype": kdt, "factors": "fitted" if choice.fitted else "hardware default"}
                        parts.append(_Part((si, wi, ri, vi), tags, var, g, m, at, gat))
            if levels:
                # Filter and prune each (role, prefix tier) of the workload on this grid in one pass over its rows of
                # every weight and KV format and KV tier: part of one group of the dominance test (PRUNE_KEYS), so
                # what a level's selection keeps is kept, in a few calls instead of one per format and tier
                # (docs/formulation.md section 1).
                by_group: dict[tuple[str, str], list[_Part]] = {}
                for part in parts:
                    by_group.setdefault((part.tags["role"], part.tags["prefix_tier"]), []).append(part)
                for (role, _), group in by_group.items():
                    sub = {k: np.concatenate([part.column(k) for part in group]) for k in FILTER_COLUMNS}
                    sub["footprint"] = np.concatenate([foot_of.get(role, foot)[part.gat] for part in group])
                    sel, drops = _stream_filter(sub, role, w.name, levels, sc.utilisation_cap,
                                                _derate(rs, hw, choice.engine.id, role), shares.get(w.name))
                    for k, v in drops.items():
                        slo_drops[k] += v
                    ends = np.cumsum([part.at.size for part in group])
                    for part, mine_ in zip(group, np.split(sel, ends[:-1]), strict=True):
                        part.at, part.gat = part.at[mine_], part.gat[mine_]
            done.extend(parts)
        done.sort(key=lambda part: part.key)  # weight and KV format, workload, role, tier: the order rows always had
        for part in done:
            # every label a fitting row has is a category, in the order of the loops, whether or not a row of it is
            # kept: the pool's categories are those of the pool evaluated whole
            codes = {}
            for k in LABELS:
                if k != "bound":
                    cats = categories.setdefault(k, [])
                    if part.tags[k] not in cats:
                        cats.append(part.tags[k])
                    codes[k] = cats.index(part.tags[k])
            for k in {**part.g, **part.var}:
                cols.setdefault(k, [])  # columns in the order of the first part, as evaluated whole
            n = part.at.size
            if not n:
                continue
            chunk = {k: part.column(k) for k in {**part.g, **part.var}}
            b = _take(part.tags["bound"], (part.m,), part.at)
            labels["bound"].append(((b == "memory") * 1 + (b == "communication") * 2).astype(np.int16))
            for k, v in chunk.items():
                cols.setdefault(k, []).append(v)
            for k, c in codes.items():
                labels[k].append(np.full(n, c, dtype=np.int16))
            cols.setdefault("usd_per_hour", []).append(chunk["chips"] * rs.prices[hw.id])
    if not labels["bound"]:
        cols = {}  # no row kept
    pool = CandidatePool(pd.DataFrame(), evaluated, dropped, sc.utilisation_cap, tuple(levels or ()), fit,
                         slo_drops if levels else {}, dict(shares), mixes_allowed(sc))
    if not cols:
        return pool
    data = {k: np.concatenate(v) for k, v in cols.items()}
    data.update({k: pd.Categorical.from_codes(np.concatenate(v), categories[k]) for k, v in labels.items()})
    pool.rows = pd.DataFrame(data)
    pool.rows["margin_derate"] = margin_derate(rs, pool.rows)
    return pool


@dataclass
class _Part:
    """Rows of one (weight and KV format, workload, role, prefix and KV tier) evaluated on a grid, as
    :func:`evaluate_candidates` holds them until they are filtered: ``var``'s columns are over ``m`` rows of the
    grid ``g``; ``at`` are the rows kept (positions in ``var``'s columns), ``gat`` the same rows in ``g``."""

    key: tuple[int, ...]
    tags: dict
    var: dict
    g: dict
    m: int
    at: np.ndarray
    gat: np.ndarray

    def column(self, k: str) -> np.ndarray:
        return _take(self.var[k], (self.m,), self.at) if k in self.var else self.g[k][self.gat]


def merge_pools(parts: list[CandidatePool]) -> CandidatePool:
    """One pool from the parts :func:`evaluate_candidates` made of one scenario's hardware (``hardware``), given in
    the scenario's hardware order: the rows, in that order, and counts of the pool evaluated whole."""
    first = parts[0]
    drops: dict[str, int] = {}
    for p in parts:
        for k, v in p.base_slo_drops.items():
            drops[k] = drops.get(k, 0) + v
    pool = CandidatePool(pd.DataFrame(), sum(p.evaluated for p in parts), sum(p.dropped_memory for p in parts),
                         first.utilisation_cap, first.levels, sum(p.fit for p in parts), drops, first.shares,
                         first.mixes)
    frames = [p.rows for p in parts if not p.rows.empty]
    if not frames:
        return pool
    cols = {}
    for c in frames[0].columns:
        if isinstance(frames[0][c].dtype, pd.CategoricalDtype):
            cols[c] = pd.api.types.union_categoricals([f[c] for f in frames])
        else:
            cols[c] = np.concatenate([f[c].to_numpy() for f in frames])
    pool.rows = pd.DataFrame(cols)
    return pool


def _take(v, shape, idx) -> np.ndarray:
    """``v`` (an array of ``shape`` or one that broadcasts to it, or a scalar) at positions ``idx``."""
    if isinstance(v, np.ndarray) and v.shape == shape:
        return v[idx]
    if np.ndim(v) == 0:
        return np.full(idx.size, v)
    return np.broadcast_to(v, shape)[idx]


FILTER_COLUMNS = ("tpot_s", "capacity_rps", "ttft_base_s", "queue_work_s", "queue_servers", "slots",
                  "prefix_bytes_per_replica")


def _stream_filter(chunk: dict[str, np.ndarray], role: str, workload: str, levels, cap: float,
                   derate: float, share: tuple[float, float] | None) -> tuple[np.ndarray, dict[str, int]]:
    """Rows of one evaluated chunk (one workload, role, hardware, prefix tier) that some SLO level needs (see
    :func:`evaluate_candidates`), and how many miss the first level's TPOT and TTFT."""
    tp = chunk["tpot_s"]
    keep = np.zeros(len(tp), dtype=bool)
    pairs = list(dict.fromkeys(lv[workload] for lv in levels))
    # Only rows within some level's TPOT need their load (the M/D/c bisection is the costly part).
    cand = np.flatnonzero(tp <= max(t for _, t in pairs))
    ttfts = list(dict.fromkeys(f for f, _ in pairs))
    # every TTFT level's load in one pass: the rows stacked once per level
    sub = {k: np.broadcast_to(chunk[k][cand], (len(ttfts), cand.size))
           for k in ("capacity_rps", "ttft_base_s", "queue_work_s", "queue_servers")}
    lams = planned_load(sub, np.asarray(ttfts, dtype=float)[:, None], cap, with_ttft=False)[0]
    loads: dict[float, np.ndarray] = {}
    for ttft, lam in zip(ttfts, lams, strict=True):
        # a looser TTFT that changes no row's load (none is queue-bound) needs no pruning of its own
        loads[ttft] = next((v for v in loads.values() if np.array_equal(v, lam, equal_nan=True)), lam)
    drops = {}
    done: set[tuple[int, float]] = set()
    for i, (ttft, tpot) in enumerate(pairs):
        lam = loads[ttft]
        if (id(lam), tpot) in done:
            continue
        done.add((id(lam), tpot))
        bad_tpot = tp[cand] > tpot
        ok = ~bad_tpot & (lam > 0)
        if i == 0:
            n_tpot = int((tp > tpot).sum())
            drops = {"tpot_slo": n_tpot, "ttft_slo": len(tp) - n_tpot - int(ok.sum())}
        idx = cand[ok]
        if idx.size:
            rate = lam[ok] / derate
            keep[idx[nondominated(chunk["slots"][idx], rate,
                                  usable_share(chunk["prefix_bytes_per_replica"][idx], rate, share), tp[idx],
                                  chunk["footprint"][idx])]] = True
    if role != "prefill":
        keep[np.argmin(tp)] = True
    first = tp <= pairs[0][1]
    if role != "decode" and first.any():
        keep[np.flatnonzero(first)[np.argmin(chunk["ttft_base_s"][first])]] = True
    return keep, drops


def _derate(rs: ResolvedScenario, hw: HardwareSpec, engine: str, role: str) -> float:
    m = rs.scenario.margin
    if m is None:
        return 1.0
    return max(1.0, hw.efficiency.error_ratio(engine, "agg" if role == "aggregated" else "disagg", m.quantile))


def margin_derate(rs: ResolvedScenario, rows: pd.DataFrame) -> np.ndarray:
    """Per row, the factor its capacity is divided by under the scenario's ``margin.quantile``: the measured /
    predicted TPOT at that quantile for its hardware, engine and serving mode (at least 1: a model that was
    pessimistic there does not earn extra capacity). 1 everywhere without a margin."""
    out = np.ones(len(rows))
    if rs.scenario.margin is None or rows.empty:
        return out
    hw = {h.id: h for h in rs.hardware}
    keys = pd.DataFrame({"h": rows["hardware"].astype(str), "e": rows["engine"].astype(str),
                         "r": rows["role"].astype(str)})
    for (h, e, role), idx in keys.groupby(["h", "e", "r"]).groups.items():
        out[np.asarray(idx)] = _derate(rs, hw[h], e, role)
    return out


BOUNDS = ("compute", "memory", "communication")
LABELS = ("workload", "model", "role", "hardware", "engine", "weights_dtype", "weights_mode", "kv_dtype", "kv_tier",
          "prefix_tier", "bound", "factors")


def queue_wait(rho, servers, work_s):
    """Mean wait in queue of an M/D/c system (Poisson arrivals, deterministic service of ``work_s`` on
    ``servers`` parallel servers) at utilisation ``rho`` (Sakasegawa's approximation:
    ``rho^(sqrt(2 (c + 1)) - 1) / (c (1 - rho)) * work / 2``; exact M/D/1 for one server)."""
    rho = np.clip(np.asarray(rho, dtype=float), 0.0, 1.0 - 1e-12)
    c = np.maximum(np.asarray(servers, dtype=float), 1.0)
    return np.power(rho, np.sqrt(2.0 * (c + 1.0)) - 1.0) / (c * (1.0 - rho)) * np.asarray(work_s, dtype=float) / 2.0


def _utilisation_for_wait(c, work, slack) -> np.ndarray:
    """The utilisation at which the M/D/c wait of :func:`queue_wait` equals ``slack`` (``c > 1``, ``slack > 0``),
    from below. Newton on the log of the wait over the log-odds ``t = ln(rho / (1 - rho))``:
    ``f(t) = ln(work / (2 c slack)) + softplus(t) - a softplus(-t)`` with ``a = sqrt(2 (c + 1)) - 1 >= 1`` is
    increasing and concave, so after the first step every iterate lies at or below the root and climbs to it
    (the answer never breaks the wait); about six iterations where a bisection took forty."""
    c = np.maximum(np.asarray(c, dtype=float), 1.0)
    a = np.sqrt(2.0 * (c + 1.0)) - 1.0
    k = np.log(np.asarray(work, dtype=float) / (2.0 * c)) - np.log(np.asarray(slack, dtype=float))
    t = np.zeros_like(c)
    for _ in range(60):
        up, down = np.logaddexp(0.0, t), np.logaddexp(0.0, -t)  # -ln(1 - rho), -ln(rho)
        f = k + up - a * down
        step = f / (a * np.exp(-down - t) + np.exp(-up + t))  # f' = a (1 - rho) + rho
        t = t - step
        if np.all(np.abs(step) <= 1e-12 * np.maximum(1.0, np.abs(t))):
            break
    rho = 1.0 / (1.0 + np.exp(-t))
    # near rho = 1 the rounding of 1 - rho can put the wait a hair over: step down until it is not
    for i in range(40):
        over = queue_wait(rho, c, work) > slack
        if not over.any():
            break
        rho = np.where(over, rho - np.minimum(rho, 1.0 - rho) * 1e-13 * 2.0**i, rho)
    return rho


def planned_load(rows, ttft_limit_s, cap: float, *, with_ttft: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """(requests/s per replica, TTFT at that load) of each row: the highest request rate whose TTFT under
    open arrivals stays within ``ttft_limit_s`` and whose utilisation stays within ``cap`` (NaN rate where
    even an idle replica misses the limit). Decode rows carry no TTFT and run at the cap. Elementwise: the
    columns and the limit may be arrays of any shape that broadcast together. ``with_ttft=False``: the rate
    alone (``None`` for the TTFT)."""
    full, base, work, c = (np.asarray(rows[k], dtype=float)
                           for k in ("capacity_rps", "ttft_base_s", "queue_work_s", "queue_servers"))
    lim = np.broadcast_to(np.asarray(ttft_limit_s, dtype=float), base.shape)
    queued = work > 0
    slack = lim - base
    # Highest queue utilisation whose wait fits the slack (the wait grows with utilisation). Only rows whose
    # wait at the utilisation cap exceeds the slack need it; one server is the exact M/D/1
    # ``rho work / (2 (1 - rho)) <= slack``, i.e. ``rho = 2 slack / (work + 2 slack)``; more servers bisect.
    cs = np.maximum(c, 1.0)
    at_cap = np.clip(cap * full * work / cs, 0.0, 1.0)
    need = queued & (slack >= 0) & (queue_wait(at_cap, c, work) > slack)
    rho = np.ones(need.shape)
    one = need & (cs <= 1.0)
    rho[one] = 2.0 * slack[one] / (work[one] + 2.0 * slack[one])
    many = need & (cs > 1.0)
    if many.any():
        rho[many] = _utilisation_for_wait(c[many], work[many], slack[many])
    lam_slo = np.where(need, rho * cs / np.maximum(work, 1e-30), np.inf)
    lam = np.minimum(cap * full, lam_slo)
    lam = np.where(slack >= 0, lam, np.nan)
    if not with_ttft:
        return lam, None
    t = np.where(queued, base + queue_wait(lam * work / np.maximum(c, 1.0), c, work), base)
    return lam, t


def select_candidates(pool: CandidatePool, slos: dict[str, tuple[float, float]], *, prune: bool = True) -> CandidateTable:
    """Rows meeting each workload's ``(ttft_s, tpot_s)`` SLO at the load they are planned for (see
    :func:`planned_load`), pruned of dominated rows."""
    r = pool.rows
    dropped = {"memory": pool.dropped_memory, "tpot_slo": 0, "ttft_slo": 0, "dominated": 0}
    if r.empty:
        return CandidateTable(r, dropped, pool.evaluated)
    wl = r["workload"].cat
    codes = wl.codes.to_numpy()
    ttft_lim = np.array([slos[k][0] for k in wl.categories], dtype=float)[codes]
    tpot_lim = np.array([slos[k][1] for k in wl.categories], dtype=float)[codes]
    bad_tpot = r["tpot_s"].to_numpy() > tpot_lim
    lam, t = planned_load(r, ttft_lim, pool.utilisation_cap)
    bad_ttft = ~bad_tpot & ~(lam > 0)
    dropped["tpot_slo"] = int(bad_tpot.sum())
    dropped["ttft_slo"] = int(bad_ttft.sum())
    keep = ~(bad_tpot | bad_ttft)
    rows = r[keep].copy()
    rows["pool_row"] = rows.index.to_numpy()  # the row's position in the pool: one identity across SLO levels
    rows["requests_per_s"] = lam[keep] / (rows["margin_derate"].to_numpy() if "margin_derate" in rows else 1.0)
    rows["ttft_s"] = t[keep]
    rows["usd_per_rps"] = rows["usd_per_hour"] / np.maximum(rows["requests_per_s"], 1e-12)
    if prune:
        rows, dropped["dominated"] = prune_dominated(rows, pool.shares, mixes=pool.mixes)
    if pool.levels and pool.base_slo_drops and slos == pool.levels[0]:
        # counted as the rows were streamed: the pool no longer holds most of the rows that missed or were dominated
        dropped.update(pool.base_slo_drops)
        dropped["dominated"] = pool.fit - pool.base_slo_drops["tpot_slo"] - pool.base_slo_drops["ttft_slo"] - len(rows)
    return CandidateTable(rows.reset_index(drop=True), dropped, pool.evaluated)


def build_candidates(rs: ResolvedScenario, engine: str | None = None, *, prune: bool = True) -> CandidateTable:
    """Evaluate, filter by the scenario's SLOs and prune (see :func:`select_candidates`)."""
    pool = evaluate_candidates(rs, engine)
    return select_candidates(pool, scenario_slos(rs.scenario.workloads), prune=prune)


def scenario_slos(workloads: list[Workload]) -> dict[str, tuple[float, float]]:
    return {w.name: (w.slo.ttft_s, w.slo.tpot_s) for w in workloads}


PRUNE_KEYS = ["workload", "role", "hardware", "prefix_tier"]
MIX_KEYS = ["workload", "role", "hardware"]


def mixes_allowed(sc) -> bool:
    """Whether a row that a mix of several other rows beats may be pruned (:func:`prune_dominated`): not
    where the scenario limits or prices pool types (the mix is more pool types than the row) or asks for N+k
    (its per-unit loss bound is read from the rows)."""
    lim = sc.limits
    return not (lim.max_pool_types_per_workload or lim.pool_type_usd_per_hour or sc.resilience.lose_units)


def prune_dominated(df: pd.DataFrame, shares: dict[str, tuple[float, float]] | None = None, *,
                    mixes: bool = False) -> tuple[pd.DataFrame, int]:
    """Drop rows the MILP never needs.

    In the MILP a row is only its packing footprint ``slots``, its request rate and, where it reuses
    prefixes, whether one replica holds its share of the working set: ``pcap / working_set >= rate / demand``,
    i.e. its prefix bytes per request/s ``pcap / rate`` reach the workload's ``working_set / demand`` (every
    row left meets its SLOs and fits in memory). With ``shares[w] = (lo, hi)`` the range of ``working_set /
    demand`` the model may be given (:func:`prefix_shares`), row B is dominated by row A of the same
    (workload, role, hardware, prefix tier) when ``k = slots_B / slots_A`` is a whole number, ``k`` replicas
    of A give at least B's rate, and A is usable wherever in that range B is (:func:`usable_share`): any plan
    using B is matched, at the same units, power and cost, by one using A. Ties keep the first row (fastest
    TPOT). A workload missing from ``shares`` is pruned for any working set and demand.

    With ``mixes`` (:func:`mixes_allowed`), a row left is then also dropped where rows left of its (workload,
    role, hardware), of any prefix tier, each usable wherever it is, beat it: one of its footprint with at least
    its rate, or replicas of several that give at least its rate in fewer slots (:func:`mix_kept`). A row
    without prefix reuse is usable at any working set. In the MILP such a mix replaces the row at the same
    units, power and cost; what it may add is pool types, which is why a scenario that limits or prices them
    keeps the row.
    """
    if df.empty:
        return df, 0
    shares = shares or {}
    keep = np.zeros(len(df), dtype=bool)
    s, q = df["slots"].to_numpy(float), df["requests_per_s"].to_numpy(float)
    c, t = df["prefix_bytes_per_replica"].to_numpy(float), df["tpot_s"].to_numpy(float)
    wl = df["workload"].astype(str).to_numpy()
    for idx in df.groupby(PRUNE_KEYS, observed=True, sort=False).indices.values():
        share = usable_share(c[idx], q[idx], shares.get(wl[idx[0]], (0.0, np.inf)))
        keep[idx[nondominated(s[idx], q[idx], share, t[idx])]] = True
    if mixes:
        left = np.flatnonzero(keep)
        sub = df.iloc[left]
        cap = np.where(sub["prefix_tier"].astype(str).to_numpy() == "none", np.inf, c[left])
        for idx in sub.groupby(MIX_KEYS, observed=True, sort=False).indices.values():
            rows = left[idx]
            share = usable_share(cap[idx], q[rows], shares.get(wl[rows[0]], (0.0, np.inf)))
            keep[rows[~mix_kept(s[rows], q[rows], share)]] = False
    out = df[keep]
    return out, len(df) - len(out)


def mix_kept(slots, rate, capacity) -> np.ndarray:
    """Mask of the rows of one (workload, role, hardware) group that no mix of the others beats, among rows
    usable wherever the row is (``capacity``, its prefix bytes per request/s as :func:`usable_share` gives it, at
    least the row's): one row of its footprint with at least its ``rate``, or replicas of rows that give at least
    its rate in *fewer* slots than its ``slots``. A plan using the row costs the same with the other row instead
    (the same slots, as many pool types), or with the mix (fewer slots, which the objective's tie-break prefers:
    no optimum uses the row), so dropping it leaves the MILP every plan it may choose, up to equal rows (a mix
    in exactly the row's slots is no reason: the row alone is one pool type where the mix is several).

    Rows are taken by capacity (descending), then footprint (ascending), then rate (descending), then position,
    so every row such a mix may use (capacity at least its own and a smaller footprint, or its footprint and at
    least its rate) comes before it. ``F[n]``, the most rate replicas of the rows kept so far give in at most
    ``n`` slots, is an unbounded knapsack over whole slots extended by each kept row; a row dropped earlier
    needs no place in it, the rows that beat it are there. Of equal rows the first stays. Footprints that are
    not whole numbers of slots are scaled to whole numbers where a small factor does it; else nothing is
    dropped."""
    n = len(slots)
    keep = np.ones(n, dtype=bool)
    if n <= 1:
        return keep
    whole = _whole_slots(np.asarray(slots, dtype=float))
    if whole is None or whole.min() < 1:
        return keep
    rate = np.asarray(rate, dtype=float)
    best = np.zeros(int(whole.max()) + 1)  # F[n]: most rate in at most n slots from the rows kept so far
    single = np.full(len(best), -np.inf)  # most rate of one kept row of n slots
    for i in np.lexsort((np.arange(n), -rate, whole, -np.asarray(capacity, dtype=float))):
        k = int(whole[i])
        if max(best[k - 1], single[k]) >= rate[i] * (1 - 1e-12):
            keep[i] = False
            continue
        _add_replicas(best, k, rate[i])
        single[k] = max(single[k], rate[i])
    return keep


def _whole_slots(slots: np.ndarray, most: int = 1 << 16) -> np.ndarray | None:
    """``slots`` times the smallest factor of 1 to 100 that makes each a whole number (at most ``most``),
    as integers; ``None`` where none does."""
    for f in range(1, 101):
        v = slots * f
        r = np.rint(v)
        if np.all(np.abs(v - r) <= 1e-9 * np.maximum(v, 1.0)):
            return r.astype(np.int64) if r.max() <= most else None
    return None


def _add_replicas(best: np.ndarray, k: int, q: float) -> None:
    """``best[n] = max over j of best[n - j k] + j q`` in place: any number of replicas of ``k`` slots and rate
    ``q`` added to the rows ``best`` is of. Along each residue of ``n`` modulo ``k`` that is a running maximum
    of ``best[n] - (n // k) q``, one vectorised pass."""
    size = len(best)
    rows = -(-size // k)
    pad = np.full(rows * k, -np.inf)
    pad[:size] = best
    grid = pad.reshape(rows, k)
    step = np.arange(rows, dtype=float)[:, None] * q
    best[:] = (np.maximum.accumulate(grid - step, axis=0) + step).reshape(-1)[:size]


def prefix_shares(workloads, low: float = 1.0, high: float = 1.0) -> dict[str, tuple[float, float]]:
    """Per workload that reuses prefixes, the range ``(lo, hi)`` of prefix working set per request/s (bytes
    per req/s) a model may be given: the scenario's ``working_set / requests_per_s`` times ``low`` and ``high``
    (a caller that will change demand or working sets widens it), the lowest positive period of a traffic
    profile setting ``hi``. Workloads without prefix reuse need no range (every row holds its none)."""
    out = {}
    for w in workloads:
        pc = w.prefix_cache
        if pc.hit_rate <= 0 or pc.working_set_gb <= 0:
            out[w.name] = (0.0, 0.0)
            continue
        ws = pc.working_set_gb * GB
        least = min((v for v in (w.profile or ()) if v > 0), default=w.requests_per_s)
        out[w.name] = (ws / w.requests_per_s * low, ws / least * high)
    return out


def usable_share(pcap, rate, share: tuple[float, float] | None) -> np.ndarray:
    """Rows' prefix bytes per request/s as pruning compares them, for a ``working_set / demand`` anywhere in
    ``share = (lo, hi)``: at most ``hi`` (a row above it is usable wherever a row at ``hi`` is), and -1 for a
    row below ``lo`` (usable nowhere in the range: it dominates no usable row). ``None``: any range."""
    q = np.maximum(np.asarray(rate, dtype=float), 1e-300)
    v = np.asarray(pcap, dtype=float) / q
    if share is None:
        return v
    lo, hi = share
    return np.where(v >= lo * (1 - 1e-9), np.minimum(v, hi), -1.0)


def nondominated(slots, rate, capacity, tpot, groups=None) -> np.ndarray:
    """Mask of the rows of one (workload, role, hardware, prefix tier) group that :func:`prune_dominated`
    keeps; ``capacity`` is each row's prefix bytes per request/s as :func:`usable_share` gives it. Rows in
    order of footprint (ascending), rate and capacity (descending), TPOT (ascending), then position; a row goes
    when an earlier row of its footprint has at least its capacity (it has at least its rate), or a row of a
    footprint ``k`` times smaller, ``k`` whole, gives at least its rate ``k`` times over and has at least its
    capacity. The first test leaves a few rows per footprint (the Pareto front of rate and capacity);
    the second compares those all against all (dominance is transitive, so being dominated by any of them is
    being dominated by one that is kept). ``groups``: small non-negative integers, equal exactly where ``slots``
    are (the footprint's index; computed here when not given)."""
    n = len(slots)
    if n <= 1:
        return np.ones(n, dtype=bool)
    if n > 64:
        # Most rows of a chunk trail the fastest row of their footprint in rate and capacity: off the front, so
        # never kept. Sorting only the others gives the same answer (rows equal to that best row stay). The
        # footprints are few: per-footprint maxima over a (footprints x rows) table, no sort.
        if groups is None:
            _, groups = np.unique(slots, return_inverse=True)
        g = np.asarray(groups).reshape(-1)
        at = np.arange(n)
        table = np.full((int(g.max()) + 1, n), -np.inf)
        table[g, at] = rate
        qb = table.max(axis=1)[g]
        top = rate == qb
        table.fill(-np.inf)
        table[g[top], at[top]] = capacity[top]
        cb = table.max(axis=1)[g]
        live = np.flatnonzero(~((rate <= qb) & (capacity <= cb) & ((rate < qb) | (capacity < cb))))
        if live.size < n:
            keep = np.zeros(n, dtype=bool)
            keep[live[_front_kept(slots[live], rate[live], capacity[live], tpot[live])]] = True
            return keep
    return _front_kept(slots, rate, capacity, tpot)


def _front_kept(slots, rate, capacity, tpot) -> np.ndarray:
    """:func:`nondominated` on rows already cleared of those that trail their footprint's fastest row (or on
    few rows): the sort, the front of each footprint and the whole-multiple test."""
    n = len(slots)
    order = np.lexsort((tpot, -capacity, -rate, slots))  # stable: ties stay in position order
    S, Q, C = slots[order], rate[order], capacity[order]
    # Front of each footprint: capacity above every earlier row's of that footprint. One running maximum over
    # keys that put each footprint above the ones before it (footprint index, then capacity's dense rank) is
    # exact and needs no loop over footprints.
    group = np.cumsum(np.concatenate(([0], S[1:] != S[:-1])))
    _, rank = np.unique(C, return_inverse=True)
    key = group * (n + 1) + rank.reshape(-1)
    prev = np.empty(n, dtype=key.dtype)
    prev[0] = -1
    np.maximum.accumulate(key[:-1], out=prev[1:])
    P = np.flatnonzero(key > prev)
    keep = np.zeros(n, dtype=bool)
    for lo in range(0, len(P), 1024):  # blocks of rows against every front row: memory stays small
        i = P[lo:lo + 1024]
        ratio = S[i][:, None] / S[P][None, :]
        k = np.rint(ratio)
        covered = ((np.abs(ratio - k) < 1e-9) & (k > 1)
                   & (k * Q[P][None, :] >= Q[i][:, None] * (1 - 1e-12))
                   & (C[P][None, :] >= C[i][:, None] * (1 - 1e-12))).any(axis=1)
        keep[order[i[~covered]]] = True
    return keep


def _variants(setup: Setup, grid: dict[str, np.ndarray], w: Workload, role: str, memo: dict | None = None):
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


def _memory(setup: Setup, grid: dict[str, np.ndarray], w: Workload, role: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per grid row: weight (with drafts) and KV bytes per chip, and HBM left free (negative: does not fit)."""
    L = [grid[k].astype(float) for k in ("tp", "ep", "pp", "attn_dp")]
    B = grid["batch"].astype(float)
    spec = grid["spec"].astype(float) if role != "prefill" else np.zeros_like(B)
    model, copies = setup.model, grid["expert_copies"]
    wchip = weight_bytes_per_chip(setup.wb, *L, copies) + draft_bytes_per_chip(model, setup.wb, *L, copies, spec)
    I, O = float(w.input_tokens), float(w.output_tokens)
    if role == "prefill":
        kv = kv_bytes_per_chip(model, L[3], I, setup.kv_dtype, L[0], L[2], L[3])
    else:
        kv = kv_bytes_per_chip(model, B, I + O, setup.kv_dtype, L[0], L[2], L[3])
    return wchip, kv, setup.hw.hbm_bytes - wchip - kv - runtime_reserve_bytes(setup.hw)


def _spill_fits(hw, wchip, free) -> np.ndarray:
    """Rows whose KV does not fit in HBM (``free`` < 0) but whose weights do, with the KV left over within the
    host DRAM it spills to (decode and aggregated rows read it over the host link every step)."""
    over = -free
    return (over > 0) & (hw.hbm_bytes - wchip - runtime_reserve_bytes(hw) > 0) & (over <= hw.host_dram_bytes)


def _variants_of(setup: Setup, grid: dict[str, np.ndarray], w: Workload, role: str, memo: dict | None,
                 key: bytes, mem: tuple):
    """:func:`_variants` on the rows of ``grid`` (``key``: which rows, for the memo; ``mem``: their
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
                "input_share": 1.0,
                "ok_memory": free >= 0,
            }
            yield {"prefix_tier": tier, "kv_tier": "hbm", "bound": pf_bound}, var
            continue
        if h not in by_hit:
            st = agg_decode(setup, *L, B, I, O, new_tokens=I_new, plain=plain) if role == "aggregated" else decode_only
            by_hit[h] = (st.step_s, np.asarray(st.bound))
        step, bound = by_hit[h]
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
            var = {
                **base,
                "host_kv_bytes_per_chip": spill,
                "kv_bytes_per_chip": kv - spill,
                "tpot_s": tpot,
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
                       engine=engine)
    for tags, var, _ in _variants(setup, g, workload, role):
        if tags["kv_tier"] == kv_tier and tags["prefix_tier"] == prefix_tier:
            if not bool(np.broadcast_to(var["ok_memory"], (1,))[0]):
                return None
            return {k: float(np.broadcast_to(v, (1,))[0]) for k, v in var.items() if k != "ok_memory"}
    return None
