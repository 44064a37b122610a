"""The router of a disaggregated workload, as each engine documents it: it sends a request to a prefill worker,
then to a decode worker that pulls the prompt's KV from it.

- **SGLang**: ``sglang_router.launch_router --pd-disaggregation`` with service discovery (it finds the prefill and
  decode leaders by label, reads each prefill leader's bootstrap port from the pod annotation
  ``sglang.ai/bootstrap-port``, fixed in sglang-router 0.3.2's ``router_args.py``: no flag sets it; follows
  autoscalers).
- **vLLM**: the NixlConnector pairing proxy of vLLM's documentation (``toy_proxy_server.py --prefiller-hosts ...
  --decoder-hosts ...``, fetched at the release's tag), pointed at each pool's Service; the prefill pod that takes
  a request hands its own address (``VLLM_NIXL_SIDE_CHANNEL_HOST``, the pod IP) to the decode pod in the
  request's ``kv_transfer_params``, so a Service in front of many replicas pairs correctly.
- **TensorRT-LLM**: ``trtllm-serve disaggregated -c disagg_config.yaml`` whose ``context_servers.urls`` and
  ``generation_servers.urls`` are the pools' Services (one URL per pool, ``num_instances`` equal to their count).

Each is a Deployment labelled ``planner.io/router: <workload>`` (the workload's ``<workload>-router`` Service
selects it), pinned to the engine release's image.
"""

from __future__ import annotations

from planner.export import k8s
from planner.export.deploy import PORT, Deployment

ROUTER_METRICS_PORT = 29000
VLLM_PROXY_URL = ("https://raw.githubusercontent.com/vllm-project/vllm/v{version}/tests/v1/kv_connector/"
                  "nixl_integration/toy_proxy_server.py")
"""vLLM's documented NIXL pairing proxy (docs/features/nixl_connector_usage.md), at the release's tag."""
SERVICE_PORT = 80
"""The port of a pool's Service (:func:`planner.export.k8s.pool_service`)."""


def pd_router(workload: str, deps: list[Deployment], plan_name: str, namespace: str,
              versions: dict[str, str] | None = None) -> list[dict]:
    """The router objects of ``workload`` when it is disaggregated (prefill and decode of one engine: the plan
    pairs them so), else none. ``versions``: engine -> its release version (the vLLM proxy's tag)."""
    pd = [d for d in deps if d.role in ("prefill", "decode")]
    if not pd or len({d.engine for d in pd}) != 1:
        return []
    engine = pd[0].engine
    if engine == "sglang":
        return sglang_router(workload, pd, plan_name, namespace)
    if engine == "vllm":
        return vllm_proxy(workload, pd, plan_name, namespace, (versions or {}).get("vllm", ""))
    if engine == "trtllm":
        return trtllm_disaggregated(workload, pd, plan_name, namespace)
    return []


def _host(d: Deployment, namespace: str) -> str:
    return f"{d.name}.{namespace}.svc.cluster.local"


def _meta(name: str, namespace: str, labels: dict) -> dict:
    return {"name": name, "namespace": namespace, "labels": dict(labels)}


def _deployment(workload: str, name: str, namespace: str, plan_name: str, container: dict, *,
                volumes: list[dict] | None = None, init: list[dict] | None = None,
                account: str | None = None) -> dict:
    w = k8s.dns_name(workload)
    labels = {"app.kubernetes.io/part-of": plan_name, "planner.io/router": w}
    probe = {"tcpSocket": {"port": PORT}, "periodSeconds": 10, "failureThreshold": 3}
    container = {**container, "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}},
                 "readinessProbe": probe, "livenessProbe": {**probe, "periodSeconds": 15, "failureThreshold": 4}}
    spec: dict = {"containers": [container]}
    if account:
        spec["serviceAccountName"] = account
    if init:
        spec["initContainers"] = init
    if volumes:
        spec["volumes"] = volumes
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(name, namespace, labels),
            "spec": {"replicas": 1, "selector": {"matchLabels": {"planner.io/router": w}},
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                     "template": {"metadata": {"labels": dict(labels)}, "spec": spec}}}


def vllm_proxy(workload: str, pd: list[Deployment], plan_name: str, namespace: str, version: str) -> list[dict]:
    """vLLM's NIXL pairing proxy over the prefill and decode pools' Services (fetched at the release's tag by an
    init container: the image does not ship it)."""
    name = f"{k8s.dns_name(workload)}-router"
    pre = [d for d in pd if d.role == "prefill"]
    dec = [d for d in pd if d.role == "decode"]
    url = VLLM_PROXY_URL.format(version=version)
    fetch = {"name": "fetch-proxy", "image": k8s.image_of(pd[0]),
             "command": ["python3", "-c", "import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], "
                         "'/proxy/toy_proxy_server.py')", url],
             "volumeMounts": [{"name": "proxy", "mountPath": "/proxy"}]}
    args = ["/proxy/toy_proxy_server.py", "--host", "0.0.0.0", "--port", str(PORT),
            "--prefiller-hosts", *[_host(d, namespace) for d in pre],
            "--prefiller-ports", *[str(SERVICE_PORT)] * len(pre),
            "--decoder-hosts", *[_host(d, namespace) for d in dec],
            "--decoder-ports", *[str(SERVICE_PORT)] * len(dec)]
    container = {"name": "router", "image": k8s.image_of(pd[0]), "command": ["python3"], "args": args,
                 "ports": [{"name": "http", "containerPort": PORT}],
                 "volumeMounts": [{"name": "proxy", "mountPath": "/proxy"}]}
    return [_deployment(workload, name, namespace, plan_name, container, init=[fetch],
                        volumes=[{"name": "proxy", "emptyDir": {}}])]


def trtllm_disagg_config(pd: list[Deployment], namespace: str) -> dict:
    """``trtllm-serve disaggregated``'s config: each pool's Service as one context or generation URL."""
    def servers(role: str) -> dict:
        urls = [f"{_host(d, namespace)}:{SERVICE_PORT}" for d in pd if d.role == role]
        return {"num_instances": len(urls), "urls": urls}

    return {"hostname": "0.0.0.0", "port": PORT, "backend": "pytorch",
            "context_servers": servers("prefill"), "generation_servers": servers("decode")}


def trtllm_disaggregated(workload: str, pd: list[Deployment], plan_name: str, namespace: str) -> list[dict]:
    import yaml

    name = f"{k8s.dns_name(workload)}-router"
    cfg = {"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": _meta(name, namespace, {"app.kubernetes.io/part-of": plan_name}),
           "data": {"disagg_config.yaml": yaml.safe_dump(trtllm_disagg_config(pd, namespace), sort_keys=False)}}
    container = {"name": "router", "image": k8s.image_of(pd[0]),
                 "command": ["trtllm-serve", "disaggregated", "-c", "/planner/disagg_config.yaml"],
                 "ports": [{"name": "http", "containerPort": PORT}],
                 "volumeMounts": [{"name": "config", "mountPath": "/planner"}]}
    return [cfg, _deployment(workload, name, namespace, plan_name, container,
                             volumes=[{"name": "config", "configMap": {"name": name}}])]


def sglang_router(workload: str, pd: list[Deployment], plan_name: str, namespace: str) -> list[dict]:
    """SGLang's router in PD mode discovering the prefill and decode leaders by their labels (so it follows the
    autoscalers), with the pod watch rights it needs."""
    w = k8s.dns_name(workload)
    name = f"{w}-router"

    def meta() -> dict:  # a fresh dict per use: a shared one is written as a YAML alias
        return _meta(name, namespace, {"app.kubernetes.io/part-of": plan_name, "planner.io/router": w})

    def selector(role: str) -> list[str]:
        return [f"planner.io/workload={w}", f"planner.io/role={role}", f"{k8s.LEADER_LABEL}=0"]

    args = ["--pd-disaggregation", "--service-discovery",
            "--prefill-selector", *selector("prefill"), "--decode-selector", *selector("decode"),
            "--service-discovery-namespace", namespace, "--service-discovery-port", str(PORT),
            "--prefill-policy", "cache_aware", "--decode-policy", "power_of_two",
            "--host", "0.0.0.0", "--port", str(PORT),
            "--prometheus-host", "0.0.0.0", "--prometheus-port", str(ROUTER_METRICS_PORT)]
    container = {"name": "router", "image": k8s.image_of(pd[0]),  # sglang-router ships in SGLang's images
                 "command": ["python3", "-m", "sglang_router.launch_router"], "args": args,
                 "ports": [{"name": "http", "containerPort": PORT},
                           {"name": "metrics", "containerPort": ROUTER_METRICS_PORT}]}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta()},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(),
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta(),
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}},
        _deployment(workload, name, namespace, plan_name, container, account=name),
    ]
