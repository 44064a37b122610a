"""Pydantic schemas of catalog entries. Every key carries its unit (``hbm_bandwidth_tb_s``, ``power_w``); the ``si``
helpers convert once so that ``perf/`` sees bytes, seconds and FLOP/s only. Models are strict and frozen: an unknown
key, a missing key or a negative value is an error that names the field."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

import planner.units as units
from planner.catalog.fields import (  # noqa: F401  (re-exported: the schemas' field types)
    BIG,
    ENGINES,
    USD_PER_CHIP_HOUR,
    Alias,
    AsOf,
    Dtype,
    Fraction,
    NonNeg,
    NonNegInt,
    Pos,
    PosInt,
    Strict,
    Vendor,
    upto,
)
from planner.catalog.ids import CatalogId, EngineId, HfId, Label
from planner.catalog.kernel_fits import KERNEL_BOUNDS, KERNEL_PARAMS, KernelCurve, KernelFits  # noqa: F401  (re-exported)

# --------------------------------------------------------------------------------------------------
# Hardware
# --------------------------------------------------------------------------------------------------


class Tier(Strict):
    usd_per_chip_hour: USD_PER_CHIP_HOUR
    preemption_rate: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Share of the capacity bought at this tier that preemption takes away at any time (spot)."""
    as_of: AsOf
    source: str = Field(min_length=3)


class Price(Strict):
    usd_per_chip_hour: USD_PER_CHIP_HOUR
    """Price of one chip for one hour, all-in (host, network and facility share included): the reserved
    price (capacity held all day)."""
    as_of: AsOf
    source: str = Field(min_length=3)
    alternatives: str = ""
    """Other quotes and why this one was picked."""
    on_demand: Tier | None = None
    """Capacity bought by the hour (what a traffic profile's off-peak-to-peak difference may use)."""
    spot: Tier | None = None


class PurchaseUnit(Strict):
    kind: Literal["node", "rack", "slice", "instance", "chip"]
    chips_per_unit: Annotated[int, Field(gt=0, le=100_000)]
    chips_per_host: Annotated[int, Field(gt=0, le=100_000)] | None = None
    """Chips one host (one Kubernetes node: a server, or a compute tray of a rack) holds; required for racks,
    else the whole unit is one host."""

    @model_validator(mode="after")
    def _host(self) -> PurchaseUnit:
        if self.kind == "rack" and self.chips_per_host is None:
            raise ValueError("purchase_unit.chips_per_host: give the chips of one server or compute tray of the rack")
        if self.chips_per_host is not None and self.chips_per_unit % self.chips_per_host:
            raise ValueError("purchase_unit.chips_per_host must divide chips_per_unit")
        return self

    @property
    def host_chips(self) -> int:
        return self.chips_per_host or self.chips_per_unit


class EngineEfficiency(Strict):
    """Empirical factors for one serving engine on one hardware (fitted on measured data). Decode step time =
    max(FLOPs / (F * compute), bytes / (W * memory)) + communication + step_overhead_us + layer_overhead_us *
    layers_per_stage (+ moe_layer_overhead_us per MoE layer); prefill uses ``prefill_compute``."""

    compute: Fraction = 1.0
    """Achievable fraction of dense peak FLOP/s in decode GEMMs and attention of large shape (bf16 maths, and
    every format without its own factor below)."""
    compute_fp8: Annotated[float, Field(ge=0, le=1)] = 0.0
    """The same for FP8 (and INT8) GEMMs; 0: as ``compute``."""
    compute_fp4: Annotated[float, Field(ge=0, le=1)] = 0.0
    """The same for FP4 GEMMs (NVFP4, MXFP4); 0: as ``compute``."""
    gemm_half_tokens: NonNeg = 0.0
    """GEMM rows (tokens per expert, or per attention-DP rank for dense layers) at which a matrix
    multiplication reaches half its large-shape efficiency: efficiency ``compute * M / (M + this)``. Small
    GEMMs run their tensor units part-empty, which is why one flat factor fitted on small benchmark batches
    under-predicts large production batches. 0: flat."""
    attention_compute: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Achievable fraction of bf16 peak FLOP/s in decode attention (the absorbed MLA kernels of DeepSeek-style
    models do most of their work here at long context); 0: as ``compute``."""
    prefill_compute: Fraction = 1.0
    """Achievable fraction of dense peak FLOP/s in prefill."""
    memory: Fraction = 1.0
    """Achievable fraction of HBM bandwidth."""
    step_overhead_us: NonNeg = 0.0
    """Fixed cost per decode step (scheduling, sampling, launches not hidden by graphs)."""
    layer_overhead_us: NonNeg = 0.0
    """Fixed cost per layer per step (small kernels, synchronisation)."""
    moe_layer_overhead_us: NonNeg = 0.0
    """Extra fixed cost per Mixture-of-Experts layer per step or prefill pass: routing, token
    permutation, the grouped expert GEMMs and the finalize kernels launch several times the work of a
    dense FFN, so an MoE model pays more per layer than a dense model of the same depth."""
    seq_overhead_us: NonNeg = 0.0
    """Cost per sequence per step on each attention-DP rank (scheduling, sampling, detokenisation,
    per-request metadata): what makes a step grow with the batch beyond the roofline."""
    collective_latency_us: NonNeg = 0.0
    """Latency of one collective (all-reduce, all-to-all) on top of its bandwidth term."""
    scale_out_latency_us: NonNeg = 0.0
    """Extra latency of a collective whose group spans more than one scale-up domain (network round
    trips, cross-node synchronisation): what makes multi-node expert parallelism slow at small batches."""
    prefill_comm_bandwidth: Fraction = 1.0
    """Achieved share of the link bandwidth in a prefill pass's collectives (tensor-parallel
    all-reduces and expert all-to-alls of whole prompts) and in the KV transfer to a decode pool: large
    messages that engines run without overlapping compute reach well below the datasheet's
    per-direction link rate, so a long prompt's prefill gains less from tensor parallelism than its
    FLOPs say. Decode collectives are latency-bound and do not use it."""
    comm_overlap: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Share of communication hidden behind compute (two-batch overlap, async all-to-all); it can
    hide at most the compute time of the step."""
    spec_accept_scale: Fraction = 1.0
    """Share of the model's published draft acceptance this engine's speculative decoding realises (each
    draft's acceptance is multiplied by it; implementations differ in sampling and verification)."""
    draft_overhead_us: NonNeg = 0.0
    """Fixed cost of one draft pass beyond its layers' work (draft scheduling, sampling, the extra launches
    of a separate draft worker)."""
    interference: NonNeg = 1.0
    """Weight of the prompt tokens interleaved with decode in aggregated serving (physics: 1, what their
    FLOPs and bytes cost; fitted, since benchmark TPOT does not always carry every prefill stall)."""
    attn_dp_wait_steps: NonNeg = 0.0
    """Decode iterations a new request waits before its prefill is scheduled under attention data
    parallelism in aggregated serving (engines hold requests to balance them over the ranks, e.g.
    TensorRT-LLM's ``attention_dp_config.timeout_iters``)."""
    first_token_steps: NonNeg = 0.0
    """Decode iterations between a prompt's prefill and its first token reaching the client, beyond the
    iteration the prompt rides on: the engine's scheduler admits, and streams results, at iteration
    boundaries (an overlap scheduler hands a batch's output over one iteration late; a disaggregated decode
    worker polls for transferred KV and joins a request to its running batch between steps), so the first
    token waits a few of the decode pool's steps, and waits longer when the steps are long."""
    queueing: NonNeg = 0.5
    """Share of the other in-flight requests a new request waits behind in a closed-loop benchmark (0.5:
    every client released at once and kept in step by equal request lengths); each request ahead costs its
    prefill and, in aggregated serving, the decode iteration it rides on."""
    ttft_overhead_ms: NonNeg = 0.0
    """Fixed cost per request before the first token (tokenisation, scheduling, transport)."""
    kernel_fixed_share: Annotated[float, Field(ge=0, le=1)] = 1.0
    """Share of the kernel curves' fixed latencies (``t0``, a collective's ``alpha``) that a step of this engine
    pays, where the hardware's step is composed from kernel curves: the curves are fitted on kernels timed
    one at a time, each paying its launch and its prologue/epilogue alone; an engine that replays a step as a
    CUDA graph, with programmatic dependent launch, overlaps those with the neighbouring kernels. 1: nothing
    hidden (the physical prior); fitted end to end."""
    prefill_expert_overhead_us: NonNeg = 0.0
    """Fixed prefill cost per routed expert per MoE layer (routing, permutation and per-expert
    kernels of a prefill pass, measured to grow with the model's expert count, not with its EP)."""
    first_wave_s: NonNeg = 0.0
    """One-time delay (seconds) the first wave of a freshly started benchmark run pays before its prompts'
    first tokens: engines that JIT-compile or autotune kernels per token count (DeepGEMM's FP8 GEMMs compile one
    kernel per shape and tile choice; AITER's JIT modules; first-use FlashInfer kernels) build them when a
    prompt batch first reaches a shape the server's warm-up (one prompt) did not. Only the closed-loop
    benchmark's p99 TTFT (``planner.calib.predict``) uses it; planned pools serve warmed-up, so plans never do.
    Fitted per engine and hardware vendor (the kernel stack) over every such hardware's p99 TTFT
    (``planner.calib.wave``); 0: none."""


QuantileKey = Literal["q50", "q75", "q90", "q95", "q99"]
SiliconFactor = Literal["compute", "compute_fp8", "compute_fp4", "memory"]
"""The efficiency factors a system's kernel curves can set (``planner.calib.silicon``)."""


class Efficiency(Strict):
    """What fraction of the datasheet is achievable, with its own provenance (the calibration)."""

    source: str = Field(min_length=3)
    as_of: AsOf
    default: EngineEfficiency
    """Factors used when no engine is named (and for engines without their own fit)."""
    by_engine: dict[EngineId, EngineEfficiency] = Field(default_factory=dict)
    fitted_rows: NonNegInt = 0
    """Measured rows behind this fit (0: transferred from similar hardware)."""
    engine_rows: dict[EngineId, NonNegInt] = Field(default_factory=dict)
    """Measured rows of this hardware per engine (an engine absent here has no rows of its own)."""
    free_factors: dict[EngineId, list[str]] = Field(default_factory=dict)
    """Per engine, the end-to-end factors fitted on this hardware and engine's own rows (at most 8,
    ``planner.calib.fit.PAIR_FREE``); every other factor of that engine's block is shared: the hardware's silicon and
    links from its fit over all its engines, the engine's fixed costs from its fit over all hardware."""
    transferred_from: str | None = None
    """Where the factors come from when this hardware has no measured rows: another hardware id, or
    ``all-hardware`` for the fit over every measured row. None: fitted on this hardware's own rows."""
    error_quantiles: dict[str, dict[QuantileKey, Annotated[float, Field(gt=0, le=100)]]] = Field(default_factory=dict)
    """Quantiles of measured / predicted TPOT on the measured rows, per ``ENGINE/MODE`` class (``sglang/agg``,
    ``trtllm/disagg``; classes of at least 30 rows) and ``all`` (every row of this hardware; for hardware
    without rows, its relative's, else the widest hardware's). A scenario's ``margin.quantile`` derates capacity by it (written by ``calibrate fit``)."""
    kernel_factors: list[SiliconFactor] = Field(default_factory=list)
    """Silicon factors (``compute``, ``compute_fp8``, ``compute_fp4``, ``memory``) set from this system's own kernel
    curves instead of its serving rows (``planner.calib.silicon``): a format none of its rows runs, or, on hardware
    transferred from a relative, the relative's factor scaled by the two systems' kernel ratio."""
    kernels: KernelFits | None = None
    """Kernel curves fitted on this system's measured kernels (None: no kernel rows; the step then uses the
    datasheet with the fitted factors above, or the kernel priors where another system's kernels transfer)."""

    @field_validator("free_factors")
    @classmethod
    def _known_factors(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for engine, names in v.items():
            unknown = [n for n in names if n not in EngineEfficiency.model_fields]
            if unknown:
                raise ValueError(f"free_factors of {engine} names {', '.join(unknown)}: not an efficiency factor")
        return v

    def error_ratio(self, engine: str, serving: str, quantile: float) -> float:
        """Measured / predicted TPOT at ``quantile`` for pools of ``engine`` serving ``agg`` or ``disagg``
        (interpolated between stored quantiles; the hardware's ``all`` class where the engine has none)."""
        table = self.error_quantiles.get(f"{engine}/{serving}") or self.error_quantiles.get("all")
        if not table:
            return 1.0
        pts = sorted((float(k[1:]) / 100.0, v) for k, v in table.items())
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        if quantile <= xs[0]:
            return ys[0]
        if quantile >= xs[-1]:
            return ys[-1]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
            if x0 <= quantile <= x1:
                return y0 + (y1 - y0) * (quantile - x0) / (x1 - x0)
        return ys[-1]

    def for_engine(self, engine: str | None) -> EngineEfficiency:
        if engine and engine in self.by_engine:
            return self.by_engine[engine]
        return self.default


IDEAL = EngineEfficiency()
"""Efficiency 1 and no overheads: the ``--ideal`` roofline."""


class HardwareSpec(Strict):
    id: CatalogId
    name: Label
    vendor: Vendor
    aliases: list[Alias] = Field(default_factory=list)
    """Names measured data uses for this system (``h100_sxm``, ``gb200``)."""
    source: str = Field(min_length=3)
    as_of: AsOf
    notes: str = ""

    dense_tflops: dict[Dtype, upto(1e5)]  # 100 PFLOP/s per chip
    """Dense (no 2:4 sparsity) peak TFLOP/s per supported compute format."""
    hbm_capacity_gb: upto(1e4)  # 10 TB per chip
    """Usable HBM per chip in GB (1e9 bytes)."""
    hbm_bandwidth_tb_s: upto(1e3)
    scale_up_domain_chips: Annotated[int, Field(gt=0, le=100_000)]
    """Chips that share the scale-up fabric (NVLink domain, TPU slice, UltraServer)."""
    scale_up_bandwidth_gb_s: upto(1e5)
    """Per-chip scale-up bandwidth, one direction."""
    scale_up_technology: str
    scale_out_bandwidth_gb_s: upto(1e5)
    """Per-chip scale-out (NIC / DCN) bandwidth, one direction."""
    host_dram_gb: upto(1e5, zero=True)
    """Host DRAM per chip."""
    host_link_bandwidth_gb_s: upto(1e5, zero=True)
    """Host-to-chip link bandwidth per chip, one direction (PCIe, NVLink-C2C)."""
    nvme_capacity_tb: upto(1e4, zero=True)
    """Local NVMe capacity per chip (0: no local flash tier)."""
    nvme_bandwidth_gb_s: upto(1e5, zero=True)
    """Local NVMe read bandwidth per chip."""
    power_w: upto(1e5) | None
    """Chip TDP in W (null where the vendor does not publish one)."""
    power_all_in_kw: upto(1e3) | None
    """Provisioned power per chip including host, network and facility share, in kW."""
    purchase_unit: PurchaseUnit
    price: Price | None
    """None: no public price found; the entry can be used only with a scenario price override."""
    efficiency: Efficiency

    @model_validator(mode="after")
    def _check(self) -> HardwareSpec:
        if self.purchase_unit.chips_per_unit > self.scale_up_domain_chips and self.purchase_unit.kind != "slice":
            if self.purchase_unit.chips_per_unit % self.scale_up_domain_chips:
                raise ValueError(
                    "purchase_unit.chips_per_unit must be a multiple of scale_up_domain_chips "
                    "when a unit spans several scale-up domains"
                )
        if "bf16" not in self.dense_tflops:
            raise ValueError("dense_tflops must list bf16 (every accelerator here runs bf16)")
        return self

    # SI views ---------------------------------------------------------------------------------
    def flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype`` maths, falling back as ``units.COMPUTE_FALLBACK`` says."""
        return self.dense_tflops[self.compute_dtype(dtype)] * units.TFLOPS

    def compute_dtype(self, dtype: str) -> str:
        for cand in units.COMPUTE_FALLBACK[dtype]:
            if cand in self.dense_tflops:
                return cand
        return "bf16"

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_capacity_gb * units.GB

    @property
    def hbm_bw(self) -> float:
        return self.hbm_bandwidth_tb_s * units.TB

    @property
    def scale_up_bw(self) -> float:
        return self.scale_up_bandwidth_gb_s * units.GB

    @property
    def scale_out_bw(self) -> float:
        return self.scale_out_bandwidth_gb_s * units.GB

    @property
    def host_dram_bytes(self) -> float:
        return self.host_dram_gb * units.GB

    @property
    def host_link_bw(self) -> float:
        return self.host_link_bandwidth_gb_s * units.GB

    @property
    def nvme_bytes(self) -> float:
        return self.nvme_capacity_tb * units.TB

    @property
    def nvme_bw(self) -> float:
        return self.nvme_bandwidth_gb_s * units.GB

    @property
    def price_usd_per_chip_hour(self) -> float | None:
        return self.price.usd_per_chip_hour if self.price else None


# --------------------------------------------------------------------------------------------------
# Engines
# --------------------------------------------------------------------------------------------------


DEFAULT_CHUNK_TOKENS = 8192
"""Prompt tokens per step of an aggregated worker where no engine says otherwise: TensorRT-LLM's default
``max_num_tokens``, vLLM's default ``max_num_batched_tokens`` for online serving on GPUs of 70 GiB and more,
SGLang's ``chunked_prefill_size`` on such GPUs (see ``catalogs/engines/*.yaml``)."""


class EngineWeights(Strict):
    """Weight formats an engine serves, and how it multiplies them."""

    native: list[Dtype] = Field(min_length=1)
    """Formats multiplied in their own format (W8A8 FP8, NVFP4 / MXFP4 W4A4), offered only on hardware
    that has tensor units for that format (``dense_tflops`` lists it)."""
    weight_only: dict[Vendor, list[Dtype]] = Field(default_factory=dict)
    """Formats the engine dequantises into bf16 maths (W4A16, W8A16) on hardware of each vendor that has
    no units for them: fewer bytes streamed per step, bf16 FLOP/s."""
    on_load: list[Dtype] = Field(default_factory=list)
    """Formats the engine quantises a bf16/fp16 checkpoint to as it loads it (dynamic FP8): no pre-quantised
    checkpoint needed."""


class EngineFeatures(Strict):
    """Serving techniques the engine implements (each read from its launch flags)."""

    attention_dp: bool
    """Attention data parallelism with expert-parallel MoE (SGLang ``--attn-dp-size``)."""
    attention_dp_tensor_parallel: bool = True
    """Whether each attention-DP rank can itself be tensor parallel (SGLang, vLLM); TensorRT-LLM fixes the DP
    width at the TP size when attention DP is on (``dp_size = tp_size``: attention at TP 1)."""
    attention_dp_prefill_balance: bool = False
    """Aggregated attention-DP ranks take their prompts in the same steps (TensorRT-LLM's ``attention_dp_config.
    enable_balance``, which the export sets): otherwise one rank's prompt chunk stalls every rank at the next expert
    exchange (``planner.perf.roofline._chunk_steps``)."""
    expert_parallel: bool
    redundant_experts: bool
    """Redundant expert slots beyond the model's experts (SGLang ``--ep-num-redundant-experts``)."""
    scale_out_expert_parallel: bool
    """Expert parallelism across nodes (DeepEP / MoRI / NIXL all-to-all over the scale-out network)."""
    micro_batch_overlap: bool
    """Two micro-batches per step, one's dispatch/combine under the other's compute."""
    speculative: list[Literal["mtp", "eagle", "draft-model"]] = Field(default_factory=list)
    disaggregation: bool
    """Separate prefill and decode workers with KV transfer."""
    kv_offload: list[Literal["host", "nvme"]] = Field(default_factory=list)
    """Tiers below HBM the engine can keep KV or reusable prefixes in."""
    sliding_kv_share: Annotated[float, Field(gt=0, le=1)] | None = None
    """How the engine sizes the KV of a model's sliding-window layers: ``None``, to the window (vLLM's hybrid KV
    cache manager); a share ``r``, a pool of ``r`` tokens per token of the full layers' pool whatever the window
    (SGLang's ``--swa-full-tokens-ratio``, 0.8 by default; TensorRT-LLM writes a sliding layer's blocks up to the
    sequence's length, as a full layer's: 1). A sequence of ``S`` tokens then holds ``(full + r sliding) max(S,
    min(S, window) / r)`` token-layers (:func:`planner.perf.params.kv_bytes_per_sequence`): what caps the batch."""


class EngineMetrics(Strict):
    """Prometheus metric names the engine exports (for SLO alerts and autoscaling)."""

    ttft_histogram: str
    tpot_histogram: str
    running_requests: str | None = None
    """Gauge of requests being decoded (what a replica's batch holds), if the engine exports one."""
    path: str = Field(default="/metrics", pattern=r"^/[a-z0-9/_-]*$")
    """HTTP path of the Prometheus endpoint on the serving port."""
    source: str = Field(min_length=3)


class EngineRelease(Strict):
    """The engine release an export targets: its version, container images, and the flag table and start-up
    rules read from that release (``engines/releases/``) that every exported command is checked against."""

    version: str = Field(pattern=r"^[0-9A-Za-z][0-9A-Za-z.+_@-]*$")
    images: dict[str, str] = Field(min_length=1)
    """Container image pinned to ``version`` (a tag, never ``latest``) per hardware vendor, or per hardware id
    where the engine builds one image per chip family (SGLang's ROCm images: ``-mi30x``, ``-mi35x``); a hardware
    id's entry wins over its vendor's."""
    flags: str = Field(pattern=r"^[A-Za-z0-9._-]+\.json\.gz$")
    """File in ``engines/releases/`` with the release's flags (``tests/data/engine_flags_from_wheel.py``)."""
    router_flags: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]+\.json\.gz$")
    """The flags of the PD router the export runs for this engine, where it is a package of its own with a
    readable flag table (SGLang's ``sglang-router``)."""
    source: str = Field(min_length=3)
    as_of: AsOf

    @field_validator("images")
    @classmethod
    def _pinned(cls, v: dict[str, str]) -> dict[str, str]:
        for vendor, image in v.items():
            if ":" not in image.rsplit("/", 1)[-1] or image.endswith((":latest", ":nightly")):
                raise ValueError(f"image for {vendor} ('{image}') must carry a version tag, not latest")
        return v

    def image_for(self, hardware: str, vendor: str) -> str | None:
        return self.images.get(hardware) or self.images.get(vendor)


class EngineSpec(Strict):
    """A serving engine: where it runs, which formats and techniques it offers."""

    id: EngineId
    name: Label
    aliases: list[Alias] = Field(default_factory=list)
    """Other names measured data uses for it (``trt``, ``dynamo-trt``, ``tensorrt-llm``)."""
    source: str = Field(min_length=3)
    as_of: AsOf
    notes: str = ""
    vendors: list[Vendor] = Field(min_length=1)
    """Hardware vendors the engine runs on."""
    weights: EngineWeights
    kv_cache: list[Dtype] = Field(min_length=1)
    """KV-cache formats it offers."""
    features: EngineFeatures
    metrics: EngineMetrics | None = None
    release: EngineRelease | None = None
    """The release exports target (images, flags and start-up rules); None: the export refuses this engine."""
    prefill_chunk_tokens: Annotated[int, Field(gt=0)] = DEFAULT_CHUNK_TOKENS
    """Most prompt tokens one step of an aggregated worker takes (chunked-prefill size, or the token budget
    per step); longer prompts are taken in chunks of this many tokens, shorter ones whole."""

    def runs_on(self, hw: HardwareSpec) -> bool:
        return hw.vendor in self.vendors

    def weight_mode(self, hw: HardwareSpec, dtype: str) -> Literal["native", "weight-only"] | None:
        """How this engine serves ``dtype`` weights on ``hw``: multiplied in that format where the hardware
        has units for it, dequantised into bf16 maths where the engine offers that, else not at all."""
        if not self.runs_on(hw):
            return None
        if dtype in self.weights.native and dtype in hw.dense_tflops:
            return "native"
        if dtype in self.weights.weight_only.get(hw.vendor, []):
            return "weight-only"
        if dtype in ("bf16", "fp16") and dtype in self.weights.native:
            return "native"
        return None


# --------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------


class Attention(Strict):
    """Attention of one model.

    ``gqa`` covers MHA (kv_heads == heads) and MQA (kv_heads == 1). ``mla`` is DeepSeek's
    multi-head latent attention: the cache holds one ``kv_lora_rank + qk_rope_head_dim`` vector per
    layer and token. Layer kinds: ``full_layers + sliding_layers + linear_layers == layers``.
    """

    type: Literal["gqa", "mla"]
    heads: PosInt
    kv_heads: PosInt
    head_dim: PosInt
    """Query/key head dimension (GQA); for MLA, qk_nope_head_dim + qk_rope_head_dim."""
    v_head_dim: PosInt | None = None
    q_lora_rank: PosInt | None = None
    kv_lora_rank: PosInt | None = None
    qk_rope_head_dim: PosInt | None = None
    output_gate: bool = False
    """A gate projection the size of Q on the attention output (Qwen3.5)."""
    full_layers: NonNegInt
    sliding_layers: NonNegInt = 0
    sliding_window_tokens: PosInt | None = None
    linear_layers: NonNegInt = 0
    """Linear-attention (Gated DeltaNet) layers: a fixed-size state per sequence, no KV growth."""
    linear_key_heads: PosInt | None = None
    linear_value_heads: PosInt | None = None
    linear_key_head_dim: PosInt | None = None
    linear_value_head_dim: PosInt | None = None
    linear_conv_kernel: PosInt | None = None
    linear_state_dtype: Dtype = "fp32"
    """Format of the recurrent state of linear-attention layers."""
    sparse_topk_tokens: PosInt | None = None
    """Top-k sparse attention (DeepSeek sparse attention): tokens each query reads from the cache."""
    indexer_heads: PosInt | None = None
    indexer_head_dim: PosInt | None = None

    @model_validator(mode="after")
    def _check(self) -> Attention:
        if self.type == "mla":
            for f in ("kv_lora_rank", "qk_rope_head_dim", "v_head_dim"):
                if getattr(self, f) is None:
                    raise ValueError(f"attention.{f} is required for type mla")
        if self.heads % self.kv_heads:
            raise ValueError("attention.heads must be a multiple of attention.kv_heads")
        if self.sliding_layers and not self.sliding_window_tokens:
            raise ValueError("attention.sliding_window_tokens is required when sliding_layers > 0")
        if self.linear_layers:
            for f in ("linear_key_heads", "linear_value_heads", "linear_key_head_dim", "linear_value_head_dim"):
                if getattr(self, f) is None:
                    raise ValueError(f"attention.{f} is required when linear_layers > 0")
        if self.sparse_topk_tokens and not (self.indexer_heads and self.indexer_head_dim):
            raise ValueError("attention.indexer_heads and indexer_head_dim are required with sparse_topk_tokens")
        return self


class Moe(Strict):
    experts: PosInt
    """Routed experts per MoE layer."""
    top_k: PosInt
    shared_experts: NonNegInt = 0
    expert_intermediate: PosInt
    shared_intermediate: NonNegInt = 0
    """Intermediate width of the shared expert(s) in total (0: as expert_intermediate x shared_experts)."""
    layers: PosInt
    """Layers whose FFN is a MoE (the others use the dense FFN)."""
    groups: PosInt = 1
    """Expert groups of group-limited routing (Hugging Face ``n_group``; DeepSeek-V3: 8; 1: none)."""
    groups_per_token: PosInt = 1
    """Groups one token's experts may come from (``topk_group``; DeepSeek-V3: 4). Engines place experts
    group by group, so this bounds the nodes a token is dispatched to when expert parallelism spans
    nodes (node-limited routing)."""

    @model_validator(mode="after")
    def _check(self) -> Moe:
        if self.top_k > self.experts:
            raise ValueError("moe.top_k must not exceed moe.experts")
        if self.experts % self.groups:
            raise ValueError("moe.groups must divide moe.experts")
        if self.groups_per_token > self.groups:
            raise ValueError("moe.groups_per_token must not exceed moe.groups")
        return self


class Architecture(Strict):
    layers: PosInt
    hidden_size: PosInt
    vocab_size: PosInt
    tie_embeddings: bool = False
    attention: Attention
    dense_intermediate: NonNegInt
    """FFN width of the dense (non-MoE) layers (0 if every layer is MoE)."""
    ffn_gated: bool = True
    """SwiGLU-style FFN with three matrices (False: two matrices, as GELU MLPs)."""
    parallel_blocks: bool = False
    """Attention and FFN read the same input (PaLM): one all-reduce per layer under TP, not two."""
    moe: Moe | None = None
    mtp_layers: NonNegInt = 0
    """Multi-token-prediction modules shipped with the checkpoint (not counted in serving)."""

    @model_validator(mode="after")
    def _check(self) -> Architecture:
        a = self.attention
        if a.full_layers + a.sliding_layers + a.linear_layers != self.layers:
            raise ValueError(
                "attention.full_layers + sliding_layers + linear_layers must equal architecture.layers "
                f"({a.full_layers}+{a.sliding_layers}+{a.linear_layers} != {self.layers})"
            )
        if self.moe and self.moe.layers > self.layers:
            raise ValueError("moe.layers must not exceed architecture.layers")
        dense_layers = self.layers - (self.moe.layers if self.moe else 0)
        if dense_layers and not self.dense_intermediate:
            raise ValueError("dense_intermediate must be > 0 when some layers are dense")
        return self

    @property
    def dense_layers(self) -> int:
        return self.layers - (self.moe.layers if self.moe else 0)


class Speculative(Strict):
    """Speculative decoding the model supports, with the acceptance its drafts reach (published)."""

    method: Literal["mtp", "eagle", "draft-model"]
    """``mtp``: the checkpoint's multi-token-prediction modules draft (DeepSeek-V3); ``eagle``: a
    separate one-layer head; ``draft-model``: a small model of the same family."""
    acceptance: list[Fraction] = Field(min_length=1)
    """Probability that draft ``i`` is accepted given that draft ``i - 1`` was: the first entry is the
    first draft's, the last entry holds for every later draft."""
    max_drafts: PosInt = 4
    """Most draft tokens per step a plan may choose."""
    draft_layers: PosInt = 1
    """Layers one draft pass runs (MTP modules or the EAGLE head); each ends in the LM head."""
    source: str = Field(min_length=3)
    as_of: AsOf


class ContextExtension(Strict):
    native_tokens: PosInt
    """``max_position_embeddings`` of the published config (what engines accept without an override)."""
    rope_scaling: dict[str, float | str]
    """The ``rope_scaling`` block the model's card documents for ``max_context_tokens`` (e.g. YaRN, factor 4)."""
    source: str = Field(min_length=3)


class Checkpoint(Strict):
    """A published checkpoint of a model in one weight format."""

    weights: Dtype
    hf_id: HfId
    vendor: Vendor | None = None
    """Hardware vendor the format's encoding targets (NVFP4: nvidia, MXFP4: amd); ``None``: any."""
    source: str = Field(min_length=3)


class Published(Strict):
    total_params_b: Pos | None = None
    active_params_b: Pos | None = None
    source: str = ""


class ModelSpec(Strict):
    id: CatalogId
    name: Label
    hf_ids: list[HfId]
    """Hugging Face ids this entry covers, quantised variants included (empty: no public checkpoint)."""
    aliases: list[Alias] = Field(default_factory=list)
    """Other names measured data uses for this model (InferenceX: ``dsr1``)."""
    source: str = Field(min_length=3)
    as_of: AsOf
    notes: str = ""
    architecture: Architecture
    weights_dtype: Dtype
    """Native format of the dense (non-expert) weights."""
    expert_weights_dtype: Dtype | None = None
    """Native format of routed-expert weights, where it differs (gpt-oss: MXFP4 experts)."""
    fp8_scales: Literal["block", "tensor"] = "block"
    """Scales of its FP8 checkpoint: ``block`` (128x128 weight blocks: DeepSeek, Kimi, Qwen3) or ``tensor`` (one a
    tensor: NVIDIA ModelOpt's Llama); the two run different GEMM kernels, timed by their own curves."""
    max_context_tokens: PosInt
    context_extension: ContextExtension | None = None
    """Where ``max_context_tokens`` is beyond the checkpoint's own ``max_position_embeddings``: that length and the
    rope scaling that reaches ``max_context_tokens`` (engines need both overridden to serve beyond it)."""
    speculative: Speculative | None = None
    """Speculative decoding a plan may choose for this model (None: not offered)."""
    checkpoints: list[Checkpoint] = Field(default_factory=list)
    """Published checkpoints per weight format beside the native one (``hf_ids[0]``)."""
    published: Published | None = None

    @model_validator(mode="after")
    def _extension(self) -> ModelSpec:
        ext = self.context_extension
        if ext is not None and ext.native_tokens >= self.max_context_tokens:
            raise ValueError("context_extension.native_tokens must be below max_context_tokens (else no extension "
                             "is needed: remove context_extension)")
        return self

    def weights_source(self, dtype: str, vendor: str, engine: EngineSpec | None = None) -> tuple[str, str] | None:
        """Where a pool serving ``dtype`` weights on ``vendor``'s hardware with ``engine`` gets them:
        ``("native", id)`` (the checkpoint's own format, or bf16/fp16 from either), ``("published", id)`` (a
        published checkpoint in that format), ``("on-load", id)`` (the engine quantises the bf16/fp16 checkpoint
        as it loads it), or ``None``: someone must quantise one first."""
        native = self.hf_ids[0] if self.hf_ids else self.id
        wide = ("bf16", "fp16")
        if dtype == self.weights_dtype or (dtype in wide and self.weights_dtype in wide):
            return "native", native
        for c in self.checkpoints:
            if c.weights == dtype and c.vendor in (None, vendor):
                return "published", c.hf_id
        if engine is not None and dtype in engine.weights.on_load and self.weights_dtype in wide:
            return "on-load", native
        return None

    @property
    def is_moe(self) -> bool:
        return self.architecture.moe is not None
