"""The checkpoint a pool loads (issue 44 item 2): the published one in its weight format, the native one where the
engine quantises on load, a path given with --checkpoint; a format with none is not planned unless the scenario
says self_quantise, and not exported without its checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from planner.catalog import load_catalog
from planner.export.deploy import deployments
from planner.export.launch import command
from planner.results import Plan
from tests.test_brownfield import _run

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def _plan(name: str) -> Plan:
    return Plan.model_validate_json((ROOT / "plans" / name / "plan.json").read_text())


def test_published_checkpoints_per_format(catalog):
    m = catalog.models["deepseek-v3"]
    assert m.weights_source("fp8", "nvidia") == ("native", "deepseek-ai/DeepSeek-V3")
    assert m.weights_source("fp4", "nvidia") == ("published", "nvidia/DeepSeek-V3-0324-FP4")
    assert m.weights_source("fp4", "amd") == ("published", "amd/DeepSeek-R1-0528-MXFP4")
    llama = catalog.models["llama-3.1-70b"]
    assert llama.weights_source("fp8", "nvidia")[0] == "published"
    assert llama.weights_source("fp4", "nvidia", catalog.engines["vllm"]) is None  # none published, not on load
    mixtral = catalog.models["mixtral-8x7b"]
    assert mixtral.weights_source("fp8", "nvidia", catalog.engines["vllm"]) == ("on-load", "mistralai/Mixtral-8x7B-v0.1")
    assert mixtral.weights_source("fp8", "nvidia", catalog.engines["trtllm"]) is None


def test_export_loads_the_checkpoint_of_the_pool_format(catalog):
    plan = _plan("multi-workload")  # Qwen3-235B in NVFP4 on B200 (and FP8 on H200, which has no FP4 maths)
    fp4 = [d for d in deployments(plan, catalog, ROOT / "plans" / "multi-workload") if d.weights_dtype == "fp4"]
    assert fp4
    for d in fp4:
        assert d.weights_source == "published" and d.model_path == "nvidia/Qwen3-235B-A22B-NVFP4"
        args = command(d, "vllm")
        # the checkpoint's config names its quantisation; naming one on the command line is refused as a mismatch
        assert "--quantization" not in args


def test_on_load_fp8_names_the_quantisation(catalog):
    plan = _plan("llama-70b-chat")
    p = plan.pools[0]
    doc = json.loads(plan.model_dump_json())
    doc["pools"][0].update({"model": "mixtral-8x7b", "weights_dtype": "fp8", "hardware": "h100-sxm", "engine": "vllm"})
    doc["scenario"]["model"] = "mixtral-8x7b"
    d = deployments(Plan.model_validate(doc), catalog)[0]
    assert d.weights_source == "on-load" and d.model_path == "mistralai/Mixtral-8x7B-v0.1"
    args = command(d, "vllm")
    assert args[args.index("--quantization") + 1] == "fp8_per_tensor"  # vLLM 0.33: "fp8" is deprecated for online
    assert command(d, "sglang")[command(d, "sglang").index("--quantization") + 1] == "fp8"
    assert p.id == d.pool


def test_no_checkpoint_is_exit_1_naming_the_pool_and_given_one_exports(tmp_path, capsys):
    src = tmp_path / "plan"
    shutil.copytree(ROOT / "plans" / "llama-70b-chat", src)
    doc = json.loads((src / "plan.json").read_text())
    # every pool (aggregated pools, or prefill/decode pairs, which must move together) made SGLang NVFP4 on B200
    pools = doc["pools"]
    for p in pools:
        p.update({"weights_dtype": "fp4", "hardware": "b200-sxm", "engine": "sglang"})
    (src / "plan.json").write_text(json.dumps(doc))
    code = _run(["export", src, "--target", "sglang", "--out", tmp_path / "out"])
    err = capsys.readouterr().err
    assert code == 1 and any(p["id"] in err for p in pools) and "--checkpoint" in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()
    given = [a for p in pools for a in ("--checkpoint", f"{p['id']}=/models/llama-70b-nvfp4")]
    code = _run(["export", src, "--target", "sglang", "--out", tmp_path / "out", *given])
    assert code == 0, capsys.readouterr().err
    pool = pools[0]
    script = (tmp_path / "out" / pool["id"] / "launch-sglang.sh").read_text()
    assert "/models/llama-70b-nvfp4" in script and "--quantization" not in script
    code = _run(["export", src, "--target", "sglang", "--out", tmp_path / "o2", "--checkpoint", "nosuch=/x"])
    assert code == 1 and "nosuch" in capsys.readouterr().err


def test_formats_without_a_checkpoint_are_not_planned_unless_self_quantised(tmp_path):
    import planner

    doc = yaml.safe_load((ROOT / "catalogs" / "scenarios" / "llama-70b-chat.yaml").read_text())
    doc.update({"weights": ["fp4"], "hardware": ["b200-sxm"]})
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    from planner.errors import PlannerError

    with pytest.raises(PlannerError, match="no checkpoint of llama-3.1-70b.*self_quantise"):
        planner.plan(planner.load_scenario(path), planner.PlanOptions(analysis=False))
    doc["self_quantise"] = True
    path.write_text(yaml.safe_dump(doc))
    plan = planner.plan(planner.load_scenario(path), planner.PlanOptions(analysis=False))
    assert all(p.weights_dtype == "fp4" for p in plan.pools)
    assert any("--checkpoint" in a and "self_quantise" in a for a in plan.assumptions)


def test_workers_have_probes_and_cross_node_pools_request_rdma(tmp_path, catalog):
    # a bundled plan's vLLM pool, its replicas spread over two 8-GPU nodes (TP8 PP2): the stages talk over scale-out
    # (the bundled plans keep them in one node; re-planning decides that, not this test)
    from planner.export.bundle import export_plan, read_plan
    from planner.export.deploy import crosses_nodes
    from tests.conftest import two_node_plan

    src = two_node_plan(tmp_path / "plan")
    export_plan(src, ["vllm", "k8s"], tmp_path / "out", catalog, rdma_resource="rdma/ib")
    docs = [d for d in yaml.safe_load_all((tmp_path / "out" / "k8s" / "serving.yaml").read_text()) if d]
    lws = [d for d in docs if d["kind"] == "LeaderWorkerSet"]
    assert lws
    for d in lws:
        tmpl = d["spec"]["leaderWorkerTemplate"]
        for pod in (tmpl["leaderTemplate"], tmpl["workerTemplate"]):
            c = pod["spec"]["containers"][0]
            assert c["readinessProbe"] and c["livenessProbe"] and c["startupProbe"]
            assert c["resources"]["limits"]["rdma/ib"] == 1 and c["resources"]["requests"]["rdma/ib"] == 1
        worker = tmpl["workerTemplate"]["spec"]["containers"][0]
        assert "pgrep -f 'vllm serve'" in worker["livenessProbe"]["exec"]["command"][-1]
    # pools inside one NVLink domain (GB200 racks) request none
    pd = deployments(_plan("deepseek-sglang-pd"), catalog, None, None, "rdma/ib")
    assert all(d.rdma_resource is None and not crosses_nodes(d) for d in pd)
    runbook = (tmp_path / "out" / "runbook.md").read_text()
    assert "RDMA between nodes" in runbook and "`rdma/ib`" in runbook
    # a plan whose first pool stays in one node and a later one spans two: the runbook names the resource the
    # crossing pools request (it read the first pool's, None, and failed)
    later = two_node_plan(tmp_path / "later", "three-models", nth=1)
    first = read_plan(later).pools[0]
    assert not first.scale_out and first.chips_per_replica <= 8
    export_plan(later, ["k8s"], tmp_path / "out2", catalog, rdma_resource="rdma/ib")
    assert "`rdma/ib`" in (tmp_path / "out2" / "runbook.md").read_text()
