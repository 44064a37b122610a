"""Kernel curves of one system fitted on measured kernel latencies (``planner calibrate kernels``): their families'
parameters, the physical range of each, and the catalog schema that stores them under a hardware entry."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, model_validator

from planner.catalog.fields import ENGINES, AsOf, NonNegInt, Strict

KERNEL_PARAMS: dict[str, tuple[str, ...]] = {
    "gemm": ("t0_us", "compute", "tile_half", "memory", "sharpness", "act_bytes"),
    "moe": ("t0_us", "compute", "tile_ns", "memory", "sharpness", "copy_bytes"),
    "attn_decode": ("t0_us", "unit_us", "compute", "memory", "red_us", "fill_half"),
    "mla_decode": ("t0_us", "unit_us", "compute", "memory", "red_us", "fill_half"),
    "attn_context": ("t0_us", "unit_us", "compute", "memory", "sms", "sharpness"),
    "mla_context": ("t0_us", "unit_us", "compute", "memory", "sms", "sharpness"),
    "collective": ("alpha_us", "alpha_gpu_us", "bus_eff", "switch_kb", "slow_eff"),
    "deepep": ("t0_us", "copy_ns", "bus_eff", "slot_ns", "expert_gbps"),
    "alltoall": ("t0_us", "peer_ns", "tok_ns", "near_gbps", "far_gbps", "fan_share"),
}
"""Parameters of each kernel family's curve (``planner/perf/kernels.py``), in the order the fit uses."""

RENAMED = (("moe", "copy_ns", "copy_bytes", "the fused-MoE curve now charges every routed copy's buffers per element "
             "over HBM; refit with planner calibrate kernels --data DIR --family moe --write"),)
"""Parameters a catalog of an earlier release may still carry: (family, old name, new name, what to do)."""

KERNEL_TERMS = ("moe", "all_reduce", "exchange", "attention", "prefill_attention", "trtllm_exchange", "gemm")
"""Terms of the roofline step a kernel block can time on its own (``KernelFits.terms``)."""

KERNEL_BOUNDS: dict[str, dict[str, tuple[float, float]]] = {
    "gemm": {"t0_us": (0.0, 100.0), "compute": (0.05, 1.0), "tile_half": (0.0, 5000.0), "memory": (0.05, 1.0),
             "sharpness": (1.0, 30.0), "act_bytes": (0.0, 24.0)},
    "moe": {"t0_us": (0.0, 500.0), "compute": (0.02, 1.0), "tile_ns": (0.0, 5000.0), "memory": (0.05, 1.0),
            "sharpness": (1.0, 30.0), "copy_bytes": (0.0, 100.0)},
    "attn_decode": {"t0_us": (0.0, 200.0), "unit_us": (0.0, 20.0), "compute": (0.001, 1.0), "memory": (0.05, 1.0),
                    "red_us": (0.0, 200.0), "fill_half": (0.0, 4096.0)},
    "mla_decode": {"t0_us": (0.0, 200.0), "unit_us": (0.0, 20.0), "compute": (0.001, 1.0), "memory": (0.05, 1.0),
                   "red_us": (0.0, 200.0), "fill_half": (0.0, 4096.0)},
    "attn_context": {"t0_us": (0.0, 500.0), "unit_us": (0.0, 20.0), "compute": (0.01, 2.0), "memory": (0.02, 1.0),
                     "sms": (1.0, 1000.0), "sharpness": (1.0, 30.0)},
    "mla_context": {"t0_us": (0.0, 500.0), "unit_us": (0.0, 20.0), "compute": (0.01, 2.0), "memory": (0.02, 1.0),
                    "sms": (1.0, 1000.0), "sharpness": (1.0, 30.0)},
    "collective": {"alpha_us": (0.0, 500.0), "alpha_gpu_us": (0.0, 100.0), "bus_eff": (0.02, 1.5),
                   "switch_kb": (0.0, 1e6), "slow_eff": (0.02, 1.5)},
    "deepep": {"t0_us": (0.0, 500.0), "copy_ns": (0.0, 500.0), "bus_eff": (0.01, 1.5), "slot_ns": (0.0, 5000.0),
               "expert_gbps": (1.0, 10000.0)},
    "alltoall": {"t0_us": (0.0, 500.0), "peer_ns": (0.0, 5000.0), "tok_ns": (0.0, 500.0), "near_gbps": (1.0, 5000.0),
                 "far_gbps": (1.0, 5000.0), "fan_share": (0.0, 1.0)},
}
"""Physical ranges of each parameter (the fit's bounds; a catalog value outside is refused)."""


class KernelCurve(Strict):
    """One fitted kernel curve (``planner/perf/kernels.py``): its parameters and how well it predicts rows it
    was not fitted on."""

    params: dict[str, float]
    """The family's parameters (``perf.kernels.PARAMS``), fitted on every row of the family."""
    rows: NonNegInt
    """Measured kernel rows (distinct shapes) the parameters were fitted on."""
    fit_mape: Annotated[float, Field(ge=0)]
    """Median absolute percentage error on those rows."""
    holdout_rows: NonNegInt = 0
    """Rows of shapes left out of a second fit (the held-out rule is in ``holdout``)."""
    holdout_mape: Annotated[float, Field(ge=0)] | None = None
    """Median absolute percentage error of that second fit on the held-out rows (None: no rows held out)."""
    holdout: str = ""
    """Which shapes were held out (e.g. ``n or k = 7168`` for GEMMs: DeepSeek's hidden size)."""
    engine_version: str = ""


class KernelFits(Strict):
    """Kernel curves of one system fitted on measured kernel latencies (``planner calibrate kernels``): the
    physics of each term of a step (GEMMs, fused MoE, decode and prefill attention and MLA, collectives, DeepEP), which
    the end-to-end fit then leaves alone."""

    source: str = Field(min_length=3)
    as_of: AsOf
    system: str
    """The system's name in the kernel data (``h200_sxm``, ``gb200``)."""
    curves: dict[str, KernelCurve] = Field(default_factory=dict)
    """Keyed ``FAMILY/ENGINE/FORMAT`` (``gemm/trtllm/fp8_block``, ``collective/nccl/all_reduce``)."""
    notes: list[str] = Field(default_factory=list)
    """Families skipped or not fitted, and why."""
    compose: bool = False
    """Whether the calibrated step of this hardware is composed from these curves (with the end-to-end factors
    fitted for that composition). False: the curves are stored and reported, and the step keeps the datasheet
    roofline with the factors above, which predict the measured serving rows better today (docs/validation.md,
    `python bench/kernel_composition.py`); `planner calibrate kernels --compose` turns it on."""
    terms: list[Literal["moe", "all_reduce", "exchange", "attention", "prefill_attention", "trtllm_exchange",
                        "gemm"]] = Field(default_factory=list)
    """Terms of the calibrated roofline step that these curves time where ``compose`` is off (a partial
    composition): ``moe``, the fused MoE layers of a decode step (its grouped GEMMs, in place of the expert
    GEMMs' roofline and the fitted ``moe_layer_overhead_us``), and ``all_reduce``, the engine's own all-reduce of
    a decode step inside one measured node (in place of the datasheet bandwidth and the fitted latency), and
    ``exchange``, the expert dispatch and combine of a decode step under attention DP (DeepEP low-latency's curve
    inside one measured node; beyond it the datasheet links at the link share that curve measured), and
    ``attention``, the decode attention (MLA, or the engine's GQA kernel, at the KV cache's format: an FP8 cache runs
    FP8 maths where the kernel does) in place of the fitted ``attention_compute`` on the bf16 peak, and
    ``prefill_attention``, a prefill pass's causal attention (context MLA, or the engine's context GQA kernel) in
    place of ``prefill_compute`` on the attention peak (the pass's GEMMs keep ``prefill_compute``), and
    ``trtllm_exchange`` (with ``exchange``), TensorRT-LLM's decode exchange as its MoE chooses it: its NVLink
    all-to-all curve where its expert parallelism exceeds top-k on a multi-node NVLink domain, else NCCL's all-gather
    and reduce-scatter (``planner.perf.compose.trtllm_exchange``), and ``gemm``, a decode step's non-expert GEMMs
    (attention projections, dense and shared FFNs, LM head) at the model's shapes in place of their roofline with the
    fitted compute and memory factors (an FP8 model by the curve of its checkpoint's scale granularity,
    ``ModelSpec.fp8_scales``). Their
    fixed latencies are paid at the fitted ``kernel_fixed_share``; the end-to-end factors are fitted with these
    terms frozen (``planner calibrate fit``). Empty: the datasheet roofline throughout."""
    overruled: list[str] = Field(default_factory=list)
    """Fused-MoE and dense GEMM curves that an engine's own measured decode steps on this hardware contradict, keyed
    ``moe/ENGINE/FORMAT`` or ``gemm/ENGINE/FORMAT`` (the curve that engine would use, its own or another engine's): on
    more than a tenth of that engine's measured rows the curve's time alone (its MoE layers, or its non-expert GEMMs
    where the ``gemm`` term is on) exceeds the whole measured step, so the engine does not run the measured kernel
    there, and those layers keep the roofline with the fitted factors. Written by
    ``planner calibrate fit`` (:mod:`planner.calib.consistency`), which decides it from the rows it fits on."""

    @model_validator(mode="after")
    def _check(self) -> KernelFits:
        for key in self.overruled:
            if key.count("/") != 2 or key.split("/")[0] not in ("moe", "gemm") or key.split("/")[1] not in ENGINES:
                raise ValueError(f"kernels.overruled entry {key!r} must be moe/ENGINE/FORMAT or gemm/ENGINE/FORMAT "
                                 f"with ENGINE one of {', '.join(ENGINES)}")
        for key, c in self.curves.items():
            fam = key.split("/", 1)[0]
            if key.count("/") != 2 or fam not in KERNEL_PARAMS:
                raise ValueError(f"kernels.curves key {key!r} must be FAMILY/ENGINE/FORMAT with FAMILY one of "
                                 f"{', '.join(KERNEL_PARAMS)}")
            fmt = key.split("/", 2)[2]
            if fam in ("attn_decode", "attn_context") and not re.fullmatch(r"[A-Za-z0-9_]+(-hd[1-9][0-9]*)?", fmt):
                # a malformed head-dimension suffix would leave the curve unused, never an error
                raise ValueError(f"kernels.curves key {key!r}: a decode-attention format is KV_FORMAT or "
                                 f"KV_FORMAT-hdN (N the head dimension, e.g. fp8-hd128), not {fmt!r}")
            if set(c.params) != set(KERNEL_PARAMS[fam]):
                hint = next((f" ({old} became {new}: {why})" for f, old, new, why in RENAMED
                             if f == fam and old in c.params), "")
                raise ValueError(f"kernels.curves.{key}.params must be exactly {', '.join(KERNEL_PARAMS[fam])}{hint}")
            for k, v in c.params.items():
                lo, hi = KERNEL_BOUNDS[fam][k]
                if not (lo <= v <= hi):
                    raise ValueError(f"kernels.curves.{key}.params.{k} = {v} is outside its physical range [{lo}, {hi}]")
        return self

    def curve(self, family: str, engine: str | None, fmt: str) -> dict[str, float] | None:
        """The parameters of ``family`` in format ``fmt`` for ``engine`` (another engine's where this one has no
        curve of that family and format); None where no engine has one. Another engine's curve is its main kernel's,
        never a kernel path of its own (``trtllm-mmha``, ``sglang-deepep``: an engine suffix after a hyphen)."""
        if engine:
            c = self.curves.get(f"{family}/{engine}/{fmt}")
            if c is not None:
                return c.params
        for key, c in sorted(self.curves.items()):
            f, eng, x = key.split("/", 2)
            if f == family and x == fmt and "-" not in eng:
                return c.params
        return None
