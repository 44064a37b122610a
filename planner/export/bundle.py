"""``planner export``: a plan folder -> everything ops need to run it, written as one unit.

Layout under the output folder: ``POOL_ID/launch-ENGINE.sh`` (and ``config-trtllm.yaml``),
``POOL_ID/expert-location-ENGINE.json|yaml``, ``k8s/*.yaml``, ``README.md`` (one table of launch commands),
``runbook.md`` and ``export.json`` (every file with its pool and kind).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from planner.catalog.loader import Catalog
from planner.errors import InputError
from planner.export import expert_maps, k8s, launch
from planner.export.deploy import Deployment, deployments
from planner.export.files import inside, staged
from planner.export.routers import pd_router
from planner.export.runbook import runbook
from planner.export.verify import Launch, refuse, router_findings, verify
from planner.results import Plan

TARGETS = ("sglang", "vllm", "trtllm", "k8s")


def read_plan(plan_dir: Path) -> Plan:
    from pydantic import ValidationError

    from planner.catalog.inputs import MAX_DATA_BYTES, read_text

    path = Path(plan_dir) / "plan.json"
    if not Path(plan_dir).is_dir():
        raise InputError(f"{plan_dir}: not a plan folder (give the folder with plan.json)")
    text = read_text(path, limit=MAX_DATA_BYTES)
    try:
        return Plan.model_validate_json(text)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise InputError(f"{path}: not a plan.json of this planner version (field '{loc}': {first['msg']}); "
                         "re-plan with `planner plan`") from None


def parse_targets(values: list[str]) -> list[str]:
    out: list[str] = []
    for v in values:
        for t in v.split(","):
            t = t.strip().lower()
            if t == "all":
                out += [x for x in TARGETS if x not in out]
            elif t in TARGETS:
                if t not in out:
                    out.append(t)
            else:
                raise InputError(f"--target: unknown target '{t}'; use {', '.join(TARGETS)} or all")
    if not out:
        raise InputError("--target: give at least one of " + ", ".join(TARGETS) + " or all")
    return out


class _Plain(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):
    """Writes a value shared by two fields twice, never as a YAML anchor and alias (which some tools reject and
    every reader has to resolve); libyaml's emitter where PyYAML has it (an expert map holds ~10^5 numbers, which
    the pure-Python emitter takes seconds to write)."""

    def ignore_aliases(self, data) -> bool:
        return True


def _dump(obj) -> str:
    return yaml.dump(obj, Dumper=_Plain, sort_keys=False, width=120)


def _dump_all(objs: list[dict]) -> str:
    return yaml.dump_all(objs, Dumper=_Plain, sort_keys=False, width=120)


def export_plan(plan_dir: Path, targets: list[str], out: Path, catalog: Catalog, *, force: bool = False,
                namespace: str = "default", gateway: str = "inference-gateway",
                checkpoints: dict[str, str] | None = None, rdma_resource: str | None = None,
                routing: str = "httproute") -> dict:
    """Write the export of ``plan_dir`` into ``out`` (swapped in whole); return the export.json document.
    ``checkpoints``: pool id -> path of a checkpoint in the pool's weight format where none is published."""
    plan_dir = Path(plan_dir)
    plan = read_plan(plan_dir)
    deps = deployments(plan, catalog, plan_dir, checkpoints, rdma_resource)
    plan_name = k8s._dns(str(plan.scenario.get("name", plan_dir.name)))
    files: list[dict] = []
    skipped: list[dict] = []
    texts: dict[str, str] = {}
    launch_of: dict[str, list[str]] = {}
    checked: dict[tuple[str, str], Launch] = {}

    def add(path: str, text: str, pool: str | None, kind: str, engine: str | None = None) -> None:
        inside(out, path)  # refused before anything is written
        texts[path] = text
        files.append({"path": path, "pool": pool, "kind": kind, "engine": engine})

    maps = {d.pool: _load_map(plan_dir, d) for d in deps}
    engines = [t for t in targets if t in launch.TARGETS]
    for d in deps:
        for t in engines:
            eng = catalog.get_engine(t)
            hw = catalog.get_hardware(d.hardware)
            if not eng.runs_on(hw):
                skipped.append({"pool": d.pool, "target": t, "reason": f"{t} does not run on {hw.vendor} hardware"})
                continue
            launch_of.setdefault(d.pool, []).append(f"{d.pool}/launch-{t}.sh")
            notes = _notes(d, t)
            loc = None
            if maps[d.pool] is not None:
                if t == "sglang":
                    add(f"{d.pool}/expert-location-sglang.json", json.dumps(expert_maps.sglang_location(maps[d.pool], d)) + "\n",
                        d.pool, "expert-location", t)
                    loc = "expert-location-sglang.json"
                elif t == "vllm":
                    add(f"{d.pool}/expert-location-vllm.json", json.dumps(expert_maps.vllm_note(d), indent=1) + "\n",
                        d.pool, "expert-location", t)
            args = launch.command(d, t, expert_location=None if loc is None else f"${{PLANNER_DIR}}/{loc}")
            cfg = None
            if t == "trtllm":
                assign = expert_maps.trtllm_assignments(maps[d.pool], d) if maps[d.pool] is not None else None
                cfg = launch.trtllm_config(d, assign)
                add(f"{d.pool}/config-trtllm.yaml", _dump(cfg), d.pool, "engine-config", t)
                if assign is not None:
                    add(f"{d.pool}/expert-location-trtllm.yaml", _dump({"moe_config": cfg["moe_config"]}), d.pool,
                        "expert-location", t)
                args = [a if a != "config.yaml" else "${PLANNER_DIR}/config-trtllm.yaml" for a in args]
            add(f"{d.pool}/launch-{t}.sh", launch.script(d, t, args, notes=notes), d.pool, "launch", t)
            checked[(d.pool, t)] = Launch(d, t, args, cfg)
    if "k8s" in targets:
        _k8s(plan, deps, catalog, maps, plan_name, namespace, add, skipped, gateway, routing, checked)
    found = verify(list(checked.values()), catalog)
    # a launch for another engine than the plan's that this engine cannot start is left out, with the reason;
    # the plan's own engine must start as planned, or nothing is written
    own = {d.pool: d.engine for d in deps}
    for v in [v for v in found if v.engine and v.engine != own.get(v.pool)]:
        path = f"{v.pool}/launch-{v.engine}.sh"
        if path in texts:
            for f in [f for f in files if f["pool"] == v.pool and f["engine"] == v.engine]:
                files.remove(f)
                texts.pop(f["path"], None)
            launch_of[v.pool] = [x for x in launch_of.get(v.pool, []) if x != path]
            skipped.append({"pool": v.pool, "target": v.engine, "reason": v.line()})
    refuse([v for v in found if not v.engine or v.engine == own.get(v.pool)])
    add("runbook.md", runbook(plan, deps, launch_of, plan_dir=str(plan_dir), namespace=namespace, skipped=skipped,
                              routing=routing),
        None, "runbook")
    add("README.md", _readme(plan, deps, launch_of), None, "readme")
    if plan.migration is not None:
        add("migration.json", plan.migration.model_dump_json(indent=1) + "\n", None, "migration")
    doc = {"plan": str(plan_dir / "plan.json"), "plan_status": plan.status, "schema_version": plan.schema_version,
           "targets": targets, "namespace": namespace, "files": sorted(files, key=lambda f: f["path"]),
           "skipped": skipped}
    texts["export.json"] = json.dumps(doc, indent=1) + "\n"
    from planner.catalog.writer import atomic_write_text

    with staged(out, force=force, unit=True, kind="export") as stage:
        for rel, text in texts.items():
            path = inside(stage, rel)
            atomic_write_text(path, text)
            if rel.endswith(".sh"):
                path.chmod(path.stat().st_mode | 0o111)
    return doc


def _load_map(plan_dir: Path, d: Deployment) -> dict | None:
    if d.expert_map is None:
        return None
    from planner.catalog.inputs import load_json

    doc = load_json(plan_dir / d.expert_map)
    if not isinstance(doc, dict) or "physical_to_logical_map" not in doc:
        raise InputError(f"{plan_dir / d.expert_map}: not a placement map (no physical_to_logical_map)")
    try:
        expert_maps.moe_rows(doc, d)
    except ValueError as err:
        raise InputError(f"{plan_dir / d.expert_map}: {err}") from None
    return doc


def _notes(d: Deployment, target: str) -> list[str]:
    notes = []
    if target != d.engine:
        notes.append(f"The plan priced this pool with {d.engine}; this is the {target} equivalent (its speed may differ).")
    for note in (launch.checkpoint_note(d), launch.context_note(d, target)):
        if note:
            notes.append(note)
    if d.role in ("prefill", "decode"):
        notes.append(f"Disaggregated {d.role} worker: start prefill workers first; a router pairs them with decode.")
    return notes


def _k8s(plan: Plan, deps: list[Deployment], catalog: Catalog, maps: dict, plan_name: str, namespace: str, add,
         skipped: list[dict], gateway: str = "inference-gateway", routing: str = "httproute",
         checked: dict | None = None) -> None:
    runnable = []
    target_of = {}
    for d in deps:
        if d.engine not in launch.TARGETS:
            skipped.append({"pool": d.pool, "target": "k8s",
                            "reason": f"engine {d.engine} has no launch template (flags not in the engine reference)"})
            continue
        target_of[d.pool] = d.engine
        runnable.append(d)
    cms, serving, hpas = [], [], []
    for d in runnable:
        data = {}
        loc = None
        if maps[d.pool] is not None and d.engine == "sglang":
            data["expert-location-sglang.json"] = json.dumps(expert_maps.sglang_location(maps[d.pool], d))
            loc = "${PLANNER_DIR}/expert-location-sglang.json"
        args = launch.command(d, d.engine, expert_location=loc)
        cfg = None
        if d.engine == "trtllm":
            assign = expert_maps.trtllm_assignments(maps[d.pool], d) if maps[d.pool] is not None else None
            cfg = launch.trtllm_config(d, assign)
            data["config-trtllm.yaml"] = _dump(cfg)
            args = [a if a != "config.yaml" else "${PLANNER_DIR}/config-trtllm.yaml" for a in args]
        data["launch.sh"] = launch.script(d, d.engine, args, notes=_notes(d, d.engine))
        if checked is not None:
            checked[(d.pool, d.engine)] = Launch(d, d.engine, args, cfg)
        cms.append(k8s.configmap(d, data, namespace))
    for d in runnable:
        h = k8s.autoscaler(d, catalog, namespace)
        if h is not None:
            hpas.append(h)
    scaled = {h["metadata"]["name"] for h in hpas}
    workloads = sorted({d.workload for d in runnable})
    routers = []
    for w in workloads:
        ds = [d for d in runnable if d.workload == w]
        serving += k8s.workload_objects(ds, target_of, plan_name, namespace,
                                        {d.pool for d in ds if d.name in scaled})
        objs = pd_router(w, ds, plan_name, namespace,
                         {e.id: e.release.version for e in catalog.engines.values() if e.release})
        if objs:
            refuse(router_findings(objs, next(d.engine for d in ds if d.role == "prefill"), catalog, w))
        routers += objs
    # Services and routes cover every pool, those without a launch template too (run by hand with the pool's
    # labels, they get the traffic the plan gives them; the route never shifts it onto the others)
    every = sorted({d.workload for d in deps})
    services = [k8s.pool_service(d, plan_name, namespace) for d in deps]
    services += [s for w in every if (s := k8s.service(w, [d for d in deps if d.workload == w], plan_name,
                                                           namespace)) is not None]
    routes = [k8s.route(w, [d for d in deps if d.workload == w], plan_name, namespace, gateway, routing) for w in every]
    if routing == "inference-pool":
        routes = [k8s.inference_pool(d, plan_name, namespace) for d in deps if d.role == "aggregated"] + routes
    add("k8s/configmaps.yaml", _dump_all(cms), None, "k8s")
    domains = [k8s.compute_domain(d, plan_name, namespace) for d in runnable if k8s.needs_compute_domain(d)]
    if domains:
        add("k8s/compute-domains.yaml", _dump_all(domains), None, "k8s")
    add("k8s/serving.yaml", _dump_all(serving), None, "k8s")
    add("k8s/services.yaml", _dump_all(services), None, "k8s")
    add("k8s/routes.yaml", _dump_all(routes), None, "k8s")
    if routers:
        add("k8s/routers.yaml", _dump_all(routers), None, "k8s")
    add("k8s/disruption.yaml", _dump_all([k8s.disruption_budget(d, namespace) for d in runnable]), None, "k8s")
    if hpas:  # an empty YAML stream is refused by `kubectl apply`
        add("k8s/autoscaling.yaml", _dump_all(hpas), None, "k8s")
    monitors = k8s.pod_monitors(runnable, catalog, plan_name, namespace)
    if monitors:
        add("k8s/monitoring.yaml", _dump_all(monitors), None, "k8s")
    add("k8s/alerts.yaml", _dump(k8s.alerts(runnable, catalog, plan_name, namespace)), None, "k8s")


def _readme(plan: Plan, deps: list[Deployment], launch_of: dict[str, list[str]]) -> str:
    L = [f"# Launch commands: {plan.scenario['name']}", "",
         "One engine instance per replica; multi-host replicas run the script on every host with `NODE_RANK` (0 on "
         "the leader) and `LEADER_ADDR`. `MODEL_PATH` defaults to the Hugging Face id. See `runbook.md` for the "
         "bring-up order and `k8s/` for manifests.", "",
         "| pool | role | hardware | replicas | GPUs per replica | hosts | plan's engine | scripts |",
         "|---|---|---|---:|---:|---:|---|---|"]
    for d in deps:
        L.append(f"| {d.pool} | {d.role} | {d.hardware} | {d.replicas} | {d.gpus} | {d.hosts} | {d.engine} | "
                 + (", ".join(f"`{x}`" for x in launch_of.get(d.pool, [])) or "(none)") + " |")
    return "\n".join(L) + "\n"
