"""One pool of a plan as a deployment: the mapping every export target shares (launch commands,
Kubernetes objects, the runbook), so no target re-derives layouts from the plan on its own.

A *replica* of a pool is one engine instance spanning ``gpus`` chips (tensor x attention-data x pipeline
parallel); it runs on ``hosts`` Kubernetes nodes of ``gpus_per_host`` chips (the hardware's server or
compute tray). Batch, memory budget and KV format come from the plan; nothing here re-plans.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from planner.catalog.loader import Catalog
from planner.errors import InputError
from planner.results import Plan, Pool

PORT = 8000
"""HTTP port every engine serves on inside its pod (set explicitly on each command line)."""
SGLANG_BOOTSTRAP_PORT = 8998
"""SGLang's prefill bootstrap port (``--disaggregation-bootstrap-port``, its default), where decode pulls KV."""


TIERS = ("host", "nvme")
"""Tiers below HBM whose KV or prefixes an engine moves through a KV connector of their own (LMCache under vLLM)."""


@dataclass(frozen=True)
class Deployment:
    pool: str
    role: str
    workload: str
    engine: str
    hardware: str
    vendor: str
    model_id: str
    model_path: str
    """The checkpoint the pool loads: the published one in its weight format, else the native one (the catalog's
    first ``hf_ids`` entry) where the engine quantises on load, else the path given with ``--checkpoint``."""
    native_dtype: str
    weights_dtype: str
    weights_mode: str
    kv_dtype: str
    kv_tier: str
    prefix_tier: str
    replicas: int
    gpus: int
    gpus_per_host: int
    tp: int
    ep: int
    pp: int
    attn_dp: int
    redundant_experts: int
    experts: int
    layers: int
    moe_layers: int
    batch: int
    spec_tokens: int
    spec_method: str | None
    two_batch_overlap: bool
    context_tokens: int
    """Longest request the engine must accept: the workload's prompt plus output."""
    max_context_tokens: int
    memory_capacity_bytes: float
    weights_bytes: float
    kv_bytes: float
    other_bytes: float
    host_kv_bytes: float
    prefix_bytes_per_replica: float
    expert_map: str | None
    """File name of the plan's expert placement map for this pool (beside plan.json), if any."""
    requests_per_s_per_replica: float
    utilisation: float
    demand_requests_per_s: float
    slo_ttft_s: float
    slo_tpot_s: float
    predicted_ttft_s: float
    predicted_tpot_s: float
    scale_up_domain_chips: int
    unit_kind: str
    unit_chips: int
    host_dram_bytes_per_chip: float = 0.0
    slo_ttft_quantile: float | None = 0.9
    """Quantile the TTFT target holds at (None: the mean); the exported alerts fire at it."""
    slo_tpot_quantile: float | None = 0.9
    """Host memory per chip (the catalog's ``host_dram_gb``): what a pod may ask of its node."""
    lose_units: int = 0
    rdma_resource: str | None = None
    """Extended resource of an RDMA NIC a pod requests (``--rdma-resource``), for pools whose traffic crosses nodes
    over scale-out: expert parallelism across hosts, or KV handed from prefill to decode outside one NVLink
    domain; ``None``: not requested."""
    """Purchase units the plan promises to survive losing (``resilience.lose_units``)."""
    weights_source: str = "native"
    """Where the weights come from: ``native``, ``published`` (a pre-quantised checkpoint: the engine reads its
    quantisation from its config), ``on-load`` (the engine quantises the native checkpoint as it loads it) or
    ``given`` (``--checkpoint``)."""
    mtp_layers: int = 0
    """The checkpoint's multi-token-prediction layers (the draft of ``mtp`` speculative decoding)."""
    image: str | None = None
    """The container image of the plan's engine release for this pool's hardware (catalog ``release.images``)."""
    router_share: float = 1.0
    """Share of its workload's requests of its role the plan routes to this pool (plan.json ``router_share``)."""
    native_context_tokens: int | None = None
    """The checkpoint's own ``max_position_embeddings`` where ``max_context_tokens`` needs a rope extension."""
    rope_scaling: dict | None = None
    """The rope scaling that extends the checkpoint to ``max_context_tokens`` (with ``native_context_tokens``)."""
    pair_tier_connector: bool = False
    """A disaggregated pool paired with a pool of its workload (same engine, other role) that keeps KV or prefixes in
    host memory or on NVMe: where the engine's hand-over needs both sides' KV connectors identical (vLLM's NIXL
    handshake), this pool carries the tier's connector too."""

    @property
    def dp_ranks_per_host(self) -> int:
        """Attention data-parallel ranks (of ``tp`` GPUs each) one host runs."""
        return max(1, self.gpus_per_host // self.tp)

    @property
    def engine_context(self) -> int:
        """Longest request the engine is started for: the model's maximum, or, where that needs a rope extension
        the workload's requests do not (prompt plus output within the checkpoint's own length), the checkpoint's
        own length (the Qwen3 card advises against static YaRN below 32K tokens)."""
        if self.native_context_tokens is None or self.context_tokens > self.native_context_tokens:
            return self.max_context_tokens
        return self.native_context_tokens

    @property
    def extends_context(self) -> bool:
        """Whether the engine must be told the rope extension (and the longer ``max_position_embeddings``)."""
        return self.native_context_tokens is not None and self.engine_context > self.native_context_tokens

    @property
    def hosts(self) -> int:
        return max(1, math.ceil(self.gpus / self.gpus_per_host))

    @property
    def gpus_per_pod(self) -> int:
        return min(self.gpus, self.gpus_per_host)

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    @property
    def name(self) -> str:
        """A DNS-1123 name for Kubernetes objects and file names."""
        return self.pool.lower().replace("_", "-").replace(".", "-")

    def fraction(self, part: float) -> float:
        """``part`` bytes as a fraction of a chip's memory, rounded up to 0.01 (engines take two decimals)."""
        return min(math.ceil(part / self.memory_capacity_bytes * 100.0) / 100.0, 0.95)

    @property
    def static_fraction(self) -> float:
        """Weights and KV pool (SGLang ``--mem-fraction-static``): all but the plan's activation and runtime
        reserve; a KV pool larger than the plan's batch needs is headroom (the batch limit caps the batch)."""
        return max(self.fraction(self.weights_bytes + self.kv_bytes), min(self.fraction(
            self.memory_capacity_bytes - self.other_bytes), 0.90))

    @property
    def total_fraction(self) -> float:
        """Everything the engine allocates (vLLM ``--gpu-memory-utilization``)."""
        return max(self.fraction(self.weights_bytes + self.kv_bytes + self.other_bytes), 0.90)

    @property
    def kv_free_fraction(self) -> float:
        """KV share of the memory left after weights (TensorRT-LLM ``free_gpu_memory_fraction``)."""
        free = self.memory_capacity_bytes - self.weights_bytes
        need = (self.kv_bytes + 0.0) / max(free, 1.0)
        return min(max(need, 0.85 * (free - self.other_bytes) / max(free, 1.0)), 0.95)

    @property
    def scale_target_in_flight(self) -> int:
        """Requests in flight per replica to scale on: the planned batch at the planned load (the plan sizes
        replicas so each carries ``utilisation`` of what its batch serves at the targets)."""
        return max(1, math.floor(self.batch * min(self.utilisation, 1.0)))


def deployments(plan: Plan, catalog: Catalog, plan_dir: Path | None = None,
                checkpoints: dict[str, str] | None = None, rdma_resource: str | None = None) -> list[Deployment]:
    """Every pool of ``plan`` as a :class:`Deployment` (the catalog supplies checkpoint ids and host sizes;
    ``checkpoints`` maps a pool id to the path of a checkpoint of its weight format where none is published)."""
    checkpoints = checkpoints or {}
    unknown = sorted(set(checkpoints) - {p.id for p in plan.pools})
    if unknown:
        raise InputError(f"--checkpoint: no pool {unknown[0]} in the plan (pools: {', '.join(p.id for p in plan.pools)})")
    out = []
    for p in plan.pools:
        # Plans before schema 2.2 name one model for the whole scenario; later ones name each pool's.
        model = catalog.get_model(p.model or plan.scenario["model"])
        d = _one(plan, p, catalog, model, model.architecture.moe, plan_dir, checkpoints.get(p.id))
        out.append(replace(d, rdma_resource=rdma_resource) if rdma_resource and crosses_nodes(d) else d)
    tiered = {(d.workload, d.engine) for d in out
              if d.role in ("prefill", "decode") and (d.prefix_tier in TIERS or d.kv_tier in TIERS)}
    return [replace(d, pair_tier_connector=True) if d.role in ("prefill", "decode") and (d.workload, d.engine) in tiered
            else d for d in out]


def crosses_nodes(d: Deployment) -> bool:
    """Whether a pool's traffic crosses hosts over scale-out: a replica spanning hosts outside one NVLink domain
    (expert parallelism or tensor parallelism over the network), or prefill/decode KV hand-over outside one."""
    in_domain = d.unit_kind == "rack" and d.gpus <= d.scale_up_domain_chips
    return (d.multi_host or d.role in ("prefill", "decode")) and not in_domain


def weights_of(p: Pool, model, hw, catalog: Catalog, given: str | None) -> tuple[str, str]:
    """(source, checkpoint) of a pool's weights (:meth:`ModelSpec.weights_source`), or the path ``given``;
    :class:`InputError` naming the pool and what to do where there is neither."""
    if given is not None:
        return "given", given
    src = model.weights_source(p.weights_dtype, hw.vendor, catalog.engines.get(p.engine))
    if src is not None:
        return src
    tool = "TensorRT Model Optimizer (modelopt hf_ptq)" if hw.vendor == "nvidia" else "AMD Quark" \
        if hw.vendor == "amd" else "the engine's quantisation tooling"
    raise InputError(f"pool {p.id}: {model.id} has no published {p.weights_dtype} checkpoint for {hw.vendor} hardware "
                     f"and {p.engine} does not quantise to {p.weights_dtype} on load; quantise "
                     f"{(model.hf_ids or [model.id])[0]} to {p.weights_dtype} with {tool} and export with "
                     f"--checkpoint {p.id}=PATH")


def _one(plan: Plan, p: Pool, catalog: Catalog, model, moe, plan_dir: Path | None, given: str | None) -> Deployment:
    hw = catalog.get_hardware(p.hardware)
    source, path = weights_of(p, model, hw, catalog, given)
    w = next(x for x in plan.workloads if x.name == p.workload)
    mem = p.memory_per_chip_bytes
    xp = p.expert_placement
    map_file = xp.map_file if xp is not None else None
    if map_file is not None and plan_dir is not None and not (plan_dir / map_file).is_file():
        map_file = None
    lay = p.layout
    return Deployment(
        pool=p.id, role=p.role, workload=p.workload, engine=p.engine, hardware=p.hardware, vendor=hw.vendor,
        model_id=model.id, model_path=path, weights_source=source, native_dtype=model.weights_dtype,
        weights_dtype=p.weights_dtype, weights_mode=p.weights_mode, kv_dtype=p.kv_dtype, kv_tier=p.kv_tier,
        prefix_tier=p.prefix_tier, replicas=p.replicas, gpus=p.chips_per_replica,
        gpus_per_host=hw.purchase_unit.host_chips, tp=lay.tp, ep=lay.ep, pp=lay.pp, attn_dp=lay.attn_dp,
        redundant_experts=lay.redundant_experts, experts=moe.experts if moe else 0,
        layers=model.architecture.layers, moe_layers=moe.layers if moe else 0, batch=p.batch,
        spec_tokens=p.spec_tokens, spec_method=p.spec_method, two_batch_overlap=p.two_batch_overlap,
        context_tokens=w.input_tokens + w.output_tokens, max_context_tokens=model.max_context_tokens,
        memory_capacity_bytes=mem.capacity, weights_bytes=mem.weights, kv_bytes=mem.kv, other_bytes=mem.other,
        host_kv_bytes=mem.host_kv, prefix_bytes_per_replica=p.prefix_cache_bytes_per_replica, expert_map=map_file,
        requests_per_s_per_replica=p.predicted.requests_per_s_per_replica, utilisation=p.predicted.utilisation,
        demand_requests_per_s=w.requests_per_s, slo_ttft_s=w.slo_ttft_s, slo_tpot_s=w.slo_tpot_s,
        predicted_ttft_s=p.predicted.ttft_s, predicted_tpot_s=p.predicted.tpot_s,
        slo_ttft_quantile=w.slo_ttft_quantile, slo_tpot_quantile=w.slo_tpot_quantile,
        scale_up_domain_chips=hw.scale_up_domain_chips, unit_kind=hw.purchase_unit.kind,
        unit_chips=hw.purchase_unit.chips_per_unit, host_dram_bytes_per_chip=hw.host_dram_bytes,
        lose_units=plan.resilience.lose_units if plan.resilience is not None else 0, router_share=p.router_share,
        native_context_tokens=model.context_extension.native_tokens if model.context_extension else None,
        rope_scaling=dict(model.context_extension.rope_scaling) if model.context_extension else None,
        image=_image(catalog, p.engine, hw), mtp_layers=model.architecture.mtp_layers,
    )


def _image(catalog: Catalog, engine: str, hw) -> str | None:
    eng = catalog.engines.get(engine)
    if eng is None or eng.release is None:
        return None
    return eng.release.image_for(hw.id, hw.vendor)
