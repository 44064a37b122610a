"""Several models in one fleet (``model`` per workload): each workload's pools serve its own model, pools of
different models share purchase units chip by chip, and a fleet never costs more than its models planned
apart (brute force: the joint plan against every separate plan)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from planner.catalog.scenario import Scenario, resolve_scenario
from planner.errors import InputError
from planner.options import PlanOptions
from planner.pipeline.plan import make_plan
from planner.results.schema import SCHEMA_VERSION

CHAT = {"name": "chat", "requests_per_s": 6, "input_tokens": 1500, "output_tokens": 300,
        "slo": {"ttft_ms": 2000, "tpot_ms": 40}}
CLASSIFY = {"name": "classify", "model": "llama-3.1-8b", "requests_per_s": 20, "input_tokens": 800, "output_tokens": 20,
            "slo": {"ttft_ms": 800, "tpot_ms": 30}}
AGENTS = {"name": "agents", "model": "qwen3-30b-a3b", "requests_per_s": 3, "input_tokens": 4000, "output_tokens": 400,
          "slo": {"ttft_ms": 3000, "tpot_ms": 40}}
FLEET = {"name": "fleet", "model": "llama-3.1-70b", "weights": ["fp8"], "kv_cache": ["fp8"], "hardware": ["h100-sxm"],
         "serving": ["aggregated"], "workloads": [CHAT, CLASSIFY, AGENTS]}


def plan_of(catalog, doc):
    rs = resolve_scenario(Scenario.model_validate(doc), catalog, Path("fleet.yaml"))
    return rs, make_plan(rs, PlanOptions(analysis=False, time_limit_s=60, mip_gap=1e-9)).plan


def test_each_workload_is_served_by_its_own_model(catalog):
    rs, plan = plan_of(catalog, FLEET)
    assert plan.recheck.ok
    assert plan.scenario["models"] == ["llama-3.1-70b", "llama-3.1-8b", "qwen3-30b-a3b"]
    want = {"chat": "llama-3.1-70b", "classify": "llama-3.1-8b", "agents": "qwen3-30b-a3b"}
    assert {p.workload: p.model for p in plan.pools} == want
    assert {w.name: w.model for w in plan.workloads} == want
    # The 8B model's weights, not the 70B's, sit on its chips (fp8: about a byte per parameter).
    small = next(p for p in plan.pools if p.workload == "classify")
    big = next(p for p in plan.pools if p.workload == "chat")
    w8 = small.memory_per_chip_bytes.weights * small.layout.tp * small.layout.pp
    w70 = big.memory_per_chip_bytes.weights * big.layout.tp * big.layout.pp
    assert 7e9 < w8 < 10e9 and 65e9 < w70 < 80e9


def test_a_fleet_never_costs_more_than_its_models_apart_and_shares_units(catalog):
    """Brute force over the partition: the joint plan costs at most the sum of the three single-model plans,
    and here strictly less, because each alone leaves chips of its last node idle; a node then hosts pools of
    two models."""
    _, joint = plan_of(catalog, FLEET)
    apart = 0.0
    for w in FLEET["workloads"]:
        model = w.get("model", FLEET["model"])
        _, p = plan_of(catalog, {**FLEET, "model": model, "workloads": [{k: v for k, v in w.items() if k != "model"}]})
        apart += p.objective.usd_per_hour
    assert joint.objective.usd_per_hour <= apart + 1e-9
    assert joint.objective.usd_per_hour < apart - 1.0
    model_of = {p.id: p.model for p in joint.pools}
    shared = [u for u in joint.placement
              if len({model_of[g.pool] for dom in u.domains for g in dom}) > 1]
    assert shared, "no purchase unit hosts pools of two models"
    # Every chip holds one model: groups of one unit never overlap in chips.
    for u in joint.placement:
        chips = sum(g.chips for dom in u.domains for g in dom)
        assert chips <= catalog.get_hardware(u.hardware).purchase_unit.chips_per_unit


def test_naming_the_default_model_per_workload_changes_nothing(catalog):
    rs0, base = plan_of(catalog, {**FLEET, "workloads": [CHAT]})
    doc = {**FLEET, "workloads": [{**CHAT, "model": "llama-3.1-70b"}]}
    rs1, same = plan_of(catalog, doc)
    assert rs0.workload_models is None and rs1.workload_models is None
    assert same.objective.usd_per_hour == pytest.approx(base.objective.usd_per_hour, rel=1e-12)
    # Only workload models, no scenario model: the first workload's model is the scenario's.
    rs2, plan = plan_of(catalog, {k: v for k, v in FLEET.items() if k != "model"} | {
        "workloads": [{**CHAT, "model": "llama-3.1-70b"}, CLASSIFY]})
    assert rs2.model.id == "llama-3.1-70b" and plan.scenario["models"] == ["llama-3.1-70b", "llama-3.1-8b"]


def test_bad_model_fields_name_the_field(catalog):
    bare = {k: v for k, v in FLEET.items() if k != "model"}
    with pytest.raises(ValidationError, match="model for every workload.*chat"):
        Scenario.model_validate(bare)
    with pytest.raises(ValidationError, match="expert_load"):
        Scenario.model_validate({**bare, "workloads": [CLASSIFY], "expert_load": {"skew": "zipf:1"}})
    typo = {**FLEET, "workloads": [CHAT, {**CLASSIFY, "model": "llama-3.1-8"}]}
    with pytest.raises(InputError, match="field 'workloads.1.model'.*unknown model"):
        resolve_scenario(Scenario.model_validate(typo), catalog, Path("f.yaml"))
    long = {**FLEET, "workloads": [CHAT, {**CLASSIFY, "input_tokens": 200_000}]}
    with pytest.raises(InputError, match="workloads.1.*context of llama-3.1-8b"):
        resolve_scenario(Scenario.model_validate(long), catalog, Path("f.yaml"))


def test_exported_pools_launch_their_own_model(catalog, tmp_path):
    from planner.export.bundle import export_plan
    from planner.export.deploy import deployments
    from planner.export.plan import plan_json

    _, plan = plan_of(catalog, FLEET)
    by_pool = {d.pool: d for d in deployments(plan, catalog)}
    for p in plan.pools:
        d = by_pool[p.id]
        m = catalog.get_model(p.model)
        assert d.model_id == m.id and d.layers == m.architecture.layers
        assert d.experts == (m.architecture.moe.experts if m.architecture.moe else 0)
    (tmp_path / "plan").mkdir()
    (tmp_path / "plan" / "plan.json").write_text(plan_json(plan))
    export_plan(tmp_path / "plan", ["vllm"], tmp_path / "out", catalog)
    for p in plan.pools:
        text = (tmp_path / "out" / p.id / "launch-vllm.sh").read_text()
        assert f"--served-model-name {p.model}" in text
        # the model's checkpoint in the pool's weight format (the native one, or the published quantised one)
        assert by_pool[p.id].model_path in text
        assert by_pool[p.id].model_path in catalog.get_model(p.model).hf_ids + [
            c.hf_id for c in catalog.get_model(p.model).checkpoints]
    assert json.loads(plan.model_dump_json())["schema_version"] == SCHEMA_VERSION
