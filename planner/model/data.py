"""Data the MILP is built from: candidate rows plus per-hardware and per-workload figures, in SI."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from planner.catalog.fleet import Fleet
from planner.catalog.scenario import Racks, ResolvedScenario
from planner.catalog.schemas import HardwareSpec
from planner.errors import InfeasibleError, InputError
from planner.perf.candidates import CandidateTable
from planner.units import GB

POWER_OVERHEAD_WHEN_ONLY_TDP = 1.5
"""All-in power per chip (host, network, cooling share) over the chip's TDP where only the TDP is known."""


@dataclass(frozen=True)
class HardwareData:
    id: str
    unit_kind: str
    chips_per_unit: int
    usd_per_chip_hour: float
    kw_per_chip: float | None
    power_assumed: bool
    max_units: int | None
    vendor: str = ""
    """The chip's vendor (nvidia, amd, ...): prefill and decode of one workload pair on one engine and vendor."""

    @property
    def usd_per_unit_hour(self) -> float:
        return self.usd_per_chip_hour * self.chips_per_unit


@dataclass(frozen=True)
class WorkloadData:
    name: str
    requests_per_s: float
    input_tokens: int
    output_tokens: int
    working_set_bytes: float
    """Prefix KV the pools that reuse prefixes must hold, for the whole traffic."""


@dataclass(frozen=True)
class Tier:
    """Prices besides the plan's own (the reserved price, held over the whole horizon) at which units of one
    hardware may be bought period by period."""
    on_demand: float | None = None
    """USD per chip-hour of a unit bought for one period."""
    spot: float | None = None
    """USD per chip-hour of a preemptible unit bought for one period."""
    preemption: float = 0.0
    """Share of the spot units' chips counted as lost (the units are bought, their capacity is discounted)."""


@dataclass(frozen=True)
class Periods:
    """The operating periods one MILP plans over (snapshots): demand per workload and period and each period's
    share of the horizon. A scenario without a traffic profile is one period at its ``requests_per_s``.

    Units held over the whole horizon are bought once; units priced per period (``Tier``) per period. A second
    index of investment periods (months, units bought or reserved per month) goes beside this one: each
    operating period then belongs to one investment period, and the held units become ``u[h, month]``."""
    demand: dict[str, tuple[float, ...]]
    """Requests/s per workload, one value per period."""
    weights: tuple[float, ...]
    """Each period's share of the horizon (sums to 1): the objective is the horizon's mean $/h."""
    horizon_h: float = 1.0
    """Hours the periods cover together (24 for a day's profile)."""
    invest: bool = False
    """Investment periods (months of growth): held units may also be bought at the start of each period after
    the first (``ub[h, t]``), held from then to the horizon's end."""

    @property
    def count(self) -> int:
        return len(self.weights)


@dataclass
class PlanData:
    rows: pd.DataFrame
    """Candidate rows (index 0..n-1): workload, role, hardware, slots, requests_per_s,
    prefix_tier, prefix_bytes_per_replica and the rest of the candidate table."""
    hardware: dict[str, HardwareData]
    workloads: dict[str, WorkloadData]
    power_kw: float | None = None
    budget_usd_per_hour: float | None = None
    roles: tuple[str, ...] = ("aggregated",)
    notes: list[str] = field(default_factory=list)
    lose_units: int = 0
    """Purchase units whose loss every workload must survive (``resilience.lose_units``)."""
    max_hardware_types: int | None = None
    max_pool_types_per_workload: int | None = None
    pool_type_usd_per_hour: float = 0.0
    racks: Racks | None = None
    """``limits.racks``: racks of a power envelope the units must fit in."""
    max_chips: int | None = None
    """``limits.max_chips``: accelerators in the whole fleet, every hardware together."""
    periods: Periods | None = None
    """The operating periods; ``None``: one period at the workloads' ``requests_per_s`` (:func:`periods_of`)."""
    tiers: dict[str, Tier] = field(default_factory=dict)
    """Per-period price tiers per hardware (none: every unit is held over the horizon at the plan's price)."""
    fleet: Fleet | None = None
    """The deployed fleet the plan starts from (:mod:`planner.model.brownfield`), or None: from scratch."""


def periods_of(data: PlanData) -> Periods:
    """The periods ``data`` is planned over (one, at the workloads' demand, where it names none)."""
    if data.periods is not None:
        return data.periods
    return Periods({w: (wd.requests_per_s,) for w, wd in data.workloads.items()}, (1.0,))


def over_periods(data: PlanData, demand: dict[str, list[float]], tiers: dict[str, Tier], horizon_h: float = 24.0,
                 invest: bool = False) -> PlanData:
    """``data`` planned over equal periods of ``demand`` (requests/s per workload and period) with price ``tiers``
    (``invest``: units may be bought at each period's start, :attr:`Periods.invest`)."""
    T = len(next(iter(demand.values())))
    return replace(data, periods=Periods({w: tuple(float(v) for v in d) for w, d in demand.items()}, (1.0 / T,) * T,
                                         horizon_h, invest), tiers=dict(tiers))


def chip_power_kw(hw: HardwareSpec) -> tuple[float | None, bool]:
    """All-in kW per chip and whether it was assumed from the TDP."""
    if hw.power_all_in_kw is not None:
        return hw.power_all_in_kw, False
    if hw.power_w is not None:
        return hw.power_w / 1000.0 * POWER_OVERHEAD_WHEN_ONLY_TDP, True
    return None, False


def drop_unpowered(rs: ResolvedScenario) -> tuple[ResolvedScenario, list[str]]:
    """Under a power limit, hardware without any power figure cannot be checked. Listed explicitly in
    the scenario it is an input error (raised by :func:`prepare`); picked by default (every priced
    entry) it is left out, with a note."""
    sc = rs.scenario
    if (sc.limits.power_kw is None and sc.limits.racks is None) or sc.hardware is not None:
        return rs, []
    keep = tuple(h for h in rs.hardware if chip_power_kw(h)[0] is not None)
    gone = [h.id for h in rs.hardware if h not in keep]
    if not gone or not keep:
        return rs, []
    note = f"left out under the power or rack limit (no power figure in the catalog): {', '.join(gone)}"
    prices = {h.id: rs.prices[h.id] for h in keep}
    return replace(rs, hardware=keep, prices=prices), [note]


def prepare(rs: ResolvedScenario, table: CandidateTable) -> PlanData:
    sc = rs.scenario
    where = str(rs.path) if rs.path else f"scenario {sc.name}"
    hardware = {}
    notes = []
    max_units = {k: v for k, v in sc.limits.max_units.items()}
    for hw in rs.hardware:
        kw, assumed = chip_power_kw(hw)
        if kw is None and (sc.limits.power_kw is not None or sc.limits.racks is not None):
            field_ = "limits.power_kw" if sc.limits.power_kw is not None else "limits.racks"
            raise InputError(
                f"{where}: field '{field_}': {hw.id} has no power figure in its catalog entry; "
                "drop it from 'hardware' or drop the limit"
            )
        if assumed and sc.limits.power_kw is not None:
            notes.append(f"{hw.id}: all-in power assumed {POWER_OVERHEAD_WHEN_ONLY_TDP}x its {hw.power_w:.0f} W TDP")
        mu = None
        for k, v in max_units.items():
            if k == hw.id or k in hw.aliases:
                mu = v
        hardware[hw.id] = HardwareData(
            hw.id, hw.purchase_unit.kind, hw.purchase_unit.chips_per_unit, rs.prices[hw.id], kw, assumed, mu,
            hw.vendor,
        )
    notes += rack_notes(sc.limits.racks, hardware)
    workloads = {
        w.name: WorkloadData(
            w.name,
            w.requests_per_s,
            w.input_tokens,
            w.output_tokens,
            w.prefix_cache.working_set_gb * GB if w.prefix_cache.hit_rate > 0 else 0.0,
        )
        for w in sc.workloads
    }
    rows = table.rows.reset_index(drop=True)
    roles = tuple(r for r in ("aggregated", "prefill", "decode") if not rows.empty and (rows["role"] == r).any())
    lim = sc.limits
    return PlanData(rows, hardware, workloads, lim.power_kw, lim.budget_usd_per_hour, roles, notes,
                    sc.resilience.lose_units, lim.max_hardware_types, lim.max_pool_types_per_workload,
                    lim.pool_type_usd_per_hour, lim.racks, lim.max_chips, fleet=rs.fleet)


def rack_notes(racks: Racks | None, hardware: dict[str, HardwareData]) -> list[str]:
    """Under ``limits.racks``: a note per hardware whose purchase unit draws more than a rack holds (the MILP rules
    it out), and :class:`InfeasibleError` where that is every hardware (no elastic slack could place a unit)."""
    if racks is None:
        return []
    unit_kw = {h: (hd.kw_per_chip or 0.0) * hd.chips_per_unit for h, hd in hardware.items()}
    over = {h: kw for h, kw in unit_kw.items() if kw > racks.kw_per_rack * (1 + 1e-12)}
    if over and len(over) == len(unit_kw):
        least = min(over, key=over.get)
        raise InfeasibleError(f"limits.racks.kw_per_rack: {racks.kw_per_rack:g} kW holds no purchase unit (the "
                              f"smallest, a {hardware[least].unit_kind} of {least}, draws {over[least]:,.1f} kW all-in); "
                              "raise it or allow other hardware")
    return [f"{h}: a {hardware[h].unit_kind} draws {kw:,.1f} kW all-in, more than a {racks.kw_per_rack:g} kW rack "
            "holds (limits.racks): ruled out" for h, kw in sorted(over.items())]


def row_arrays(data: PlanData) -> dict[str, np.ndarray]:
    r = data.rows
    return {
        "workload": r["workload"].astype(str).to_numpy(),
        "role": r["role"].astype(str).to_numpy(),
        "hardware": r["hardware"].astype(str).to_numpy(),
        "slots": r["slots"].to_numpy(float),
        "rate": r["requests_per_s"].to_numpy(float),
        "prefix": (r["prefix_tier"].astype(str) != "none").to_numpy(),
        "pcap": r["prefix_bytes_per_replica"].to_numpy(float),
        "pd_class": pd_classes(data),
    }


def pd_classes(data: PlanData) -> np.ndarray:
    """Each row's prefill/decode pairing class, ``engine@vendor`` and the KV cache's format (``engine@vendor/kv``):
    every engine's prefill hands KV only to its own decode (vLLM's NIXL handshake refuses another version; SGLang and
    TensorRT-LLM pair their own servers), no engine documents a transfer between vendors' chips
    (shared/reference/engine-rules.md section 4), and the decode side reads the blocks the prefill side wrote, so both
    hold them in one format (vLLM's handshake refuses a pair whose KV-cache dtype differs, rules.yaml
    ``vllm.pd-same-kv-dtype``; SGLang's and TensorRT-LLM's transfers copy the buffers as they are). Rows without an
    engine or KV column (hand-built tests) share one class per vendor."""
    r = data.rows
    n = len(r)
    engine = r["engine"].astype(str).to_numpy() if "engine" in r else np.full(n, "", dtype=object)
    kv = r["kv_dtype"].astype(str).to_numpy() if "kv_dtype" in r else np.full(n, "", dtype=object)
    vendor = np.array([data.hardware[h].vendor for h in r["hardware"].astype(str)], dtype=object) if n else \
        np.array([], dtype=object)
    return np.array([f"{e}@{v}" + (f"/{k}" if k else "") for e, v, k in zip(engine, vendor, kv, strict=True)],
                    dtype=object)
