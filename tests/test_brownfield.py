"""Re-planning from a deployed fleet (issue 47): the brownfield MILP against brute-force enumeration, its
optimum against keeping the fleet and against the from-scratch plan with its change cost, growth over months,
stable re-plans of a bundled scenario, the migration diff and steps, ``planner diff`` and bad input."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pyomo.core as pyo
import pytest
import yaml

from planner.catalog.fleet import DeployedPool, Fleet, UnitGroup
from planner.model import PlanData, WorkloadData, build_model
from planner.model.brownfield import committed_usd, horizon_hours
from planner.model.data import Tier, over_periods
from planner.solve import Solver
from tests.test_milp import _hw, _rows

ROOT = Path(__file__).resolve().parents[1]
H = 12 * 730.0


def _rows_with_layouts():
    rows = _rows([
        ("w", "aggregated", "a", 4, 2.0, 0),   # deployed layout (TP4 on a): one replica a unit, 2 req/s
        ("w", "aggregated", "a", 2, 1.2, 0),   # TP2 on a: 2 replicas a unit, 2.4 req/s a unit
        ("w", "aggregated", "b", 2, 1.5, 0),   # TP2 on b (2 chips a unit): 1.5 req/s a unit, cheaper
    ])
    rows["engine"] = "vllm"
    rows["tp"] = [4, 2, 2]
    rows["ep"] = rows["pp"] = rows["attn_dp"] = 1
    rows["weights_dtype"] = "fp8"
    return rows


def _fleet(commitment: str, share: float, count: int = 2, added: float = 0.0, released: float = 0.0,
           reconf: float = 0.0, rate: float = 1.0) -> Fleet:
    until = None if share >= 1 else dt.date(2027, 1, 1) + dt.timedelta(days=int(share * 365))
    grp = UnitGroup("a", count, commitment, until, rate, share if commitment == "reserved" else 0.0, 1.0)
    pool = DeployedPool("w", "aggregated", "a", "vllm", 4, 1, 1, 1, "fp8", count, "w-aggregated-1", 2.0)
    return Fleet("test", (grp,), (pool,), 12.0, dt.date(2027, 1, 1), {"a": added, "b": added},
                 {"a": released, "b": released}, reconf, reconf, 0.0)


def _data(fleet: Fleet | None, demand: float) -> PlanData:
    hw = {"a": _hw("a", 4, 1.0), "b": _hw("b", 2, 0.9)}
    return PlanData(_rows_with_layouts(), hw, {"w": WorkloadData("w", demand, 1000, 100, 0.0)}, fleet=fleet)


def _brute(data: PlanData) -> tuple[float, float | None, float]:
    """Least horizon $/h by enumeration (replicas per row, deployed units kept), the least keeping every
    deployed unit and adding none (``None``: it cannot serve), and the from-scratch fleet's units held as
    cheaply as the fleet allows."""
    fleet, r = data.fleet, data.rows
    grp = fleet.groups[0]
    cpu = {h: hd.chips_per_unit for h, hd in data.hardware.items()}
    price = {h: hd.usd_per_chip_hour * cpu[h] for h, hd in data.hardware.items()}
    keep_rate = ((1 - grp.committed_share) * grp.renew_usd_per_chip_hour if grp.commitment == "reserved"
                 else grp.usd_per_chip_hour) * cpu["a"]
    committed = grp.committed_share * grp.usd_per_chip_hour * cpu["a"] * grp.count if grp.commitment == "reserved" else 0.0
    demand = data.workloads["w"].requests_per_s

    def cost_of(units_a: int, units_b: int, new_layouts: int, keep_all: bool = False) -> float:
        best = math.inf
        for k in range(grp.count + 1):
            if keep_all and k != grp.count:
                continue
            add_a = max(units_a - k, 0)
            if keep_all and add_a:
                continue
            c = price["a"] * add_a + keep_rate * k + committed + price["b"] * units_b
            c += (fleet.unit_added_usd["a"] * add_a + fleet.unit_added_usd["b"] * units_b
                  + fleet.unit_released_usd["a"] * (grp.count - k) + fleet.pool_reconfigured_usd * new_layouts) / H
            best = min(best, c)
        return best

    best = keep = math.inf
    scratch = (math.inf, None)
    for x in itertools.product(range(7), range(9), range(9)):
        if sum(x[i] * float(r.loc[i, "requests_per_s"]) for i in range(3)) < demand - 1e-9:
            continue
        ua = math.ceil((4 * x[0] + 2 * x[1]) / 4 - 1e-9)
        ub = math.ceil(2 * x[2] / 2 - 1e-9)
        new = int(x[1] > 0) + int(x[2] > 0)
        best = min(best, cost_of(ua, ub, new))
        keep = min(keep, cost_of(ua, ub, new, keep_all=True) if ub == 0 else math.inf)
        plain = price["a"] * ua + price["b"] * ub
        if plain < scratch[0] - 1e-9:
            scratch = (plain, (ua, ub))
    ua, ub = scratch[1]
    held_as = math.inf
    for x in itertools.product(range(7), range(9), range(9)):
        if math.ceil((4 * x[0] + 2 * x[1]) / 4 - 1e-9) <= ua and x[2] <= ub and \
                sum(x[i] * float(r.loc[i, "requests_per_s"]) for i in range(3)) >= demand - 1e-9:
            held_as = min(held_as, cost_of(ua, ub, int(x[1] > 0) + int(x[2] > 0)))
    return best, (keep if keep < math.inf else None), held_as


CASES = [
    ("reserved", 1.0, 0.0, 0.0, 0.0, 2.4),      # committed all year, free changes: keep and add what is cheapest
    ("reserved", 1.0, 50.0, 20.0, 30.0, 2.4),
    ("reserved", 0.5, 50.0, 20.0, 30.0, 4.5),   # half the year committed
    ("on_demand", 0.0, 0.0, 0.0, 0.0, 3.1),     # market price, no change cost: the from-scratch plan
    ("on_demand", 0.0, 5000.0, 5000.0, 8000.0, 3.1),
    ("owned", 0.0, 100.0, 100.0, 100.0, 6.0),   # sunk: keeping costs the running cost only
]


@pytest.mark.parametrize("commitment,share,added,released,reconf,demand", CASES)
def test_brownfield_matches_enumeration_and_beats_both_alternatives(commitment, share, added, released, reconf, demand):
    rate = 0.2 if commitment == "owned" else 1.0
    data = _data(_fleet(commitment, share, added=added, released=released, reconf=reconf, rate=rate), demand)
    m = build_model(data)
    r = Solver(time_limit_s=30, mip_gap=1e-9).solve(m)
    assert r.status == "optimal"
    got = float(pyo.value(m.cost)) + committed_usd(m, 0)
    best, keep, scratch = _brute(data)
    # the objective carries the tie-break (1e-6 of the chips' dollars)
    assert got == pytest.approx(best, rel=1e-4, abs=1e-6)
    assert got <= scratch * (1 + 1e-5) + 1e-9
    if keep is not None:
        assert got <= keep * (1 + 1e-5) + 1e-9


def test_zero_change_costs_at_market_cost_what_the_from_scratch_plan_costs():
    data = _data(_fleet("on_demand", 0.0), 3.1)
    m = build_model(data)
    Solver(time_limit_s=30, mip_gap=1e-9).solve(m)
    scratch = build_model(replace(data, fleet=None))
    Solver(time_limit_s=30, mip_gap=1e-9).solve(scratch)
    assert float(pyo.value(m.cost)) == pytest.approx(float(pyo.value(scratch.cost)), rel=1e-6)


def test_growth_over_months_reserves_when_needed_and_releases_after_the_term():
    """Three months of growth: the reservation ends after month 1; month 3 needs more capacity."""
    fleet = replace(_fleet("reserved", 1.0), groups=(UnitGroup("a", 2, "reserved", dt.date(2027, 2, 1), 1.0, 0.0, 1.0),))
    data = _data(fleet, 6.0)
    demand = {"w": [3.0, 3.0, 6.0]}
    d = over_periods(data, demand, {"b": Tier(on_demand=2.0)}, 3 * 730.0, invest=True)
    m = build_model(d)
    r = Solver(time_limit_s=30, mip_gap=1e-9).solve(m)
    assert r.status == "optimal"
    keep = [round(pyo.value(m.bf_keep[0, t])) for t in m.T]
    assert keep == sorted(keep, reverse=True)  # a released unit is gone
    assert pyo.value(m.ub["b", 2]) >= 1  # bought when first needed, not before
    assert horizon_hours(m) == pytest.approx(3 * 730.0)
    # the a-units are free while reserved (month 1), then cost more than b-units: released
    assert keep[0] == 2 and keep[2] == 0


def _scenario(tmp_path: Path, rps: float, extra: dict) -> Path:
    doc = yaml.safe_load((ROOT / "catalogs" / "scenarios" / "deepseek-chat.yaml").read_text())
    doc["workloads"][0]["requests_per_s"] = rps
    doc.update(extra)
    path = tmp_path / f"s-{rps:g}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _plan(path: Path, **kw):
    import planner

    return planner.plan(planner.load_scenario(path, **kw), planner.PlanOptions(analysis=False))


def test_plus_ten_percent_keeps_the_deployed_fleet_and_adds_what_pays(tmp_path):
    deployed = ROOT / "plans" / "deepseek-chat"
    before = {g["hardware"]: g["count"] for g in json.loads((deployed / "plan.json").read_text())["units"]}
    plan = _plan(_scenario(tmp_path, 440, {"start": "2026-12-01"}), existing=deployed)
    after = {g.hardware: g.count for g in plan.units}
    assert all(after.get(h, 0) >= n for h, n in before.items())  # nothing deployed is thrown away
    mig = plan.migration
    assert mig is not None and mig.cost is not None
    assert mig.cost.scratch_usd is None or mig.cost.total_usd <= mig.cost.scratch_usd + 1e-6
    # deployed pools the re-plan keeps are kept, resized or retuned; on the plan of 2026-12-07's fifth session (six
    # pools on five units) it folds four small pools into the two it keeps, reusing their units (none is released,
    # above), which pays within the horizon
    kept = [c for c in mig.pools if c.old_pool is not None and c.status != "removed"]
    assert kept and all(c.status in ("kept", "resized", "retuned") for c in kept)
    removed = [c for c in mig.pools if c.status == "removed"]
    assert all(c.old_pool is not None and c.replicas_after == 0 for c in removed)
    assert all(s.ok for s in mig.steps)
    assert [s.action for s in mig.steps][0] == "provision units"
    # at market prices and with free changes the re-plan costs what today's from-scratch plan costs
    free = {"start": "2026-12-01", "change_costs": {"unit_added_usd": 0, "unit_released_usd": 0,
                                                    "pool_reconfigured_usd": 0, "pool_reengined_usd": 0},
            "existing": {"plan": str(deployed), "commitment": "on_demand"}}
    at_market = _plan(_scenario(tmp_path, 440, free))
    scratch = _plan(_scenario(tmp_path, 440, {}))
    assert at_market.migration.cost.usd_per_hour == pytest.approx(scratch.objective.usd_per_hour, rel=1e-6)


def test_diff_cli_and_steps_add_before_remove(tmp_path, capsys):
    from planner.cli.app import main

    code = 0
    try:
        main(["diff", str(ROOT / "plans" / "deepseek-chat"), str(ROOT / "plans" / "deepseek-sglang-pd"), "--json"])
    except SystemExit as e:
        code = e.code or 0
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    actions = [s["action"] for s in doc["steps"]]
    assert actions.index("route traffic") > max(i for i, a in enumerate(actions) if a.startswith("start") or a.startswith("provision"))
    drains = [i for i, a in enumerate(actions) if a.startswith("drain") or a == "release units"]
    assert all(i > actions.index("route traffic") for i in drains)
    pre = [i for i, a in enumerate(actions) if a == "start prefill pools"]
    dec = [i for i, a in enumerate(actions) if a == "start decode pools"]
    if pre and dec:
        assert pre[0] < dec[0]
    assert all(s["ok"] for s in doc["steps"])


def _run(args) -> int:
    from planner.cli.app import main

    try:
        main([str(a) for a in args])
    except SystemExit as e:
        return e.code or 0
    return 0


@pytest.mark.parametrize("extra,says", [
    ({"existing": {"units": [{"hardware": "no-such-gpu", "count": 2}]}}, "existing.units.0.hardware"),
    ({"existing": {"units": [{"hardware": "b200-sxm", "count": 2, "until": "2020-01-01"}]},
      "start": "2026-12-01"}, "existing.units.0.until"),
    ({"existing": {"units": [{"hardware": "b200-sxm", "count": 2}]},
      "change_costs": {"unit_added_usd": -5}}, "change_costs.unit_added_usd"),
    ({"existing": {"units": [{"hardware": "b200-sxm", "count": 2}],
                   "pools": [{"workload": "chat", "hardware": "b200-sxm", "engine": "nosuch", "replicas": 1}]}},
     "existing.pools.0.engine"),
    ({"existing": {"units": [{"hardware": "b200-sxm", "count": 1, "commitment": "rented"}]}},
     "existing.units.0.commitment"),
    ({"existing": "/nonexistent/plan"}, "existing.plan"),
])
def test_bad_fleet_input_names_the_field(tmp_path, capsys, extra, says):
    path = _scenario(tmp_path, 400, extra)
    code = _run(["plan", path, "--out", tmp_path / "out"])
    err = capsys.readouterr().err
    assert code == 1 and says in err and "Traceback" not in err, err


def test_plan_of_another_schema_version_is_refused(tmp_path, capsys):
    src = tmp_path / "old"
    shutil.copytree(ROOT / "plans" / "deepseek-chat", src)
    doc = json.loads((src / "plan.json").read_text())
    doc["schema_version"] = "2.5"
    (src / "plan.json").write_text(json.dumps(doc))
    code = _run(["plan", ROOT / "catalogs" / "scenarios" / "deepseek-chat.yaml", "--from", src, "--out", tmp_path / "o"])
    err = capsys.readouterr().err
    assert code == 1 and "schema 2.5" in err and "Traceback" not in err and err.count("\n") <= 2, err


def test_room_notes_say_what_the_overlap_needs():
    from planner.pipeline.brownfield import room_notes
    from planner.results.migration import Step

    hw = {"a": _hw("a", 4, 1.0, kw=1.0, max_units=3), "b": _hw("b", 2, 0.9, kw=2.0)}
    data = PlanData(_rows_with_layouts(), hw, {"w": WorkloadData("w", 3.0, 1000, 100, 0.0)}, power_kw=20.0)
    steps = [Step(step=1, action="provision units", detail="", units={"a": 4, "b": 2}, usd_per_hour=1.0,
                  capacity_rps={}, demand_rps={}, ok=True),
             Step(step=2, action="release units", detail="", units={"a": 2, "b": 2}, usd_per_hour=1.0,
                  capacity_rps={}, demand_rps={}, ok=True)]
    notes = room_notes(data, steps)
    assert any("4 a units" in n and "allows 3" in n for n in notes)
    assert any("24 kW" in n and "20 kW" in n for n in notes)  # 4 x 4 x 1 + 2 x 2 x 2 = 24 kW at the overlap
    assert room_notes(replace(data, power_kw=30.0, hardware={**hw, "a": _hw("a", 4, 1.0, kw=1.0)}), steps) == []


def test_export_carries_the_migration(tmp_path):
    from planner.catalog import load_catalog
    from planner.export.bundle import export_plan

    src = ROOT / "plans" / "growth-year"
    doc = export_plan(src, ["vllm", "k8s"], tmp_path / "export", load_catalog())
    paths = {f["path"] for f in doc["files"]}
    assert "migration.json" in paths
    mig = json.loads((tmp_path / "export" / "migration.json").read_text())
    assert mig["steps"] and mig["cost"]["horizon_months"] == 12
    runbook = (tmp_path / "export" / "runbook.md").read_text()
    assert "## Migrating from the deployed fleet" in runbook and "route traffic" in runbook
    plan = json.loads((src / "plan.json").read_text())
    # kept pools keep their deployed names: the manifests update them in place
    kept = [c for c in plan["migration"]["pools"] if c["old_pool"] and c["pool"]]
    assert kept and all(c["pool"] in {p["id"] for p in plan["pools"]} for c in kept)


def test_growth_year_says_what_to_reserve_when():
    plan = json.loads((ROOT / "plans" / "growth-year" / "plan.json").read_text())
    months = plan["months"]
    assert len(months) == 12 and all(m["recheck_ok"] for m in months)
    for w in ("chat", "classify", "agents"):
        assert all(m["capacity_rps"][w] >= m["requests_per_s"][w] * (1 - 1e-9) for m in months)
    # with the 30-day lead time nothing is added in month 1: its units are the deployed ones
    deployed = {"h100-sxm": 2, "b200-sxm": 3}
    first = {u["hardware"]: u["reserved"] for u in months[0]["units"]}
    assert all(first.get(h, 0) <= n for h, n in deployed.items()) and set(first) <= set(deployed)
    assert plan["growth"]["usd_total"] <= plan["growth"]["peak_reserved_usd_total"] * (1 + 1e-9)
    assert plan["migration"]["cost"]["total_usd"] <= plan["migration"]["cost"]["keep_usd"] * (1 + 1e-6)


@pytest.mark.parametrize("name", ["llama-70b-chat", "three-models"])
def test_plus_ten_percent_adds_deployed_hardware_unless_other_hardware_pays(tmp_path, name):
    """+10% on every workload from the bundled plan: nothing deployed is released, and hardware not deployed
    is added only where that costs less over the horizon, changes included, than adding deployed hardware."""
    import planner

    deployed = ROOT / "plans" / name
    before = {g["hardware"]: g["count"] for g in json.loads((deployed / "plan.json").read_text())["units"]}
    doc = yaml.safe_load((ROOT / "catalogs" / "scenarios" / f"{name}.yaml").read_text())
    for w in doc["workloads"]:
        w["requests_per_s"] = round(w["requests_per_s"] * 1.1, 6)
    doc["start"] = "2026-12-01"
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    plan = _plan(path, existing=deployed)
    after = {g.hardware: g.count for g in plan.units}
    assert all(after.get(h, 0) >= n for h, n in before.items())
    others = {h for h in after if h not in before}
    if others:
        doc["hardware"] = sorted(before)
        path.write_text(yaml.safe_dump(doc))
        only = planner.plan(planner.load_scenario(path, existing=deployed), planner.PlanOptions(analysis=False))
        assert only.migration.cost.usd_per_hour >= plan.migration.cost.usd_per_hour * (1 - 1e-6)
    steps = plan.migration.steps
    assert all(s.ok for s in steps)
    assert plan.migration.cost.total_usd <= (plan.migration.cost.keep_usd or math.inf) * (1 + 1e-6)
