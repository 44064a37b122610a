"""The plan's schema (pydantic): what ``plan.json`` holds, read back strictly. A change of the contract changes
:data:`SCHEMA_VERSION`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.catalog.ids import CATALOG_ID, CatalogId, EngineId, FileName, NameId, PoolId
from planner.catalog.scenario import LengthSpread
from planner.model.build import solution_values  # noqa: F401  (re-exported: plans are read from solved models)
from planner.results.migration import Migration
from planner.version import PLAN_SCHEMA_VERSION

SCHEMA_VERSION = PLAN_SCHEMA_VERSION
"""2.1: ``software`` (planner, solver and Pyomo versions); 2.2: a ``model`` per pool and workload; 2.3:
``binding_constraints[].saving_proven``; 2.5: ``day`` (a traffic profile's cost over the day); 2.6: percentile SLOs
(``predicted.latency`` per pool, the SLO quantiles and predicted goodput per workload; ``ttft_s`` is at the SLO's
quantile); 2.7: ``migration`` (a re-plan from a deployed fleet: the diff, the steps and the horizon's costs). A
change of the contract changes this (in :mod:`planner.version`)."""


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


class Percentiles(_M):
    """p50, p90 and p99 of one latency, seconds."""

    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0


class Latency(_M):
    """A pool's latency distribution at its planned load (``perf/latency.py``): TTFT under open arrivals with the
    workload's prompt-length spread, each request's TPOT, the gap between emissions (ITL), and the share of
    requests meeting each target."""

    ttft: Percentiles = Percentiles()
    ttft_mean_s: float = 0.0
    tpot: Percentiles = Percentiles()
    tpot_slo_s: float = 0.0
    """TPOT at the workload's TPOT quantile (the mean where the SLO is on the mean)."""
    itl: Percentiles = Percentiles()
    ttft_attainment: float = 1.0
    """Share of the pool's requests whose TTFT meets the target (a decode pool: the share of hand-overs that find a
    slot free at once)."""
    tpot_attainment: float = 1.0
    ttft_base_s: float = 0.0
    """TTFT of a mean-length prompt that does not wait (what ``planner simulate`` starts from)."""
    prefill_work_s: float = 0.0
    """Prefill time one mean-length prompt holds a server of the pool's queue (0: no queue, a decode pool)."""
    prefill_servers: float = 1.0
    """Prompts a replica prefills at once (its attention data-parallel ranks)."""
    tpot_cv: float = 0.0
    """Coefficient of variation of a request's TPOT."""
    chunk_share: float = 0.0
    """Share of decode steps that carry a prefill chunk (aggregated pools)."""


class Predicted(_M):
    ttft_s: float
    """TTFT at the workload's TTFT quantile, at the load the plan routes to the pool (open arrivals; the mean where
    the SLO is on the mean; 0 for decode pools)."""
    tpot_s: float
    """Mean TPOT (``latency`` holds its quantiles)."""
    latency: Latency = Latency()
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
    ``compose``); or ``datasheet roofline with fitted factors``, naming the silicon factors taken from the system's
    own kernel curves where its serving rows cannot set them (``planner.calib.silicon``)."""
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
    """The slowest pool's TTFT at the SLO's quantile."""
    tpot_s: float
    """The slowest pool's TPOT at the SLO's quantile."""
    slo_ttft_s: float
    slo_tpot_s: float
    slo_ttft_quantile: float | None = 0.9
    """Quantile the TTFT target is met at (None: the mean)."""
    slo_tpot_quantile: float | None = 0.9
    slo_goodput: float | None = None
    """Share of requests that must meet both targets at once, where the scenario sets one."""
    input_spread: LengthSpread | None = None
    """How prompt lengths spread around ``input_tokens`` (None: every prompt that long)."""
    output_spread: LengthSpread | None = None
    ttft_attainment: float = 1.0
    """Predicted share of the workload's requests whose TTFT meets the target (pools weighted by their traffic)."""
    tpot_attainment: float = 1.0
    goodput: float = 1.0
    """Predicted share meeting both at once (TTFT and TPOT taken as independent)."""
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
    bought: int = 0
    """Over months of growth: units reserved at the start of this month (held from then on)."""


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


class GrowthCost(_M):
    """Growth over months: what the fleet costs over the horizon, month by month."""

    months: int
    usd_total: float
    usd_per_hour: float
    """Mean over the horizon."""
    tokens: float
    """Input and output tokens the months' peak demand would carry (an upper bound on the served tokens)."""
    usd_per_mtok: float
    peak_reserved_usd_total: float
    """Reserving the peak month's fleet from the first month (the plan's pools) for the whole horizon."""
    status: str
    mip_gap: float | None = None
    wall_s: float = 0.0


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
    months: list[PeriodOut] = []
    """Growth over months (``workloads[].months``): each month's fleet, units reserved and rented on demand."""
    growth: GrowthCost | None = None
    migration: Migration | None = None
    """From a deployed fleet (``existing``): the diff against it, the steps and the horizon's costs."""

    def pools_frame(self):
        """One row per pool: workload, role, hardware, engine, layout, batch, dtypes, tiers, replicas and chips, the
        predicted TTFT, TPOT and requests/s, utilisation and $/h."""
        import pandas as pd

        rows = []
        for p in self.pools:
            lay, pr = p.layout, p.predicted
            rows.append({
                "pool": p.id, "workload": p.workload, "role": p.role, "hardware": p.hardware, "engine": p.engine,
                "tp": lay.tp, "ep": lay.ep, "pp": lay.pp, "attn_dp": lay.attn_dp, "batch": p.batch,
                "weights_dtype": p.weights_dtype, "kv_dtype": p.kv_dtype, "kv_tier": p.kv_tier,
                "prefix_tier": p.prefix_tier, "replicas": p.replicas, "chips": p.replicas * p.chips_per_replica,
                "ttft_s": pr.ttft_s, "tpot_s": pr.tpot_s, "requests_per_s": pr.requests_per_s,
                "utilisation": pr.utilisation, "usd_per_hour": p.usd_per_hour,
            })
        return pd.DataFrame(rows)

    def units_frame(self):
        """One row per hardware bought: units, chips, chips used, $/h and kW."""
        import pandas as pd

        return pd.DataFrame([g.model_dump() for g in self.units])

    def workloads_frame(self):
        """One row per workload: demand, capacity, the TTFT and TPOT reached against their targets."""
        import pandas as pd

        return pd.DataFrame([w.model_dump() for w in self.workloads])

    def periods_frame(self):
        """With a traffic profile, one row per period and hardware: demand (all workloads), units held, bought on
        demand and spot, and the period's $/h; empty without one."""
        import pandas as pd

        rows = [{"period": p.period, "requests_per_s": sum(p.requests_per_s.values()), "hardware": u.hardware,
                 "reserved": u.reserved, "on_demand": u.on_demand, "spot": u.spot, "usd_per_hour": p.usd_per_hour}
                for p in self.periods for u in p.units]
        return pd.DataFrame(rows, columns=["period", "requests_per_s", "hardware", "reserved", "on_demand", "spot",
                                           "usd_per_hour"])


def software_versions() -> dict[str, str]:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from planner.version import __version__

    out = {"planner": __version__, "python": platform.python_version()}
    for pkg in ("pyomo", "highspy"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "unknown"
    return out

