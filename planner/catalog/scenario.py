"""Scenario files (``catalogs/scenarios/*.yaml``): what to serve, on which hardware, at which SLOs.

A scenario is validated twice: by its schema (types, signs, unknown keys) and against the catalog
(model and hardware ids, a price for every hardware). Both kinds of error name the file and field.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import pandas as pd
from pydantic import Field, ValidationError, model_validator

from planner.catalog.fields import AsOf
from planner.catalog.fleet import (
    DEFAULT_HORIZON_MONTHS,
    ChangeCosts,
    ExistingFleet,
    Fleet,
    fleet_hardware,
    read_fleet,
    resolve_fleet,
)
from planner.catalog.ids import CatalogId, NameId
from planner.catalog.loader import Catalog, format_validation_error, read_yaml, unknown_id_message
from planner.catalog.schemas import Dtype, EngineSpec, HardwareSpec, ModelSpec, Strict
from planner.errors import InputError

PosF = Annotated[float, Field(gt=0)]
MAX_DEMAND_RPS = 1e7
"""Largest demand a workload may state: ten million requests/s (the planner's MILP is scaled for demands up to
here; an input beyond it is refused rather than solved to a wrong answer)."""
MIN_DEMAND_SHARE = 1e-6
"""Smallest positive demand of a scenario, as a share of its largest (any period, any workload): the MILP counts
requests/s in units of a thousandth of the largest demand, and a demand a million times smaller is still a
thousandth of a unit, well inside the solver's tolerance. Any positive demand plans on its own; zero is a
period without traffic for that workload."""
MAX_TOKENS = 10_000_000
MAX_WORKING_SET_GB = 1e9
MAX_SLO_MS = 1e9


class PrefixCache(Strict):
    hit_rate: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Share of input tokens served from a cached prefix."""
    working_set_gb: Annotated[float, Field(ge=0, le=MAX_WORKING_SET_GB)] = 0.0
    """Bytes of reusable prefixes to keep (their KV), in GB."""


QUANTILE_NAMES = {"mean": None, "median": 0.5, "p50": 0.5, "p75": 0.75, "p90": 0.9, "p95": 0.95, "p99": 0.99,
                  "p99.9": 0.999}
"""Names a quantile may be given by (``mean`` sizes for the mean, as plans did before percentiles)."""
DEFAULT_QUANTILE = 0.9
"""Quantile an SLO is met at when the scenario names none: p90, the quantile the exported alerts fire on."""

QuantileSpec = Annotated[float, Field(gt=0, lt=1)] | Literal["mean", "median", "p50", "p75", "p90", "p95", "p99",
                                                              "p99.9"]


def quantile_value(spec: float | str | None) -> float | None:
    """A quantile as a number in (0, 1), or ``None`` for the mean."""
    if spec is None or isinstance(spec, str):
        return QUANTILE_NAMES[spec] if spec is not None else None
    return float(spec)


def quantile_label(q: float | None) -> str:
    """``p90``, ``p99.9``, ``median`` or ``mean``."""
    if q is None:
        return "mean"
    if abs(q - 0.5) < 1e-12:
        return "median"
    return f"p{q * 100:.10g}"


class Slo(Strict):
    ttft_ms: Annotated[float, Field(gt=0, le=MAX_SLO_MS)]
    tpot_ms: Annotated[float, Field(gt=0, le=MAX_SLO_MS)]
    quantile: QuantileSpec = DEFAULT_QUANTILE
    """Quantile both targets are met at: a number in (0, 1) or ``mean``, ``median``, ``p90``, ``p95``, ``p99``
    (default p90: 90% of requests see a TTFT and a TPOT within target)."""
    ttft_quantile: QuantileSpec | None = None
    """The TTFT target's own quantile where it differs from ``quantile``."""
    tpot_quantile: QuantileSpec | None = None
    """The TPOT target's own quantile where it differs from ``quantile``."""
    goodput: Annotated[float, Field(gt=0, lt=1)] | None = None
    """Also size so that this share of requests meets both targets at once (DistServe's goodput); requests'
    TTFT and TPOT are taken as independent."""

    @property
    def ttft_q(self) -> float | None:
        """The TTFT target's quantile (``None``: the mean)."""
        return quantile_value(self.ttft_quantile if self.ttft_quantile is not None else self.quantile)

    @property
    def tpot_q(self) -> float | None:
        """The TPOT target's quantile (``None``: the mean)."""
        return quantile_value(self.tpot_quantile if self.tpot_quantile is not None else self.quantile)

    def describe(self) -> str:
        """``p90 TTFT 2000 ms, p90 TPOT 50 ms`` (and the goodput where one is set)."""
        out = (f"{quantile_label(self.ttft_q)} TTFT {self.ttft_ms:g} ms, "
               f"{quantile_label(self.tpot_q)} TPOT {self.tpot_ms:g} ms")
        return out + (f", goodput {self.goodput:g}" if self.goodput is not None else "")

    @property
    def ttft_s(self) -> float:
        """The TTFT target in seconds (the unit everything below the scenario works in)."""
        return self.ttft_ms / 1e3

    @property
    def tpot_s(self) -> float:
        """The TPOT target in seconds."""
        return self.tpot_ms / 1e3


class LengthSpread(Strict):
    """How a workload's request lengths spread around their mean: a lognormal through the mean and the p90,
    or a histogram (``points``: tokens and weight)."""

    mean: Annotated[float, Field(gt=0, le=MAX_TOKENS)] | None = None
    p90: Annotated[float, Field(gt=0, le=MAX_TOKENS)] | None = None
    points: list[tuple[Annotated[float, Field(gt=0, le=MAX_TOKENS)], Annotated[float, Field(ge=0)]]] | None = Field(
        default=None, min_length=1, max_length=100_000)
    """(tokens, weight) pairs: a histogram read from ``{file: lengths.csv}`` (columns ``tokens,weight``)."""

    @model_validator(mode="before")
    @classmethod
    def _histogram_mean(cls, data):
        if isinstance(data, dict) and isinstance(data.get("points"), list) and data["points"]:
            try:
                w = sum(float(p[1]) for p in data["points"])
                mean = sum(float(t) * float(p) for t, p in data["points"]) / w if w > 0 else None
            except (TypeError, ValueError, IndexError):
                return data  # the field's own validation names what is wrong
            if mean is not None and data.get("mean") is not None and abs(float(data["mean"]) - mean) > 1e-6 * mean:
                raise ValueError(f"mean {data['mean']} is not the histogram's mean ({mean:g}); leave it out")
            if mean is not None:
                data = {**data, "mean": mean}
        return data

    @model_validator(mode="after")
    def _check(self) -> LengthSpread:
        if self.points is not None:
            if self.p90 is not None:
                raise ValueError("give either mean and p90 or a histogram file, not both")
            if sum(p[1] for p in self.points) <= 0:
                raise ValueError("a length histogram needs a positive total weight")
            return self
        if self.mean is None or self.p90 is None:
            raise ValueError("a length distribution is {mean: N, p90: M} or {file: lengths.csv}")
        if self.p90 < self.mean:
            raise ValueError(f"p90 ({self.p90:g}) is below the mean ({self.mean:g}): give a p90 at or above the mean")
        if self.p90 > self.mean * LOGNORMAL_MAX_P90_RATIO:
            raise ValueError(f"p90 ({self.p90:g}) is over {LOGNORMAL_MAX_P90_RATIO:.3g}x the mean ({self.mean:g}): no "
                             "lognormal has such a tail; give the lengths as a histogram file")
        return self


LOGNORMAL_MAX_P90_RATIO = 2.2721
"""Largest p90 / mean of a lognormal: ``exp(z90 s - s^2 / 2)`` peaks at ``s = z90 = 1.2816``."""


MAX_PERIODS = 168
MAX_MONTHS = 60
"""Periods a traffic profile may have (hourly over a week)."""


class Workload(Strict):
    name: NameId
    model: str | None = None
    """Model this workload is served by (a catalog id or alias; default: the scenario's ``model``). Workloads of
    different models form one fleet: their pools share purchase units chip by chip."""
    requests_per_s: Annotated[float, Field(gt=0, le=MAX_DEMAND_RPS)]
    """Peak requests/s. Written as a list (one value per period of equal length, e.g. 24 hourly values) or
    ``{file: traffic.csv}`` (columns ``period,requests_per_s``), it is a traffic profile: ``profile`` holds
    the values and this field their peak."""
    profile: list[Annotated[float, Field(ge=0, le=MAX_DEMAND_RPS)]] | None = Field(default=None, min_length=1,
                                                                                   max_length=MAX_PERIODS)
    months: list[Annotated[float, Field(ge=0, le=MAX_DEMAND_RPS)]] | None = Field(default=None, min_length=2,
                                                                                  max_length=MAX_MONTHS)
    """Growth: peak requests/s of each month of the horizon (month 1 first). The plan then says which units to
    reserve at the start of which month and which to rent on demand month by month; ``requests_per_s`` is
    their peak (default) and the pools shown are the peak month's."""
    input_tokens: Annotated[int, Field(gt=0, le=MAX_TOKENS)]
    """Prompt tokens per request: a number, or a distribution ``{mean: 2000, p90: 4000}`` (a lognormal through
    both) or ``{file: prompts.csv}`` (a histogram, columns ``tokens,weight``); the field then holds the mean
    and ``input_spread`` the distribution."""
    output_tokens: Annotated[int, Field(gt=0, le=MAX_TOKENS)]
    """Output tokens per request, written like ``input_tokens``."""
    input_spread: LengthSpread | None = None
    output_spread: LengthSpread | None = None
    prefix_cache: PrefixCache = PrefixCache()
    slo: Slo

    @model_validator(mode="before")
    @classmethod
    def _lengths(cls, data):
        if isinstance(data, dict):
            for k in ("input", "output"):
                v = data.get(f"{k}_tokens")
                if isinstance(v, dict):
                    try:
                        spread = LengthSpread.model_validate(v)
                    except ValidationError as err:
                        e = err.errors()[0]
                        where = ".".join(str(x) for x in e["loc"])
                        msg = str(e["msg"]).removeprefix("Value error, ")
                        raise ValueError(f"{k}_tokens{'.' + where if where else ''}: {msg}") from None
                    data = {**data, f"{k}_tokens": max(1, round(spread.mean)), f"{k}_spread": spread}
        return data

    @model_validator(mode="before")
    @classmethod
    def _months(cls, data):
        if isinstance(data, dict) and isinstance(data.get("months"), list) and "requests_per_s" not in data:
            nums = [v for v in data["months"] if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if len(nums) == len(data["months"]) and nums:
                data = {**data, "requests_per_s": max(nums)}
        return data

    @model_validator(mode="before")
    @classmethod
    def _profile(cls, data):
        if isinstance(data, dict) and isinstance(data.get("requests_per_s"), list):
            values = data["requests_per_s"]
            data = {**data, "profile": values}
            nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if len(nums) != len(values):
                raise ValueError("requests_per_s: a profile holds numbers only (requests/s per period)")
            data["requests_per_s"] = max(nums) if nums else 0.0
        return data


class TierPrice(Strict):
    usd_per_chip_hour: Annotated[float, Field(gt=0, le=1e4)]
    preemption_rate: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Share of the capacity bought at this tier that is lost to preemption at any time (spot)."""


class PriceTiers(Strict):
    """Prices beside the reserved one (the hardware's price, held all day): capacity bought per period."""

    on_demand: TierPrice | None = None
    spot: TierPrice | None = None


class ExpertLoad(Strict):
    """How routed tokens spread over a MoE model's experts: a seeded power law or a measured CSV
    (``expert,load`` or ``layer,expert,load``, path relative to the scenario file; layers merged)."""

    skew: str | None = Field(default=None, pattern=r"^zipf:[0-9.]+$")
    """``zipf:S``: expert ranks get weight rank^-S (S = 0 is uniform)."""
    file: str | None = None
    seed: Annotated[int, Field(ge=0)] = 0

    @model_validator(mode="after")
    def _one(self) -> ExpertLoad:
        if (self.skew is None) == (self.file is None):
            raise ValueError("give exactly one of skew (zipf:S) or file (a CSV of expert loads)")
        return self


class Racks(Strict):
    """Datacenter racks of one power envelope: purchase units sit in racks of their own hardware, as many to a
    rack as its power allows; a unit that draws more than a rack holds cannot be placed."""
    count: Annotated[int, Field(ge=1, le=1_000_000)]
    """Racks available."""
    kw_per_rack: Annotated[float, Field(gt=0, le=10_000)]
    """All-in power each rack can feed and cool, kW."""


class Limits(Strict):
    max_units: dict[str, Annotated[int, Field(ge=0, le=1_000_000)]] = Field(default_factory=dict)
    """Purchase units available per hardware id."""
    power_kw: Annotated[float, Field(gt=0, le=1e9)] | None = None
    budget_usd_per_hour: Annotated[float, Field(gt=0, le=1e12)] | None = None
    max_hardware_types: Annotated[int, Field(ge=1, le=100)] | None = None
    """At most this many hardware kinds in the whole fleet (fewer spares, drivers and runbooks)."""
    max_pool_types_per_workload: Annotated[int, Field(ge=1, le=100)] | None = None
    """At most this many pool types (hardware x engine x layout x batch x tiers) serving one workload."""
    pool_type_usd_per_hour: Annotated[float, Field(ge=0, le=1e6)] = 0.0
    """Fixed cost of operating each pool type the plan uses (its own images, alerts, on-call), $/h."""
    racks: Racks | None = None
    """Racks of a power envelope the fleet must fit in (``{count: 20, kw_per_rack: 40}``)."""
    max_chips: Annotated[int, Field(ge=1, le=100_000_000)] | None = None
    """At most this many accelerators in the whole fleet, of every hardware together (a cloud account's GPU quota,
    an allocation from a shared pool)."""


class Resilience(Strict):
    lose_units: Annotated[int, Field(ge=0, le=1000)] = 0
    """After losing any ``lose_units`` purchase units (a node; a whole NVL72 rack is one unit), every
    workload is still served at its targets (N+k)."""


class Margin(Strict):
    quantile: Annotated[float, Field(gt=0, lt=1)]
    """Size pools so that capacity holds when the performance model errs as it did at this quantile of the
    measured rows of the pool's hardware, engine and serving mode (``efficiency.error_quantiles``)."""


class Scenario(Strict):
    name: CatalogId
    description: str = ""
    model: str | None = None
    """Model of every workload that names none (required unless each workload names its own)."""
    weights: list[Dtype] | None = Field(default=None, min_length=1)
    """Allowed weight formats (default: each model's native format)."""
    kv_cache: list[Dtype] = Field(default_factory=lambda: ["bf16"], min_length=1)
    hardware: list[str] | None = Field(default=None, min_length=1)
    """Candidate hardware ids (default: every entry with a price)."""
    prices: dict[str, Annotated[float, Field(gt=0, le=1e4)]] = Field(default_factory=dict)
    """USD per chip-hour overrides (the reserved price: held all day)."""
    price_tiers: dict[str, PriceTiers] = Field(default_factory=dict)
    """Per hardware id: on-demand and spot prices for capacity bought per period of a traffic profile
    (overrides the catalog's ``price.tiers``)."""
    engine: str | None = None
    """Serving engine every pool must run (a catalog engine id: sglang, vllm, trtllm, atom); default: the
    planner chooses per pool among the engines that run on each hardware."""
    self_quantise: bool = False
    """Allow weight formats no published checkpoint has and the engine cannot quantise to on load (the plan
    then says what to quantise, and the export needs the checkpoint's path); default: only formats that can be
    served from a published checkpoint."""
    require_validated: bool = False
    """Leave out hardware whose efficiency factors were transferred from other hardware (no measured rows of
    its own)."""
    serving: list[Literal["aggregated", "disaggregated"]] = Field(default_factory=lambda: ["aggregated"], min_length=1)
    utilisation_cap: Annotated[float, Field(gt=0, le=1)] = 0.8
    limits: Limits = Limits()
    resilience: Resilience = Resilience()
    margin: Margin | None = None
    """Derate every candidate's capacity by the model's measured error at ``margin.quantile`` (default: none,
    capacity at the prediction)."""
    expert_load: ExpertLoad | None = None
    """MoE only: routed-token skew over the experts of the scenario's ``model``; sets the imbalance of every
    expert-parallel layout and lets the planner buy redundant expert slots (default: uniform routing)."""
    workloads: list[Workload] = Field(min_length=1)
    existing: ExistingFleet | None = None
    """The deployed fleet to re-plan from: a plan folder (``existing: PLAN_DIR`` is ``existing: {plan: PLAN_DIR}``),
    or its units (with their commitments) and pools (:mod:`planner.catalog.fleet`); default none: from scratch."""
    change_costs: ChangeCosts = ChangeCosts()
    """What changing the deployed fleet costs (units added or released, pools reconfigured or re-engined)."""
    horizon_months: Annotated[float, Field(gt=0, le=120)] = DEFAULT_HORIZON_MONTHS
    """Months over which a change must pay for itself (the change costs are spread over them)."""
    start: AsOf | None = None
    """The plan's first day (default: today), against which commitments' end dates are read."""

    @model_validator(mode="before")
    @classmethod
    def _existing(cls, data):
        if isinstance(data, dict) and isinstance(data.get("existing"), str):
            data = {**data, "existing": {"plan": data["existing"]}}
        return data

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        if self.model is None:
            bare = [w.name for w in self.workloads if w.model is None]
            if bare:
                raise ValueError(f"give 'model' (the default) or a model for every workload (none for: {', '.join(bare)})")
            if self.expert_load is not None:
                raise ValueError("expert_load describes the scenario's 'model'; give one to use it")
        names = [w.name for w in self.workloads]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"workload names must be unique (repeated: {', '.join(sorted(dup))})")
        top = max(w.requests_per_s for w in self.workloads)
        for i, w in enumerate(self.workloads):
            low = min(v for v in (w.profile or w.months or [w.requests_per_s]) if v > 0)
            if low < top * MIN_DEMAND_SHARE:
                raise ValueError(f"workloads.{i}.requests_per_s: {low:g} req/s is below {MIN_DEMAND_SHARE:g} of the "
                                 f"scenario's largest demand ({top:g} req/s); plan it in a scenario of its own")
        lengths = {len(w.profile) for w in self.workloads if w.profile is not None}
        if len(lengths) > 1:
            raise ValueError(f"every workload's profile needs the same number of periods (got {sorted(lengths)})")
        months = {len(w.months) for w in self.workloads if w.months is not None}
        if len(months) > 1:
            raise ValueError(f"every workload's months need the same number of months (got {sorted(months)})")
        for i, w in enumerate(self.workloads):
            if w.months is not None and w.profile is not None:
                raise ValueError(f"workloads.{i}: give months (growth) or a daily profile, not both (plan each "
                                 "month's peak hour as its month)")
            if w.months is not None and abs(max(w.months) - w.requests_per_s) > 1e-9 * max(w.requests_per_s, 1.0):
                raise ValueError(f"workloads.{i}.requests_per_s: {w.requests_per_s:g} is not the peak of its months "
                                 f"({max(w.months):g}); leave it out (it defaults to that peak)")
            if w.months is not None and max(w.months) <= 0:
                raise ValueError(f"workloads.{i}.months: no month has traffic")
        k = self.resilience.lose_units
        mu = self.limits.max_units
        if k and self.hardware is not None and all(h in mu for h in self.hardware):
            total = sum(mu[h] for h in self.hardware)
            if k >= total:
                raise ValueError(f"resilience.lose_units {k} is at least every unit the limits allow ({total}); "
                                 "nothing would be left to serve")
        return self


@dataclass(frozen=True)
class ResolvedScenario:
    """A scenario with its catalog entries looked up and prices settled."""

    scenario: Scenario
    path: Path | None
    model: ModelSpec
    """The scenario's model (the default of its workloads; with no default, the first workload's)."""
    hardware: tuple[HardwareSpec, ...]
    prices: dict[str, float]
    """USD per chip-hour of every candidate hardware (catalog price or override)."""
    weights: tuple[str, ...]
    expert_load: np.ndarray | None = None
    """Share of routed tokens per expert (sums to 1), or None for uniform routing."""
    engines: tuple[EngineSpec, ...] = ()
    """Engines a pool may run (the scenario's engine alone, or every catalog engine)."""
    notes: tuple[str, ...] = ()
    """What resolution left out and why (reported in the plan's assumptions)."""
    workload_models: dict[str, ModelSpec] | None = None
    """Model of each workload by name (None: every workload is served by ``model``)."""
    fleet: Fleet | None = None
    """The deployed fleet the plan starts from (``existing``), or None: a plan from scratch."""

    def model_for(self, workload: str) -> ModelSpec:
        """The model a workload is served by."""
        return self.model if self.workload_models is None else self.workload_models.get(workload, self.model)

    @property
    def models(self) -> tuple[ModelSpec, ...]:
        """Every distinct model of the fleet, the scenario's model first."""
        out = {self.model.id: self.model}
        for m in (self.workload_models or {}).values():
            out.setdefault(m.id, m)
        return tuple(out.values())

    def weights_for(self, model: ModelSpec) -> tuple[str, ...]:
        """Weight formats a model may be served in: the scenario's list, or the model's native format."""
        return tuple(self.scenario.weights) if self.scenario.weights else (model.weights_dtype,)

    def expert_load_for(self, model: ModelSpec) -> np.ndarray | None:
        """Routed-token shares over the model's experts (the scenario's ``expert_load`` belongs to its model)."""
        return self.expert_load if model.id == self.model.id else None


def load_scenario(path: Path | str) -> Scenario:
    path = Path(path)
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping of fields at top level")
    wls = data.get("workloads")
    for i, w in enumerate(wls if isinstance(wls, list) else []):
        if isinstance(w, dict) and isinstance(w.get("requests_per_s"), dict):
            w["requests_per_s"] = read_profile(w["requests_per_s"], path, f"workloads.{i}.requests_per_s")
        for k in ("input_tokens", "output_tokens"):
            if isinstance(w, dict) and isinstance(w.get(k), dict) and "file" in w[k]:
                w[k] = read_lengths(w[k], path, f"workloads.{i}.{k}")
    try:
        return Scenario.model_validate(data)
    except ValidationError as err:
        raise InputError(format_validation_error(path, err)) from None


def _two_columns(spec: dict, path: Path, field: str, cols: tuple[str, str], example: str):
    """The two numeric columns ``cols`` of the CSV a ``{file: ...}`` field names (relative to the scenario), or
    :class:`InputError` naming the file and what to fix (NaN where a value is not a number)."""
    from planner.catalog.inputs import read_csv

    if set(spec) != {"file"} or not isinstance(spec["file"], str):
        raise InputError(f"{path}: field '{field}': a file is written {{file: {example}}}")
    f = (path.parent / spec["file"]) if not Path(spec["file"]).is_absolute() else Path(spec["file"])
    df = read_csv(f)
    if list(df.columns)[:2] != list(cols):
        raise InputError(f"{f}: expected the columns {','.join(cols)}")
    return f, pd.to_numeric(df[cols[0]], errors="coerce"), pd.to_numeric(df[cols[1]], errors="coerce")


def read_profile(spec: dict, path: Path, field: str) -> list[float]:
    """``{file: traffic.csv}`` -> requests/s per period (CSV columns ``period,requests_per_s``, periods
    0..n-1 or 1..n, each once, in any order)."""
    f, per, rps = _two_columns(spec, path, field, ("period", "requests_per_s"), "traffic.csv")
    if per.isna().any() or rps.isna().any() or not np.isfinite(rps).all():
        raise InputError(f"{f}: every row needs a whole period number and a finite requests_per_s")
    if (rps < 0).any():
        raise InputError(f"{f}: requests_per_s must not be negative (period {int(per[rps < 0].iloc[0])})")
    p = sorted(per.astype(int))
    if p not in (list(range(len(p))), list(range(1, len(p) + 1))):
        raise InputError(f"{f}: periods must be 0..n-1 or 1..n, each once (missing or repeated periods)")
    order = np.argsort(per.to_numpy())
    return [float(x) for x in rps.to_numpy()[order]]


def read_lengths(spec: dict, path: Path, field: str) -> dict:
    """``{file: lengths.csv}`` -> ``{points: [(tokens, weight), ...]}`` (CSV columns ``tokens,weight``; weights
    need not sum to one)."""
    f, tok, wt = _two_columns(spec, path, field, ("tokens", "weight"), "lengths.csv")
    if tok.isna().any() or wt.isna().any() or not (np.isfinite(tok).all() and np.isfinite(wt).all()):
        raise InputError(f"{f}: every row needs a number of tokens and a finite weight")
    if (tok <= 0).any() or (wt < 0).any():
        raise InputError(f"{f}: tokens must be positive and weights not negative")
    return {"points": [(float(a), float(b)) for a, b in zip(tok, wt, strict=True)]}


def resolve_scenario(sc: Scenario, catalog: Catalog, path: Path | str | None = None) -> ResolvedScenario:
    where = str(path) if path is not None else f"scenario {sc.name}"

    def look_up(name: str, field: str) -> ModelSpec:
        mid = catalog.model_id(name)
        if mid is None:
            raise InputError(f"{where}: field '{field}': {unknown_id_message('model', name, catalog.models)}")
        return catalog.models[mid]

    per = {w.name: look_up(w.model, f"workloads.{i}.model") for i, w in enumerate(sc.workloads) if w.model is not None}
    model = look_up(sc.model, "model") if sc.model is not None else per[sc.workloads[0].name]
    by_workload = {w.name: per.get(w.name, model) for w in sc.workloads}
    workload_models = by_workload if len({m.id for m in by_workload.values()}) > 1 else None
    if sc.hardware is None:
        ids = [h.id for h in catalog.hardware.values() if h.price is not None or h.id in sc.prices]
    else:
        ids = []
        for i, name in enumerate(sc.hardware):
            hid = catalog.hardware_id(name)
            if hid is None:
                raise InputError(
                    f"{where}: field 'hardware.{i}': {unknown_id_message('hardware', name, catalog.hardware)}"
                )
            ids.append(hid)
    for key, table in (("prices", sc.prices), ("limits.max_units", sc.limits.max_units), ("price_tiers", sc.price_tiers)):
        for name in table:
            if catalog.hardware_id(name) is None:
                raise InputError(f"{where}: field '{key}.{name}': {unknown_id_message('hardware', name, catalog.hardware)}")
    weights = tuple(sc.weights) if sc.weights else (model.weights_dtype,)
    for i, w in enumerate(sc.workloads):
        wm = by_workload[w.name]
        if w.input_tokens + w.output_tokens > wm.max_context_tokens:
            raise InputError(
                f"{where}: field 'workloads.{i}': input_tokens + output_tokens = {w.input_tokens + w.output_tokens:,} "
                f"exceeds the {wm.max_context_tokens:,}-token context of {wm.id}"
            )
    load = _expert_load(sc, model, where, Path(path).parent if path else Path("."))
    notes: list[str] = []
    engines = tuple(catalog.engines.values())
    if sc.engine is not None:
        eid = catalog.engine_id(sc.engine)
        if eid is None:
            raise InputError(f"{where}: field 'engine': {unknown_id_message('engine', sc.engine, catalog.engines)}")
        engines = (catalog.engines[eid],)
        ids, notes = _runnable(ids, engines[0], catalog, where, "field 'engine'")
    if sc.require_validated:
        kept = [h for h in ids if catalog.hardware[h].efficiency.fitted_rows > 0]
        if not kept:
            raise InputError(
                f"{where}: field 'require_validated': none of the candidate hardware has measured rows of its own "
                f"({', '.join(ids)}); drop require_validated or add measured hardware"
            )
        ids = kept
    base = Path(path).parent if path else Path(".")
    fleet_files = read_fleet(sc, where, base)
    deployed = fleet_hardware(fleet_files, catalog, where)
    extra = [h for h in deployed if h not in ids]
    if extra:
        notes.append(f"kept among the candidates, not added to: the deployed fleet holds {', '.join(extra)}")
        ids += extra
    if not ids:
        raise InputError(f"{where}: field 'hardware': no candidate hardware")
    overrides = {catalog.hardware_id(k): v for k, v in sc.prices.items()}
    prices: dict[str, float] = {}
    for hid in ids:
        hw = catalog.hardware[hid]
        price = overrides.get(hid, hw.price_usd_per_chip_hour)
        if price is None:
            raise InputError(
                f"{where}: field 'prices.{hid}': {hid} has no catalog price; give one in USD per chip-hour"
            )
        prices[hid] = float(price)
    if not ids:
        raise InputError(f"{where}: field 'hardware': no candidate hardware")
    if sc.margin is not None:
        bare = [h for h in ids if not catalog.hardware[h].efficiency.error_quantiles]
        if bare:
            raise InputError(
                f"{where}: field 'margin.quantile': no measured error for {', '.join(bare)} (efficiency.error_quantiles "
                "is empty); run `planner calibrate margins --data FILE --write`, or drop the margin"
            )
    fleet = resolve_fleet(sc, fleet_files, catalog, where, prices)
    if fleet is not None:
        notes += list(fleet.notes)
        fleet = replace(fleet, keep_only=tuple(extra))
    return ResolvedScenario(sc, Path(path) if path else None, model, tuple(catalog.hardware[h] for h in ids), prices,
                            weights, load, engines, tuple(notes), workload_models, fleet)


def _runnable(ids: list[str], engine: EngineSpec, catalog, where: str, what: str) -> tuple[list[str], list[str]]:
    """The hardware of ``ids`` (looked up in ``catalog``, a mapping of hardware id to entry or a Catalog) the
    engine runs on, and a note naming what it leaves out (an error naming ``what`` when nothing is left)."""
    table = catalog.hardware if hasattr(catalog, "hardware") else catalog
    keep = [h for h in ids if engine.runs_on(table[h])]
    if not keep:
        raise InputError(
            f"{where}: {what}: {engine.id} runs on {', '.join(engine.vendors)} hardware and none of the candidate "
            f"hardware is ({', '.join(ids)})"
        )
    gone = [h for h in ids if h not in keep]
    notes = [f"left out, {engine.id} does not run on it: {', '.join(gone)}"] if gone else []
    return keep, notes


def with_engine(rs: ResolvedScenario, engine: str | None) -> ResolvedScenario:
    """``rs`` with every pool on ``engine`` (``planner plan --engine``, an id or alias of one of ``rs.engines``):
    only the hardware it runs on."""
    if engine is None:
        return rs
    from dataclasses import replace

    where = str(rs.path) if rs.path is not None else f"scenario {rs.scenario.name}"
    n = engine.strip().lower()
    eng = next((e for e in rs.engines if n == e.id or n in (a.lower() for a in e.aliases)), None)
    if eng is None:
        raise InputError(f"--engine: unknown engine id '{engine}' (known: {', '.join(e.id for e in rs.engines)})")
    hw = {h.id: h for h in rs.hardware}
    ids, notes = _runnable(list(hw), eng, hw, where, f"--engine {eng.id}")
    return replace(rs, hardware=tuple(hw[h] for h in ids), prices={h: rs.prices[h] for h in ids},
                   engines=(eng,), notes=rs.notes + tuple(notes))
def _expert_load(sc: Scenario, model: ModelSpec, where: str, base: Path) -> np.ndarray | None:
    el = sc.expert_load
    if el is None:
        return None
    if not model.is_moe:
        raise InputError(f"{where}: field 'expert_load': {model.id} is dense; remove expert_load")
    experts = model.architecture.moe.experts
    if el.skew is not None:
        from planner.catalog.expert_loads import parse_skew, zipf_loads

        try:
            return zipf_loads(experts, parse_skew(el.skew), el.seed)
        except ValueError as exc:
            raise InputError(f"{where}: field 'expert_load.skew': {str(exc).split(': ', 1)[-1]}") from None
    from planner.catalog.expert_loads import read_expert_loads

    layers = read_expert_loads(base / el.file, experts)
    total = sum(v / v.sum() for v in layers.values())
    return total / total.sum()
