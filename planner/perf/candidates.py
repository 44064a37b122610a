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

import itertools
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from planner.catalog.fleet import pool_key
from planner.catalog.scenario import ResolvedScenario, Workload
from planner.catalog.schemas import (
    EngineEfficiency,
    EngineSpec,
    HardwareSpec,
    ModelSpec,
)
from planner.perf import params as P
from planner.perf.grid import (  # noqa: F401  (re-exported)
    MAX_CHIPS_PER_REPLICA,
    PIPELINE,
    WIDE_EP,
    decode_options,
    expert_options,
    expert_rows,
    layout_tuples,
    layouts,
    packing_domain,
    slots_per_replica,
)
from planner.perf.latency import Tail, lognormal_attainment, lognormal_quantile, workload_tail
from planner.perf.pruning import (  # noqa: F401  (re-exported)
    MIX_KEYS,
    PRUNE_KEYS,
    bound_dominated,
    mix_kept,
    mixes_allowed,
    nondominated,
    prefix_shares,
    prune_dominated,
    usable_share,
)
from planner.perf.queueing import BOUNDS, LABELS, PENDING_LOAD, planned_load, queue_wait  # noqa: F401  (re-exported)
from planner.perf.refine import refine_targets, refined_grids
from planner.perf.roofline import Setup
from planner.perf.setup import engine_options
from planner.perf.variants import PREFIX_TIERS, evaluate_point, variants  # noqa: F401  (re-exported)

BATCH_PER_RANK = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
"""Batch limits per attention rank the grid tries (engines take any ``--max-running-requests`` /
``max_batch_size``). Between two of them, each decode and aggregated layout also gets a row at the largest batch
that meets each TPOT target (:mod:`planner.perf.refine`): doubling alone left a pool whose TPOT quantile sat just over
its target at one step to run at half of it (llama-70b-chat cost 1.74x what it costs with the refined rows, the
llama-70b day plans 1.13x); steps of 1.5x instead took 1.5x the rows and still cost llama-70b-chat 1.23x
(``python bench/refine_check.py``)."""
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
    tails: dict[str, Tail] = field(default_factory=dict)
    """Per workload, the SLO quantiles and length spread the pool was evaluated with (:func:`workload_tail`); the
    quantiles and lengths a selection sizes for unless it passes its own."""


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
    maths. A format needs a checkpoint to serve from (:meth:`ModelSpec.weights_source`: the native one, a
    published one, or the engine's quantisation on load) unless the scenario says ``self_quantise``."""
    out = []
    for w in rs.weights_for(model):
        if not rs.scenario.self_quantise and model.weights_source(w, hw.vendor, engine) is None:
            continue  # no published checkpoint in this format, and the engine does not quantise to it on load
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
                        hardware: list[str] | None = None,
                        refine: dict[str, tuple[float, ...]] | None = None) -> CandidatePool:
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
    :func:`merge_pools` joins to the others).

    ``refine``: per workload, the TPOT limits (seconds) at which each decode and aggregated layout also gets a row at
    the largest batch that meets the limit between two grid steps (:mod:`planner.perf.refine`); default every
    level's (:func:`planner.perf.refine.refine_targets`), or the workload's own without levels. A pool streamed for
    some levels and one evaluated whole select the same rows where both were refined alike."""
    sc = rs.scenario
    shares = prefix_shares(sc.workloads) if shares is None else shares
    engine = engine or sc.engine
    cols: dict[str, list] = {}
    labels: dict[str, list] = {k: [] for k in LABELS}
    categories: dict[str, list] = {"bound": list(BOUNDS)}
    counts = {"evaluated": 0, "dropped": 0, "fit": 0}
    slo_drops = {"tpot_slo": 0, "ttft_slo": 0}
    refine = refine_targets(levels, sc.workloads) if refine is None else refine
    groups = [(m, [w for w in sc.workloads if rs.model_for(w.name).id == m.id]) for m in rs.models]
    mine = [h for h in rs.hardware if hardware is None or h.id in hardware]
    for hw, choice, (model, wls) in ((h, c, g) for h in mine for c in engine_choices(rs, h, engine) for g in groups):
        gcols = grid_arrays(model, hw, choice.engine, rs.expert_load_for(model))
        # A prefill pass is one prompt per rank without drafts: only those grid rows are prefill candidates (the
        # others differ in decode batch and drafts alone), so only they are evaluated for that role.
        one = (gcols["b_rank"] == 1) & (gcols["spec"] == 0)
        by_role = {"prefill": {k: v[one] for k, v in gcols.items()}}
        # each row's footprint as a small integer, for the dominance test's per-footprint maxima
        slots = np.unique(gcols["slots"])
        setups = [(wdt, mode, kdt, Setup.make(model, hw, weights=wdt, kv=kdt, eff=choice.eff,
                                              engine=choice.engine.id, **engine_options(choice.engine)))
                  for (wdt, mode), kdt in itertools.product(weight_options(rs, model, hw, choice.engine),
                                                            kv_options(sc.kv_cache, choice.engine))]
        roles = [r for r in roles_for(sc.serving) if r == "aggregated" or choice.engine.features.disaggregation]
        base = {"model": model.id, "hardware": hw.id, "engine": choice.engine.id,
                "factors": "fitted" if choice.fitted else "hardware default"}
        done: list[_Part] = []  # this grid's evaluated rows, emitted below in the loops' order
        for wi, w in enumerate(wls):
            parts = _grid_parts(setups, roles, {**dict.fromkeys(roles, gcols), **by_role}.get, slots, w, wi, base, 0,
                                counts)
            tail = workload_tail(w)
            if refine.get(w.name):
                # a row per layout at the largest batch that meets each TPOT target between two grid steps
                seen = [(pt.tags["role"], pt.gat, pt.column("tpot_s"), pt.column("tpot_cv")) for pt in parts]
                extra = refined_grids(gcols, seen, tail.tpot_q, refine[w.name], len(BATCH_PER_RANK))
                parts += _grid_parts(setups, roles, extra.get, slots, w, wi, base, REFINED_KEY, counts)
            if levels:
                for k, v in _filter_parts(parts, w.name, tail, levels, sc.utilisation_cap,
                                          lambda role, hw=hw, e=choice.engine.id: _derate(rs, hw, e, role),
                                          shares.get(w.name)).items():
                    slo_drops[k] += v
            done.extend(parts)
        done.sort(key=lambda part: part.key)  # weight and KV format, workload, role, tier: the order rows always had
        _collect(done, cols, labels, categories, rs.prices[hw.id])
    if not labels["bound"]:
        cols = {}  # no row kept
    pool = CandidatePool(pd.DataFrame(), counts["evaluated"], counts["dropped"], sc.utilisation_cap,
                         tuple(levels or ()), counts["fit"],
                         slo_drops if levels else {}, dict(shares), mixes_allowed(sc),
                         scenario_tails(sc.workloads))
    if not cols:
        return pool
    data = {k: np.concatenate(v) for k, v in cols.items()}
    data.update({k: pd.Categorical.from_codes(np.concatenate(v), categories[k]) for k, v in labels.items()})
    pool.rows = pd.DataFrame(data)
    pool.rows["margin_derate"] = margin_derate(rs, pool.rows)
    return pool


REFINED_KEY = 100
"""Offset of the refined rows' variant index in a part's key: they follow the grid's rows of the same format, workload
and role, in both a streamed pool and one evaluated whole."""


def _grid_parts(setups, roles, grid_of, slots: np.ndarray, w: Workload, wi: int, base: dict, offset: int,
                counts: dict) -> list[_Part]:
    """The parts of workload ``w`` (``wi``-th of its model) evaluated on each role's grid (``grid_of(role)``, None to
    skip the role), for every weight and KV format in ``setups``; ``counts`` gains the rows evaluated, dropped for
    memory and fitting. ``offset``: added to the variant index of each part's key."""
    parts: list[_Part] = []
    for si, (wdt, mode, kdt, setup) in enumerate(setups):
        memos: dict = {}  # per grid, the disaggregated decode step its aggregated and decode roles share
        for ri, role in enumerate(roles):
            g = grid_of(role)
            if g is None:
                continue
            memo = memos.setdefault(id(g), {})
            size = len(g["batch"])
            foot = np.searchsorted(slots, g["slots"])
            for vi, (tags, var, rows) in enumerate(variants(setup, g, w, role, memo)):
                m = size if rows is None else len(rows)  # var's columns are over the grid's ``rows``
                ok = np.broadcast_to(var.pop("ok_memory"), (m,))
                n = int(ok.sum())
                counts["evaluated"] += size
                counts["dropped"] += size - n
                counts["fit"] += n
                if n == 0:
                    continue
                at = np.flatnonzero(ok)  # positions in var's columns
                gat = at if rows is None else rows[at]  # the same rows' positions in the grid
                tags = {**tags, **base, "workload": w.name, "role": role, "weights_dtype": wdt, "weights_mode": mode,
                        "kv_dtype": kdt}
                parts.append(_Part((si, wi, ri, offset + vi), tags, var, g, m, at, gat, foot))
    return parts


def _filter_parts(parts: list[_Part], workload: str, tail: Tail, levels, utilisation_cap: float, derate,
                  share) -> dict[str, int]:
    """Filter and prune each (role, prefix tier) of a workload on one grid in one pass over its rows of every weight
    and KV format and KV tier: part of one group of the dominance test (PRUNE_KEYS), so what a level's selection
    keeps is kept, in a few calls instead of one per format and tier (docs/formulation.md section 1). Narrows each
    part's rows in place; returns the rows each SLO dropped."""
    drops_total = {"tpot_slo": 0, "ttft_slo": 0}
    by_group: dict[tuple[str, str], list[_Part]] = {}
    for part in parts:
        by_group.setdefault((part.tags["role"], part.tags["prefix_tier"]), []).append(part)
    for (role, _), group in by_group.items():
        sub = {k: np.concatenate([part.column(k) for part in group]) for k in FILTER_COLUMNS}
        sub["footprint"] = np.concatenate([part.foot[part.gat] for part in group])
        sel, drops = _stream_filter(sub, role, tail, workload, levels, utilisation_cap, derate(role), share)
        for k, v in drops.items():
            drops_total[k] += v
        ends = np.cumsum([part.at.size for part in group])
        for part, mine_ in zip(group, np.split(sel, ends[:-1]), strict=True):
            part.at, part.gat = part.at[mine_], part.gat[mine_]
    return drops_total


def _collect(done: list[_Part], cols: dict, labels: dict, categories: dict, price: float) -> None:
    """Append the kept rows of ``done`` (in order) to the pool's columns and label codes. Every label a fitting row
    has is a category, in the order of the loops, whether or not a row of it is kept: the pool's categories are
    those of the pool evaluated whole."""
    for part in done:
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
        cols.setdefault("usd_per_hour", []).append(chunk["chips"] * price)


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
    foot: np.ndarray
    """Each row of ``g``'s footprint (its slots) as a small integer, for the dominance test's per-footprint maxima."""

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
                         first.mixes, first.tails)
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


FILTER_COLUMNS = ("tpot_s", "tpot_cv", "batch", "capacity_rps", "ttft_base_s", "queue_work_s", "queue_servers", "slots",
                  "prefix_bytes_per_replica")


def slo_terms(tail: Tail, role: str, tpot, cv, tpot_target) -> tuple[np.ndarray, np.ndarray | float]:
    """(rows that meet the TPOT target, the TTFT quantile each must meet) under a workload's :class:`Tail`: TPOT
    at its quantile (lognormal of the row's mean and spread); with a goodput target ``g`` an aggregated row's
    TTFT quantile rises to ``g / P(TPOT ok)`` (the two taken as independent), and a disaggregated pool's two
    roles each meet ``sqrt(g)``. NaN: the mean."""
    tpot = np.asarray(tpot, dtype=float)
    q_tp = np.nan if tail.tpot_q is None else tail.tpot_q
    ok = lognormal_quantile(tpot, cv, q_tp) <= tpot_target
    qt = np.nan if tail.ttft_q is None else tail.ttft_q
    if tail.goodput is None or role == "prefill":
        return ok, (tail.ttft_sizing_q if role == "prefill" and tail.ttft_sizing_q is not None else qt)
    a = lognormal_attainment(tpot, cv, tpot_target)
    g = tail.goodput
    if role == "decode":
        return ok & (a >= np.sqrt(g)), qt
    return ok & (a > g), np.fmax(qt, g / np.maximum(a, 1e-300))


def slot_queue(role: str, batch, tail: Tail):
    """The ``slots`` argument of :func:`planned_load` for rows of one role: an aggregated replica's requests wait
    for one of its ``batch`` slots; a prefill replica's hand their KV on and hold none."""
    return (np.asarray(batch, dtype=float), tail.cv2_out) if role == "aggregated" else None


def handover_queue(role: str, batch, tail: Tail):
    """The ``handover`` argument of :func:`planned_load` for rows of one role: a disaggregated decode replica's
    ``batch`` slots and the chance a handed-over request may find them all held (:attr:`Tail.handover_miss`)."""
    if role != "decode" or tail.handover_miss is None:
        return None
    return np.asarray(batch, dtype=float), tail.handover_miss


def _stream_filter(chunk: dict[str, np.ndarray], role: str, tail: Tail, workload: str, levels, cap: float,
                   derate: float, share: tuple[float, float] | None) -> tuple[np.ndarray, dict[str, int]]:
    """Rows of one evaluated chunk (one workload, role, hardware, prefix tier) that some SLO level needs (see
    :func:`evaluate_candidates`), and how many miss the first level's TPOT and TTFT."""
    tp, cv = chunk["tpot_s"], chunk["tpot_cv"]
    keep = np.zeros(len(tp), dtype=bool)
    pairs = list(dict.fromkeys(lv[workload] for lv in levels))
    # Only rows within some level's TPOT need their load (the queue's inversion is the costly part).
    q_tp = np.nan if tail.tpot_q is None else tail.tpot_q
    tpq = lognormal_quantile(tp, cv, q_tp)
    cand = np.flatnonzero(tpq <= max(t for _, t in pairs))
    # The TTFT quantile depends on the TPOT level only under a goodput target (aggregated rows).
    by_tpot = tail.goodput is not None and role == "aggregated"
    keys = list(dict.fromkeys((f, t if by_tpot else None) for f, t in pairs))
    lams = _loads(chunk, cand, role, tail, keys, pairs, by_tpot, cap, derate, share)
    loads: dict[tuple, np.ndarray] = {}
    for key, lam in zip(keys, lams, strict=True):
        # a looser TTFT that changes no row's load (none is queue-bound) needs no pruning of its own
        loads[key] = next((v for v in loads.values() if np.array_equal(v, lam, equal_nan=True)), lam)
    drops = {}
    done: set[tuple[int, float]] = set()
    for i, (ttft, tpot) in enumerate(pairs):
        lam = loads[(ttft, tpot if by_tpot else None)]
        if (id(lam), tpot) in done:
            continue
        done.add((id(lam), tpot))
        good_tpot = slo_terms(tail, role, tp[cand], cv[cand], tpot)[0]
        ok = good_tpot & (lam > 0)
        if i == 0:
            n_tpot = int((tpq > tpot).sum()) + int((~good_tpot & (tpq[cand] <= tpot)).sum())
            met = int((ok | (good_tpot & (lam == PENDING_LOAD))).sum())  # rows not searched meet it below the cap
            drops = {"tpot_slo": n_tpot, "ttft_slo": len(tp) - n_tpot - met}
        idx = cand[ok]
        if idx.size:
            rate = lam[ok] / derate
            keep[idx[nondominated(chunk["slots"][idx], rate,
                                  usable_share(chunk["prefix_bytes_per_replica"][idx], rate, share), tpq[idx],
                                  chunk["footprint"][idx])]] = True
    if role != "prefill":
        keep[np.argmin(tpq)] = True
    first = tpq <= pairs[0][1]
    if role != "decode" and first.any():
        keep[np.flatnonzero(first)[np.argmin(chunk["ttft_base_s"][first])]] = True
    return keep, drops


def _loads(chunk: dict[str, np.ndarray], cand: np.ndarray, role: str, tail: Tail, keys: list, pairs: list,
           by_tpot: bool, cap: float, derate: float, share) -> np.ndarray:
    """Per TTFT key of :func:`_stream_filter` (rows) and candidate row ``cand`` (columns), the load it is planned for
    (:func:`planned_load`), searched below the cap only where it can matter: first every row at its cap (one
    evaluation each), then the search for the rows below it that no row at its cap provably beats in every TPOT level
    of that key they meet (:func:`bound_dominated`: its rate above their cap's, its prefix capacity at least what
    theirs can be). The others stay :data:`PENDING_LOAD`: the dominance test drops them whatever their load, so what
    it keeps is the same as with every load searched (``tests/test_candidates.py``)."""
    tp, cv, n = chunk["tpot_s"][cand], chunk["tpot_cv"][cand], cand.size
    sub = {k: np.broadcast_to(chunk[k][cand], (len(keys), n))
           for k in ("capacity_rps", "ttft_base_s", "queue_work_s", "queue_servers")}
    lim = np.asarray([f for f, _ in keys], dtype=float)[:, None]
    quant = np.stack([np.broadcast_to(np.asarray(slo_terms(tail, role, tp, cv, t if t is not None else pairs[0][1])[1],
                                                 dtype=float), (n,)) for _, t in keys])
    batch = chunk["batch"][cand]
    common = dict(with_ttft=False, nodes=(np.asarray(tail.x), np.asarray(tail.p)), cs2=tail.cs2)
    lams = planned_load(sub, lim, cap, quantile=quant, slots=slot_queue(role, batch, tail),
                        handover=handover_queue(role, batch, tail), search=False, **common)[0]
    pend = lams == PENDING_LOAD
    if not pend.any():
        return lams
    foot, pcap = chunk["footprint"][cand], chunk["prefix_bytes_per_replica"][cand]
    # capacity falls with the rate: its most is at no load, unbounded for a row that holds prefixes unless the range
    # of shares caps it
    with np.errstate(over="ignore"):
        bound = np.where(pcap > 0, np.inf, 0.0) if share is None else usable_share(pcap, 0.0, share)
    upper = cap * chunk["capacity_rps"][cand] / derate
    need = pend.copy()
    for k, key in enumerate(keys):
        beaten = np.ones(n, dtype=bool)
        for _, t in (p for p in pairs if (p[0], p[1] if by_tpot else None) == key):
            good = slo_terms(tail, role, tp, cv, t)[0]
            rate = np.where(good & (lams[k] > 0), lams[k] / derate, np.nan)
            beaten &= ~(good & pend[k]) | bound_dominated(foot, rate, usable_share(pcap, rate, share),
                                                           np.where(good & pend[k], upper, np.nan), bound)
        need[k] &= ~beaten
    if need.any():
        ki, ri = np.nonzero(need)
        lams[ki, ri] = planned_load({c: v[ki, ri] for c, v in sub.items()}, lim[ki, 0], cap, quantile=quant[ki, ri],
                                    slots=slot_queue(role, batch[ri], tail), handover=handover_queue(role, batch[ri], tail),
                                    **common)[0]
    return lams


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


def select_candidates(pool: CandidatePool, slos: dict[str, tuple[float, float]], *, prune: bool = True,
                      tails: dict[str, Tail] | None = None, keep: set[tuple] | None = None) -> CandidateTable:
    """Rows meeting each workload's ``(ttft_s, tpot_s)`` SLO, at the quantiles of its :class:`Tail` (``tails``,
    default the pool's), at the load they are planned for (see :func:`planned_load`), pruned of dominated
    rows; rows of the pool identities in ``keep`` (a deployed fleet's, :func:`pool_keys`) are pruned only among
    themselves."""
    r = pool.rows
    dropped = {"memory": pool.dropped_memory, "tpot_slo": 0, "ttft_slo": 0, "dominated": 0}
    if r.empty:
        return CandidateTable(r, dropped, pool.evaluated)
    tails = pool.tails if tails is None else tails
    n = len(r)
    ttft_lim, good_tpot, qt = np.zeros(n), np.zeros(n, dtype=bool), np.full(n, np.nan)
    K = max(len(tails.get(k, Tail()).x) for k in r["workload"].cat.categories)
    xs, ps, cs2 = np.ones((n, K)), np.zeros((n, K)), np.zeros(n)
    for (wname, role), idx in r.groupby(["workload", "role"], observed=True).indices.items():
        tail = tails.get(str(wname), Tail())
        ttft_lim[idx] = slos[str(wname)][0]
        ok, q = slo_terms(tail, str(role), r["tpot_s"].to_numpy()[idx], r["tpot_cv"].to_numpy()[idx],
                          slos[str(wname)][1])
        good_tpot[idx], qt[idx] = ok, q
        k = len(tail.x)
        xs[idx, :k], ps[idx, :k], cs2[idx] = tail.x, tail.p, tail.cs2
    bad_tpot = ~good_tpot
    agg = (r["role"] == "aggregated").to_numpy()
    cv2_out = np.array([tails.get(str(k), Tail()).cv2_out for k in r["workload"].cat.categories])[r["workload"].cat.codes]
    dec = (r["role"] == "decode").to_numpy()
    miss = np.array([np.nan if tails.get(str(k), Tail()).handover_miss is None else tails[str(k)].handover_miss
                     for k in r["workload"].cat.categories])[r["workload"].cat.codes]
    lam, t = planned_load(r, ttft_lim, pool.utilisation_cap, quantile=qt, nodes=(xs, ps), cs2=cs2,
                          slots=(np.where(agg, r["batch"].to_numpy(float), 0.0), cv2_out),
                          handover=(np.where(dec, r["batch"].to_numpy(float), 0.0), miss))
    bad_ttft = ~bad_tpot & ~(lam > 0)
    dropped["tpot_slo"] = int(bad_tpot.sum())
    dropped["ttft_slo"] = int(bad_ttft.sum())
    good = ~(bad_tpot | bad_ttft)
    rows = r[good].copy()
    rows["pool_row"] = rows.index.to_numpy()  # the row's position in the pool: one identity across SLO levels
    rows["requests_per_s"] = lam[good] / (rows["margin_derate"].to_numpy() if "margin_derate" in rows else 1.0)
    rows["ttft_s"] = t[good]
    rows["tpot_slo_s"] = tpot_at_slo(rows, tails)
    rows["usd_per_rps"] = rows["usd_per_hour"] / np.maximum(rows["requests_per_s"], 1e-12)
    if prune:
        protect = deployed_rows(rows, keep) if keep is not None else None
        rows, dropped["dominated"] = prune_dominated(rows, pool.shares, mixes=pool.mixes and not keep, protect=protect)
    if pool.levels and pool.base_slo_drops and slos == pool.levels[0]:
        # counted as the rows were streamed: the pool no longer holds most of the rows that missed or were dominated
        dropped.update(pool.base_slo_drops)
        dropped["dominated"] = pool.fit - pool.base_slo_drops["tpot_slo"] - pool.base_slo_drops["ttft_slo"] - len(rows)
    return CandidateTable(rows.reset_index(drop=True), dropped, pool.evaluated)


def deployed_rows(rows: pd.DataFrame, keys: set[tuple]) -> np.ndarray:
    """Whether each row is of a deployed pool's identity in ``keys`` (a pool given without a weight format
    matches any)."""
    return np.array([k in keys or (*k[:-1], "") in keys for k in pool_keys(rows)], dtype=bool)


def pool_keys(rows: pd.DataFrame) -> np.ndarray:
    """Each row's pool identity (:func:`planner.catalog.fleet.pool_key`), one tuple per row."""
    cols = [rows[c].astype(str).to_numpy() for c in ("workload", "role", "hardware", "engine")]
    ints = [rows[c].to_numpy(int) for c in ("tp", "ep", "pp", "attn_dp")]
    wd = rows["weights_dtype"].astype(str).to_numpy()
    out = np.empty(len(rows), dtype=object)
    for i in range(len(rows)):
        out[i] = pool_key(*(c[i] for c in cols), *(c[i] for c in ints), wd[i])
    return out


def build_candidates(rs: ResolvedScenario, engine: str | None = None, *, prune: bool = True) -> CandidateTable:
    """Evaluate, filter by the scenario's SLOs and prune (see :func:`select_candidates`)."""
    pool = evaluate_candidates(rs, engine)
    return select_candidates(pool, scenario_slos(rs.scenario.workloads), prune=prune)


def tpot_at_slo(rows: pd.DataFrame, tails: dict[str, Tail]) -> np.ndarray:
    """Each row's TPOT at its workload's TPOT quantile (the mean where the SLO is on the mean)."""
    out = rows["tpot_s"].to_numpy(float).copy()
    for wname, idx in rows.groupby("workload", observed=True).indices.items():
        q = tails.get(str(wname), Tail()).tpot_q
        if q is not None:
            out[idx] = lognormal_quantile(out[idx], rows["tpot_cv"].to_numpy(float)[idx], q)
    return out


def scenario_tails(workloads: list[Workload]) -> dict[str, Tail]:
    """Each workload's :class:`Tail` (SLO quantiles and length spread)."""
    return {w.name: workload_tail(w) for w in workloads}


def scenario_slos(workloads: list[Workload]) -> dict[str, tuple[float, float]]:
    return {w.name: (w.slo.ttft_s, w.slo.tpot_s) for w in workloads}


