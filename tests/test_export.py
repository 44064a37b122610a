"""Ops export: every launch flag is one the target engine release accepts (catalogs/engines/releases/), every
expert map has the
shape its engine loads, every Kubernetes object validates against its schema (the lws CRDs, upstream
schemas for core objects)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from planner.cli import main
from planner.export import launch
from planner.export.bundle import export_plan, read_plan
from planner.export.deploy import deployments
from planner.results.schema import SCHEMA_VERSION
from tests.conftest import ROOT, crd_schema, engine_flags, two_node_plan

PLANS = ["deepseek-skewed", "llama-70b-chat", "multi-workload", "deepseek-chat", "long-context"]


@pytest.fixture(scope="module")
def flags():
    return engine_flags()


@pytest.fixture(scope="module")
def exported(tmp_path_factory, catalog):
    out = {}
    root = tmp_path_factory.mktemp("exports")
    for name in PLANS:
        dest = root / name
        export_plan(ROOT / "plans" / name, ["sglang", "vllm", "trtllm", "k8s"], dest, catalog)
        out[name] = dest
    return out


def check_argv(engine: str, argv: list[str], catalog) -> None:
    """Every option is a flag (or alias) of the target release of ``engine`` (its flag table read from the
    release's package), not deprecated, with a value where it takes one, within its choices; ints and JSON parse."""
    from planner.catalog.releases import flag_table
    from planner.export.checks import Command, parse

    table = flag_table(catalog, catalog.get_engine(engine))
    cmd = Command(pool="p", engine=engine, argv=argv)
    found = parse(cmd, table)
    assert not found, [v.line() for v in found]
    for key, value in cmd.values.items():
        entry = table.flags[key]
        if entry.get("type") == "int" and isinstance(value, str) and not value.startswith("$"):
            int(value)
        if entry.get("type") == "json":
            json.loads(value)


def test_launch_flags_are_accepted_by_each_engine(catalog):
    seen = set()
    for name in PLANS:
        plan = read_plan(ROOT / "plans" / name)
        for d in deployments(plan, catalog, ROOT / "plans" / name):
            for t in launch.TARGETS:
                if not catalog.get_engine(t).runs_on(catalog.get_hardware(d.hardware)):
                    continue
                argv = launch.command(d, t, expert_location="/x/expert-location-sglang.json" if d.expert_map else None)
                check_argv(t, argv, catalog)
                seen |= {(t, a) for a in argv if a.startswith("--")}
    # the checks saw the flags that matter for production layouts
    for t, f in [("sglang", "--attn-dp-size"), ("sglang", "--ep-num-redundant-experts"),
                 ("sglang", "--init-expert-location"), ("sglang", "--disaggregation-mode"),
                 ("vllm", "--enable-expert-parallel"), ("vllm", "--data-parallel-size"),
                 ("trtllm", "--moe_expert_parallel_size")]:
        assert (t, f) in seen, (t, f)


def test_unknown_flag_is_caught(catalog):
    with pytest.raises(AssertionError, match="not a flag"):
        check_argv("sglang", ["python3", "-m", "sglang.launch_server", "--enable-deepep-moe"], catalog)
    with pytest.raises(AssertionError, match="not among"):
        check_argv("sglang", ["x", "--kv-cache-dtype", "fp8"], catalog)
    with pytest.raises(AssertionError, match="not a flag"):
        check_argv("trtllm", ["trtllm-serve", "m", "--tp-size", "8"], catalog)  # click takes exact names only
    with pytest.raises(AssertionError, match="deprecated"):
        check_argv("sglang", ["x", "--dp-size", "8", "--enable-dp-attention"], catalog)


def test_trtllm_config_keys_are_llm_api_fields(flags, exported):
    spec = flags["trtllm"]["extra_llm_api_options_yaml"]
    top = set(spec["BaseLlmArgs"]) | set(spec["TorchLlmArgs"])
    spec_keys = {"decoding_type", *[k.split(" ")[0] for k in spec["speculative_config"]["common_keys"]],
                 *[k.split(" ")[0] for k in spec["speculative_config"]["MTP_keys"]]}
    n = 0
    for dest in exported.values():
        for f in dest.glob("*/config-trtllm.yaml"):
            cfg = yaml.safe_load(f.read_text())
            assert set(cfg) <= top, set(cfg) - top
            assert set(cfg["kv_cache_config"]) <= set(spec["KvCacheConfig"])
            if "moe_config" in cfg:
                assert set(cfg["moe_config"]) <= set(spec["MoeConfig"])
                lb = cfg["moe_config"]["load_balancer"]
                assert set(lb) <= set(spec["MoeLoadBalancerConfig"])
                for row in lb.get("initial_global_assignments", {}).values():
                    assert len(row) == lb["num_slots"]
            if "speculative_config" in cfg:
                assert set(cfg["speculative_config"]) <= spec_keys
                assert cfg["speculative_config"]["decoding_type"] in spec["speculative_config"]["decoding_type_values_read"]
            n += 1
    assert n > 0


def test_sglang_expert_location_shape(exported, catalog):
    files = list(exported["deepseek-skewed"].glob("*/expert-location-sglang.json"))
    assert files
    m = catalog.get_model("deepseek-v3")
    redundant: list[int] = []
    for f in files:
        doc = json.loads(f.read_text())
        assert list(doc) == ["physical_to_logical_map"]
        rows = doc["physical_to_logical_map"]
        assert len(rows) == m.architecture.layers  # every hidden layer, dense ones included
        width = {len(r) for r in rows}
        assert len(width) == 1
        slots = width.pop()
        assert slots >= m.architecture.moe.experts
        redundant.append(slots - m.architecture.moe.experts)
        for r in rows:
            assert all(0 <= e < m.architecture.moe.experts for e in r)
            assert set(r) == set(range(m.architecture.moe.experts))  # every expert has a copy
        vllm = json.loads((f.parent / "expert-location-vllm.json").read_text())
        assert vllm["explicit_map"] is False and vllm["num_redundant_experts"] == slots - m.architecture.moe.experts
    assert max(redundant) > 0  # the skewed plan replicates hot experts somewhere


def test_scripts_are_valid_bash(exported):
    scripts = [s for dest in exported.values() for s in dest.glob("*/launch-*.sh")]
    assert scripts
    for s in scripts:
        r = subprocess.run(["bash", "-n", str(s)], capture_output=True, text=True)
        assert r.returncode == 0, (s, r.stderr)
        assert s.stat().st_mode & 0o100


def test_kubernetes_objects_validate(exported, tmp_path, catalog):
    import jsonschema
    import kubernetes_validate as kv

    schemas = {"LeaderWorkerSet": crd_schema("leaderworkerset"), "DisaggregatedSet": crd_schema("disaggregatedset"),
               "PrometheusRule": crd_schema("prometheusrule"), "PodMonitor": crd_schema("podmonitor"),
               "HTTPRoute": crd_schema("httproute")}
    kinds = set()
    # with a replica over two hosts (a LeaderWorkerSet), whether or not a bundled plan has one today
    two = tmp_path / "two-node"
    export_plan(two_node_plan(tmp_path / "two-node-src"), ["vllm", "k8s"], two, catalog)
    for dest in [*exported.values(), two]:
        for f in sorted((dest / "k8s").glob("*.yaml")):
            for obj in yaml.safe_load_all(f.read_text()):
                if obj is None:
                    continue
                kinds.add(obj["kind"])
                if obj["kind"] in schemas:
                    # the CRD's own schema is not checked against the metaschema: Prometheus Operator's holds a
                    # Go regex ('^(?i)...') Python's re refuses; our objects carry no field with a pattern
                    jsonschema.Draft7Validator(schemas[obj["kind"]]).validate(obj)
                if obj["kind"] == "ComputeDomain":  # NVIDIA's DRA driver CRD, not among the carried schemas
                    assert obj["apiVersion"] == "resource.nvidia.com/v1beta1"
                    assert set(obj["spec"]) == {"numNodes", "channel"}
                    assert set(obj["spec"]["channel"]["resourceClaimTemplate"]) == {"name"}
                    continue
                if obj["kind"] == "PrometheusRule":
                    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
                    for g in obj["spec"]["groups"]:
                        for r in g["rules"]:
                            assert {"alert", "expr", "for"} <= set(r) and "histogram_quantile(0.9" in r["expr"]
                elif obj["kind"] not in schemas:
                    kv.validate(obj, "1.33", strict=True)
    assert {"Deployment", "LeaderWorkerSet", "DisaggregatedSet", "Service", "ConfigMap",
            "HorizontalPodAutoscaler", "PrometheusRule", "PodMonitor", "PodDisruptionBudget", "HTTPRoute"} <= kinds


def _pods(obj: dict) -> list[dict]:
    """Pod templates of a serving object (Deployment, LeaderWorkerSet, DisaggregatedSet)."""
    spec = obj["spec"]
    if obj["kind"] == "Deployment":
        return [spec["template"]]
    lws = [spec] if obj["kind"] == "LeaderWorkerSet" else [r["spec"] for r in spec["roles"]]
    return [t for x in lws for t in (x["leaderWorkerTemplate"]["leaderTemplate"], x["leaderWorkerTemplate"]["workerTemplate"])]


def test_manifests_carry_production_defaults(exported):
    """Every serving container requests CPU and memory beside its GPUs (no BestEffort pods), mounts a sized
    /dev/shm and a model cache, may read a Hugging Face token; a serving (leader) container has readiness,
    startup and liveness probes; updates never take capacity down first; every pool has a disruption budget
    and every engine with metrics a PodMonitor on its own metrics path; no empty YAML file is written."""
    for name, dest in exported.items():
        serving = [o for o in yaml.safe_load_all((dest / "k8s" / "serving.yaml").read_text()) if o]
        for obj in serving:
            if obj["kind"] == "Deployment":
                assert obj["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
            elif obj["kind"] == "LeaderWorkerSet":
                assert obj["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["maxUnavailable"] == 0
            for pod in _pods(obj):
                c = pod["spec"]["containers"][0]
                req = c["resources"]["requests"]
                assert {"cpu", "memory"} <= set(req), (name, obj["metadata"]["name"])
                vols = {v["name"]: v for v in pod["spec"]["volumes"]}
                assert vols["shm"]["emptyDir"]["sizeLimit"].endswith("Gi") and "model-cache" in vols
                env = {e["name"]: e for e in c["env"]}
                assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True
                if "ports" in c:
                    assert {"readinessProbe", "livenessProbe", "startupProbe"} <= set(c)
        pdbs = [o for o in yaml.safe_load_all((dest / "k8s" / "disruption.yaml").read_text()) if o]
        pools = {pod["metadata"]["labels"]["planner.io/pool"] for obj in serving for pod in _pods(obj)}
        assert {b["spec"]["selector"]["matchLabels"]["planner.io/pool"] for b in pdbs} == pools
        mon = dest / "k8s" / "monitoring.yaml"
        if not mon.exists():  # no engine of the plan publishes metrics the catalog knows (ATOM): nothing to watch
            assert all(p.engine == "atom" for p in read_plan(ROOT / "plans" / name).pools), name
            continue
        monitors = [o for o in yaml.safe_load_all(mon.read_text()) if o]
        paths = {m["spec"]["selector"]["matchLabels"]["planner.io/engine"]: m["spec"]["podMetricsEndpoints"][0]["path"]
                 for m in monitors}
        assert paths.get("trtllm", "/prometheus/metrics") == "/prometheus/metrics"
        assert all(p == "/metrics" for e, p in paths.items() if e != "trtllm")
        for f in (dest / "k8s").glob("*.yaml"):
            assert any(o for o in yaml.safe_load_all(f.read_text())), f"{f.name} is empty"


def test_alerts_use_the_plan_targets_and_engine_metrics(exported, catalog):
    """Every pool whose engine publishes latency histograms is watched at its workload's targets (ATOM publishes
    none the catalog knows: llama-70b-chat's plan, one ATOM pool, has no latency alert)."""
    checked = 0
    for name, dest in exported.items():
        plan = read_plan(ROOT / "plans" / name)
        engines = [catalog.get_engine(e) for e in sorted({p.engine for p in plan.pools})]
        watched = [e for e in engines if e.metrics is not None and e.metrics.ttft_histogram]
        if not watched:
            continue
        rules = yaml.safe_load((dest / "k8s" / "alerts.yaml").read_text())["spec"]["groups"][0]["rules"]
        exprs = " ".join(r["expr"] for r in rules)
        for w in plan.workloads:
            assert f"> {w.slo_ttft_s:g}" in exprs and f"> {w.slo_tpot_s:g}" in exprs, (name, w.name)
        for eng in watched:
            assert eng.metrics.ttft_histogram in exprs
        checked += 1
    assert checked >= 3


def test_export_json_lists_every_file(exported):
    for dest in exported.values():
        doc = json.loads((dest / "export.json").read_text())
        listed = {f["path"] for f in doc["files"]}
        on_disk = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()} - {"export.json", ".planner-manifest.json"}
        assert listed == on_disk
        assert all(f["kind"] for f in doc["files"])


def test_runbook_names_the_loss_of_a_unit(exported):
    text = (exported["deepseek-skewed"] / "runbook.md").read_text()
    assert "## Bring-up order" in text and "Prefill pools first" in text
    assert "Losing " in text and "worst single unit" in text
    assert "planner plan" in text


def test_cli_export_and_schema(tmp_path, capsys):
    src = tmp_path / "plan"
    shutil.copytree(ROOT / "plans" / "llama-70b-chat", src)
    for args, code in ((["export", src, "--target", "all"], 0), (["export", src, "--target", "all"], 1),
                       (["export", src, "--target", "docker"], 1), (["export", tmp_path / "nope", "--target", "k8s"], 1),
                       (["export", src, "--target", "sglang", "--namespace", "Bad_NS", "--force"], 1),
                       (["export", src, "--target", "k8s", "--routing", "istio", "--force"], 1),
                       (["export", src, "--target", "k8s", "--routing", "inference-pool", "--force"], 0)):
        try:
            main([str(a) for a in args])
            got = 0
        except SystemExit as exc:
            got = int(exc.code or 0)
        err = capsys.readouterr().err
        assert got == code, (args, err)
        assert "Traceback" not in err
    assert (src / "export" / "runbook.md").exists()
    try:
        main(["schema", "plan"])
    except SystemExit as exc:
        assert not exc.code
    schema = json.loads(capsys.readouterr().out)
    assert "pools" in schema["properties"] and "software" in schema["properties"]


def test_plan_records_software_versions():
    plan = read_plan(ROOT / "plans" / "llama-70b-chat")
    assert {"planner", "pyomo", "highspy"} <= set(plan.software)
    assert plan.schema_version == SCHEMA_VERSION == "2.7"


def test_deployment_sizes(catalog):
    plan = read_plan(ROOT / "plans" / "deepseek-skewed")
    for d in deployments(plan, catalog, ROOT / "plans" / "deepseek-skewed"):
        assert d.gpus == d.tp * d.attn_dp * d.pp
        assert d.hosts * d.gpus_per_pod >= d.gpus
        assert 0 < d.static_fraction <= 0.95 and 0 < d.total_fraction <= 0.95
        assert d.static_fraction >= (d.weights_bytes + d.kv_bytes) / d.memory_capacity_bytes - 1e-9
        if d.hardware == "gb200-nvl72":
            assert d.gpus_per_host == 4
    assert isinstance(Path, type)


def test_vllm_micro_batching_names_a_backend_that_allows_it(exported):
    """vLLM refuses --enable-dbo on its default all-to-all backend (engine-rules.md 2.1): every script that
    asks for it names one of the backends micro-batching runs on."""
    allowed = {"deepep_low_latency", "deepep_high_throughput", "nixl_ep", "allgather_reducescatter"}
    seen = 0
    for dest in exported.values():
        for f in dest.glob("*/launch-vllm.sh"):
            text = f.read_text()
            if "--enable-dbo" not in text:
                continue
            seen += 1
            backend = text.split("--all2all-backend", 1)[1].split()[0] if "--all2all-backend" in text else None
            assert backend in allowed, f
    assert seen, "no bundled plan exports a vLLM pool with two-batch overlap"


def test_routes_split_traffic_as_the_plan_routes_it(exported):
    """Each workload's HTTPRoute sends each aggregated pool its plan.json router share (a pool with 0.8% of the
    requests gets 0.8% of the weight, not an equal share of pods), through a Service per pool; a disaggregated
    workload's part goes to its router's Service; the runbook's shares are plan.json's."""
    for name, dest in exported.items():
        plan = read_plan(ROOT / "plans" / name)
        routes = [o for o in yaml.safe_load_all((dest / "k8s" / "routes.yaml").read_text()) if o]
        services = {o["metadata"]["name"] for o in yaml.safe_load_all((dest / "k8s" / "services.yaml").read_text()) if o}
        by_name = {r["metadata"]["name"]: r for r in routes}
        for w in plan.workloads:
            pools = [p for p in plan.pools if p.workload == w.name]
            refs = by_name[w.name.lower()]["spec"]["rules"][-1]["backendRefs"]  # the weighted split
            assert {r["name"] for r in refs} <= services
            total = sum(r["weight"] for r in refs)
            agg = [p for p in pools if p.role == "aggregated"]
            if agg and not any(p.role != "aggregated" for p in pools):
                for p in agg:
                    ref = next(r for r in refs if r["name"] == p.id.lower())
                    assert ref["weight"] / total == pytest.approx(p.router_share, abs=2e-4), (name, p.id)
            if any(p.role == "decode" for p in pools):
                assert any(r["name"].endswith("-router") for r in refs)
        runbook = (dest / "runbook.md").read_text()
        for p in plan.pools:
            assert f"| {p.router_share:.1%} |" in runbook


def test_rack_replicas_across_hosts_claim_the_nvlink_channel(exported, catalog):
    """A replica spanning hosts of one NVL72 rack claims its pool's ComputeDomain channel on every pod (leader and
    workers), the claim naming the template its ComputeDomain creates; a replica that fits one host, or spans hosts
    over scale-out, claims none."""
    seen = 0
    for dest in exported.values():
        objs = [o for o in yaml.safe_load_all((dest / "k8s" / "serving.yaml").read_text()) if o]
        cds = dest / "k8s" / "compute-domains.yaml"
        domains = [o for o in yaml.safe_load_all(cds.read_text()) if o] if cds.exists() else []
        templates = {o["spec"]["channel"]["resourceClaimTemplate"]["name"] for o in domains}
        assert all(o["kind"] == "ComputeDomain" for o in domains)
        for o in objs:
            for pod in _pods(o):
                claims = pod["spec"].get("resourceClaims", [])
                labels = pod["metadata"]["labels"]
                if claims:
                    seen += 1
                    (c,) = claims
                    assert c["resourceClaimTemplateName"] in templates, c
                    assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": c["name"]}]
                    assert labels["planner.io/pool"] in c["resourceClaimTemplateName"]
    assert seen > 0
    # the pools that claim are exactly the multi-host pools inside a rack's NVLink domain
    from planner.export.k8s import needs_compute_domain

    for name in PLANS:
        for d in deployments(read_plan(ROOT / "plans" / name), catalog, ROOT / "plans" / name):
            assert needs_compute_domain(d) == (d.multi_host and d.unit_kind == "rack" and d.gpus <= d.scale_up_domain_chips)


def test_prefix_families_stay_on_one_pool(exported, tmp_path, catalog):
    """Where a workload's pools reuse prefixes, each family bucket (every value 00-ff of the header) is sent to
    exactly one backend by a header rule, the backends' bucket shares are the weighted split's within one bucket
    (the largest remainder rounds each quota down or up), and the runbook lists them; a workload without prefix reuse
    has only the weighted rule, and a backend whose quota is under one bucket may get none (deepseek-skewed's
    aggregated replica, 0.19% of chat, since the catalog of 2026-11-29's second session). Beside the exported plans:
    llama-70b-margin (its aggregated pools with HBM prefix caches; one since that catalog) and llama-70b-day with
    prefix caches in HBM on its three aggregated pools."""
    import re
    import shutil

    from planner.export import k8s

    day = tmp_path / "plans" / "llama-70b-day"
    shutil.copytree(ROOT / "plans" / "llama-70b-day", day)
    doc = json.loads((day / "plan.json").read_text())
    for p in doc["pools"]:
        p["prefix_tier"] = "hbm"
    (day / "plan.json").write_text(json.dumps(doc))
    sources = {name: ROOT / "plans" / name for name in exported}
    sources.update({"llama-70b-margin": ROOT / "plans" / "llama-70b-margin", "llama-70b-day-prefix": day})
    exported = dict(exported)
    for name in ("llama-70b-margin", "llama-70b-day-prefix"):
        exported[name] = tmp_path / "out" / name
        export_plan(sources[name], ["k8s"], exported[name], catalog)
    seen = 0
    for name, dest in exported.items():
        plan = read_plan(sources[name])
        for r in (o for o in yaml.safe_load_all((dest / "k8s" / "routes.yaml").read_text()) if o):
            rules = r["spec"]["rules"]
            w = next(x for x in plan.workloads if x.name.lower() == r["metadata"]["name"])
            reuse = any(p.prefix_tier != "none" for p in plan.pools if p.workload == w.name)
            weighted = rules[-1]["backendRefs"]
            if not reuse or len(weighted) < 2:
                assert len(rules) == 1, (name, w.name)
                continue
            seen += 1
            family = rules[:-1]
            total = sum(b["weight"] for b in weighted)
            assert len(family) <= len(weighted) <= 15  # Gateway API: at most 16 rules a route
            # a backend without a family rule is one whose quota rounds down to no bucket (under one)
            ruled = {f["backendRefs"][0]["name"] for f in family}
            assert all(k8s.PREFIX_BUCKETS * b["weight"] / total < 1.0 for b in weighted if b["name"] not in ruled)
            runbook = (dest / "runbook.md").read_text()
            for b in (b for b in weighted if b["name"] not in ruled):  # the runbook says it gets none, and why
                assert f"| {b['name']} | none | 0.0% |" in runbook and f"{b['name']}: a share under one bucket" in runbook
            hits = {}
            for v in (f"{i:02x}" for i in range(k8s.PREFIX_BUCKETS)):
                owners = [f["backendRefs"][0]["name"] for f in family
                          if re.fullmatch(f["matches"][0]["headers"][0]["value"], v)]
                assert len(owners) == 1, (name, v, owners)
                hits[owners[0]] = hits.get(owners[0], 0) + 1
            for b in weighted:
                assert hits.get(b["name"], 0) / k8s.PREFIX_BUCKETS == pytest.approx(
                    b["weight"] / total, abs=1.0 / k8s.PREFIX_BUCKETS), (name, b["name"])
            assert f"`{k8s.PREFIX_HEADER}` header" in (dest / "runbook.md").read_text()
    assert seen >= 2


def test_hex_range_regex_matches_exactly_its_range():
    import re

    from planner.export.k8s import hex_range_regex

    for lo, hi in [(0, 256), (0, 24), (24, 256), (15, 17), (0x8a, 0xc3), (0xff, 0x100), (16, 32)]:
        rx = hex_range_regex(lo, hi)
        assert [i for i in range(256) if re.fullmatch(rx, f"{i:02x}")] == list(range(lo, hi)), rx
        assert not re.fullmatch(rx, "Z0") and not re.fullmatch(rx, ":0")  # no ASCII spans like [8-b]


def test_inference_pool_routing(tmp_path, catalog):
    """``routing="inference-pool"``: each aggregated pool is an InferencePool (valid against its CRD) selecting
    the pool's serving pods, the HTTPRoute's backends name them with the plan's weights, and the runbook says how
    their endpoint pickers are installed."""
    import jsonschema

    dest = tmp_path / "ip"
    export_plan(ROOT / "plans" / "llama-70b-chat", ["k8s"], dest, catalog, routing="inference-pool")
    objs = [o for o in yaml.safe_load_all((dest / "k8s" / "routes.yaml").read_text()) if o]
    pools = {o["metadata"]["name"]: o for o in objs if o["kind"] == "InferencePool"}
    plan = read_plan(ROOT / "plans" / "llama-70b-chat")
    assert set(pools) == {p.id.lower() for p in plan.pools if p.role == "aggregated"}
    for o in pools.values():
        jsonschema.Draft7Validator(crd_schema("inferencepool")).validate(o)
        assert o["spec"]["selector"]["matchLabels"]["planner.io/pool"] == o["metadata"]["name"]
    route = next(o for o in objs if o["kind"] == "HTTPRoute")
    jsonschema.Draft7Validator(crd_schema("httproute")).validate(route)
    weighted = route["spec"]["rules"][-1]["backendRefs"]
    ip = [b for b in weighted if b.get("kind") == "InferencePool"]
    assert {b["name"] for b in ip} == set(pools)
    assert all(b["group"] == "inference.networking.k8s.io" for b in ip)
    # a prefill/decode pair (when the plan has one) is reached through its PD router, a plain Service backend
    pairs = {p.workload for p in plan.pools if p.role == "decode"}
    assert {b["name"] for b in weighted if b.get("kind") != "InferencePool"} == {f"{w}-router" for w in pairs}
    for p in plan.pools:
        if p.role != "aggregated":
            continue
        # its share of the aggregated part (the pair's router takes the disaggregated part: route_weights)
        b = next(x for x in ip if x["name"] == p.id.lower())
        assert b["weight"] / sum(x["weight"] for x in ip) == pytest.approx(p.router_share, abs=2e-4)
    assert "InferencePools" in (dest / "runbook.md").read_text()


def test_pd_router_and_both_roles_autoscale(tmp_path, catalog):
    """A disaggregated SGLang workload gets its PD router: discovery of exactly the prefill and decode leaders (the
    selectors match the pod labels of the DisaggregatedSet's roles), each prefill leader annotated with the
    bootstrap port its launch pins, pod-watch RBAC, labels the workload's router Service selects. Prefill and
    decode roles both autoscale, each through the DisaggregatedSetRoleScaler named ``<set>-<role>`` of a role in
    External scaling mode (no inline replicas). All of it validates (core kinds strict, CRDs by schema)."""
    import jsonschema
    import kubernetes_validate as kv

    dest = tmp_path / "pd"
    export_plan(ROOT / "plans" / "deepseek-sglang-pd", ["k8s"], dest, catalog)
    load = lambda f: [o for o in yaml.safe_load_all((dest / "k8s" / f).read_text()) if o]  # noqa: E731
    routers = load("routers.yaml")
    assert [o["kind"] for o in routers] == ["ServiceAccount", "Role", "RoleBinding", "Deployment"]
    for o in routers:
        kv.validate(o, "1.33", strict=True)
    dep = routers[-1]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {"--pd-disaggregation", "--service-discovery"} <= set(args)
    svc = next(o for o in load("services.yaml") if o["metadata"]["name"] == "chat-router")
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    (ds,) = [o for o in load("serving.yaml") if o["kind"] == "DisaggregatedSet"]
    jsonschema.Draft7Validator(crd_schema("disaggregatedset")).validate(ds)

    def selector(flag: str) -> dict:
        i = args.index(flag) + 1
        out = {}
        while i < len(args) and not args[i].startswith("--"):
            k, _, v = args[i].partition("=")
            out[k] = v
            i += 1
        return out

    for role in ("prefill", "decode"):
        sel = selector(f"--{role}-selector")
        assert sel.pop("leaderworkerset.sigs.k8s.io/worker-index") == "0"  # leaders only (LWS labels them)
        matching = [r for r in ds["spec"]["roles"]
                    if sel.items() <= r["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["labels"].items()]
        assert {r["metadata"]["labels"]["planner.io/role"] for r in matching} == {role} and matching
        for r in matching:
            leader = r["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
            if role == "prefill":
                port = leader["metadata"]["annotations"]["sglang.ai/bootstrap-port"]
                pool = r["metadata"]["labels"]["planner.io/pool"]
                # the launch scripts as parsed (the YAML emitter folds long lines wherever the text falls)
                scripts = " ".join(str(v) for o in load("configmaps.yaml") for v in (o.get("data") or {}).values())
                assert f"--disaggregation-bootstrap-port {port}" in scripts
                assert pool
    hpas = {h["metadata"]["name"]: h for h in load("autoscaling.yaml")}
    for r in ds["spec"]["roles"]:
        pool = r["metadata"]["labels"]["planner.io/pool"]
        ref = hpas[pool]["spec"]["scaleTargetRef"]
        assert ref == {"apiVersion": "disaggregatedset.x-k8s.io/v1", "kind": "DisaggregatedSetRoleScaler",
                       "name": f"{ds['metadata']['name']}-{r['name']}"}
        assert r["scaling"] == {"mode": "External"} and "replicas" not in r["spec"]
        kv.validate(hpas[pool], "1.33", strict=True)
    assert {r["metadata"]["labels"]["planner.io/role"] for r in ds["spec"]["roles"]} == {"prefill", "decode"}
    assert "routers.yaml" in (dest / "runbook.md").read_text()


def test_context_stays_within_the_checkpoint_or_says_how_it_is_extended(catalog, tmp_path):
    """Qwen3's config allows 40,960 tokens; the catalog's 131,072 needs YaRN. A workload within 40,960 starts the
    engines at 40,960 (no rope override); a longer one gets the rope scaling and max_position_embeddings
    overrides both engines need (engine-rules.md 1.5, 2.3); TensorRT-LLM stays at the checkpoint's length and
    says so. Models without an extension keep their maximum."""
    import dataclasses

    plan = read_plan(ROOT / "plans" / "multi-workload")
    deps = deployments(plan, catalog, ROOT / "plans" / "multi-workload")
    d = next(x for x in deps if x.role in ("aggregated", "decode"))
    assert d.native_context_tokens == 40960 and d.max_context_tokens == 131072
    short = dataclasses.replace(d, context_tokens=4000)
    long = dataclasses.replace(d, context_tokens=101000)
    for t, flag, override in (("sglang", "--context-length", "--json-model-override-args"),
                              ("vllm", "--max-model-len", "--hf-overrides")):
        a = launch.command(short, t)
        assert a[a.index(flag) + 1] == "40960" and override not in a
        b = launch.command(long, t)
        assert b[b.index(flag) + 1] == "131072"
        ov = json.loads(b[b.index(override) + 1])
        assert ov["max_position_embeddings"] == 131072 and ov["rope_scaling"]["factor"] == 4.0
    tr = launch.command(long, "trtllm")
    assert tr[tr.index("--max_seq_len") + 1] == "40960" and "capped" in launch.context_note(long, "trtllm")
    llama = deployments(read_plan(ROOT / "plans" / "llama-70b-chat"), catalog)[0]
    a = launch.command(llama, "sglang")
    assert a[a.index("--context-length") + 1] == "131072" and launch.context_note(llama, "sglang") is None


def test_bucket_ranges_round_each_quota_down_or_up():
    """Largest remainder: contiguous ranges covering every bucket, each backend its exact quota rounded down or up
    (five equal weights: 51.2 buckets each, so one of them 52, 0.8 of a bucket over)."""
    from planner.export import k8s

    for weights in ({"a": 1, "b": 1, "c": 1, "d": 1, "e": 1}, {"a": 7, "b": 2, "c": 1}, {"a": 3, "b": 0, "c": 5}):
        r = k8s.bucket_ranges(weights)
        total = sum(weights.values())
        assert sorted(r.values())[0][0] == 0 and max(hi for _, hi in r.values()) == k8s.PREFIX_BUCKETS
        assert sum(hi - lo for lo, hi in r.values()) == k8s.PREFIX_BUCKETS
        for k, w in weights.items():
            n = r[k][1] - r[k][0] if k in r else 0
            exact = k8s.PREFIX_BUCKETS * w / total
            assert int(exact) <= n <= int(exact) + 1, (weights, k)
    assert sorted(hi - lo for lo, hi in k8s.bucket_ranges({k: 1 for k in "abcde"}).values()) == [51, 51, 51, 51, 52]
