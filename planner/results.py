"""Solution -> :class:`Plan` (pydantic), packing of replicas into purchase units, and
:func:`recheck`, which re-evaluates a plan with ``perf/`` alone.

After :func:`extract` nothing here touches Pyomo again.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Annotated, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from planner.catalog.ids import CATALOG_ID, CatalogId, EngineId, FileName, NameId, PoolId
from planner.catalog.scenario import ResolvedScenario
from planner.catalog.schemas import DEFAULT_CHUNK_TOKENS
from planner.model.build import solution_values  # noqa: F401  (re-exported: plans are read from solved models)
from planner.model.data import PlanData
from planner.model.families import FAMILIES
from planner.perf.candidates import evaluate_point, packing_domain, planned_load
from planner.perf.layout import Layout, check_layout, describe_layout
from planner.solve import SolveResult
from planner.units import HOUR_S, MTOK

SCHEMA_VERSION = "2.5"
"""2.1: ``software`` (planner, solver and Pyomo versions); 2.2: a ``model`` per pool and workload; 2.3:
``binding_constraints[].saving_proven``; 2.5: ``day`` (a traffic profile's cost over the day). A change of the contract changes this."""
REL_TOL = 1e-6


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


ModelRef = Annotated[str, Field(pattern=CATALOG_ID + "|^$")]
"""A pool's or workload's model id (empty in plans before schema 2.2)."""


class Objective(_M):
    usd_per_hour: float
    usd_per_mtok: float
    usd_per_mtok_input: float
    usd_per_mtok_output: float


class SolverInfo(_M):
    status: str
    termination: str
    mip_gap: float | None
    wall_s: float
    mip_gap_target: float
    time_limit_s: float
    candidates_s: float = 0.0
    build_s: float = 0.0
    candidates: dict[str, int] = {}


class UnitGroup(_M):
    hardware: CatalogId
    kind: str
    count: int
    chips: int
    chips_used: int
    usd_per_hour: float
    kw: float | None


class LayoutOut(_M):
    """Parallel layout of one replica, in the notation engines use."""

    tp: int
    """Tensor-parallel degree of attention (and of the dense layers) within one attention rank."""
    ep: int
    """Expert-parallel degree (1: experts split by tensor parallelism over the stage)."""
    pp: int
    """Pipeline stages."""
    attn_dp: int
    """Attention data-parallel ranks (SGLang DP attention, TRT-LLM ADP): each rank holds attention for its own
    sequences; the experts are shared by all ``tp * attn_dp`` GPUs of a stage. A replica is one engine
    instance of ``tp * attn_dp * pp`` GPUs, not ``attn_dp`` replicas."""
    redundant_experts: int = 0
    """Redundant expert slots (EP divides experts + redundant)."""
    notation: str = ""
    """``attn-DP72 EP72 +32 redundant``, ``TP8``, ``TP4 EP4 PP2``."""


class Predicted(_M):
    ttft_s: float
    """Mean TTFT at the load the plan routes to the pool (open arrivals; 0 for decode pools)."""
    tpot_s: float
    requests_per_s: float
    """Requests/s the pool is planned to carry at most (its capacity in the plan)."""
    utilisation: float = 1.0
    """Share of that capacity the plan's demand uses (traffic split over a workload's pools by capacity)."""
    ttft_at_capacity_s: float = 0.0
    """TTFT if the pool ran at its planned capacity (at most the TTFT target)."""
    input_tokens_per_s: float
    output_tokens_per_s: float
    requests_per_s_per_replica: float


class MemoryPerChip(_M):
    weights: float
    kv: float
    other: float
    capacity: float
    free: float
    host_kv: float = 0.0


class ExpertPlacementOut(_M):
    """Expert placement of an expert-parallel MoE pool (``planner experts`` on the pool's stage)."""

    imbalance: float
    """Max / mean GPU expert load the step time carries (even split among copies)."""
    redundant_experts: int
    gpus: int
    """GPUs one expert-parallel stage spreads the experts over (tp x dp)."""
    slots_per_gpu: int
    map_file: FileName | None = None
    placement_imbalance: float | None = None
    """Imbalance of the MILP placement in ``map_file`` (never above ``imbalance``)."""
    greedy_imbalance: float | None = None
    """The greedy EPLB placement's imbalance, for comparison."""
    mip_gap: float | None = None


class Pool(_M):
    id: PoolId
    role: Literal["aggregated", "prefill", "decode"]
    workload: NameId
    model: ModelRef = ""
    """Catalog id of the model the pool serves (its workload's model)."""
    hardware: CatalogId
    engine: EngineId
    """Serving engine the pool runs (its launch flags follow from it)."""
    factors: str = "fitted"
    """``fitted``: efficiency factors fitted on this hardware and engine's measured rows; ``hardware
    default``: the hardware's fit over all its engines (no rows of this engine on it)."""
    unvalidated: str | None = None
    """Set when the hardware has no measured rows of its own: where its factors come from."""
    physics: str = "datasheet roofline with fitted factors"
    """Where the pool's step times come from: ``kernel curves (SYSTEM's own kernels)``, the terms of the step
    fitted on that system's measured kernels with the end-to-end factors above (hardware whose kernel block says
    ``compose``); or ``datasheet roofline with fitted factors``."""
    replicas: int
    chips_per_replica: int
    slots_per_replica: float
    layout: LayoutOut
    scale_out: bool
    batch: int
    spec_tokens: int = 0
    """Draft tokens per step of speculative decoding (0: off)."""
    spec_method: str | None = None
    tokens_per_step: float = 1.0
    """Expected output tokens per sequence and decode step (speculative decoding accepts some drafts)."""
    two_batch_overlap: bool = False
    """Two micro-batches per step, one's expert exchange under the other's compute."""
    weights_dtype: str
    weights_mode: str = "native"
    """``native``: multiplied in the weight format; ``weight-only``: dequantised into bf16 maths (the
    hardware has no units for the format)."""
    kv_dtype: str
    kv_tier: str
    prefix_tier: str
    prefix_cache_bytes_per_replica: float
    bound: str
    input_share: float
    usd_per_hour: float
    predicted: Predicted
    memory_per_chip_bytes: MemoryPerChip
    expert_placement: ExpertPlacementOut | None = None
    margin_derate: float = 1.0
    """Capacity divided by this factor: the model's measured error at the scenario's margin quantile."""
    router_share: float = 1.0
    """Share of its workload's requests of this role the router sends here (by capacity; with prefix reuse,
    the share of prefix families hashed to this pool)."""


class WorkloadOut(_M):
    name: NameId
    model: ModelRef = ""
    """Catalog id of the model serving the workload."""
    requests_per_s: float
    served_requests_per_s: float
    served_at_prediction_rps: float | None = None
    """With a margin: the capacity at the model's prediction (``served_requests_per_s`` is at the quantile)."""
    input_tokens: int
    output_tokens: int
    ttft_s: float
    tpot_s: float
    slo_ttft_s: float
    slo_tpot_s: float
    serving: str
    prefix_working_set_bytes: float
    prefix_capacity_bytes: float


class Binding(_M):
    name: str
    detail: str
    usd_per_hour_saved: float | None = None
    saving_proven: bool = True
    """False where the re-solve stopped at its time limit before proving its optimum: the saving is then at
    least ``usd_per_hour_saved`` (the detail says so)."""


class PlacedGroup(_M):
    pool: PoolId
    replica: int
    """Replica number of this group in the first unit of the run; in the k-th unit of a run of identical
    units it is ``replica + k * n``, ``n`` the groups of this pool and stage in one unit."""
    stage: int
    chips: int


class UnitPlacement(_M):
    hardware: CatalogId
    unit: int
    """Number of the first unit of this run."""
    count: int = 1
    """Identical units in the run (units ``unit`` to ``unit + count - 1``)."""
    domains: list[list[PlacedGroup]]


class RunnerUp(_M):
    excluded: str
    status: str
    """``optimal``, or ``feasible``: the best plan the analysis's time limit allowed, not proven cheapest."""
    usd_per_hour: float | None = None
    usd_per_hour_floor: float | None = None
    """Where not proven cheapest: what the cheapest plan without the hardware costs at least (the solver's lower
    bound on the objective, less the tie-break term; none where pool types are priced, the objective then holds
    more than the fleet's dollars)."""
    usd_per_mtok: float | None = None
    hardware: list[str] = []
    summary: str = ""


class Check(_M):
    name: str
    ok: bool
    detail: str


class Recheck(_M):
    ok: bool
    checks: list[Check]


class ResilienceOut(_M):
    lose_units: int
    capacity_after_worst_loss_rps: dict[str, float]
    """Per workload: requests/s left after losing the ``lose_units`` units whose loss hurts it most (from the
    placement: a replica is lost when any unit it runs on is lost)."""
    worst_units: dict[str, list[str]] = {}
    headroom_usd_per_hour: float | None = None
    """What the resilience costs: this plan's $/h less the plan without it (None when not priced)."""


class PeriodUnits(_M):
    hardware: CatalogId
    chips_per_unit: int
    reserved: int
    on_demand: int = 0
    spot: int = 0


class PeriodOut(_M):
    period: int
    requests_per_s: dict[str, float]
    capacity_rps: dict[str, float]
    units: list[PeriodUnits]
    usd_per_hour: float
    recheck_ok: bool
    """The period's fleet re-checked by the performance model alone (SLOs, memory, demand, placement)."""


class DayCost(_M):
    """What a traffic profile's fleet costs over the day, against the tokens the day serves."""

    usd_per_day: float
    tokens_per_day: float
    """Input and output tokens the day's requests carry (each period's demand for its share of the day)."""
    output_tokens_per_day: float
    usd_per_mtok: float
    """Dollars per million tokens over the day: the headline of a profile plan."""
    usd_per_mtok_output: float
    peak_usd_per_hour: float
    peak_usd_per_mtok: float
    """The peak period's fleet and price per token (the pools shown), beside the day's."""


class Plan(_M):
    schema_version: str = SCHEMA_VERSION
    scenario: dict
    status: Literal["optimal", "feasible", "infeasible"]
    objective: Objective
    solver: SolverInfo
    units: list[UnitGroup]
    pools: list[Pool]
    workloads: list[WorkloadOut]
    binding_constraints: list[Binding] = []
    runner_up: RunnerUp | None = None
    placement: list[UnitPlacement] = []
    assumptions: list[str] = []
    sources: list[dict] = []
    recheck: Recheck | None = None
    resilience: ResilienceOut | None = None
    periods: list[PeriodOut] = []
    """With a traffic profile: the fleet of every period (the pools above are the peak period's)."""
    usd_per_day: float | None = None
    periods_solver: dict | None = None
    """Status, gap and wall time of the multi-period solve."""
    flat_peak_usd_per_day: float | None = None
    """What provisioning the peak all day at the reserved price costs (this plan's pools, 24 hours)."""
    day: DayCost | None = None
    """A traffic profile's day: $/day and $/M tokens over the day's tokens, with the peak period's beside them."""
    software: dict[str, str] = {}
    """Versions that produced the plan: planner, Pyomo, HiGHS (highspy), Python."""


def software_versions() -> dict[str, str]:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import planner

    out = {"planner": planner.__version__, "python": platform.python_version()}
    for pkg in ("pyomo", "highspy"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "unknown"
    return out


def _expert_out(rs: ResolvedScenario, r) -> ExpertPlacementOut | None:
    moe = rs.model_for(str(r["workload"])).architecture.moe
    if moe is None or int(r["ep"]) <= 1:
        return None
    gpus = int(r["tp"]) * int(r["attn_dp"])
    red = int(r.get("redundant", 0))
    return ExpertPlacementOut(imbalance=float(r.get("moe_imbalance", 1.0)), redundant_experts=red, gpus=gpus,
                              slots_per_gpu=(moe.experts + red) // gpus)


def extract(rs: ResolvedScenario, data: PlanData, x: dict[int, int], u: dict[str, int], solve: SolveResult) -> Plan:
    """Plan from integer replicas per candidate row and units per hardware."""
    sc = rs.scenario
    rows = data.rows
    hw_by_id = {h.id: h for h in rs.hardware}
    pools: list[Pool] = []
    queue: dict[str, tuple[float, float, float]] = {}
    for i, n in sorted(x.items(), key=lambda kv: (str(rows.loc[kv[0], "workload"]), str(rows.loc[kv[0], "role"]), kv[0])):
        r = rows.loc[i]
        w = next(w for w in sc.workloads if w.name == r["workload"])
        role = str(r["role"])
        rate = float(r["requests_per_s"])
        I = w.input_tokens * (1.0 - (w.prefix_cache.hit_rate if str(r["prefix_tier"]) != "none" else 0.0))
        pid = f"{w.name}-{role}-{len([p for p in pools if p.workload == w.name and p.role == role]) + 1}"
        hw = hw_by_id[str(r["hardware"])]
        spec_n = int(r["spec"]) if role != "prefill" else 0
        model = rs.model_for(w.name)
        pools.append(
            Pool(
                id=pid,
                role=role,
                workload=w.name,
                model=model.id,
                hardware=str(r["hardware"]),
                engine=str(r["engine"]),
                factors=str(r["factors"]),
                unvalidated=unvalidated(hw),
                physics=physics_path(hw),
                replicas=n,
                chips_per_replica=int(r["chips"]),
                slots_per_replica=float(r["slots"]),
                layout=LayoutOut(tp=int(r["tp"]), ep=int(r["ep"]), pp=int(r["pp"]), attn_dp=int(r["attn_dp"]),
                                 redundant_experts=int(r.get("redundant", 0)),
                                 notation=describe_layout(r["tp"], r["ep"], r["pp"], r["attn_dp"], r.get("redundant", 0))),
                scale_out=bool(r["scale_out"]),
                batch=int(r["batch"]),
                spec_tokens=spec_n,
                spec_method=model.speculative.method if spec_n and model.speculative else None,
                tokens_per_step=float(_tokens_per_step(model, hw, str(r["engine"]), spec_n)),
                two_batch_overlap=bool(int(r["tbo"])),
                weights_dtype=str(r["weights_dtype"]),
                weights_mode=str(r["weights_mode"]),
                kv_dtype=str(r["kv_dtype"]),
                kv_tier=str(r["kv_tier"]),
                prefix_tier=str(r["prefix_tier"]),
                prefix_cache_bytes_per_replica=float(r["prefix_bytes_per_replica"]),
                bound=str(r["bound"]),
                margin_derate=float(r.get("margin_derate", 1.0)),
                input_share=float(r["input_share"]),
                usd_per_hour=0.0,
                predicted=Predicted(
                    ttft_s=float(r["ttft_s"]),
                    tpot_s=float(r["tpot_s"]),
                    requests_per_s=rate * n,
                    input_tokens_per_s=rate * n * I if role != "decode" else 0.0,
                    output_tokens_per_s=rate * n * w.output_tokens if role != "prefill" else 0.0,
                    requests_per_s_per_replica=rate,
                    ttft_at_capacity_s=float(r["ttft_s"]),
                ),
                memory_per_chip_bytes=MemoryPerChip(
                    weights=float(r["weight_bytes_per_chip"]),
                    kv=float(r["kv_bytes_per_chip"]),
                    other=float(r["other_bytes_per_chip"]),
                    capacity=float(r["hbm_bytes_per_chip"]),
                    free=float(r["hbm_bytes_per_chip"] - r["weight_bytes_per_chip"] - r["kv_bytes_per_chip"] - r["other_bytes_per_chip"]),
                    host_kv=float(r["host_kv_bytes_per_chip"]),
                ),
                expert_placement=_expert_out(rs, r),
            )
        )
        queue[pid] = (float(r["ttft_base_s"]), float(r["queue_work_s"]), float(r["queue_servers"]))
    _apply_load(sc.workloads, pools, queue)
    _router_shares(pools)
    placement, needed = pack(pools, {h: hw_by_id[h] for h in u})
    assumptions = list(data.notes)
    for h, k in needed.items():
        if k > u.get(h, 0):
            assumptions.append(f"{h}: placing the replicas took {k} units where the MILP counted {u.get(h, 0)}; the plan buys {k}")
            u[h] = k
    units = []
    for h, k in u.items():
        if k <= 0:
            continue
        hd = data.hardware[h]
        used = sum(p.chips_per_replica * p.replicas for p in pools if p.hardware == h)
        units.append(
            UnitGroup(
                hardware=h,
                kind=hd.unit_kind,
                count=k,
                chips=k * hd.chips_per_unit,
                chips_used=used,
                usd_per_hour=k * hd.usd_per_unit_hour,
                kw=None if hd.kw_per_chip is None else k * hd.chips_per_unit * hd.kw_per_chip,
            )
        )
    usd = sum(g.usd_per_hour for g in units)
    # Apportion each hardware's cost to its pools by the unit capacity they occupy (idle share pro rata).
    for g in units:
        mine = [p for p in pools if p.hardware == g.hardware]
        slots = sum(p.slots_per_replica * p.replicas for p in mine)
        for p in mine:
            p.usd_per_hour = g.usd_per_hour * p.slots_per_replica * p.replicas / slots if slots else 0.0
    objective = _objective(sc.workloads, pools, usd)
    workloads = [_workload_out(w, pools, rs.model_for(w.name).id) for w in sc.workloads]
    status = solve.status if solve.status in ("optimal", "feasible") else "feasible"
    return Plan(
        scenario={"name": sc.name, "model": rs.model.id, "models": [m.id for m in rs.models],
                  "path": str(rs.path) if rs.path else None},
        status=status,
        objective=objective,
        solver=SolverInfo(
            status=solve.status,
            termination=solve.termination,
            mip_gap=solve.mip_gap,
            wall_s=solve.wall_s,
            mip_gap_target=0.0,
            time_limit_s=0.0,
        ),
        units=units,
        pools=pools,
        workloads=workloads,
        placement=placement,
        assumptions=assumptions,
    )


def physics_path(hw) -> str:
    """Which physics prices a pool on ``hw`` (see :attr:`Pool.physics`)."""
    kf = hw.efficiency.kernels
    if kf is None or not kf.compose:
        return "datasheet roofline with fitted factors"
    return f"kernel curves ({kf.system}'s own kernels)"


def unvalidated(hw) -> str | None:
    """``unvalidated: factors transferred from X`` for hardware without measured rows of its own."""
    eff = hw.efficiency
    if eff.fitted_rows > 0:
        return None
    src = eff.transferred_from or "other hardware"
    return f"unvalidated: factors transferred from {src} (no measured rows for {hw.id})"


def _tokens_per_step(model, hw, engine: str, spec: int) -> float:
    if spec <= 0:
        return 1.0
    from planner.perf.roofline import Setup

    s = Setup.make(model, hw, eff=hw.efficiency.for_engine(engine), spec_tokens=float(spec), engine=engine)
    return float(np.asarray(s.tokens_per_step))


def role_loads(workloads, pools: list[Pool]) -> dict[tuple[str, str], float]:
    """Utilisation of each (workload, role) pool set under the plan's demand: traffic goes to aggregated
    and disaggregated capacity in proportion to their size, and each pool of a role carries its share of
    the role's traffic in proportion to its capacity."""
    out: dict[tuple[str, str], float] = {}
    for w in workloads:
        agg, pre, dec = served_requests(pools, w.name)
        dis = min(pre, dec)
        total = agg + dis
        if total <= 0:
            continue
        for role, cap, routed in (("aggregated", agg, w.requests_per_s * agg / total),
                                  ("prefill", pre, w.requests_per_s * dis / total),
                                  ("decode", dec, w.requests_per_s * dis / total)):
            if cap > 0:
                out[(w.name, role)] = min(routed / cap, 1.0)
    return out


def _router_shares(pools: list[Pool]) -> None:
    """Each pool's share of its workload's requests of its role, in proportion to capacity (all pools of a
    role run at the same utilisation that way)."""
    tot: dict[tuple[str, str], float] = defaultdict(float)
    for p in pools:
        tot[(p.workload, p.role)] += p.predicted.requests_per_s
    for p in pools:
        t = tot[(p.workload, p.role)]
        p.router_share = p.predicted.requests_per_s / t if t > 0 else 0.0


def _apply_load(workloads, pools: list[Pool], queue: dict[str, tuple[float, float, float]]) -> None:
    """Set each pool's utilisation and its TTFT at that load (the candidate row's TTFT is at capacity)."""
    from planner.perf.candidates import queue_wait

    loads = role_loads(workloads, pools)
    for p in pools:
        u = loads.get((p.workload, p.role), 1.0)
        p.predicted.utilisation = u
        if p.role == "decode":
            continue
        base, work, servers = queue[p.id]
        lam = u * p.predicted.requests_per_s_per_replica
        wait = float(queue_wait(lam * work / max(servers, 1.0), servers, work)) if work > 0 else 0.0
        p.predicted.ttft_s = base + wait


def _objective(workloads, pools: list[Pool], usd: float) -> Objective:
    tin = sum(w.requests_per_s * w.input_tokens for w in workloads)
    tout = sum(w.requests_per_s * w.output_tokens for w in workloads)
    cin = sum(p.usd_per_hour * p.input_share for p in pools)
    cout = usd - cin
    per = HOUR_S / MTOK
    return Objective(
        usd_per_hour=usd,
        usd_per_mtok=usd / ((tin + tout) * per),
        usd_per_mtok_input=cin / (tin * per) if tin else 0.0,
        usd_per_mtok_output=cout / (tout * per) if tout else 0.0,
    )


def served_requests(pools: list[Pool], workload: str) -> tuple[float, float, float]:
    """(aggregated, prefill, decode) request capacity of a workload's pools."""
    tot = {"aggregated": 0.0, "prefill": 0.0, "decode": 0.0}
    for p in pools:
        if p.workload == workload:
            tot[p.role] += p.predicted.requests_per_s
    return tot["aggregated"], tot["prefill"], tot["decode"]


def _workload_out(w, pools: list[Pool], model: str) -> WorkloadOut:
    mine = [p for p in pools if p.workload == w.name]
    agg, pre, dec = served_requests(pools, w.name)
    ttft = max([p.predicted.ttft_s for p in mine if p.role != "decode"], default=0.0)
    tpot = max([p.predicted.tpot_s for p in mine if p.role != "prefill"], default=0.0)
    roles = {p.role for p in mine}
    serving = "aggregated" if roles == {"aggregated"} else "disaggregated" if "aggregated" not in roles else "mixed"
    ws = w.prefix_cache.working_set_gb * 1e9 if w.prefix_cache.hit_rate > 0 else 0.0
    raw = defaultdict(float)
    for p in mine:
        raw[p.role] += p.predicted.requests_per_s * p.margin_derate
    derated = any(p.margin_derate != 1.0 for p in mine)
    return WorkloadOut(
        name=w.name,
        model=model,
        requests_per_s=w.requests_per_s,
        served_requests_per_s=agg + min(pre, dec),
        served_at_prediction_rps=raw["aggregated"] + min(raw["prefill"], raw["decode"]) if derated else None,
        input_tokens=w.input_tokens,
        output_tokens=w.output_tokens,
        ttft_s=ttft,
        tpot_s=tpot,
        slo_ttft_s=w.slo.ttft_ms / 1e3,
        slo_tpot_s=w.slo.tpot_ms / 1e3,
        serving=serving,
        prefix_working_set_bytes=ws,
        prefix_capacity_bytes=sum(p.prefix_cache_bytes_per_replica * p.replicas for p in mine if p.prefix_tier != "none"),
    )


def pack(pools: list[Pool], hardware: dict) -> tuple[list[UnitPlacement], dict[str, int]]:
    """Place every replica's stage groups (``tp * attn_dp`` chips each) into packing domains, first fit by
    decreasing size, then domains into purchase units. Returns the map, runs of identical units compressed
    into one entry each, and the units it needs.

    Linear in the number of group kinds, not of replicas: identical groups are placed by count (a fleet of
    a million replicas packs in microseconds), domains are kept as patterns with multiplicities.
    """
    out: list[UnitPlacement] = []
    needed: dict[str, int] = {}
    for h, hw in hardware.items():
        D = packing_domain(hw)
        per_unit = hw.purchase_unit.chips_per_unit // D
        kinds: list[tuple[int, str, int, int]] = []  # (group chips, pool, stage, count)
        for p in pools:
            if p.hardware == h and p.replicas > 0:
                g = p.layout.tp * p.layout.attn_dp
                kinds += [(g, p.id, st, p.replicas) for st in range(1, p.layout.pp + 1)]
        kinds.sort(key=lambda t: -t[0])
        # Domain patterns: [groups: tuple of (pool, stage, chips, n), free chips, count of such domains]
        pats: list[list] = []
        for g, pid, st, n in kinds:
            if g > D:
                k = math.ceil(g / D)
                for j in range(k):
                    c = min(D, g - j * D)
                    pats.append([((pid, st, c, 1),), D - c, n])
                continue
            left = n
            i = 0
            while left > 0 and i < len(pats):
                groups, free, cnt = pats[i]
                take = free // g
                if take <= 0:
                    i += 1
                    continue
                full = min(cnt, left // take)
                part = left - full * take if full < cnt else 0
                new = []
                if full:
                    new.append([groups + ((pid, st, g, take),), free - take * g, full])
                if part:
                    new.append([groups + ((pid, st, g, part),), free - part * g, 1])
                rest = cnt - full - (1 if part else 0)
                if rest:
                    new.append([groups, free, rest])
                left -= full * take + part
                pats[i:i + 1] = new
                i += len(new) - (1 if rest else 0)
            if left > 0:
                per = D // g
                full, part = divmod(left, per)
                if full:
                    pats.append([((pid, st, g, per),), D - per * g, full])
                if part:
                    pats.append([((pid, st, g, part),), D - part * g, 1])
        domains_total = sum(c for _, _, c in pats)
        n_units = math.ceil(domains_total / per_unit) if domains_total else 0
        needed[h] = n_units
        out += _units_of(h, pats, per_unit)
    return out, needed


def _units_of(h: str, pats: list[list], per_unit: int) -> list[UnitPlacement]:
    """Group domain patterns (with multiplicities) into purchase units of ``per_unit`` domains, runs of
    identical units compressed; replica numbers follow placement order per (pool, stage)."""
    counter: dict[tuple[str, int], int] = defaultdict(int)
    out: list[UnitPlacement] = []
    unit_no = 1
    buf: list[tuple] = []  # domain patterns (groups) of the unit being filled

    def groups_of(doms: list[tuple], times: int) -> list[list[PlacedGroup]]:
        """Domains of one unit (first of ``times`` identical ones), advancing the replica counters."""
        per: dict[tuple[str, int], int] = defaultdict(int)
        res = []
        for groups in doms:
            dom = []
            for pid, st, c, n in groups:
                for _ in range(n):
                    dom.append(PlacedGroup(pool=pid, replica=counter[(pid, st)] + per[(pid, st)] + 1, stage=st, chips=c))
                    per[(pid, st)] += 1
            res.append(dom)
        for key, n in per.items():
            counter[key] += n * times
        return res

    for groups, _free, cnt in pats:
        left = cnt
        while left > 0:
            if buf:
                take = min(per_unit - len(buf), left)
                buf += [groups] * take
                left -= take
                if len(buf) == per_unit:
                    out.append(UnitPlacement(hardware=h, unit=unit_no, count=1, domains=groups_of(buf, 1)))
                    unit_no += 1
                    buf = []
                continue
            whole = left // per_unit
            if whole:
                out.append(UnitPlacement(hardware=h, unit=unit_no, count=whole, domains=groups_of([groups] * per_unit, whole)))
                unit_no += whole
                left -= whole * per_unit
            if left:
                buf = [groups] * left
                left = 0
    if buf:
        out.append(UnitPlacement(hardware=h, unit=unit_no, count=1, domains=groups_of(buf, 1)))
    return out


def unit_losses(plan: Plan) -> list[tuple[str, int, dict[str, set[int]]]]:
    """Per purchase unit of the placement: (hardware, unit number, pool -> replicas that run on it). A run of
    identical units (``count``) stands for that many units with the same pattern."""
    out = []
    for up in plan.placement:
        lost: dict[str, set[int]] = defaultdict(set)
        for dom in up.domains:
            for g in dom:
                lost[g.pool].add(g.replica)
        for j in range(up.count):
            out.append((up.hardware, up.unit + j, lost))
    return out


def capacity_after_losing(plan: Plan, k: int) -> dict[str, tuple[float, list[str]]]:
    """Per workload: capacity (req/s) left after losing the ``k`` units whose individual loss hurts it most,
    and which units. Aggregated pools add up; prefill and decode pools serve the smaller of the two."""
    units = unit_losses(plan)
    out = {}
    for w in plan.workloads:
        pools = [p for p in plan.pools if p.workload == w.name]

        def cap(lost_by_pool: dict[str, int], pools=pools) -> float:
            by_role: dict[str, float] = defaultdict(float)
            for p in pools:
                by_role[p.role] += max(p.replicas - lost_by_pool.get(p.id, 0), 0) * p.predicted.requests_per_s_per_replica
            return by_role["aggregated"] + min(by_role["prefill"], by_role["decode"])

        scored = sorted(units, key=lambda u: cap({q: len(r) for q, r in u[2].items()}))
        worst = scored[:k]
        lost: dict[str, int] = defaultdict(int)
        for _, _, by_pool in worst:
            for q, r in by_pool.items():
                lost[q] += len(r)
        out[w.name] = (cap(lost), [f"{h} {u}" for h, u, _ in worst])
    return out


def recheck(plan: Plan, rs: ResolvedScenario) -> Recheck:
    """Re-evaluate ``plan`` with ``perf/`` alone: every pool's layout is valid, fits in memory and
    meets its workload's SLOs at the predicted rate; demand and prefix working sets are covered;
    every replica sits in a purchase unit inside one scale-up domain; units, power, budget and
    cost add up."""
    sc = rs.scenario
    hw_by_id = {h.id: h for h in rs.hardware}
    wl = {w.name: w for w in sc.workloads}
    checks: list[Check] = []
    capacity: dict[tuple[str, str], float] = defaultdict(float)

    def add(name: str, ok: bool, detail: str) -> None:
        checks.append(Check(name=name, ok=bool(ok), detail=detail))

    loads = role_loads(sc.workloads, plan.pools)
    for p in plan.pools:
        hw = hw_by_id[p.hardware]
        w = wl[p.workload]
        lay = Layout(p.layout.tp, p.layout.ep, p.layout.pp, p.layout.attn_dp, p.layout.redundant_experts)
        model = rs.model_for(p.workload)
        if p.model and p.model != model.id:
            add(f"{p.id}: model", False, f"the pool serves {p.model}, its workload {p.workload} is served by {model.id}")
            continue
        try:
            check_layout(model, lay)
            add(f"{p.id}: layout", True, f"{lay.describe()} valid for {model.id}")
        except Exception as err:  # noqa: BLE001 - reported as a failed check
            add(f"{p.id}: layout", False, str(err))
            continue
        eng = next((e for e in rs.engines if e.id == p.engine), None)
        add(f"{p.id}: engine", eng is not None and eng.runs_on(hw) and eng.weight_mode(hw, p.weights_dtype) is not None,
            f"{p.engine} runs on {hw.id} and serves {p.weights_dtype} weights ({p.weights_mode})")
        # The plan is re-evaluated with exactly the factors it was solved with: the pool's engine on its hardware.
        ev = evaluate_point(
            model, hw, lay, p.batch, w, p.role, weights=p.weights_dtype, kv=p.kv_dtype,
            eff=hw.efficiency.for_engine(p.engine), kv_tier=p.kv_tier, prefix_tier=p.prefix_tier,
            spec_tokens=p.spec_tokens, tbo=p.two_batch_overlap,
            moe_imbalance=p.expert_placement.imbalance if p.expert_placement else 1.0,
            prefill_chunk_tokens=eng.prefill_chunk_tokens if eng is not None else DEFAULT_CHUNK_TOKENS,
            engine=p.engine,
        )
        if p.expert_placement is not None and p.expert_placement.placement_imbalance is not None:
            ep_ = p.expert_placement
            add(f"{p.id}: expert placement", ep_.placement_imbalance <= ep_.imbalance * (1 + REL_TOL),
                f"placement imbalance {ep_.placement_imbalance:.4f} <= {ep_.imbalance:.4f} in the step time")
        if ev is None:
            add(f"{p.id}: memory", False, "the layout does not fit this memory tier")
            continue
        used = ev["weight_bytes_per_chip"] + ev["kv_bytes_per_chip"] + ev["other_bytes_per_chip"]
        add(f"{p.id}: memory", used <= hw.hbm_bytes and ev["host_kv_bytes_per_chip"] <= hw.host_dram_bytes,
            f"{used / 1e9:.1f} of {hw.hbm_bytes / 1e9:.1f} GB HBM per chip")
        lam, t_cap = planned_load(pd.DataFrame([ev]), w.slo.ttft_ms / 1e3, sc.utilisation_cap)
        rate = float(lam[0]) / p.margin_derate if np.isfinite(lam[0]) else 0.0
        if p.role != "prefill":
            add(f"{p.id}: tpot", ev["tpot_s"] <= w.slo.tpot_ms / 1e3 * (1 + REL_TOL),
                f"{ev['tpot_s'] * 1e3:.1f} ms <= {w.slo.tpot_ms:g} ms")
        if p.role != "decode":
            from planner.perf.candidates import queue_wait

            u = loads.get((p.workload, p.role), 1.0)
            work, servers = ev["queue_work_s"], ev["queue_servers"]
            at_load = ev["ttft_base_s"] + (float(queue_wait(u * rate * work / servers, servers, work)) if work > 0 else 0.0)
            add(f"{p.id}: ttft", rate > 0 and at_load <= w.slo.ttft_ms / 1e3 * (1 + REL_TOL),
                f"{at_load * 1e3:.0f} ms at {u:.0%} of capacity <= {w.slo.ttft_ms:g} ms (open arrivals)")
        if sc.margin is not None:
            srv = "agg" if p.role == "aggregated" else "disagg"
            want = max(1.0, hw.efficiency.error_ratio(p.engine, srv, sc.margin.quantile))
            add(f"{p.id}: margin", math.isclose(p.margin_derate, want, rel_tol=1e-9),
                f"capacity / {p.margin_derate:.3f}: measured/predicted TPOT at quantile {sc.margin.quantile:g} "
                f"of {p.hardware} {p.engine}/{srv}")
        capacity[(p.workload, p.role)] += rate * p.replicas
        same = math.isclose(rate * p.replicas, p.predicted.requests_per_s, rel_tol=1e-6)
        add(f"{p.id}: rate", same, f"{rate * p.replicas:.3f} req/s re-evaluated vs {p.predicted.requests_per_s:.3f} planned")
    for w in sc.workloads:
        agg, pre, dec = (capacity[(w.name, r)] for r in ("aggregated", "prefill", "decode"))
        served = agg + min(pre, dec)
        add(f"{w.name}: demand", served >= w.requests_per_s * (1 - REL_TOL),
            f"{served:.2f} req/s capacity for {w.requests_per_s:g} req/s")
        ws = w.prefix_cache.working_set_gb * 1e9 if w.prefix_cache.hit_rate > 0 else 0.0
        for p in plan.pools:
            if p.workload != w.name or p.prefix_tier == "none" or ws <= 0:
                continue
            # Each pool's tier holds the prefixes of the traffic routed to it (routing by prefix family).
            need = ws * p.predicted.requests_per_s_per_replica / w.requests_per_s if w.requests_per_s > 0 else 0.0
            add(f"{p.id}: prefix cache", p.prefix_cache_bytes_per_replica >= need * (1 - REL_TOL),
                f"{p.prefix_cache_bytes_per_replica / 1e9:,.1f} GB per replica in {p.prefix_tier} for "
                f"{need / 1e9:,.1f} GB of prefixes of its traffic")
    # Placement: every group inside one domain, every replica's stage groups placed whole, units as bought.
    placed: dict[tuple[str, int], int] = defaultdict(int)
    for up in plan.placement:
        D = packing_domain(hw_by_id[up.hardware])
        for dom in up.domains:
            if sum(g.chips for g in dom) > D:
                add(f"{up.hardware} unit {up.unit}: domain", False, f"{sum(g.chips for g in dom)} chips in a {D}-chip domain")
            for g in dom:
                placed[(g.pool, g.stage)] += g.chips * up.count
    expected = {(p.id, s): p.layout.tp * p.layout.attn_dp * p.replicas for p in plan.pools for s in range(1, p.layout.pp + 1)}
    missing = [f"{k[0]} stage {k[1]}" for k in expected.keys() | placed.keys() if placed.get(k, 0) != expected.get(k, 0)]
    add("placement", not missing, "every stage group placed whole" if not missing else f"misplaced: {', '.join(missing[:5])}")
    for g in plan.units:
        hw = hw_by_id[g.hardware]
        n = sum(up.count for up in plan.placement if up.hardware == g.hardware)
        add(f"{g.hardware}: units", n <= g.count, f"{n} units hold the replicas, {g.count} bought")
        cost = g.count * hw.purchase_unit.chips_per_unit * rs.prices[g.hardware]
        add(f"{g.hardware}: cost", math.isclose(cost, g.usd_per_hour, rel_tol=1e-9), f"{g.count} x {hw.purchase_unit.chips_per_unit} chips x ${rs.prices[g.hardware]:.2f}")
        mu = next((v for k, v in sc.limits.max_units.items() if k == g.hardware or k in hw.aliases), None)
        if mu is not None:
            add(f"{g.hardware}: inventory", g.count <= mu, f"{g.count} of {mu} units")
    lim = sc.limits
    if lim.max_hardware_types is not None:
        kinds = sorted({g.hardware for g in plan.units if g.count})
        add("limits.max_hardware_types", len(kinds) <= lim.max_hardware_types,
            f"{len(kinds)} hardware kinds ({', '.join(kinds)}) of at most {lim.max_hardware_types}")
    if lim.max_pool_types_per_workload is not None:
        for w in sc.workloads:
            n = sum(1 for p in plan.pools if p.workload == w.name)
            add(f"{w.name}: pool types", n <= lim.max_pool_types_per_workload,
                f"{n} pool types of at most {lim.max_pool_types_per_workload}")
    k = sc.resilience.lose_units
    if k:
        left = capacity_after_losing(plan, k)
        for w in sc.workloads:
            cap, units = left[w.name]
            add(f"{w.name}: resilience", cap >= w.requests_per_s * (1 - REL_TOL),
                f"{cap:,.2f} req/s left after losing {', '.join(units) or 'nothing'} (lose_units {k}) for "
                f"{w.requests_per_s:g} req/s")
    total = sum(g.usd_per_hour for g in plan.units)
    add("objective", math.isclose(total, plan.objective.usd_per_hour, rel_tol=1e-9), f"${total:,.2f}/h")
    for family in FAMILIES:  # the limits the registry's families re-check on the plan's own figures
        if family.recheck is not None:
            for name, ok, detail in family.recheck(plan, rs):
                add(name, ok, detail)
    return Recheck(ok=all(c.ok for c in checks), checks=checks)
