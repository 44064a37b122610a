"""``runbook.md``: how to bring a plan's fleet up, what it was sized for, what a lost unit leaves, what to
watch and what to do when an alert fires."""

from __future__ import annotations

from planner.export import k8s
from planner.export.deploy import Deployment
from planner.results import Plan, capacity_after_losing


def runbook(plan: Plan, deps: list[Deployment], files: dict[str, list[str]], *, plan_dir: str, namespace: str,
            skipped: list[dict], routing: str = "httproute") -> str:
    sc = plan.scenario
    o = plan.objective
    L = [f"# Runbook: {sc['name']}", ""]
    fleet = ", ".join(f"{g.count} {g.kind}{'s' if g.count != 1 else ''} of {g.hardware}" for g in plan.units)
    L += [f"Plan `{plan_dir}/plan.json` ({plan.status}, ${o.usd_per_hour:,.2f}/h): {fleet}, serving "
          + "; ".join(f"{w.name} {w.requests_per_s:g} req/s (TTFT {w.slo_ttft_s * 1e3:g} ms, TPOT {w.slo_tpot_s * 1e3:g} ms)"
                      for w in plan.workloads) + ".", ""]
    from planner.export.deploy import crosses_nodes

    over = sorted(d.pool for d in deps if crosses_nodes(d))
    rdma = ([f"- RDMA between nodes: {', '.join(over)} send expert or KV traffic across hosts over scale-out. "
             + ("Their pods request one `" + next(d.rdma_resource for d in deps if d.rdma_resource)
                + "` each (`--rdma-resource`)."
                if any(d.rdma_resource for d in deps) else
                "Re-export with `--rdma-resource <the RDMA device plugin's resource>` so their pods request a NIC; "
                "without one the engines fall back to TCP, far below the bandwidth the plan assumed.")]
            if over else [])
    L += ["## Before you start", "",
          *rdma,
          f"- Label the nodes of each hardware kind `planner.io/hardware=<id>` "
          f"({', '.join(sorted({d.hardware for d in deps}))}); on NVL72 racks the GPU operator's "
          "`nvidia.com/gpu.clique` label keeps a replica inside one NVLink domain.",
          "- A Gateway API implementation and a Gateway for the HTTPRoutes (default name `inference-gateway`).",
          "- Install the LeaderWorkerSet and DisaggregatedSet controllers (kubernetes-sigs/lws) where a pool spans "
          "hosts or serves prefill/decode separately, the Prometheus operator for the alerts, and a metrics adapter "
          "that exposes each engine's running-requests gauge to the autoscaler (the HPA names it with `_` for `:`).",
          "- Engine images are pinned to the release each engine's catalog entry targets (`release.images`); every "
          "launch command was checked against that release's flags and start-up rules "
          "(`catalogs/engines/releases/`). Mirror the images to your registry before the bring-up.",
          "- Gated checkpoints (Llama): `kubectl create secret generic hf-token --from-literal=token=<HF token>`; pods "
          "read it as `HF_TOKEN` when present. Weights download to an `emptyDir` at `/model-cache` per pod: for "
          "restarts without a download, replace the `model-cache` volume with a ReadWriteMany claim holding them.",
          "- Pods request GPUs, 4 CPU cores per GPU and half the node's host memory per GPU (`resources.requests`), "
          "and a 32 GiB `/dev/shm`; adjust to your nodes.",
          "- Rolling updates start a new replica before stopping an old one (`maxUnavailable: 0`); "
          "`k8s/disruption.yaml` lets a node drain take at most the replicas the plan can lose "
          "(`resilience.lose_units`; none without it: add capacity before draining).",
          f"- Namespace: `{namespace}`.", ""]
    if plan.migration is not None:
        from planner.export.migration import runbook_lines

        L += runbook_lines(plan.migration)
    L += ["## Bring-up order" + (" (a fresh cluster; from the deployed fleet, follow the migration above)"
                                 if plan.migration is not None else ""), "",
          "1. `kubectl apply -f k8s/configmaps.yaml` (launch scripts, engine configs, expert maps)"
          + ("; then `k8s/compute-domains.yaml`: a ComputeDomain per pool whose replicas span hosts of a rack's "
             "NVLink domain (NVIDIA's DRA driver, `k8s-dra-driver-gpu` with ComputeDomain support, on Kubernetes with "
             "DRA); each of its pods claims the domain's IMEX channel, which NCCL needs across the hosts."
             if any(k8s.needs_compute_domain(d) for d in deps) else "."),
          "2. Prefill pools first (in `k8s/serving.yaml`, the DisaggregatedSet's prefill roles): wait until their "
          "leaders are Ready; decode workers need them to pull KV from.",
          "3. Decode and aggregated pools (`k8s/serving.yaml`); wait for every replica's readiness probe (`/health`).",
          "4. Routers last: " + _router_text(deps) + " Then `k8s/services.yaml` (one Service per pool, one per router) and "
          "`k8s/routes.yaml`: each workload's HTTPRoute splits its requests over its pools with the plan's router "
          "shares as weights (the table below); it attaches to the Gateway named at export (`--gateway`)."
          + (" With `--routing inference-pool` the aggregated pools are InferencePools (in `k8s/routes.yaml`), "
             "each naming its endpoint picker `<pool>-epp` on port 9002: install one per pool with the Gateway API "
             "Inference Extension's chart; until it runs, the pool fails open (plain load balancing)."
             if routing == "inference-pool" else ""),
          "5. `k8s/disruption.yaml`, `k8s/autoscaling.yaml` (where written; a disaggregated role scales through the "
          "DisaggregatedSetRoleScaler `<set>-<role>` its `scaling.mode: External` makes the LWS controller create, "
          "which needs a controller newer than v0.9.0 and one slice), `k8s/monitoring.yaml` (PodMonitors: "
          "what the Prometheus operator scrapes) and `k8s/alerts.yaml`.", ""]
    L += _prefix_lines(plan, deps)
    L += ["## Pools", "", "| pool | role | hardware | replicas | hosts x GPUs per replica | engine | capacity req/s | "
          "router share | utilisation | launch |", "|---|---|---|---:|---|---|---:|---:|---:|---|"]
    for d in deps:
        p = next(x for x in plan.pools if x.id == d.pool)
        launch = ", ".join(f"`{f}`" for f in files.get(d.pool, [])) or "(none)"
        L.append(f"| {d.pool} | {d.role} | {d.hardware} | {d.replicas} | {d.hosts} x {d.gpus_per_pod} | {d.engine} | "
                 f"{p.predicted.requests_per_s:,.2f} | {p.router_share:.1%} | {p.predicted.utilisation:.0%} | {launch} |")
    L.append("")
    for d in deps:
        L.append(f"- **{d.pool}**: layout {next(x for x in plan.pools if x.id == d.pool).layout.notation}, batch {d.batch} "
                 f"sequences per replica, weights {d.weights_dtype}, KV {d.kv_dtype} in {d.kv_tier}; predicted TTFT "
                 f"{d.predicted_ttft_s * 1e3:,.0f} ms and TPOT {d.predicted_tpot_s * 1e3:,.1f} ms against "
                 f"{d.slo_ttft_s * 1e3:g} / {d.slo_tpot_s * 1e3:g} ms; autoscale on {d.scale_target_in_flight} requests "
                 "in flight per replica.")
    L.append("")
    if skipped:
        L += ["Not exported:", ""] + [f"- {s['pool']} ({s['target']}): {s['reason']}" for s in skipped] + [""]
    L += ["## Capacity, headroom and losing a unit", ""]
    loss = capacity_after_losing(plan, 1)
    for w in plan.workloads:
        head = w.served_requests_per_s / w.requests_per_s - 1.0 if w.requests_per_s else 0.0
        line = f"- {w.name}: capacity {w.served_requests_per_s:,.2f} req/s for {w.requests_per_s:g} demanded ({head:+.1%} headroom)."
        if w.name in loss and loss[w.name][1]:
            cap, units = loss[w.name]
            short = cap < w.requests_per_s
            line += (f" Losing {units[0]} (the worst single unit) leaves {cap:,.2f} req/s"
                     + (f": **{w.requests_per_s - cap:,.2f} req/s short** until it is replaced or the "
                        "autoscaler adds replicas" if short else ", still above demand") + ".")
        L.append(line)
    L += ["", "## What to watch", "",
          "- TTFT and TPOT per workload against the targets, at the quantile the plan was sized for (alerts in "
          "`k8s/alerts.yaml`, 10 minutes over target).",
          "- Requests in flight per replica against the autoscaling target: sustained above it means demand beyond "
          "the plan's sizing.",
          "- KV-cache usage and preemptions (each engine's gauges): a pool that preempts runs a smaller batch than planned.",
          "", "## When an alert fires", "",
          "- **TTFT above target**: for a disaggregated workload add prefill replicas (the prefill role of its "
          "DisaggregatedSet); for an aggregated pool add replicas (the HPA does so up to its maximum). Check the "
          "queue time gauge: a long queue is load, a short one with slow TTFT is prompt length beyond the plan's.",
          "- **TPOT above target**: decode replicas carry larger batches than planned: add decode (or aggregated) "
          "replicas; lowering the engine's running-request limit trades throughput for TPOT.",
          "- Sustained over a day: the traffic is not what the plan was sized for. Re-plan with the new demand.", "",
          "## Re-plan", "",
          f"`planner plan <scenario.yaml> --out {plan_dir} --force` with the scenario `{sc['name']}` updated "
          f"(demand, targets, prices), then `planner export {plan_dir} --target all --force`.", ""]
    return "\n".join(L)


def _prefix_lines(plan: Plan, deps: list[Deployment]) -> list[str]:
    """Prefix-family routing: which family buckets each backend of a workload serves, beside the plan's share (a
    backend whose share rounds to no bucket is listed, and said so)."""
    L, unranged = [], []
    for w in sorted({d.workload for d in deps}):
        ds = [d for d in deps if d.workload == w]
        if not k8s.prefix_routed(ds):
            continue
        weights = k8s.route_weights(ds)
        total = sum(weights.values())
        if not L:
            L += ["## Prefix families", "",
                  f"The plan sizes each pool's prefix cache for its share of a workload's prefix families, so a family "
                  f"must stay on one pool: send each request's family bucket in the `{k8s.PREFIX_HEADER}` header, the "
                  "first two hex digits (lowercase) of a hash of the family's key (its shared system prompt, tenant or "
                  "conversation id). The HTTPRoute sends each bucket range to one backend; requests without the "
                  "header take the weighted split (and lose that reuse).", "",
                  "| workload | backend | buckets | share of families | plan's share |", "|---|---|---|---:|---:|"]
        ranges = k8s.bucket_ranges(weights)
        for name in weights:
            if name in ranges:
                lo, hi = ranges[name]
                L.append(f"| {w} | {name} | {lo:02x}-{hi - 1:02x} | {(hi - lo) / k8s.PREFIX_BUCKETS:.1%} | "
                         f"{weights[name] / total:.1%} |")
            else:
                unranged.append(name)
                L.append(f"| {w} | {name} | none | 0.0% | {weights[name] / total:.1%} |")
    if unranged:
        L += ["", f"{', '.join(unranged)}: a share under one bucket (1/{k8s.PREFIX_BUCKETS} of the families) gets no "
              "bucket range, so it serves only requests without the header and the backends with ranges take its "
              "planned load; send some traffic without the header, or leave the pool out."]
    return L + [""] if L else []


def _router_text(deps: list[Deployment]) -> str:
    """What routes each disaggregated workload: the router its engine documents, generated in
    ``k8s/routers.yaml`` (:mod:`planner.export.routers`)."""
    pd = sorted({(d.workload, d.engine) for d in deps if d.role in ("prefill", "decode")})
    if not pd:
        return "no workload is disaggregated."
    parts = []
    for w, engine in pd:
        if engine == "sglang":
            parts.append(f"`k8s/routers.yaml` runs {w}'s SGLang router in PD mode (`sglang_router.launch_router "
                         "--pd-disaggregation --service-discovery`): it finds the prefill and decode leaders by their "
                         f"labels, reads each prefill leader's bootstrap port from `{k8s.BOOTSTRAP_ANNOTATION}`, and "
                         "follows the autoscalers; its ServiceAccount and Role let it watch pods.")
        elif engine == "vllm":
            parts.append(f"`k8s/routers.yaml` runs {w}'s vLLM NIXL pairing proxy (vLLM's documented "
                         "`toy_proxy_server.py`, fetched at the release's tag by an init container: the cluster needs "
                         "egress to raw.githubusercontent.com, or mirror the file) over the prefill and decode pools' "
                         "Services; each prefill pod gives the decode pod its own address "
                         "(`VLLM_NIXL_SIDE_CHANNEL_HOST`, the pod IP), so the Services' balancing pairs correctly.")
        elif engine == "trtllm":
            parts.append(f"`k8s/routers.yaml` runs {w}'s `trtllm-serve disaggregated` with a `disagg_config.yaml` "
                         "listing each prefill pool's Service under `context_servers.urls` and each decode pool's "
                         "under `generation_servers.urls` (the Services balance over replicas and follow the "
                         "autoscalers).")
        else:
            parts.append(f"{w} ({engine}): no router template; run the engine's own router with the label "
                         f"`planner.io/router={k8s.dns_name(w)}`.")
    return " ".join(parts)
