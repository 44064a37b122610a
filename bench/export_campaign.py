"""Export campaign (issue 44's target): plans the planner solves on generated scenarios, every one exported and
checked as ops would receive it.

    python bench/export_campaign.py [--limit N] [--jobs 2] [--keep DIR] [--json]

The scenarios are a grid over model (dense, MoE, MLA, sliding-window), hardware (Hopper, Blackwell 8-GPU and
NVL72, AMD), engine (SGLang, vLLM, TensorRT-LLM, or the planner's choice), serving mode (aggregated, disaggregated
allowed), prefix reuse and prompt length; each is planned without the analysis, and its plan exported to every
target. Checks, per export (the same checks as ``tests/test_export.py``, on the references carried in
``tests/data/``):

- every launch command's flags are the engine's, with values among its choices (``check_argv``);
- every launch script parses (``bash -n``);
- every Kubernetes object validates: CRD kinds against their ``openAPIV3Schema`` (LeaderWorkerSet,
  DisaggregatedSet, PrometheusRule, PodMonitor, HTTPRoute), core kinds with ``kubernetes-validate`` strict;
- prefill and decode of one workload run one engine; every HPA targets an object the export creates (or the
  scaler a DisaggregatedSet role in External mode gets); every pod's resource claim names the channel template of a
  ComputeDomain the export creates.

Prints the count of scenarios, plans (solved), exports, violations by kind, and the coverage: engine x serving
mode x technique (expert parallelism, attention DP, two-batch overlap, speculative decoding, prefix tier, KV
offload, multi-host) over the exported pools. Exit 1 on any violation.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = ["llama-3.1-8b", "llama-3.1-70b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3",
          "gpt-oss-120b", "mixtral-8x7b", "kimi-k2"]
HARDWARE = [["h100-sxm"], ["h200-sxm"], ["b200-sxm"], ["gb200-nvl72"], ["mi300x", "mi355x"]]
ENGINES = [None, "sglang", "vllm", "trtllm"]
SERVING = [["aggregated"], ["aggregated", "disaggregated"]]
WORKLOADS = [(2000, 400, 0.0), (8000, 500, 0.5)]
"""(prompt tokens, output tokens, prefix hit rate)."""


def scenarios(limit: int | None) -> list[dict]:
    out = []
    for model, hw, engine, serving, (isl, osl, hit) in itertools.product(MODELS, HARDWARE, ENGINES, SERVING,
                                                                         WORKLOADS):
        if engine == "trtllm" and hw[0].startswith("mi"):
            continue  # TensorRT-LLM runs on NVIDIA only
        name = f"c{len(out):04d}"
        wl = {"name": "chat", "requests_per_s": 20, "input_tokens": isl, "output_tokens": osl,
              "slo": {"ttft_ms": 3000 if isl > 4000 else 1500, "tpot_ms": 60}}
        if hit:
            wl["prefix_cache"] = {"hit_rate": hit, "working_set_gb": 100}
        sc = {"name": name, "model": model, "hardware": hw, "serving": serving, "weights": ["bf16", "fp8", "fp4"],
              "kv_cache": ["fp8", "bf16"], "workloads": [wl]}
        if engine:
            sc["engine"] = engine
        out.append(sc)
    return out[:limit] if limit else out


def _techniques(d) -> set[str]:
    t = set()
    if d.ep > 1:
        t.add("expert-parallel")
    if d.attn_dp > 1:
        t.add("attention-dp")
    if d.two_batch_overlap:
        t.add("two-batch-overlap")
    if d.spec_tokens:
        t.add("speculative")
    if d.prefix_tier != "none":
        t.add(f"prefix-{d.prefix_tier}")
    if d.kv_tier != "hbm":
        t.add(f"kv-{d.kv_tier}")
    if d.multi_host:
        t.add("multi-host")
    return t


def _pod_specs(o: dict) -> list[dict]:
    spec = o.get("spec", {})
    if o["kind"] in ("Deployment",):
        return [spec["template"]["spec"]]
    if o["kind"] == "LeaderWorkerSet":
        lws = [spec]
    elif o["kind"] == "DisaggregatedSet":
        lws = [r["spec"] for r in spec["roles"]]
    else:
        return []
    return [t[k]["spec"] for x in lws for t in [x["leaderWorkerTemplate"]] for k in ("leaderTemplate", "workerTemplate")]


def _check_export(dest: Path, deps, catalog) -> list[str]:
    import jsonschema
    import kubernetes_validate as kv

    from planner.export import launch
    from tests.conftest import crd_schema, engine_flags
    from tests.test_export import check_argv

    bad: list[str] = []
    flags = engine_flags()
    for d in deps:
        for t in launch.TARGETS:
            if not catalog.get_engine(t).runs_on(catalog.get_hardware(d.hardware)):
                continue
            try:
                check_argv(t, launch.command(d, t, expert_location="/x/map.json" if d.expert_map else None), flags)
            except AssertionError as e:
                bad.append(f"flags: {d.pool} {t}: {str(e).splitlines()[0]}")
    for s in dest.glob("*/launch-*.sh"):
        r = subprocess.run(["bash", "-n", str(s)], capture_output=True, text=True)
        if r.returncode:
            bad.append(f"bash: {s.name}: {r.stderr.strip()[:120]}")
    schemas = {k: crd_schema(f) for k, f in (("LeaderWorkerSet", "leaderworkerset"), ("DisaggregatedSet", "disaggregatedset"),
                                              ("PrometheusRule", "prometheusrule"), ("PodMonitor", "podmonitor"),
                                              ("HTTPRoute", "httproute"), ("InferencePool", "inferencepool"))}
    objs = [o for f in sorted((dest / "k8s").glob("*.yaml")) for o in yaml.safe_load_all(f.read_text()) if o]
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    for o in objs:
        try:
            if o["kind"] == "ComputeDomain":  # NVIDIA's DRA driver CRD: not among the carried schemas
                assert o["apiVersion"] == "resource.nvidia.com/v1beta1" and set(o["spec"]) == {"numNodes", "channel"}
                names.add(("ResourceClaimTemplate", o["spec"]["channel"]["resourceClaimTemplate"]["name"]))
            elif o["kind"] in schemas:
                jsonschema.Draft7Validator(schemas[o["kind"]]).validate(o)
            else:
                kv.validate(o, "1.33", strict=True)
        except Exception as e:  # noqa: BLE001 - every schema error is a violation to count
            bad.append(f"schema: {o['kind']}/{o['metadata']['name']}: {str(e).splitlines()[0][:160]}")
        if o["kind"] == "DisaggregatedSet":
            for r in o["spec"]["roles"]:
                if r.get("scaling", {}).get("mode") == "External":
                    names.add(("DisaggregatedSetRoleScaler", f"{o['metadata']['name']}-{r['name']}"))
    for o in objs:
        for pod in _pod_specs(o):
            for c in pod.get("resourceClaims", []):
                if ("ResourceClaimTemplate", c["resourceClaimTemplateName"]) not in names:
                    bad.append(f"claim: {o['metadata']['name']} claims {c['resourceClaimTemplateName']}, no ComputeDomain makes it")
        if o["kind"] == "HorizontalPodAutoscaler":
            ref = o["spec"]["scaleTargetRef"]
            if (ref["kind"], ref["name"]) not in names:
                bad.append(f"autoscaler: {o['metadata']['name']} targets {ref['kind']}/{ref['name']}, not exported")
    by_w: dict[str, set] = {}
    for d in deps:
        if d.role in ("prefill", "decode"):
            by_w.setdefault(d.workload, set()).add(d.engine)
    bad += [f"pairing: {w} pairs engines {sorted(e)}" for w, e in by_w.items() if len(e) > 1]
    return bad


def one(sc: dict) -> dict:
    from planner.catalog import load_catalog
    from planner.catalog.scenario import Scenario, resolve_scenario
    from planner.errors import PlannerError
    from planner.export.bundle import export_plan, read_plan
    from planner.export.deploy import deployments
    from planner.export.plan import write_plan
    from planner.options import PlanOptions
    from planner.pipeline.plan import make_plan

    cat = load_catalog()
    out = {"name": sc["name"], "planned": False, "exported": False, "violations": [], "coverage": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        try:
            rs = resolve_scenario(Scenario.model_validate(sc), cat, tmp / "s.yaml")
            result = make_plan(rs, PlanOptions(analysis=False, time_limit_s=30))
        except PlannerError as e:
            out["why"] = str(e).splitlines()[0][:160]
            return out
        out["planned"] = True
        plan_dir = tmp / "plan"
        write_plan(result.plan, plan_dir, files=result.files)
        dest = tmp / "export"
        try:
            export_plan(plan_dir, ["sglang", "vllm", "trtllm", "k8s"], dest, cat)
        except PlannerError as e:
            out["violations"].append(f"export refused: {str(e).splitlines()[0][:160]}")
            return out
        out["exported"] = True
        plan = json.loads((plan_dir / "plan.json").read_text())
        deps = deployments(read_plan(plan_dir), cat, plan_dir)
        out["violations"] += _check_export(dest, deps, cat)
        out["coverage"] = sorted({f"{d.engine}|{d.role}|{t}" for d in deps for t in (_techniques(d) or {"plain"})})
        out["pools"] = len(plan["pools"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    scs = scenarios(a.limit)
    t0 = time.perf_counter()
    if a.jobs > 1:
        with ProcessPoolExecutor(max_workers=a.jobs) as ex:
            res = list(ex.map(one, scs))
    else:
        res = [one(s) for s in scs]
    wall = time.perf_counter() - t0
    planned = [r for r in res if r["planned"]]
    exported = [r for r in res if r["exported"]]
    kinds = Counter(v.split(":")[0] for r in res for v in r["violations"])
    cov = Counter(c for r in exported for c in r["coverage"])
    engine_mode = Counter("|".join(c.split("|")[:2]) for c in cov.elements())
    doc = {"scenarios": len(scs), "planned": len(planned), "exported": len(exported),
           "pools": sum(r.get("pools", 0) for r in exported), "violations": dict(kinds), "wall_s": round(wall, 1),
           "engine_role_pools": dict(sorted(engine_mode.items())), "coverage": dict(sorted(cov.items())),
           "not_planned": Counter(r.get("why", "")[:80] for r in res if not r["planned"]).most_common(8),
           "examples": [v for r in res for v in r["violations"]][:20]}
    if a.json:
        print(json.dumps(doc, indent=1))
    else:
        print(f"{doc['scenarios']} scenarios, {doc['planned']} planned, {doc['exported']} exported "
              f"({doc['pools']} pools) in {wall:.0f} s; violations: {dict(kinds) or 'none'}")
        print("pools by engine and role: " + ", ".join(f"{k} {v}" for k, v in doc["engine_role_pools"].items()))
        print("coverage (engine|role|technique: pools): " + ", ".join(f"{k} {v}" for k, v in doc["coverage"].items()))
        for why, n in doc["not_planned"]:
            print(f"  not planned x{n}: {why}")
        for v in doc["examples"]:
            print("  " + v)
    return 1 if kinds else 0


if __name__ == "__main__":
    sys.exit(main())
