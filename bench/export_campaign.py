"""Export campaign (issue 44's target): plans the planner solves on generated scenarios, every one exported and
checked as ops would receive it.

    python bench/export_campaign.py [--limit N] [--jobs 2] [--keep DIR] [--json]

The scenarios are a grid over model (dense, MoE, MLA, sliding-window), hardware (Hopper, Blackwell 8-GPU and
NVL72, AMD), engine (SGLang, vLLM, TensorRT-LLM, or the planner's choice), serving mode (aggregated, disaggregated
allowed), prefix reuse and prompt length; each is planned without the analysis, and its plan exported to every
target. Checks, per export (the same checks as ``tests/test_export.py``, on the references carried in
``tests/data/``):

- every launch command of the plan's own engine passes its target release's flag table and start-up rules
  (``planner.export.verify``: the export refuses otherwise; checked again here), and no pool's own-engine launch
  is left out; launches for other engines that cannot start a pool's layout are left out and counted;
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
    from planner.export.verify import Launch, verify
    from tests.conftest import crd_schema

    bad: list[str] = []
    own = [Launch(d, d.engine, launch.command(d, d.engine, expert_location="/x/map.json" if d.expert_map else None),
                  launch.trtllm_config(d) if d.engine == "trtllm" else None)
           for d in deps if d.engine in launch.TARGETS]
    # the release's flags and start-up rules, again, on the plan's own engines (the export refuses on a finding)
    bad += [f"rule: {v.line()[:200]}" for v in verify(own, catalog)]
    skipped = json.loads((dest / "export.json").read_text())["skipped"]
    bad += [f"left out: {s['pool']} {s['target']}: {s['reason'][:160]}" for s in skipped
            if s["target"] == next((d.engine for d in deps if d.pool == s["pool"]), None)]
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


def _exercised(deps, catalog) -> tuple[list[str], list[str]]:
    """Rules whose ``when`` held on some launch of the plan's own engines (so their ``require`` was checked), and
    the flags those launches emit (engine|flag)."""
    from planner.catalog.releases import flag_table, rules_for
    from planner.export import launch
    from planner.export.checks import applies, functions, parse
    from planner.export.verify import Launch, command_of

    fired, flags = set(), set()
    for d in deps:
        if d.engine not in launch.TARGETS:
            continue
        eng = catalog.get_engine(d.engine)
        cmd = command_of(Launch(d, d.engine, launch.command(d, d.engine),
                                launch.trtllm_config(d) if d.engine == "trtllm" else None), catalog)
        parse(cmd, flag_table(catalog, eng))
        flags |= {f"{d.engine}|{f}" for f in cmd.values}
        names = functions(cmd)
        fired |= {r.id for r in rules_for(catalog, eng) if r.scope != "pair" and applies(r, names)[0]}
    return sorted(fired), sorted(flags)


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
        out["rules_exercised"], out["flags"] = _exercised(deps, cat)
        out["equivalents_left_out"] = sum(1 for s in json.loads((dest / "export.json").read_text())["skipped"]
                                          if s["reason"].startswith("pool '"))
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
    from planner.catalog import load_catalog
    from planner.catalog.releases import rules_for
    from planner.export.checks import coverage

    cat = load_catalog()
    rules = [r for e in ("sglang", "vllm", "trtllm") for r in rules_for(cat, cat.get_engine(e))]
    emitted: dict[str, set[str]] = {}
    for r in exported:
        for ef in r["flags"]:
            e, f = ef.split("|", 1)
            emitted.setdefault(e, set()).add(f)
    fired = sorted({x for r in exported for x in r["rules_exercised"]})
    doc = {"scenarios": len(scs), "planned": len(planned), "exported": len(exported),
           "rules": len(rules), "rules_touching_emitted_flags": coverage(rules, emitted),
           "rules_exercised": len(fired), "rules_never_exercised": sorted({r.id for r in rules if r.scope != "pair"}
                                                                          - set(fired)),
           "equivalent_scripts_left_out": sum(r.get("equivalents_left_out", 0) for r in exported),
           "pools": sum(r.get("pools", 0) for r in exported), "violations": dict(kinds), "wall_s": round(wall, 1),
           "engine_role_pools": dict(sorted(engine_mode.items())), "coverage": dict(sorted(cov.items())),
           "not_planned": Counter(r.get("why", "")[:80] for r in res if not r["planned"]).most_common(8),
           "examples": [v for r in res for v in r["violations"]][:20]}
    if a.json:
        print(json.dumps(doc, indent=1))
    else:
        print(f"{doc['scenarios']} scenarios, {doc['planned']} planned, {doc['exported']} exported "
              f"({doc['pools']} pools) in {wall:.0f} s; violations: {dict(kinds) or 'none'}")
        print(f"rules: {doc['rules']} encoded; touching flags the export emitted: "
              f"{doc['rules_touching_emitted_flags']}; exercised (when held on some launch): {doc['rules_exercised']}; "
              f"equivalent scripts left out (another engine cannot start the layout): "
              f"{doc['equivalent_scripts_left_out']}")
        print("pools by engine and role: " + ", ".join(f"{k} {v}" for k, v in doc["engine_role_pools"].items()))
        print("coverage (engine|role|technique: pools): " + ", ".join(f"{k} {v}" for k, v in doc["coverage"].items()))
        for why, n in doc["not_planned"]:
            print(f"  not planned x{n}: {why}")
        for v in doc["examples"]:
            print("  " + v)
    return 1 if kinds else 0


if __name__ == "__main__":
    sys.exit(main())
