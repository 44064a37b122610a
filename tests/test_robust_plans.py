"""Failure headroom (N+k): every loss of k purchase units leaves demand served, checked by removing units
from the placement and re-counting capacity from the re-checked per-replica rates; cost is monotone in k."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path

import pytest

from planner.catalog.scenario import Scenario, resolve_scenario
from planner.errors import InfeasibleError
from planner.options import PlanOptions
from planner.pipeline.plan import make_plan
from planner.results import unit_losses

BASE = {
    "name": "res", "model": "llama-3.1-70b", "weights": ["fp8"], "kv_cache": ["fp8"],
    "hardware": ["h100-sxm", "h200-sxm"], "serving": ["aggregated"],
    "workloads": [{"name": "chat", "requests_per_s": 50, "input_tokens": 1500, "output_tokens": 300,
                   "slo": {"ttft_ms": 1500, "tpot_ms": 40}}],
}


def plan_of(catalog, **changes):
    doc = json.loads(json.dumps(BASE))
    doc.update(changes)
    rs = resolve_scenario(Scenario.model_validate(doc), catalog, Path("res.yaml"))
    return make_plan(rs, PlanOptions(analysis=True, time_limit_s=30, mip_gap=1e-6)).plan


def capacity_without(plan, lost_units) -> dict[str, float]:
    """Capacity per workload with the replicas on ``lost_units`` gone (brute force over the placement)."""
    lost: dict[str, set] = defaultdict(set)
    for hw, unit, by_pool in lost_units:
        for pool, replicas in by_pool.items():
            # units of one run hold different replicas with the same pattern: key them by unit
            lost[pool] |= {(hw, unit, r) for r in replicas}
    out = {}
    for w in plan.workloads:
        by_role: dict[str, float] = defaultdict(float)
        for p in plan.pools:
            if p.workload == w.name:
                by_role[p.role] += max(p.replicas - len(lost[p.id]), 0) * p.predicted.requests_per_s_per_replica
        out[w.name] = by_role["aggregated"] + min(by_role["prefill"], by_role["decode"])
    return out


@pytest.mark.parametrize("k", [1, 2])
def test_every_loss_of_k_units_leaves_demand_served(catalog, k):
    plan = plan_of(catalog, resilience={"lose_units": k})
    assert plan.recheck.ok
    units = unit_losses(plan)
    assert len(units) > k
    for combo in itertools.combinations(units, k):
        left = capacity_without(plan, combo)
        for w in plan.workloads:
            assert left[w.name] >= w.requests_per_s * (1 - 1e-9), (combo, left)
    r = plan.resilience
    assert r.lose_units == k and r.capacity_after_worst_loss_rps["chat"] >= 50 * (1 - 1e-9)


def test_without_resilience_one_loss_can_leave_a_shortfall(catalog):
    plan = plan_of(catalog)
    worst = min(capacity_without(plan, [u])["chat"] for u in unit_losses(plan))
    assert worst < 50  # the base plan is sized for demand, not for a failure
    assert plan.resilience is None


def test_cost_is_monotone_in_lose_units(catalog):
    costs = [plan_of(catalog, resilience={"lose_units": k}).objective.usd_per_hour for k in (0, 1, 2)]
    assert costs[0] < costs[1] <= costs[2]
    one = plan_of(catalog, resilience={"lose_units": 1})
    assert one.resilience.headroom_usd_per_hour == pytest.approx(costs[1] - costs[0], rel=1e-6)


def test_infeasible_resilience_reports_the_shortfall(catalog):
    with pytest.raises(InfeasibleError, match=r"limits\.max_units\.h100-sxm: needs \d+ nodes, 3 allowed"):
        plan_of(catalog, hardware=["h100-sxm"], limits={"max_units": {"h100-sxm": 3}}, resilience={"lose_units": 1})


def test_lose_units_beyond_every_unit_is_refused(catalog):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="lose_units 3 is at least every unit"):
        Scenario.model_validate({**BASE, "hardware": ["h100-sxm"], "limits": {"max_units": {"h100-sxm": 3}},
                                 "resilience": {"lose_units": 3}})
    with pytest.raises(ValidationError):
        Scenario.model_validate({**BASE, "resilience": {"lose_units": -1}})


def test_margin_derates_capacity_and_cost_is_monotone_in_the_quantile(catalog):
    costs = []
    for q in (0.5, 0.75, 0.9, 0.99):
        plan = plan_of(catalog, margin={"quantile": q})
        assert plan.recheck.ok
        for p in plan.pools:
            hw = catalog.get_hardware(p.hardware)
            want = max(1.0, hw.efficiency.error_ratio(p.engine, "agg", q))
            assert p.margin_derate == pytest.approx(want)
        w = plan.workloads[0]
        assert w.served_requests_per_s >= 50 * (1 - 1e-9)
        if any(p.margin_derate > 1 for p in plan.pools):
            assert w.served_at_prediction_rps > w.served_requests_per_s
        costs.append(plan.objective.usd_per_hour)
    assert costs == sorted(costs) and costs[-1] > costs[0]
    assert plan_of(catalog).objective.usd_per_hour <= costs[0]


def test_error_ratio_interpolates_and_falls_back(catalog):
    from planner.catalog.schemas import Efficiency

    eff = catalog.get_hardware("h100-sxm").efficiency
    t = eff.error_quantiles["all"]
    assert eff.error_ratio("nope", "agg", 0.9) == pytest.approx(t["q90"])  # unknown class: the hardware's all
    mid = eff.error_ratio("nope", "agg", 0.825)
    assert mid == pytest.approx((t["q75"] + t["q90"]) / 2)
    assert eff.error_ratio("nope", "agg", 0.2) == pytest.approx(t["q50"])
    bare = Efficiency.model_validate({**eff.model_dump(), "error_quantiles": {}})
    assert bare.error_ratio("sglang", "agg", 0.9) == 1.0
    # hardware without measured rows carries a margin too (its relative's or the widest)
    assert catalog.get_hardware("tpu-v6e").efficiency.error_quantiles["all"]["q90"] > 1.0


def test_margin_quantile_bounds():
    from pydantic import ValidationError

    for q in (0, 1, 1.5, -0.1):
        with pytest.raises(ValidationError):
            Scenario.model_validate({**BASE, "margin": {"quantile": q}})


TWO = {
    **BASE, "hardware": ["h100-sxm", "h200-sxm", "b200-sxm", "mi300x"], "weights": ["bf16", "fp8"],
    "workloads": [
        {"name": "chat", "requests_per_s": 300, "input_tokens": 1500, "output_tokens": 300,
         "slo": {"ttft_ms": 1500, "tpot_ms": 40}},
        {"name": "batch", "requests_per_s": 100, "input_tokens": 4000, "output_tokens": 800,
         "slo": {"ttft_ms": 10000, "tpot_ms": 100}},
    ],
}


def _two(catalog, **changes):
    doc = json.loads(json.dumps(TWO))
    doc.update(changes)
    rs = resolve_scenario(Scenario.model_validate(doc), catalog, Path("two.yaml"))
    return make_plan(rs, PlanOptions(analysis=False, time_limit_s=60, mip_gap=1e-6)).plan


def test_one_hardware_type_is_the_best_single_hardware_plan(catalog):
    """Brute force: with max_hardware_types 1 the plan costs the cheapest of the single-hardware plans."""
    limited = _two(catalog, limits={"max_hardware_types": 1})
    assert len({g.hardware for g in limited.units}) == 1 and limited.recheck.ok
    singles = []
    for h in TWO["hardware"]:
        try:
            singles.append(_two(catalog, hardware=[h]).objective.usd_per_hour)
        except InfeasibleError:
            continue
    assert limited.objective.usd_per_hour == pytest.approx(min(singles), rel=1e-6)
    assert _two(catalog).objective.usd_per_hour <= limited.objective.usd_per_hour + 1e-9


def test_pool_types_per_workload_and_router_shares(catalog):
    free = _two(catalog)
    one = _two(catalog, limits={"max_pool_types_per_workload": 1})
    assert one.recheck.ok
    for w in ("chat", "batch"):
        assert sum(1 for p in one.pools if p.workload == w) == 1
    assert one.objective.usd_per_hour >= free.objective.usd_per_hour - 1e-9
    for plan in (free, one):
        shares: dict = defaultdict(float)
        for p in plan.pools:
            shares[(p.workload, p.role)] += p.router_share
        assert all(v == pytest.approx(1.0) for v in shares.values())


def test_pool_type_cost_trades_pools_for_dollars(catalog):
    """A priced pool type buys fewer pool types, and the chip-count tie-break after the solve
    (``planning.fewest_replicas``) must not split pools again to save chips (it once did: 4 pools for 2 workloads)."""
    free = _two(catalog)
    costly = _two(catalog, limits={"pool_type_usd_per_hour": 1000.0})
    assert len(costly.pools) <= len(free.pools)
    assert len(costly.pools) == len({p.workload for p in costly.pools})  # one pool per workload pays off


DAY = [20, 15, 10, 8, 8, 10, 20, 40, 60, 80, 90, 100, 100, 95, 90, 85, 80, 75, 70, 60, 50, 40, 30, 25]


def test_flat_profile_is_todays_plan(catalog):
    base = plan_of(catalog, hardware=["h100-sxm"])
    flat = plan_of(catalog, hardware=["h100-sxm"],
                   workloads=[{**BASE["workloads"][0], "requests_per_s": [50.0] * 24}])
    assert len(flat.periods) == 24 and all(p.recheck_ok for p in flat.periods)
    assert flat.usd_per_day == pytest.approx(24 * base.objective.usd_per_hour, rel=1e-9)
    for p in flat.periods:
        assert p.usd_per_hour == pytest.approx(base.objective.usd_per_hour, rel=1e-9)
        assert sum(u.reserved for u in p.units) == sum(g.count for g in base.units)


def test_profile_with_tiers_saves_against_the_flat_peak(catalog):
    plan = plan_of(catalog, price_tiers={"h100-sxm": {"spot": {"usd_per_chip_hour": 2.5, "preemption_rate": 0.1}}},
                   workloads=[{**BASE["workloads"][0], "requests_per_s": DAY}])
    assert plan.usd_per_day < plan.flat_peak_usd_per_day
    assert plan.objective.usd_per_hour * 24 == pytest.approx(plan.flat_peak_usd_per_day)
    assert any(u.spot for p in plan.periods for u in p.units)
    for p in plan.periods:
        assert p.recheck_ok and p.capacity_rps["chat"] >= p.requests_per_s["chat"] * (1 - 1e-9)
        # spot capacity counts net of preemption: chips of replicas fit in reserved + on-demand + 90% of spot
    # more expensive spot never lowers the day's cost
    dear = plan_of(catalog, price_tiers={"h100-sxm": {"spot": {"usd_per_chip_hour": 4.0, "preemption_rate": 0.1}}},
                   workloads=[{**BASE["workloads"][0], "requests_per_s": DAY}])
    assert dear.usd_per_day >= plan.usd_per_day - 1e-6


@pytest.mark.parametrize("text,needle", [
    ("period,requests_per_s\n0,10\n2,20\n", "missing or repeated"),
    ("period,requests_per_s\n0,10\n1,-5\n", "must not be negative"),
    ("hour,rps\n0,10\n", "period,requests_per_s"),
])
def test_bad_profile_files(tmp_path, text, needle):
    from planner.catalog.scenario import load_scenario
    from planner.errors import InputError

    (tmp_path / "t.csv").write_text(text)
    doc = {**BASE, "workloads": [{**BASE["workloads"][0], "requests_per_s": {"file": "t.csv"}}]}
    (tmp_path / "s.yaml").write_text(json.dumps(doc))
    with pytest.raises(InputError, match=needle):
        load_scenario(tmp_path / "s.yaml")


def test_profile_file_and_bad_profiles(tmp_path):
    from pydantic import ValidationError

    from planner.catalog.scenario import load_scenario

    (tmp_path / "t.csv").write_text("period,requests_per_s\n2,30\n1,20\n0,10\n")
    doc = {**BASE, "workloads": [{**BASE["workloads"][0], "requests_per_s": {"file": "t.csv"}}]}
    (tmp_path / "s.yaml").write_text(json.dumps(doc))
    sc = load_scenario(tmp_path / "s.yaml")
    assert sc.workloads[0].profile == [10.0, 20.0, 30.0] and sc.workloads[0].requests_per_s == 30.0
    for bad in ([10, -1], [0, 0], [10, "x"], []):
        with pytest.raises(ValidationError):
            Scenario.model_validate({**BASE, "workloads": [{**BASE["workloads"][0], "requests_per_s": bad}]})
    two = {**BASE["workloads"][0], "name": "b", "requests_per_s": [1, 2, 3]}
    with pytest.raises(ValidationError, match="same number of periods"):
        Scenario.model_validate({**BASE, "workloads": [{**BASE["workloads"][0], "requests_per_s": [1, 2]}, two]})
    with pytest.raises(ValidationError):  # a tier without a price
        Scenario.model_validate({**BASE, "price_tiers": {"h100-sxm": {"spot": {"preemption_rate": 0.1}}}})


def test_price_tier_typo_and_margin_without_measured_error(catalog, tmp_path):
    """A tier for hardware the catalog does not know is a typo, not something to ignore; a margin on hardware
    without stored error quantiles would derate nothing, so it is refused."""
    from planner.errors import InputError

    sc = Scenario.model_validate({**BASE, "price_tiers": {"h100-sx": {"on_demand": {"usd_per_chip_hour": 5.0}}}})
    with pytest.raises(InputError, match="field 'price_tiers.h100-sx'"):
        resolve_scenario(sc, catalog, Path("t.yaml"))
    hw = catalog.get_hardware("h100-sxm")
    bare = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"error_quantiles": {}})})
    cat = catalog.__class__(**{**catalog.__dict__, "hardware": {**catalog.hardware, "h100-sxm": bare}})
    sc = Scenario.model_validate({**BASE, "hardware": ["h100-sxm"], "margin": {"quantile": 0.9}})
    with pytest.raises(InputError, match="margin.quantile.*h100-sxm"):
        resolve_scenario(sc, cat, Path("t.yaml"))


def test_price_curve_with_a_margin_never_costs_less(catalog):
    """The price curve accepts the margin: every interactivity level costs at least as much at the 0.9 error
    quantile as at the prediction (capacity is divided by a derate >= 1), and strictly more somewhere."""
    import numpy as np

    from planner.errors import InputError
    from planner.studies.pricing import price_curve

    base = price_curve(catalog, "llama-3.1-70b", ["h100-sxm"]).points
    safe = price_curve(catalog, "llama-3.1-70b", ["h100-sxm"], margin_quantile=0.9).points
    for speed in base["tokens_per_s_per_user"]:
        # the cheapest point at least this fast, on each curve
        b = base[base["tokens_per_s_per_user"] >= speed]["usd_per_mtok_output"].min()
        s = safe[safe["tokens_per_s_per_user"] >= speed]["usd_per_mtok_output"].min()
        assert np.isnan(s) or s >= b * (1 - 1e-9)
    assert safe["usd_per_mtok_output"].min() > base["usd_per_mtok_output"].min()
    with pytest.raises(InputError, match="--margin-quantile"):
        price_curve(catalog, "llama-3.1-70b", ["h100-sxm"], margin_quantile=1.0)
