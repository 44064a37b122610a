"""The one period-indexed MILP against brute-force enumeration: profiles with per-period price tiers, N+k,
pool-type limits and racks together; the registry of constraint families."""

from __future__ import annotations

import itertools
import math

import pytest

from planner.catalog.scenario import Limits, Racks
from planner.model import HardwareData, PlanData, WorkloadData, build_model
from planner.model.build import period_values
from planner.model.data import Tier, over_periods
from planner.model.families import FAMILIES, limit_relaxations, shortfalls
from planner.solve import Solver
from tests.test_milp import _hw, _rows

DEMAND = {"w": [6.0, 2.5]}
"""Two periods of equal length: a peak and a trough."""


def _data(**kw) -> PlanData:
    rows = _rows([
        ("w", "aggregated", "a", 2, 1.0, 0),   # 4 chips a unit: 2 replicas, 2 req/s per unit
        ("w", "aggregated", "a", 4, 2.5, 0),   # one replica a unit, 2.5 req/s per unit
        ("w", "aggregated", "b", 1, 1.5, 0),   # 2 chips a unit: 3 req/s per unit
    ])
    hw = {"a": _hw("a", 4, 1.0, kw=2.0), "b": _hw("b", 2, 1.1, kw=1.0)}
    data = PlanData(rows, hw, {"w": WorkloadData("w", max(DEMAND["w"]), 1000, 100, 0.0)}, **kw)
    return over_periods(data, DEMAND, {"a": Tier(on_demand=1.6)}, 24.0)


def _loss(data: PlanData, role_rows: list[int], h: str) -> float:
    """What one lost unit of ``h`` takes (the densest row's rate per chip times the unit's chips)."""
    r, cpu = data.rows, data.hardware[h].chips_per_unit
    out = 0.0
    for i in role_rows:
        if r.loc[i, "hardware"] == h:
            s, q = float(r.loc[i, "slots"]), float(r.loc[i, "requests_per_s"])
            out = max(out, cpu * q / s if s <= cpu else 2 * q)
    return out


def _cheapest_units(data: PlanData, need: dict[str, list[int]]) -> tuple[float, dict[str, int]] | None:
    """Least mean $/h of units meeting ``need`` (units per hardware and period): units held all horizon at the
    plan's price, the rest bought per period at the on-demand tier where there is one."""
    T = len(next(iter(need.values())))
    usd, held = 0.0, {}
    for h, hd in data.hardware.items():
        tier = data.tiers.get(h)
        best = None
        for u in range(max(need[h]) + 1):
            if tier is None or tier.on_demand is None:
                if u < max(need[h]):
                    continue
                extra = 0.0
            else:
                extra = sum(tier.on_demand * hd.chips_per_unit * max(n - u, 0) for n in need[h]) / T
            c = hd.usd_per_chip_hour * hd.chips_per_unit * u + extra
            if best is None or c < best[0] - 1e-12:
                best = (c, u)
        usd += best[0]
        held[h] = best[1]
    return usd, held


def _brute(data: PlanData, xmax: tuple[int, ...] = (3, 3, 6)) -> float | None:
    r = data.rows
    n, T = len(r), len(DEMAND["w"])
    k = data.lose_units
    rows = list(range(n))
    rate = r["requests_per_s"].to_numpy(float)
    slots = r["slots"].to_numpy(float)
    hw = r["hardware"].to_numpy()
    loss = {h: _loss(data, rows, h) for h in data.hardware}
    best = None
    for xs in itertools.product(itertools.product(*(range(m + 1) for m in xmax)), repeat=T):
        if data.max_pool_types_per_workload is not None:
            used = {i for t in range(T) for i in rows if xs[t][i]}
            if len(used) > data.max_pool_types_per_workload:
                continue
        ok = True
        need = {h: [] for h in data.hardware}
        for t in range(T):
            cap = sum(xs[t][i] * rate[i] for i in rows)
            for h in data.hardware:
                on = [i for i in rows if hw[i] == h]
                if k and any(xs[t][i] for i in on) and cap - k * loss[h] < DEMAND["w"][t] - 1e-9:
                    ok = False
                chips = sum(xs[t][i] * slots[i] for i in on)
                need[h].append(math.ceil(chips / data.hardware[h].chips_per_unit - 1e-9))
            if cap < DEMAND["w"][t] - 1e-9:
                ok = False
        if not ok:
            continue
        if data.racks is not None:
            per = {h: math.floor(data.racks.kw_per_rack / (hd.kw_per_chip * hd.chips_per_unit))
                   for h, hd in data.hardware.items()}
            if any(sum(math.ceil(need[h][t] / per[h]) if per[h] else (math.inf if need[h][t] else 0)
                       for h in data.hardware) > data.racks.count for t in range(T)):
                continue
        usd, _ = _cheapest_units(data, need)
        if best is None or usd < best - 1e-9:
            best = usd
    return best


def _milp(data: PlanData):
    m = build_model(data)
    res = Solver(mip_gap=0.0, time_limit_s=60).solve(m)
    if res.status == "infeasible":
        return None, m
    assert res.status == "optimal"
    return res.objective, m


@pytest.mark.parametrize("kw", [
    {},
    {"lose_units": 1},
    {"max_pool_types_per_workload": 1},
    {"lose_units": 1, "max_pool_types_per_workload": 2},
    {"racks": Racks(count=2, kw_per_rack=8.0)},
    {"racks": Racks(count=3, kw_per_rack=8.0), "lose_units": 1},
], ids=["plain", "n+1", "one-pool-type", "n+1-two-pool-types", "racks", "racks-n+1"])
def test_the_period_model_is_the_brute_force_optimum(kw):
    """Profiles combine with N+k, pool-type limits and racks: each combination's optimum over two periods (units
    held all day or bought per period on demand) is the cheapest of every assignment of replicas per period."""
    data = _data(**kw)
    want = _brute(data)
    got, m = _milp(data)
    if want is None:
        assert got is None
        return
    assert got == pytest.approx(want, rel=1e-5, abs=1e-4)  # the tie-break adds at most 1e-6 of it
    # every period's fleet serves its demand
    for t, (x, _, _) in enumerate(period_values(m)):
        cap = sum(n * data.rows.loc[i, "requests_per_s"] for i, n in x.items())
        assert cap >= DEMAND["w"][t] - 1e-6


def test_racks_rule_out_a_unit_that_draws_more_than_a_rack_and_the_diagnosis_says_what_is_short():
    """A 4-chip unit of hardware ``a`` draws 8 kW: in 3 kW racks it cannot be placed, so ``b`` (2 kW a unit, one to
    a rack) alone serves; with one such rack the demand cannot be met and the elastic model names the racks and how
    many are short."""
    data = _data(racks=Racks(count=10, kw_per_rack=3.0))
    got, m = _milp(data)
    assert got is not None and round(m.u["a"].value) == 0
    assert got == pytest.approx(_brute(data), rel=1e-5)
    short = _data(racks=Racks(count=1, kw_per_rack=3.0))
    assert _milp(short)[0] is None
    e = build_model(short, elastic=True)
    assert Solver(mip_gap=0.0, time_limit_s=30).solve(e).has_solution
    lines = shortfalls(e)
    # b's units carry 3 req/s each: the 6 req/s peak needs 2 units, one to a 3 kW rack: 2 racks
    assert lines == ["limits.racks.count: serving the demand needs 2 racks of 3 kW, 1 allowed (short by 1)"]


def test_every_family_is_one_registry_entry_the_builder_defines():
    """Each registry entry's component is in a model that asks for every family, each limit's scenario path is a
    field of the scenario schema, and each relaxable limit names a mutable parameter of the model."""
    data = _data(lose_units=1, max_pool_types_per_workload=2, max_hardware_types=2, power_kw=100.0,
                 budget_usd_per_hour=1e3, racks=Racks(count=5, kw_per_rack=40.0), max_chips=1000)
    data.hardware["a"] = _hw("a", 4, 1.0, kw=2.0, max_units=9)
    m = build_model(data, elastic=True)
    names = {c.name for c in m.component_objects()}
    assert {"demand_coverage", "aggregated_capacity", "unit_packing", "inventory", "power", "budget", "racks",
            "resilience", "hardware_types", "row_used_link", "pool_types", "chip_quota"} <= names
    assert len({f.name for f in FAMILIES}) == len(FAMILIES)
    fields = set(Limits.model_fields)
    for f in FAMILIES:
        if f.path and f.path.startswith("limits."):
            assert f.path.split(".")[1] in fields, f.name
        if f.parameter is not None:
            assert isinstance(getattr(m, f.parameter), pyo_param_types()), f.name
        if f.slack is not None:
            assert hasattr(m, f.slack), f.name


def pyo_param_types():
    import pyomo.core as pyo
    from pyomo.core.base.param import IndexedParam, ScalarParam

    return (pyo.Param, IndexedParam, ScalarParam)


def test_a_full_rack_limit_is_priced_by_the_analysis():
    """The analysis asks each family for its relaxations: racks all used gives one, ten percent more (at least one
    more rack)."""
    data = _data(racks=Racks(count=2, kw_per_rack=8.0))

    class _G:
        def __init__(self, h, n):
            self.hardware, self.count, self.kw = h, n, None

    class _P:
        units = [_G("a", 3)]
        objective = None

    (r,) = [r for r in limit_relaxations(data, _P()) if r.family == "racks"]
    assert r.value == 3


@pytest.mark.parametrize("quota", [2, 4, 6, 8])
def test_a_chip_quota_is_the_brute_force_optimum_with_the_quota(quota):
    """``limits.max_chips`` (a GPU quota over every hardware) against enumeration: the cheapest plan whose every
    period holds at most ``quota`` chips; with too few, none, and the elastic model says how many are short."""
    data = _data(max_chips=quota)
    best = None
    rate, slots = data.rows["requests_per_s"].tolist(), data.rows["slots"].tolist()
    hw = data.rows["hardware"].tolist()
    for xs in itertools.product(itertools.product(range(4), range(4), range(7)), repeat=2):
        need = {h: [] for h in data.hardware}
        ok = True
        for t, x in enumerate(xs):
            if sum(x[i] * rate[i] for i in range(3)) < DEMAND["w"][t] - 1e-9:
                ok = False
            for h, hd in data.hardware.items():
                chips = sum(x[i] * slots[i] for i in range(3) if hw[i] == h)
                need[h].append(math.ceil(chips / hd.chips_per_unit - 1e-9))
            if sum(need[h][t] * data.hardware[h].chips_per_unit for h in data.hardware) > quota:
                ok = False
        if ok:
            usd, _ = _cheapest_units(data, need)
            best = usd if best is None or usd < best else best
    got, m = _milp(data)
    if best is None:
        assert got is None
        e = build_model(data, elastic=True)
        assert Solver(mip_gap=0.0, time_limit_s=30).solve(e).has_solution
        (line,) = shortfalls(e)
        assert line.startswith("limits.max_chips: serving the demand needs") and f"{quota:,} allowed" in line
    else:
        assert got == pytest.approx(best, rel=1e-5, abs=1e-4)


def _pd_data(vendor_b: str = "nvidia") -> PlanData:
    """One disaggregated workload: prefill and decode rows on engine e1 (hardware a) and e2 (hardware b); the
    cheapest prefill is e1's, the cheapest decode e2's, so an unpaired plan would mix them."""
    rows = _rows([
        ("w", "prefill", "a", 1, 2.0, 0),
        ("w", "decode", "a", 1, 1.0, 0),
        ("w", "prefill", "b", 1, 1.0, 0),
        ("w", "decode", "b", 1, 2.0, 0),
        ("w", "decode", "a", 2, 2.4, 0),
    ])
    rows["engine"] = ["e1", "e1", "e2", "e2", "e2"]
    hw = {"a": _hw("a", 2, 1.0), "b": HardwareData("b", "node", 2, 1.0, 1.0, False, None, vendor_b)}
    hw["a"] = HardwareData("a", "node", 2, 1.0, 1.0, False, None, "nvidia")
    return PlanData(rows, hw, {"w": WorkloadData("w", 4.0, 1000, 100, 0.0)}, roles=("prefill", "decode"))


def _pd_brute(data: PlanData) -> float | None:
    """Cheapest replicas per row (0..6) whose prefill and decode each carry the demand, every used row of one
    engine@vendor class (and one KV format where the rows say it)."""
    r = data.rows
    kv = r["kv_dtype"] if "kv_dtype" in r else [""] * len(r)
    cls = [f"{e}@{data.hardware[h].vendor}/{k}" for e, h, k in zip(r["engine"], r["hardware"], kv, strict=True)]
    best = None
    for x in itertools.product(range(7), repeat=len(r)):
        if len({cls[i] for i in range(len(r)) if x[i]}) > 1:
            continue
        cap = {role: sum(x[i] * r.loc[i, "requests_per_s"] for i in range(len(r)) if r.loc[i, "role"] == role)
               for role in ("prefill", "decode")}
        if min(cap.values()) < 4.0 - 1e-9:
            continue
        usd = 0.0
        for h, hd in data.hardware.items():
            chips = sum(x[i] * r.loc[i, "slots"] for i in range(len(r)) if r.loc[i, "hardware"] == h)
            usd += math.ceil(chips / hd.chips_per_unit - 1e-9) * hd.usd_per_unit_hour
        best = usd if best is None or usd < best else best
    return best


@pytest.mark.parametrize("vendor_b", ["nvidia", "amd"])
def test_prefill_and_decode_pair_on_one_engine_and_vendor(vendor_b):
    """The MILP's optimum is the brute-force optimum over plans whose prefill and decode share one engine and
    vendor, dearer here than the unpaired mix (e1's prefill with e2's decode), which the MILP never returns."""
    data = _pd_data(vendor_b)
    got, m = _milp(data)
    assert got == pytest.approx(_pd_brute(data), rel=1e-5, abs=1e-4)
    x, _ = period_values(m)[0][:2]
    used = {data.rows.loc[i, "engine"] for i in x}
    assert len(used) == 1
    unpaired = data.rows.assign(engine="e1")  # one engine everywhere: the mix is allowed and cheaper
    if vendor_b == "nvidia":
        assert _milp(PlanData(unpaired, data.hardware, data.workloads, roles=data.roles))[0] < got - 1e-6


def test_prefill_and_decode_pair_on_one_kv_format():
    """One engine and vendor whose cheapest prefill keeps KV in bf16 and whose cheapest decode keeps it in FP8: the
    decode side reads the blocks the prefill side wrote (vLLM's handshake refuses the pair, rules.yaml
    ``vllm.pd-same-kv-dtype``), so the MILP's optimum is the brute-force optimum over plans of one format, dearer
    than the mix, which it never returns."""
    data = _pd_data("nvidia")
    rows = data.rows.assign(engine="e1", kv_dtype=["bf16", "bf16", "fp8", "fp8", "fp8"])
    paired = PlanData(rows, data.hardware, data.workloads, roles=data.roles)
    got, m = _milp(paired)
    assert got == pytest.approx(_pd_brute(paired), rel=1e-5, abs=1e-4)
    x, _ = period_values(m)[0][:2]
    assert len({rows.loc[i, "kv_dtype"] for i in x}) == 1
    mixed = PlanData(rows.assign(kv_dtype="fp8"), data.hardware, data.workloads, roles=data.roles)
    assert _milp(mixed)[0] < got - 1e-6


def test_pruning_keeps_each_kv_formats_prefill_and_decode():
    """A prefill row of one KV format is no substitute for one of another (it cannot pair with that format's
    decode), so neither dominates the other across formats."""
    import pandas as pd

    from planner.perf.pruning import prune_dominated

    t = pd.DataFrame({
        "workload": "w", "role": ["prefill", "decode", "prefill", "decode"], "hardware": "a", "engine": "e1",
        "kv_dtype": ["bf16", "bf16", "fp8", "fp8"], "prefix_tier": "none", "slots": 1.0,
        "requests_per_s": [2.0, 2.0, 1.0, 3.0], "prefix_bytes_per_replica": 0.0, "tpot_s": 0.02})
    kept, _ = prune_dominated(t, {}, mixes=False)
    assert sorted(zip(kept["kv_dtype"], kept["role"], strict=True)) == [
        ("bf16", "decode"), ("bf16", "prefill"), ("fp8", "decode"), ("fp8", "prefill")]


def test_pruning_keeps_each_engines_prefill_and_decode_unless_another_beats_both():
    """Dominance never crosses engines for prefill and decode rows (a row of another engine cannot pair with this
    engine's other role), except that an engine beaten in both roles by another is dropped whole."""
    import pandas as pd

    from planner.perf.pruning import prune_dominated

    def table(e2_decode_rate):
        return pd.DataFrame({
            "workload": "w", "role": ["prefill", "decode", "prefill", "decode"], "hardware": "a",
            "engine": ["e1", "e1", "e2", "e2"], "prefix_tier": "none", "slots": 1.0,
            "requests_per_s": [2.0, 2.0, 1.0, e2_decode_rate], "prefix_bytes_per_replica": 0.0,
            "tpot_s": 0.02})

    kept, _ = prune_dominated(table(3.0), {}, mixes=False)  # e1 better at prefill, e2 at decode: both stay
    assert sorted(zip(kept["engine"], kept["role"], strict=True)) == [
        ("e1", "decode"), ("e1", "prefill"), ("e2", "decode"), ("e2", "prefill")]
    kept, _ = prune_dominated(table(1.0), {}, mixes=False)  # e1 better at both: e2 goes
    assert set(kept["engine"]) == {"e1"}


def test_racks_that_hold_no_unit_are_a_diagnosis_not_a_silent_exclusion():
    """A unit that draws more than a rack holds is ruled out with a note; where that is every hardware the plan is
    refused naming the field and the smallest unit's draw (the elastic model could not place one either)."""
    from planner.errors import InfeasibleError
    from planner.model.data import rack_notes

    hw = {"a": _hw("a", 4, 1.0, kw=2.0), "b": _hw("b", 2, 1.1, kw=1.0)}  # units of 8 and 2 kW
    assert rack_notes(Racks(count=3, kw_per_rack=3.0), hw) == [
        "a: a node draws 8.0 kW all-in, more than a 3 kW rack holds (limits.racks): ruled out"]
    with pytest.raises(InfeasibleError, match=r"limits.racks.kw_per_rack: 1 kW holds no purchase unit .* b, draws 2.0 kW"):
        rack_notes(Racks(count=3, kw_per_rack=1.0), hw)
    assert rack_notes(None, hw) == []
