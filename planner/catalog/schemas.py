"""Pydantic schemas of catalog entries.

Every key carries its unit (``hbm_bandwidth_tb_s``, ``power_w``); the ``si`` helpers convert once so
that ``perf/`` sees bytes, seconds and FLOP/s only. Models are strict and frozen: an unknown key, a
missing key or a negative value is an error that names the field.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner import units

Pos = Annotated[float, Field(gt=0)]
NonNeg = Annotated[float, Field(ge=0)]
PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]
Dtype = Literal["fp32", "bf16", "fp16", "fp8", "int8", "fp4", "int4"]
ENGINES = ("trtllm", "sglang", "vllm")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------------------------------
# Hardware
# --------------------------------------------------------------------------------------------------


class Price(Strict):
    usd_per_chip_hour: Pos
    """Price of one chip for one hour, all-in (host, network and facility share included)."""
    as_of: dt.date
    source: str = Field(min_length=3)
    alternatives: str = ""
    """Other quotes and why this one was picked."""


class PurchaseUnit(Strict):
    kind: Literal["node", "rack", "slice", "instance", "chip"]
    chips_per_unit: PosInt


class EngineEfficiency(Strict):
    """Empirical factors for one serving engine on one hardware (fitted on measured data).

    Decode step time = max(FLOPs / (F * compute), bytes / (W * memory)) + communication
    + step_overhead_us + layer_overhead_us * layers_per_stage (+ moe_layer_overhead_us per MoE layer); prefill uses ``prefill_compute``.
    """

    compute: Fraction = 1.0
    """Achievable fraction of dense peak FLOP/s in decode GEMMs."""
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
    interference: NonNeg = 1.0
    """Weight of the prefill work interleaved with decode in aggregated serving (physics: 1)."""
    queueing: NonNeg = 0.5
    """Share of the other in-flight requests a new request waits behind (0.5: synchronised burst)."""
    queue_prompt_exponent: Annotated[float, Field(ge=0, le=2)] = 1.0
    """Aggregated serving interleaves queued prompts with decode iterations in chunks, so the wait per
    request ahead is ``t_step * (I / 1000 tokens) ** x``; x = 1 when every prompt token ahead costs its
    share of an iteration, lower when requests desynchronise."""
    ttft_overhead_ms: NonNeg = 0.0
    """Fixed cost per request before the first token (tokenisation, scheduling, transport)."""
    prefill_expert_overhead_us: NonNeg = 0.0
    """Fixed prefill cost per routed expert per MoE layer (routing, permutation and per-expert
    kernels of a prefill pass, measured to grow with the model's expert count, not with its EP)."""


class Efficiency(Strict):
    """What fraction of the datasheet is achievable, with its own provenance (the calibration)."""

    source: str = Field(min_length=3)
    as_of: dt.date
    default: EngineEfficiency
    """Factors used when no engine is named (and for engines without their own fit)."""
    by_engine: dict[Literal["trtllm", "sglang", "vllm"], EngineEfficiency] = Field(default_factory=dict)
    fitted_rows: NonNegInt = 0
    """Measured rows behind this fit (0: transferred from similar hardware)."""

    def for_engine(self, engine: str | None) -> EngineEfficiency:
        if engine and engine in self.by_engine:
            return self.by_engine[engine]
        return self.default


IDEAL = EngineEfficiency()
"""Efficiency 1 and no overheads: the ``--ideal`` roofline."""


class HardwareSpec(Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    name: str
    vendor: Literal["nvidia", "amd", "google", "aws"]
    aliases: list[str] = Field(default_factory=list)
    """Names measured data uses for this system (``h100_sxm``, ``gb200``)."""
    source: str = Field(min_length=3)
    as_of: dt.date
    notes: str = ""

    dense_tflops: dict[Dtype, Pos]
    """Dense (no 2:4 sparsity) peak TFLOP/s per supported compute format."""
    hbm_capacity_gb: Pos
    """Usable HBM per chip in GB (1e9 bytes)."""
    hbm_bandwidth_tb_s: Pos
    scale_up_domain_chips: PosInt
    """Chips that share the scale-up fabric (NVLink domain, TPU slice, UltraServer)."""
    scale_up_bandwidth_gb_s: Pos
    """Per-chip scale-up bandwidth, one direction."""
    scale_up_technology: str
    scale_out_bandwidth_gb_s: Pos
    """Per-chip scale-out (NIC / DCN) bandwidth, one direction."""
    host_dram_gb: NonNeg
    """Host DRAM per chip."""
    host_link_bandwidth_gb_s: NonNeg
    """Host-to-chip link bandwidth per chip, one direction (PCIe, NVLink-C2C)."""
    nvme_capacity_tb: NonNeg
    """Local NVMe capacity per chip (0: no local flash tier)."""
    nvme_bandwidth_gb_s: NonNeg
    """Local NVMe read bandwidth per chip."""
    power_w: Pos | None
    """Chip TDP in W (null where the vendor does not publish one)."""
    power_all_in_kw: Pos | None
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

    @model_validator(mode="after")
    def _check(self) -> Moe:
        if self.top_k > self.experts:
            raise ValueError("moe.top_k must not exceed moe.experts")
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


class Published(Strict):
    total_params_b: Pos | None = None
    active_params_b: Pos | None = None
    source: str = ""


class ModelSpec(Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    name: str
    hf_ids: list[str]
    """Hugging Face ids this entry covers, quantised variants included (empty: no public checkpoint)."""
    source: str = Field(min_length=3)
    as_of: dt.date
    notes: str = ""
    architecture: Architecture
    weights_dtype: Dtype
    """Native format of the dense (non-expert) weights."""
    expert_weights_dtype: Dtype | None = None
    """Native format of routed-expert weights, where it differs (gpt-oss: MXFP4 experts)."""
    max_context_tokens: PosInt
    published: Published | None = None

    @property
    def is_moe(self) -> bool:
        return self.architecture.moe is not None
