"""Kubernetes objects for a plan's fleet (dicts, written as YAML by ``bundle``).

Per pool: a ``ConfigMap`` with its launch script (and engine config / expert map); a ``Deployment`` when a
replica fits one host, a ``LeaderWorkerSet`` (``leaderworkerset.x-k8s.io/v1``) when it spans several (the
leader and ``size - 1`` workers scheduled as a group, kept inside one scale-up domain where the hardware's
domain is a rack); prefill and decode pools of one workload together as a ``DisaggregatedSet``
(``disaggregatedset.x-k8s.io/v1``) whose roles are those LeaderWorkerSets. Per workload a ``Service``.
Per serving pool a ``HorizontalPodAutoscaler`` on requests in flight per replica, and one
``PrometheusRule`` with the TTFT and TPOT alerts at the plan's targets, in each engine's metric names.

Nodes are selected by the label ``planner.io/hardware: <hardware id>`` (label the nodes of each kind);
GPUs are requested by the vendor's device-plugin resource.
"""

from __future__ import annotations

import math
import shlex

from planner.catalog.loader import Catalog
from planner.catalog.scenario import quantile_label
from planner.errors import InputError
from planner.export.deploy import PORT, SGLANG_BOOTSTRAP_PORT, Deployment
from planner.export.launch import environment

CPU_PER_GPU = 4
"""CPU cores a serving pod requests per GPU (tokenisation, the scheduler, the HTTP server): a stated default,
not a measurement; raise it for engines that run their detokeniser or router in the pod."""
HOST_MEMORY_SHARE = 0.5
"""Share of the node's host memory per GPU (``host_dram_gb``) a pod requests: the engine's CPU-side buffers and
the model loader; the rest stays for the host KV tier and the system."""
SHM_GIB = 32
"""``/dev/shm`` of a serving pod (NCCL and the engines' worker processes share tensors through it)."""
MODEL_CACHE = "/model-cache"
"""Where a pod keeps downloaded weights (``HF_HOME``): an ``emptyDir`` unless ``--model-cache-pvc`` names a claim."""
HF_TOKEN_SECRET = "hf-token"
"""Optional Secret (key ``token``) with a Hugging Face token for gated checkpoints (Llama): absent, pods start without it."""
ENGINE_PROCESS = {"sglang": "sglang.launch_server", "vllm": "vllm serve", "trtllm": "trtllm-serve"}
"""What a worker pod's liveness and readiness probes look for in its process list: the engine its launch script
runs (``launch.py``'s command lines)."""
RESOURCE = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu", "google": "google.com/tpu", "aws": "aws.amazon.com/neuron"}
HARDWARE_LABEL = "planner.io/hardware"
RACK_TOPOLOGY = "nvidia.com/gpu.clique"
"""Node label of an NVLink domain (set by NVIDIA's GPU operator on NVL72 racks): a replica stays inside one."""
BOOTSTRAP_ANNOTATION = "sglang.ai/bootstrap-port"
"""Pod annotation SGLang's router reads each prefill leader's bootstrap port from (service discovery)."""
LEADER_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"


def _labels(d: Deployment, plan_name: str) -> dict:
    return {"app.kubernetes.io/name": d.name, "app.kubernetes.io/part-of": plan_name,
            "planner.io/pool": d.name, "planner.io/workload": _dns(d.workload), "planner.io/role": d.role,
            "planner.io/engine": d.engine}


def _dns(s: str) -> str:
    out = "".join(c if c.isalnum() else "-" for c in s.lower()).strip("-")
    return out[:63] or "x"


dns_name = _dns
"""A name as a Kubernetes object or label value takes it (lowercase, '-' for the rest, 63 characters at most)."""


def image_of(d: Deployment) -> str:
    """The pool's pinned engine image (catalog ``release.images``); an :class:`InputError` where none is pinned."""
    if not d.image:
        raise InputError(f"pool {d.pool}: no {d.engine} image pinned for {d.hardware} ({d.vendor}); add one to "
                         f"release.images of the {d.engine} engine in the catalog")
    return d.image


def _pod(d: Deployment, target: str, *, leader: bool, multi: bool, plan_name: str) -> dict:
    # LeaderWorkerSet gives every pod of a group LWS_LEADER_ADDRESS and LWS_WORKER_INDEX (0 on the leader)
    cmd = ("export LEADER_ADDR=\"$LWS_LEADER_ADDRESS\" NODE_RANK=\"$LWS_WORKER_INDEX\"; " if multi else "") + \
        "exec bash /planner/launch.sh"
    env = [{"name": "MODEL_PATH", "value": d.model_path},
           {"name": "HF_HOME", "value": MODEL_CACHE},
           {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": HF_TOKEN_SECRET, "key": "token", "optional": True}}}]
    if "VLLM_NIXL_SIDE_CHANNEL_HOST" in environment(d, target):  # peers reach the handshake at the pod's address
        env.append({"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    gpus = d.gpus_per_pod
    memory_gib = max(16, int(HOST_MEMORY_SHARE * d.host_dram_bytes_per_chip * gpus / 2**30))
    container = {
        "name": "engine",
        "image": image_of(d),
        "command": ["/bin/bash", "-c", cmd],
        "env": env,
        "resources": {"limits": {RESOURCE[d.vendor]: gpus},
                      "requests": {RESOURCE[d.vendor]: gpus, "cpu": str(CPU_PER_GPU * gpus), "memory": f"{memory_gib}Gi"}},
        "volumeMounts": [{"name": "launch", "mountPath": "/planner"}, {"name": "shm", "mountPath": "/dev/shm"},
                         {"name": "model-cache", "mountPath": MODEL_CACHE}],
    }
    if d.rdma_resource:
        for k in ("limits", "requests"):
            container["resources"][k][d.rdma_resource] = 1
    if not leader:
        # a worker serves no HTTP: it is ready and alive while its engine process runs (the leader's probes see
        # the group's health through /health)
        alive = {"exec": {"command": ["/bin/sh", "-c", f"pgrep -f {shlex.quote(ENGINE_PROCESS[target])} >/dev/null"]}}
        container["startupProbe"] = {**alive, "periodSeconds": 10, "failureThreshold": 60}
        container["readinessProbe"] = {**alive, "periodSeconds": 10, "failureThreshold": 3}
        container["livenessProbe"] = {**alive, "periodSeconds": 15, "failureThreshold": 4}
    if leader:
        container["ports"] = [{"name": "http", "containerPort": PORT}]
        container["readinessProbe"] = {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 10,
                                       "failureThreshold": 3, "initialDelaySeconds": 60}
        # loading hundreds of GB of weights takes minutes: the liveness probe waits for the first ready start
        container["startupProbe"] = {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 10,
                                     "failureThreshold": 180}
        container["livenessProbe"] = {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 15,
                                      "failureThreshold": 4, "timeoutSeconds": 5}
    spec = {
        "nodeSelector": {HARDWARE_LABEL: d.hardware},
        "containers": [container],
        "volumes": [{"name": "launch", "configMap": {"name": f"{d.name}-launch"}},
                    {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{SHM_GIB}Gi"}},
                    {"name": "model-cache", "emptyDir": {}}],
    }
    if needs_compute_domain(d):
        # the rack's multi-node NVLink (IMEX) channel: NCCL's cuMem/NVLS across the hosts of a replica needs it
        container["resources"]["claims"] = [{"name": CHANNEL_CLAIM}]
        spec["resourceClaims"] = [{"name": CHANNEL_CLAIM, "resourceClaimTemplateName": channel_template(d)}]
    meta: dict = {"labels": _labels(d, plan_name)}
    if leader and d.role == "prefill" and target == "sglang":
        # the PD router reads each prefill leader's bootstrap port from this annotation (service discovery)
        meta["annotations"] = {BOOTSTRAP_ANNOTATION: str(SGLANG_BOOTSTRAP_PORT)}
    return {"metadata": meta, "spec": spec}


def _lws_template(d: Deployment, target: str, plan_name: str) -> dict:
    tmpl = {
        "size": d.hosts,
        "leaderTemplate": _pod(d, target, leader=True, multi=True, plan_name=plan_name),
        "workerTemplate": _pod(d, target, leader=False, multi=True, plan_name=plan_name),
    }
    # a rolling update never takes a group down before its replacement is ready: capacity stays as planned
    return {"replicas": d.replicas, "leaderWorkerTemplate": tmpl, "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {"type": "RollingUpdate",
                                "rollingUpdateConfiguration": {"maxUnavailable": 0, "maxSurge": 1}}}


def _rack_bound(d: Deployment) -> bool:
    return d.unit_kind == "rack" and d.gpus <= d.scale_up_domain_chips


CHANNEL_CLAIM = "compute-domain-channel"


def needs_compute_domain(d: Deployment) -> bool:
    """A replica spanning hosts inside one rack's NVLink domain (GB200/GB300 NVL72): its GPUs talk over multi-node
    NVLink, which Kubernetes hands out as an IMEX channel of a ComputeDomain (NVIDIA's DRA driver)."""
    return d.multi_host and _rack_bound(d)


def channel_template(d: Deployment) -> str:
    return f"{d.name}-channel"[:63]


def compute_domain(d: Deployment, plan_name: str, namespace: str) -> dict:
    """The pool's ComputeDomain (``resource.nvidia.com/v1beta1``, NVIDIA k8s-dra-driver-gpu): the controller runs
    the IMEX daemons of the nodes its pods land on and creates the ResourceClaimTemplate the pods claim a channel
    from. ``numNodes: 0``: with the driver's default ``IMEXDaemonsWithDNSNames`` the count is not used (it only gated
    start-up before), so an autoscaler can add replicas."""
    return {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
            "metadata": {"name": f"{d.name}-domain"[:63], "namespace": namespace, "labels": _labels(d, plan_name)},
            "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": channel_template(d)}}}}


def configmap(d: Deployment, files: dict[str, str], namespace: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{d.name}-launch", "namespace": namespace}, "data": files}


def workload_objects(deps: list[Deployment], target_of: dict[str, str], plan_name: str, namespace: str,
                     scaled: frozenset[str] | set[str] = frozenset()) -> list[dict]:
    """Serving objects of one workload's pools (Deployments, LeaderWorkerSets or a DisaggregatedSet). A
    disaggregated pool in ``scaled`` takes its replicas from an autoscaler: its role is ``scaling.mode:
    External`` (the controller's DisaggregatedSetRoleScaler, :func:`role_scaler`, is what its autoscaler scales)."""
    out = []
    disagg = [d for d in deps if d.role in ("prefill", "decode")]
    for d in deps:
        if d.role in ("prefill", "decode"):
            continue
        t = target_of[d.pool]
        meta = {"name": d.name, "namespace": namespace, "labels": _labels(d, plan_name)}
        if d.multi_host:
            if _rack_bound(d):
                meta["annotations"] = {"leaderworkerset.sigs.k8s.io/exclusive-topology": RACK_TOPOLOGY}
            out.append({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": meta,
                        "spec": _lws_template(d, t, plan_name)})
        else:
            out.append({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                        "spec": {"replicas": d.replicas, "selector": {"matchLabels": {"planner.io/pool": d.name}},
                                 "strategy": {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                                 "template": _pod(d, t, leader=True, multi=False, plan_name=plan_name)}})
    if disagg:
        w = _dns(disagg[0].workload)
        roles = []
        for d in disagg:
            role = {"name": role_name(d), "metadata": {"labels": _labels(d, plan_name)},
                    "spec": _lws_template(d, target_of[d.pool], plan_name)}
            if d.pool in scaled:
                role["scaling"] = {"mode": "External"}  # spec.replicas is ignored and must not be set
                del role["spec"]["replicas"]
            roles.append(role)
        spec: dict = {"roles": roles}
        if all(_rack_bound(d) for d in disagg):
            spec["placementPolicy"] = {"type": "ExclusiveTopology", "topology": RACK_TOPOLOGY}
        out.append({"apiVersion": "disaggregatedset.x-k8s.io/v1", "kind": "DisaggregatedSet",
                    "metadata": {"name": disaggregated_set(w), "namespace": namespace,
                                 "labels": {"app.kubernetes.io/part-of": plan_name, "planner.io/workload": w}},
                    "spec": spec})
    return out


def disaggregated_set(workload: str) -> str:
    return f"{_dns(workload)}-pd"


def role_name(d: Deployment) -> str:
    return _dns(d.pool)[:63]


def role_scaler(d: Deployment) -> str:
    """Name of the DisaggregatedSetRoleScaler the controller creates for a role in External scaling mode:
    ``<DisaggregatedSet>-<role>`` (kubernetes-sigs/lws DisaggregatedSet docs, KEP-849)."""
    return f"{disaggregated_set(d.workload)}-{role_name(d)}"


def disruption_budget(d: Deployment, namespace: str) -> dict:
    """Voluntary disruptions (node drains) may take down at most the replicas the plan can lose: ``lose_units``
    units' worth (a replica per unit at most, the worst case the plan's re-check uses), none without resilience
    (drain such a pool's nodes only after adding capacity; the runbook says so)."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": d.name, "namespace": namespace},
            "spec": {"maxUnavailable": min(d.lose_units, d.replicas) if not d.multi_host else 0,
                     "selector": {"matchLabels": {"planner.io/pool": d.name}}}}


def pod_monitors(deps: list[Deployment], catalog: Catalog, plan_name: str, namespace: str) -> list[dict]:
    """One PodMonitor per engine (each serves its metrics on its own path): what makes the alerts fire."""
    out = []
    for engine in sorted({d.engine for d in deps}):
        eng = catalog.get_engine(engine)
        if eng.metrics is None:
            continue
        out.append({"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
                    "metadata": {"name": _dns(f"{plan_name}-{engine}"), "namespace": namespace,
                                 "labels": {"app.kubernetes.io/part-of": plan_name}},
                    "spec": {"selector": {"matchLabels": {"app.kubernetes.io/part-of": plan_name,
                                                          "planner.io/engine": engine}},
                             "podMetricsEndpoints": [{"port": "http", "path": eng.metrics.path, "interval": "15s"}]}})
    return out


def service(workload: str, deps: list[Deployment], plan_name: str, namespace: str) -> dict | None:
    """A disaggregated workload's entry point: the engine's prefill/decode router (label
    ``planner.io/router: <workload>``, see the runbook). Aggregated traffic goes through the workload's
    HTTPRoute to each pool's own Service instead (:func:`route`), weighted as the plan routes it."""
    if not any(d.role in ("prefill", "decode") for d in deps):
        return None
    w = _dns(workload)
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": f"{w}-router", "namespace": namespace, "labels": {"app.kubernetes.io/part-of": plan_name}},
            "spec": {"selector": {"planner.io/router": w}, "ports": [{"name": "http", "port": 80, "targetPort": PORT}]}}


def pool_service(d: Deployment, plan_name: str, namespace: str) -> dict:
    """One pool's serving pods (the leaders of multi-host replicas): what a route or a router sends to."""
    selector = {"planner.io/pool": d.name}
    if d.multi_host:
        selector["leaderworkerset.sigs.k8s.io/worker-index"] = "0"
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": d.name, "namespace": namespace, "labels": _labels(d, plan_name)},
            "spec": {"selector": selector, "ports": [{"name": "http", "port": 80, "targetPort": PORT}]}}


ROUTE_WEIGHT = 10_000
"""Sum of a route's backend weights (Gateway API weights are integers, proportions of their sum)."""


def route_weights(deps: list[Deployment]) -> dict[str, int]:
    """Backend -> weight of one workload's route: each aggregated pool its share of the workload's requests (its
    ``router_share`` of the aggregated part), the prefill/decode router the disaggregated part; the parts in
    proportion to the capacity the plan gives each (aggregated pools, and the smaller of prefill and decode)."""
    def cap(role: str) -> float:
        return sum(d.requests_per_s_per_replica * d.replicas for d in deps if d.role == role)

    agg, dis = cap("aggregated"), min(cap("prefill"), cap("decode"))
    total = agg + dis
    out: dict[str, int] = {}
    if total <= 0:
        return out
    for d in deps:
        if d.role == "aggregated":
            out[d.name] = round(ROUTE_WEIGHT * agg / total * d.router_share)
    if dis > 0:
        out[f"{_dns(deps[0].workload)}-router"] = round(ROUTE_WEIGHT * dis / total)
    return out


PREFIX_HEADER = "x-prefix-family"
"""Request header carrying a prefix family's bucket: the first two hex digits (lowercase) of a hash of the family's
key (its shared system prompt, tenant or conversation id), set by the client or the gateway in front."""
PREFIX_BUCKETS = 256
HEX = "0123456789abcdef"
INFERENCE_POOL_GROUP = "inference.networking.k8s.io"
MAX_FAMILY_RULES = 15
"""Family rules a route may carry beside its weighted rule (Gateway API: at most 16 rules per HTTPRoute); a
workload with more backends keeps only the weighted split."""
EPP_PORT = 9002
"""Port of a pool's endpoint picker (the Inference Extension's ext-proc service)."""


def prefix_routed(deps: list[Deployment]) -> bool:
    """Whether a workload's route keeps each prefix family on one pool: its pools reuse cached prefixes, and
    the plan sized each pool's prefix tier for its share of the families (formulation.md, the prefix rule)."""
    return any(d.prefix_tier != "none" for d in deps) and 1 < len(route_weights(deps)) <= MAX_FAMILY_RULES


def bucket_ranges(weights: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Backend -> ``[lo, hi)`` of the ``PREFIX_BUCKETS`` family buckets it serves: contiguous, in proportion to
    its weight (largest remainder: each backend gets its exact quota rounded down or up, so each share is within one
    bucket of the weight's; half a bucket cannot be promised, five equal weights need 51.2 buckets each)."""
    total = sum(weights.values())
    if total <= 0:
        return {}
    exact = {k: PREFIX_BUCKETS * w / total for k, w in weights.items()}
    count = {k: int(v) for k, v in exact.items()}
    for k in sorted(exact, key=lambda k: count[k] - exact[k])[:PREFIX_BUCKETS - sum(count.values())]:
        count[k] += 1
    out, lo = {}, 0
    for k in weights:
        if count[k]:
            out[k] = (lo, lo + count[k])
            lo += count[k]
    return out


def hex_range_regex(lo: int, hi: int) -> str:
    """An RE2 pattern matching exactly the two-hex-digit values in ``[lo, hi)`` (character classes list their
    digits, never an ASCII span such as ``8-b``)."""
    def cls(a: int, b: int) -> str:
        return HEX[a] if a == b else "[" + HEX[a:b + 1] + "]"

    parts = []
    while lo < hi:
        high, low = divmod(lo, 16)
        if low == 0 and hi - lo >= 16:
            n = (hi - lo) // 16
            parts.append(cls(high, high + n - 1) + "[0-9a-f]")
            lo += 16 * n
        else:
            end = min(hi, (high + 1) * 16)
            parts.append(HEX[high] + cls(low, end - 1 - high * 16))
            lo = end
    return "^(" + "|".join(parts) + ")$"


def _backend(name: str, weight: int, pools: set[str], routing: str) -> dict:
    ref = {"name": name, "port": 80, "weight": weight}
    if routing == "inference-pool" and name in pools:
        ref = {"group": INFERENCE_POOL_GROUP, "kind": "InferencePool", "name": name, "weight": weight}
    return ref


def route(workload: str, deps: list[Deployment], plan_name: str, namespace: str, gateway: str,
          routing: str = "httproute") -> dict:
    """The workload's HTTPRoute (Gateway API v1): requests split over its pools as the plan routes them. Where
    its pools reuse prefixes, a rule per backend keeps each prefix family (header :data:`PREFIX_HEADER`) on
    one backend, the families split in the plan's proportions; requests without the header take the weighted
    split. ``routing="inference-pool"``: aggregated pools are reached through their InferencePools."""
    weights = route_weights(deps)
    pools = {d.name for d in deps if d.role == "aggregated"}
    rules = []
    if prefix_routed(deps):
        for name, (lo, hi) in bucket_ranges(weights).items():
            rules.append({"matches": [{"path": {"type": "PathPrefix", "value": "/"},
                                       "headers": [{"type": "RegularExpression", "name": PREFIX_HEADER,
                                                    "value": hex_range_regex(lo, hi)}]}],
                          "backendRefs": [_backend(name, 1, pools, routing)]})
    rules.append({"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                  "backendRefs": [_backend(name, w, pools, routing) for name, w in weights.items()]})
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": _dns(workload), "namespace": namespace, "labels": {"app.kubernetes.io/part-of": plan_name}},
            "spec": {"parentRefs": [{"name": gateway}], "rules": rules}}


def inference_pool(d: Deployment, plan_name: str, namespace: str) -> dict:
    """An aggregated pool as an Inference Extension InferencePool (its serving pods, the leaders of multi-host
    replicas) with its endpoint picker ``<pool>-epp`` (deployed with the extension's chart; fail-open, so the
    pool serves before its picker runs)."""
    selector = {"planner.io/pool": d.name}
    if d.multi_host:
        selector["leaderworkerset.sigs.k8s.io/worker-index"] = "0"
    return {"apiVersion": f"{INFERENCE_POOL_GROUP}/v1", "kind": "InferencePool",
            "metadata": {"name": d.name, "namespace": namespace, "labels": _labels(d, plan_name)},
            "spec": {"selector": {"matchLabels": selector}, "targetPorts": [{"number": PORT}],
                     "endpointPickerRef": {"name": f"{d.name}-epp"[:63], "port": {"number": EPP_PORT},
                                           "failureMode": "FailOpen"}}}


def autoscaler(d: Deployment, catalog: Catalog, namespace: str) -> dict | None:
    """Scale a serving pool on requests in flight per replica (the planned batch at the planned load),
    between the planned replicas and half as many again (bounded by the units one may add). Prefill and decode
    roles scale independently, each through its DisaggregatedSetRoleScaler (whose selector counts one pod, the
    leader, per replica)."""
    eng = catalog.get_engine(d.engine)
    if eng.metrics is None or eng.metrics.running_requests is None:
        return None
    if d.role in ("prefill", "decode"):
        kind, api, name = "DisaggregatedSetRoleScaler", "disaggregatedset.x-k8s.io/v1", role_scaler(d)
    elif d.multi_host:
        kind, api, name = "LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1", d.name
    else:
        kind, api, name = "Deployment", "apps/v1", d.name
    return {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": d.name, "namespace": namespace},
        "spec": {
            "scaleTargetRef": {"apiVersion": api, "kind": kind, "name": name},
            "minReplicas": d.replicas,
            "maxReplicas": max(d.replicas + 1, math.ceil(d.replicas * 1.5)),
            "metrics": [{"type": "Pods", "pods": {
                "metric": {"name": eng.metrics.running_requests.replace(":", "_")},
                "target": {"type": "AverageValue", "averageValue": str(d.scale_target_in_flight)}}}],
        },
    }


def alerts(deps: list[Deployment], catalog: Catalog, plan_name: str, namespace: str) -> dict:
    """TTFT and TPOT alerts per workload at the plan's targets, at the quantile each was sized for (over 5
    minutes; the mean where the SLO is on the mean), in each engine's names."""
    rules = []
    seen = set()
    for d in deps:
        eng = catalog.get_engine(d.engine)
        if eng.metrics is None:
            continue
        for which, metric, slo, q in (("TTFT", eng.metrics.ttft_histogram, d.slo_ttft_s, d.slo_ttft_quantile),
                                      ("TPOT", eng.metrics.tpot_histogram, d.slo_tpot_s, d.slo_tpot_quantile)):
            key = (d.workload, which, metric)
            if key in seen:
                continue
            seen.add(key)
            sel = f'{{namespace="{namespace}"}}'
            if q is None:
                expr = f"sum(rate({metric}_sum{sel}[5m])) / sum(rate({metric}_count{sel}[5m])) > {slo:g}"
            else:
                expr = f"histogram_quantile({q:g}, sum by (le) (rate({metric}_bucket{sel}[5m]))) > {slo:g}"
            rules.append({
                "alert": f"{_camel(d.workload)}{which}AboveTarget",
                "expr": expr, "for": "10m",
                "labels": {"severity": "page", "workload": d.workload},
                "annotations": {"summary": f"{d.workload}: {quantile_label(q)} {which} above the plan's target of "
                                           f"{slo * 1e3:g} ms",
                                "runbook": "runbook.md#when-an-alert-fires"},
            })
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": f"{plan_name}-slo", "namespace": namespace},
            "spec": {"groups": [{"name": f"{plan_name}-slo", "rules": rules}]}}


def _camel(s: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in _dns(s).split("-"))
