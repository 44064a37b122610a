"""The deployed fleet a scenario re-plans from (brownfield planning): its units with their commitments, its pools,
the cost of changing them and the horizon over which a change must pay for itself.

Scenario fields (all optional; without ``existing`` a plan is from scratch)::

    existing: plans/deepseek-chat          # a plan folder (its units and pools), or:
    existing:
      plan: plans/deepseek-chat            # optional: a plan folder to read units and pools from
      commitment: reserved                 # of the plan's units: owned | reserved | on_demand
      until: 2027-06-30                    # end of the reservation (default: the horizon's end)
      units:                               # units by hand (replace the plan's units of that hardware)
        - {hardware: b300-sxm, count: 4, commitment: reserved, until: 2027-03-31, usd_per_chip_hour: 2.4}
      pools:                               # pools by hand (replace the plan's pools)
        - {workload: chat, hardware: b300-sxm, engine: vllm, ep: 8, attn_dp: 8, weights_dtype: fp4, replicas: 4}
    change_costs: {unit_added_usd: 2000, unit_released_usd: 500, pool_reconfigured_usd: 1000,
                   pool_reengined_usd: 5000, lead_time_days: 30}
    horizon_months: 12
    start: 2026-12-01

What a unit costs over the horizon (``horizon_months`` from ``start``):

- ``owned``: its capital is sunk; keeping it costs ``usd_per_chip_hour`` (the running cost: power, space,
  operations; default 0), releasing it saves that.
- ``reserved``: paid at ``usd_per_chip_hour`` (default the scenario's price) until ``until`` whether kept or
  not; past ``until`` (within the horizon) a kept unit renews at the scenario's price.
- ``on_demand``: paid at ``usd_per_chip_hour`` (default the scenario's price) while kept; released at any time.

Changes are one-off dollars, spread over the horizon's hours in the objective: a unit added or released, a pool
whose layout changes (reconfigured) or whose engine changes (re-engined).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from planner.catalog.fields import AsOf, Dtype, Strict
from planner.catalog.ids import NameId
from planner.errors import InputError
from planner.version import PLAN_SCHEMA_VERSION

Commitment = Literal["owned", "reserved", "on_demand"]
Role = Literal["aggregated", "prefill", "decode"]
HOURS_PER_MONTH = 730.0
"""8,760 hours a year over twelve months."""
DEFAULT_HORIZON_MONTHS = 12.0
"""Months over which a change must pay for itself unless the scenario says (a one-year reservation's term)."""
UNIT_ADDED_HOURS = 48.0
"""Default cost of adding a purchase unit: 48 hours of its price (racking or provisioning, burn-in and
validation before it takes traffic)."""
UNIT_RELEASED_HOURS = 24.0
"""Default cost of releasing a purchase unit: 24 hours of its price (draining, wiping and handing it back)."""
POOL_RECONFIGURED_USD = 1_000.0
"""Default cost of a pool whose layout or weight format changes: about an engineer-day of rollout work (a
new launch configuration tested, weights re-sharded, a canary)."""
POOL_REENGINED_USD = 5_000.0
"""Default cost of a pool whose serving engine changes: about an engineer-week (a new engine qualified on the
model: accuracy, flags, dashboards and alerts)."""
MAX_USD = 1e12


class FleetUnits(Strict):
    hardware: str
    count: Annotated[int, Field(ge=0, le=1_000_000)]
    commitment: Commitment = "reserved"
    until: AsOf | None = None
    """``reserved``: the end of the term (default: the horizon's end, i.e. committed throughout)."""
    usd_per_chip_hour: Annotated[float, Field(ge=0, le=1e4)] | None = None
    """What one chip costs per hour: the reserved or on-demand rate (default: the scenario's price), or an owned
    unit's running cost (default 0: its capital is sunk)."""


class FleetPool(Strict):
    workload: NameId
    role: Role = "aggregated"
    hardware: str
    engine: str
    tp: Annotated[int, Field(ge=1, le=4096)] = 1
    ep: Annotated[int, Field(ge=1, le=4096)] = 1
    pp: Annotated[int, Field(ge=1, le=4096)] = 1
    attn_dp: Annotated[int, Field(ge=1, le=4096)] = 1
    weights_dtype: Dtype | None = None
    """The weight format served (default: any: the pool is kept whatever format a candidate of its layout uses)."""
    replicas: Annotated[int, Field(ge=0, le=1_000_000)]


class ExistingFleet(Strict):
    plan: str | None = None
    """A plan folder (``plan.json``), relative to the scenario file."""
    commitment: Commitment = "reserved"
    """Commitment of the plan's units (a plan is priced at the reserved price)."""
    until: AsOf | None = None
    """End of the plan's units' reservation (default: the horizon's end)."""
    units: list[FleetUnits] = Field(default_factory=list)
    pools: list[FleetPool] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> ExistingFleet:
        if self.plan is None and not self.units:
            raise ValueError("give 'plan' (a plan folder) or 'units' (the deployed units)")
        return self


class ChangeCosts(Strict):
    unit_added_usd: Annotated[float, Field(ge=0, le=MAX_USD)] | None = None
    """Per purchase unit added (default: ``UNIT_ADDED_HOURS`` hours of its price)."""
    unit_released_usd: Annotated[float, Field(ge=0, le=MAX_USD)] | None = None
    """Per purchase unit released (default: ``UNIT_RELEASED_HOURS`` hours of its price)."""
    pool_reconfigured_usd: Annotated[float, Field(ge=0, le=MAX_USD)] = POOL_RECONFIGURED_USD
    """Per pool of a deployed workload whose layout or weight format is new."""
    pool_reengined_usd: Annotated[float, Field(ge=0, le=MAX_USD)] = POOL_REENGINED_USD
    """Per pool of a deployed workload and role on an engine it did not run before."""
    lead_time_days: Annotated[float, Field(ge=0, le=3650)] = 0.0
    """Days before added hardware exists (the existing fleet carries the traffic until then)."""


@dataclass(frozen=True)
class UnitGroup:
    """Deployed units of one hardware and commitment."""
    hardware: str
    count: int
    commitment: str
    until: dt.date | None
    usd_per_chip_hour: float
    """Their rate (reserved, on-demand) or running cost (owned)."""
    committed_share: float
    """Share of the horizon the units are paid for whether kept or not (a reservation's remaining term)."""
    renew_usd_per_chip_hour: float
    """Rate of a kept unit past its commitment (the scenario's price); equal to the rate for on-demand units."""

    def keep_usd_per_chip_hour(self) -> float:
        """Horizon-average cost per chip-hour of keeping a unit, beyond what is committed anyway."""
        if self.commitment == "reserved":
            return (1.0 - self.committed_share) * self.renew_usd_per_chip_hour
        return self.usd_per_chip_hour

    def committed_usd_per_chip_hour(self) -> float:
        """Horizon-average cost per chip-hour paid whether the unit is kept or released."""
        return self.committed_share * self.usd_per_chip_hour if self.commitment == "reserved" else 0.0


@dataclass(frozen=True)
class DeployedPool:
    """A deployed pool: its identity (what a change of it means), replicas and, read from a plan, its requests/s
    per replica."""
    workload: str
    role: str
    hardware: str
    engine: str
    tp: int
    ep: int
    pp: int
    attn_dp: int
    weights_dtype: str
    """Empty where the pool was given without one (any format matches)."""
    replicas: int
    pool_id: str = ""
    requests_per_s_per_replica: float | None = None
    tune: tuple | None = None
    """Launch flags read from a plan (batch, cache format and tier, prefix tier, speculative tokens)."""
    notation: str = ""

    @property
    def key(self) -> tuple:
        return pool_key(self.workload, self.role, self.hardware, self.engine, self.tp, self.ep, self.pp,
                        self.attn_dp, self.weights_dtype)

    @property
    def layout(self) -> str:
        return self.notation or f"TP{self.tp} EP{self.ep} PP{self.pp} DP{self.attn_dp}"


def pool_key(workload, role, hardware, engine, tp, ep, pp, attn_dp, weights_dtype="") -> tuple:
    """A pool's identity: the same workload, role, hardware, engine, layout and weight format is the same pool
    (batch, cache format and tiers are launch flags: retuned, not reconfigured)."""
    return (str(workload), str(role), str(hardware), str(engine), int(tp), int(ep), int(pp), int(attn_dp),
            str(weights_dtype or ""))


@dataclass(frozen=True)
class Fleet:
    """The deployed fleet, resolved against the catalog, with the change costs per hardware."""
    source: str
    groups: tuple[UnitGroup, ...]
    pools: tuple[DeployedPool, ...]
    horizon_months: float
    start: dt.date
    unit_added_usd: dict[str, float]
    unit_released_usd: dict[str, float]
    pool_reconfigured_usd: float
    pool_reengined_usd: float
    lead_time_days: float
    notes: tuple[str, ...] = ()
    demand: dict[str, float] = field(default_factory=dict)
    """Requests/s per workload the deployed fleet was planned for (read from its plan; empty where given by hand)."""
    keep_only: tuple[str, ...] = ()
    """Deployed hardware outside the scenario's ``hardware`` list: kept or released, never added to."""

    @property
    def horizon_h(self) -> float:
        return self.horizon_months * HOURS_PER_MONTH

    def units(self) -> dict[str, int]:
        """Deployed units per hardware."""
        out: dict[str, int] = {}
        for g in self.groups:
            out[g.hardware] = out.get(g.hardware, 0) + g.count
        return out

    def keys(self) -> set[tuple]:
        """Identities of the deployed pools with replicas."""
        return {p.key for p in self.pools if p.replicas > 0}

    def summary(self) -> dict:
        """The fleet as plain data (for the plan's input hash and its JSON)."""
        return {"source": self.source, "start": str(self.start), "horizon_months": self.horizon_months,
                "groups": [[g.hardware, g.count, g.commitment, str(g.until), g.usd_per_chip_hour, g.committed_share]
                           for g in self.groups],
                "pools": [list(p.key) + [p.replicas] for p in self.pools],
                "costs": [self.unit_added_usd, self.unit_released_usd, self.pool_reconfigured_usd,
                          self.pool_reengined_usd, self.lead_time_days]}


def months_between(a: dt.date, b: dt.date) -> float:
    return (b - a).days / (365.0 / 12.0)


@dataclass(frozen=True)
class FleetFiles:
    """The scenario's ``existing`` with its plan folder read (once)."""
    spec: ExistingFleet
    plan_dir: Path | None
    doc: dict


def read_fleet(sc, where: str, base: Path) -> FleetFiles | None:
    """The scenario's ``existing`` and the ``plan.json`` it names (relative to ``base``), or ``None``."""
    spec = sc.existing
    if spec is None:
        return None
    if spec.plan is None:
        return FleetFiles(spec, None, {})
    plan_dir = Path(spec.plan) if Path(spec.plan).is_absolute() else base / spec.plan
    return FleetFiles(spec, plan_dir, _read_plan(plan_dir, where, "existing.plan"))


def resolve_fleet(sc, files: FleetFiles | None, catalog, where: str, prices: dict[str, float],
                  today: dt.date | None = None) -> Fleet | None:
    """The scenario's ``existing`` fleet (read by :func:`read_fleet`) resolved against ``catalog``: hardware and
    models known, the plan of this schema version, commitments not ended before ``start``. ``None`` where the
    scenario names no fleet."""
    if files is None:
        return None
    spec = files.spec
    start = sc.start or today or dt.date.today()
    horizon = sc.horizon_months
    notes: list[str] = []
    units: dict[str, list[FleetUnits]] = {}
    pools: list[DeployedPool] = []
    demand: dict[str, float] = {}
    label = "existing"
    if files.plan_dir is not None:
        plan_dir, doc = files.plan_dir, files.doc
        for i, g in enumerate(doc.get("units", [])):
            hid = _hardware(catalog, g.get("hardware", ""), where, f"{label}: {plan_dir}/plan.json units.{i}.hardware")
            units.setdefault(hid, []).append(FleetUnits(hardware=hid, count=int(g["count"]), commitment=spec.commitment,
                                                        until=spec.until))
        for i, p in enumerate(doc.get("pools", [])):
            loc = f"{label}: {plan_dir}/plan.json pools.{i}"
            hid = _hardware(catalog, p.get("hardware", ""), where, f"{loc}.hardware")
            if p.get("model") and catalog.model_id(p["model"]) is None:
                raise InputError(f"{where}: {loc}.model: model '{p['model']}' is not in the catalog")
            lay = p.get("layout", {})
            pools.append(DeployedPool(p["workload"], p["role"], hid, p["engine"], int(lay["tp"]), int(lay["ep"]),
                                      int(lay["pp"]), int(lay["attn_dp"]), p.get("weights_dtype", ""),
                                      int(p["replicas"]), p.get("id", ""),
                                      float(p["predicted"]["requests_per_s_per_replica"]),
                                      (p.get("batch"), p.get("kv_dtype"), p.get("kv_tier"), p.get("prefix_tier"),
                                       p.get("spec_tokens")), lay.get("notation", "")))
        demand = {w["name"]: float(w["requests_per_s"]) for w in doc.get("workloads", []) if "name" in w}
    by_hand: dict[str, list[FleetUnits]] = {}
    for i, u in enumerate(spec.units):
        hid = _hardware(catalog, u.hardware, where, f"existing.units.{i}.hardware")
        if u.until is not None and u.until < start:
            raise InputError(f"{where}: field 'existing.units.{i}.until': the commitment ends {u.until}, before the "
                             f"plan's start {start}; drop the unit or move 'start'")
        by_hand.setdefault(hid, []).append(u.model_copy(update={"hardware": hid}))
    units.update(by_hand)
    if spec.until is not None and spec.until < start:
        raise InputError(f"{where}: field 'existing.until': the commitment ends {spec.until}, before the plan's "
                         f"start {start}; drop it or move 'start'")
    if spec.pools:
        pools = []
        for i, p in enumerate(spec.pools):
            hid = _hardware(catalog, p.hardware, where, f"existing.pools.{i}.hardware")
            if catalog.engine_id(p.engine) is None:
                raise InputError(f"{where}: field 'existing.pools.{i}.engine': engine '{p.engine}' is not in the catalog")
            pools.append(DeployedPool(p.workload, p.role, hid, catalog.engine_id(p.engine), p.tp, p.ep, p.pp,
                                      p.attn_dp, p.weights_dtype or "", p.replicas))
    names = {w.name for w in sc.workloads}
    gone = sorted({p.workload for p in pools if p.workload not in names})
    if gone:
        notes.append(f"existing pools of workloads the scenario no longer serves are removed: {', '.join(gone)}")
    groups = []
    for hid, lst in units.items():
        for u in lst:
            if not u.count:
                continue
            if hid not in prices:
                raise InputError(f"{where}: field 'prices.{hid}': the existing fleet holds {hid}, which has no price; "
                                 "give one in USD per chip-hour")
            rate = u.usd_per_chip_hour if u.usd_per_chip_hour is not None else (
                0.0 if u.commitment == "owned" else prices[hid])
            share = 0.0
            if u.commitment == "reserved":
                share = 1.0 if u.until is None else min(max(months_between(start, u.until) / horizon, 0.0), 1.0)
            groups.append(UnitGroup(hid, u.count, u.commitment, u.until, float(rate), share, prices[hid]))
    cc = sc.change_costs
    unit_h = {h.id: h.purchase_unit.chips_per_unit for h in catalog.hardware.values()}
    added = {h: cc.unit_added_usd if cc.unit_added_usd is not None else UNIT_ADDED_HOURS * p * unit_h[h]
             for h, p in prices.items()}
    released = {h: cc.unit_released_usd if cc.unit_released_usd is not None else UNIT_RELEASED_HOURS * p * unit_h[h]
                for h, p in prices.items()}
    return Fleet(str(spec.plan) if spec.plan is not None else "scenario", tuple(groups),
                 tuple(p for p in pools if p.workload in names), float(horizon), start, added, released,
                 cc.pool_reconfigured_usd, cc.pool_reengined_usd, cc.lead_time_days, tuple(notes), demand)


def fleet_hardware(files: FleetFiles | None, catalog, where: str) -> list[str]:
    """Hardware ids the deployed fleet holds (its units), so the scenario's candidates include them."""
    if files is None:
        return []
    out = [_hardware(catalog, g.get("hardware", ""), where, f"existing: {files.plan_dir}/plan.json units.{i}.hardware")
           for i, g in enumerate(files.doc.get("units", []))]
    out += [_hardware(catalog, u.hardware, where, f"existing.units.{i}.hardware") for i, u in enumerate(files.spec.units)]
    return list(dict.fromkeys(out))


def _hardware(catalog, name: str, where: str, field: str) -> str:
    from planner.catalog.loader import unknown_id_message

    hid = catalog.hardware_id(str(name))
    if hid is None:
        raise InputError(f"{where}: field '{field}': {unknown_id_message('hardware', str(name), catalog.hardware)}")
    return hid


def _read_plan(plan_dir: Path, where: str, field: str) -> dict:
    """The raw ``plan.json`` of a plan folder of this schema version (the catalog layer reads it as data: the
    plan's own schema lives above it)."""
    from planner.catalog.inputs import MAX_DATA_BYTES, load_json

    if not plan_dir.is_dir() or not (plan_dir / "plan.json").is_file():
        raise InputError(f"{where}: field '{field}': {plan_dir} is not a plan folder (give the folder with plan.json)")
    doc = load_json(plan_dir / "plan.json", limit=MAX_DATA_BYTES)
    if not isinstance(doc, dict):
        raise InputError(f"{plan_dir / 'plan.json'}: not a plan (expected a mapping)")
    version = doc.get("schema_version")
    if version != PLAN_SCHEMA_VERSION:
        raise InputError(f"{where}: field '{field}': {plan_dir}/plan.json is plan schema {version}, this planner "
                         f"reads {PLAN_SCHEMA_VERSION}; re-plan it with `planner plan` (or give its units by hand)")
    try:
        for p in doc.get("pools", []):
            _ = (p["workload"], p["role"], p["engine"], p["layout"]["tp"], p["replicas"],
                 p["predicted"]["requests_per_s_per_replica"])
        for g in doc.get("units", []):
            _ = g["count"]
    except (KeyError, TypeError) as err:
        raise InputError(f"{plan_dir / 'plan.json'}: not a plan.json of this planner (missing {err}); re-plan it") from None
    return doc
