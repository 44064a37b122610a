"""Fit the kernel curves of ``planner/perf/kernels.py`` on measured kernel latencies (``planner calibrate kernels``).

The data is a folder laid out ``SYSTEM/FAMILY/ENGINE/FILE.parquet`` (``../shared/calibration/kernels/``:
AIConfigurator's collectors on six NVIDIA systems). For each system, family, engine and number format this
module reads the rows, keeps the fastest kernel per shape (what an engine's autotuner picks) within each kernel the
engine runs for the format, and fits the family's curve by robust least squares on ``log(predicted / measured)``.
Where an engine runs several kernels for one format, each is a curve of its own, the main one (most rows) under the
engine's name and the others as ``ENGINE-KERNEL`` (fused MoE: ``sglang-triton`` beside SGLang's FlashInfer kernel;
decode attention: ``trtllm-mmha``, TensorRT-LLM's generic kernel for query-head groups outside XQA's 2-32): a curve
fitted to the faster of two kernels per shape describes neither. Each curve is fitted twice: once
without a held-out set of shapes (scored on them: the honest error on shapes the fit has not seen) and once
on every row (the parameters written to the catalog). Predictions only ever come from the curves.

Held-out shapes per family (chosen to be the shapes of a real model the curve must extend to):

- GEMM: ``n`` or ``k`` equal to 7,168 (DeepSeek-V3/R1's hidden size: every projection of that model);
- fused MoE: DeepSeek-V3's and Qwen3-235B's expert shapes (hidden 7,168 with 256 experts, hidden 4,096 with 128
  experts and 1,536 columns; top-8), where the engine's rows of them measure what their columns say (below);
- decode attention: every configuration with 8 query heads per GPU (Llama-3.1-70B at TP8, Qwen3 at TP8...);
- MLA decode: 16 heads per GPU (DeepSeek at TP8);
- prefill attention (GQA) and context MLA: as their decode families (8 query heads, 16 heads per GPU);
- collectives: 8 GPUs (fitted on 2 and 4: the extension in group size); GB200/GB300 rows stop at 4, so there
  the held-out set is 4 GPUs fitted on 2;
- DeepEP low-latency: hidden 7,168.

Bad input (a missing column, an unknown format) is a note in the report and the family is skipped for that
system; a family with fewer than :data:`MIN_ROWS` rows is reported, not fitted.

Fused-MoE rows that cannot be what their columns say are dropped, with a note: a shape (hidden, expert columns,
experts, top-k) of which some single-rank, balanced row runs faster than streaming the weights of the experts its
routing touches at :data:`FLOOR_SLACK` times the datasheet HBM bandwidth (:func:`implausible_moe_shapes`). The
collectors route by the model's own top-k: DeepSeek-V3's grouped top-k (4 of 8 expert groups) turns their balanced
logits into half the experts and a few hot ones (SGLang's and vLLM's rows of that shape stream "all" experts at
1.7x HBM peak on every system; TensorRT-LLM's, at 0.9x), and Nemotron-3's experts are two matrices with ReLU²
(1.2-1.5x). The routing is the collector's, not the GPU's, so a shape flagged on any system is dropped from that
engine's files on every system.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from planner.calib.kernel_comm import (  # noqa: F401 - the communication readers, re-exported
    ALLTOALL_HOLDOUT,
    ALLTOALL_KERNELS,
    ALLTOALL_PAYLOAD,
    _collective,
    _predict_alltoall,
    _predict_deepep,
    bench_fanout,
    read_custom_allreduce,
    read_deepep,
    read_nccl,
    read_trtllm_alltoall,
)
from planner.calib.kernel_rows import (  # noqa: F401 - shared with the communication readers, re-exported
    SYSTEM_GPUS_PER_NODE,
    Rows,
    _fastest,
    _need,
    _need_sizes,
    _version,
)
from planner.catalog import Catalog
from planner.catalog.schemas import HardwareSpec, KernelCurve, KernelFits
from planner.errors import InputError
from planner.perf import kernels as K
from planner.perf.routing import power_law_loads

log = logging.getLogger(__name__)

MIN_ROWS = 30
"""Fewest distinct shapes a curve is fitted on."""
FLOOR_SLACK = 1.1
"""How far above the datasheet HBM bandwidth a fused-MoE row may seem to stream its experts before its shape is
judged not to measure its columns (the datasheet figures are rounded; a real kernel never beats them by 10%)."""
MOE_SHAPE = ("hidden_size", "inter_size", "num_experts", "topk")

GEMM_FORMATS = {
    # kernel data's gemm_dtype -> (our format name, weight bytes per element, maths format)
    "bfloat16": ("bf16", 2.0, "bf16"),
    "fp8": ("fp8", 1.0, "fp8"),
    "fp8_block": ("fp8_block", 1.0 + 4.0 / (128 * 128), "fp8"),
    "nvfp4": ("fp4", 0.5 + 1.0 / 16, "fp4"),
}
MOE_FORMATS = {
    "bfloat16": ("bf16", 2.0, "bf16"),
    "fp8": ("fp8", 1.0, "fp8"),
    "fp8_block": ("fp8_block", 1.0 + 4.0 / (128 * 128), "fp8"),
    "nvfp4": ("fp4", 0.5 + 1.0 / 16, "fp4"),
    "w4a16_mxfp4": ("mxfp4_w4a16", 0.5 + 1.0 / 32, "bf16"),
    "int4_wo": ("int4_w4a16", 0.5 + 2.0 / 128, "bf16"),
    "w4afp8": ("int4_w4a8", 0.5 + 2.0 / 128, "fp8"),
    "w4a8_mxfp4_mxfp8": ("mxfp4_w4a8", 0.5 + 1.0 / 32, "fp8"),
}
KV_BYTES = {"bfloat16": 2.0, "fp8": 1.0, "float16": 2.0}
MLA_LATENT = 512.0 + 64.0
"""Elements of one cached MLA token (kv_lora_rank + qk_rope_head_dim of DeepSeek-V3, the kernels' shape)."""


@dataclass
class SystemReport:
    system: str
    hardware: str
    curves: dict[str, KernelCurve] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    errors: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    """Per curve: predicted / measured of every row (all-row fit) with the measured seconds, and of the held-out
    rows (fit without them) with theirs, for pooled errors per family and residual plots."""
    groups: dict[str, np.ndarray] = field(default_factory=dict)
    """Per curve whose rows carry a :attr:`Rows.group`, that label of every row (aligned with ``errors``)."""


# --------------------------------------------------------------------------------------------------
# readers: one per family, each returning {(engine, format): Rows}
# --------------------------------------------------------------------------------------------------


def _by_format(df: pd.DataFrame, column: str, formats: dict, path: Path, hw: HardwareSpec):
    """(rows, format, weight bytes, maths) per value of ``column`` whose maths ``hw`` has a peak for; an unknown value
    is an InputError naming the file."""
    for dt_, g in df.groupby(column):
        if dt_ not in formats:
            raise InputError(f"{path}: {column} {dt_!r} is unknown (known: {', '.join(formats)})")
        fmt, wb, maths = formats[dt_]
        if maths in hw.dense_tflops:
            yield g, fmt, wb, maths


def read_gemm(path: Path, hw: HardwareSpec) -> dict[str, Rows]:
    df = pd.read_parquet(path)
    _need(df, path, ("gemm_dtype", "m", "n", "k", "latency"))
    out = {}
    for g, fmt, wb, maths in _by_format(df, "gemm_dtype", GEMM_FORMATS, path, hw):
        g = _fastest(g, ["m", "n", "k"])
        n, k = g["n"].to_numpy(float), g["k"].to_numpy(float)
        x = {"m": g["m"].to_numpy(float), "n": n, "k": k, "F": np.full(len(g), hw.flops(maths)),
             "W": np.full(len(g), hw.hbm_bw), "wb": np.full(len(g), wb)}
        out[fmt] = Rows(x, g["latency"].to_numpy(float) * 1e-3, (n == 7168) | (k == 7168), "n or k = 7168",
                        _version(df))
    return out


MOE_COLS = ("moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size",
            "distribution", "latency")


def implausible_moe_shapes(df: pd.DataFrame, hbm_bw: float) -> set[tuple[int, ...]]:
    """Shapes (:data:`MOE_SHAPE`) of a ``moe_perf`` table of which some balanced row on one rank (EP1) runs faster
    than streaming the three matrices of the experts its routing touches (``min(tokens x top-k, experts)``: the
    collectors' balanced logits give each token ``top-k`` experts a stride apart) at :data:`FLOOR_SLACK` times
    ``hbm_bw``."""
    if any(c not in df.columns for c in MOE_COLS):
        return set()
    d = df[(df["distribution"] == "balanced") & (df["moe_ep_size"] == 1) & df["moe_dtype"].isin(list(MOE_FORMATS))]
    lat = d["latency"].to_numpy(float) * 1e-3
    wb = d["moe_dtype"].astype(str).map(lambda f: MOE_FORMATS[f][1]).to_numpy(float)
    tokens, h, inter, e, k, tp = (d[c].to_numpy(float) for c in ("num_tokens", "hidden_size", "inter_size",
                                                                  "num_experts", "topk", "moe_tp_size"))
    floor = np.minimum(tokens * k, e) * 3.0 * h * inter / tp * wb / hbm_bw
    bad = np.isfinite(lat) & (lat > 0) & (floor > FLOOR_SLACK * lat)
    return {tuple(int(v) for v in r) for r in d.loc[bad, list(MOE_SHAPE)].to_numpy()}


def implausible_moe_by_engine(root: Path, systems: list[tuple[str, HardwareSpec]]) -> dict[str, set[tuple[int, ...]]]:
    """Per engine folder, the shapes :func:`implausible_moe_shapes` flags in any system's ``moe_perf`` file."""
    out: dict[str, set[tuple[int, ...]]] = {}
    for system, hw in systems:
        for path in sorted((root / system / "moe").glob("*/moe_perf.parquet")):
            try:
                flagged = implausible_moe_shapes(pd.read_parquet(path), hw.hbm_bw)
            except (OSError, ValueError):
                continue  # fit_system reports an unreadable file
            out.setdefault(path.parent.name, set()).update(flagged)
    return out


def _moe_rows(df: pd.DataFrame, path: Path, hw: HardwareSpec, wide: bool,
              drop: set[tuple[int, ...]] | None = None, notes: list[str] | None = None) -> dict[str, Rows]:
    """Fused-MoE rows per format: balanced (uniformly routed) rows, and for the single-layer table also the rows routed
    with power-law skew (:data:`SKEW_PATTERN`; one whose expert parallelism does not divide its experts is left out
    with a note). ``wide``: DeepEP's MoE, whose ``num_tokens`` are the EP group's tokens, each rank routing its share
    (held out: EP32; balanced rows only); else every rank routes every token (held out: DeepSeek-V3's and
    Qwen3-235B's expert shapes). ``drop``: shapes (:data:`MOE_SHAPE`) left out, each named in ``notes``."""
    _need(df, path, MOE_COLS)
    skew = (not wide) & df["distribution"].astype(str).str.match(SKEW_PATTERN)
    odd = skew & (df["num_experts"] % df["moe_ep_size"] != 0)
    if odd.any() and notes is not None:
        notes.append(f"{path}: {int(odd.sum())} skewed-routing rows whose moe_ep_size does not divide num_experts "
                     "left out (the busiest rank's block of experts is undefined)")
    df = df[df["distribution"].isin(["uniform", "balanced"]) | (skew & ~odd)]
    if "kernel_source" in df.columns:
        df = df[~df["kernel_source"].astype(str).str.contains("nongated")]
    if drop:
        key = pd.Series(list(map(tuple, df[list(MOE_SHAPE)].astype(int).to_numpy())), index=df.index)
        hit = key.isin(drop)
        if hit.any() and notes is not None:
            shapes = ", ".join("x".join(map(str, s)) for s in sorted(set(key[hit])))
            notes.append(f"{path}: {int(hit.sum())} rows of {len(set(key[hit]))} fused-MoE shapes (hidden x columns x "
                         f"experts x top-k: {shapes}) left out: on some system they stream their experts faster than "
                         f"{FLOOR_SLACK:g}x HBM peak (the collector's routing or gating is not what the columns say)")
        df = df[~hit]
    out = {}
    src = df["kernel_source"].astype(str) if "kernel_source" in df.columns else pd.Series("", index=df.index)
    df = df.assign(_kernel=src.map(moe_kernel_tag))
    for by_fmt, fmt, wb, maths in _by_format(df, "moe_dtype", MOE_FORMATS, path, hw):
        # the engine's main kernel for the format (the one most of its rows measure) keeps the engine's name
        main = by_fmt["_kernel"].value_counts().sort_index().idxmax()
        for tag, g in by_fmt.groupby("_kernel"):
            kernel = "" if tag == main else f"-{tag}"
            out[fmt + kernel] = _moe_format_rows(_fastest(g, list(MOE_COLS[1:-1])), hw, wb, maths, wide,
                                                 _version(df), kernel)
    return out


SKEW_PATTERN = r"^power_law_(\d+(\.\d+)?)$"
"""A skewed ``distribution`` of the fused-MoE rows: per-expert loads from a power law of that exponent
(``planner.perf.routing``)."""


def routing_alpha(dist: pd.Series) -> np.ndarray:
    """The power-law exponent of each ``distribution`` (NaN: balanced)."""
    return pd.to_numeric(dist.astype(str).str.extract(SKEW_PATTERN)[0], errors="coerce").to_numpy(float)


def moe_load(g: pd.DataFrame, alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(copies, touched experts, padded rows) on the measured rank of each fused-MoE row, ``alpha`` its power-law
    exponent (:func:`routing_alpha`; NaN: balanced). Balanced rows as uniform routing (``kernels.uniform_moe_load``:
    the expected touched experts of random picks, which fits them better than their exact even spread, 12.6% against
    13.1% median APE on H200); skewed rows on the busiest rank as the collectors pick it
    (``routing.power_law_loads``)."""
    t, k, e, ep = (g[c].to_numpy(float) for c in ("num_tokens", "topk", "num_experts", "moe_ep_size"))
    out = [np.array(v, dtype=float) for v in K.uniform_moe_load(t, k, e, e / ep)]
    skew = np.isfinite(alpha)
    if skew.any():
        for o, v in zip(out, power_law_loads(t[skew], e[skew], k[skew], ep[skew], alpha[skew]), strict=True):
            o[skew] = v
    return out[0], out[1], out[2]


MOE_KERNELS = ("marlin", "triton", "cutlass", "trtllm", "deepgemm")
"""Kernel families a fused-MoE ``kernel_source`` names (the first one its name contains after the engine's prefix)."""


def moe_kernel_tag(source: str) -> str:
    """The kernel family of a fused-MoE ``kernel_source`` (:data:`MOE_KERNELS`; ``other`` if none)."""
    name = source.split("_", 1)[1] if "_" in source else source
    return next((k for k in MOE_KERNELS if k in name), "other") if source else ""


def _moe_format_rows(g: pd.DataFrame, hw: HardwareSpec, wb: float, maths: str, wide: bool, version: str,
                     kernel: str) -> Rows:
    h = g["hidden_size"].to_numpy(float)
    e = g["num_experts"].to_numpy(float)
    ep = g["moe_ep_size"].to_numpy(float)
    t = g["num_tokens"].to_numpy(float)
    x = {"tokens": t, "hidden": h, "inter": g["inter_size"].to_numpy(float) / g["moe_tp_size"].to_numpy(float),
         "top_k": g["topk"].to_numpy(float), "experts": e, "local": e / ep,
         "F": np.full(len(g), hw.flops(maths)), "W": np.full(len(g), hw.hbm_bw), "wb": np.full(len(g), wb)}
    if wide:
        x["routed"] = t / ep
        hold, label = ep == 32, "EP32 (fitted on the other EP sizes)"
        return Rows(x, g["latency"].to_numpy(float) * 1e-3, hold, label, version, kernel)
    alpha = routing_alpha(g["distribution"])
    x.update(zip(("copies", "touched", "rows"), moe_load(g, alpha), strict=True))
    cols = g["inter_size"].to_numpy(float)
    hold = (x["top_k"] == 8) & (((h == 7168) & (e == 256)) | ((h == 4096) & (e == 128) & (cols == 1536)))
    label = "DeepSeek-V3's and Qwen3-235B's experts"
    group = np.where(np.isfinite(alpha), "skewed", "balanced")
    return Rows(x, g["latency"].to_numpy(float) * 1e-3, hold, label, version, kernel, group)


def read_moe(path: Path, hw: HardwareSpec, drop: set[tuple[int, ...]] | None = None,
             notes: list[str] | None = None) -> dict[str, Rows]:
    """Fused MoE layers (``moe_perf``): every rank routes every token, computes its local experts."""
    return _moe_rows(pd.read_parquet(path), path, hw, wide=False, drop=drop, notes=notes)


def read_wideep_moe(path: Path, hw: HardwareSpec) -> dict[str, Rows]:
    """SGLang's DeepEP MoE (``wideep_generation_moe_perf``: DeepGEMM grouped GEMMs on the copies a dispatch
    delivers)."""
    return _moe_rows(pd.read_parquet(path), path, hw, wide=True)


def _by_kv(df: pd.DataFrame, path: Path):
    """The rows of each KV-cache format (an unknown one is an error naming the file)."""
    for kv, g in df.groupby("kv_cache_dtype"):
        if kv not in KV_BYTES:
            raise InputError(f"{path}: kv_cache_dtype {kv!r} is unknown (known: {', '.join(KV_BYTES)})")
        yield kv, g


def _gqa_table(path: Path, length: str) -> pd.DataFrame:
    """A GQA attention file with its shape columns checked (``length``: ``step`` in decode, ``isl`` in prefill) and
    ``window_size`` 0 (full attention) where the file has none."""
    df = pd.read_parquet(path)
    _need(df, path, ("batch_size", length, "num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype", "latency"))
    _need_sizes(df, path, ("batch_size", length, "num_heads", "num_key_value_heads", "head_dim"))
    return df if "window_size" in df.columns else df.assign(window_size=0)


def read_attn_decode(path: Path, hw: HardwareSpec, engine: str = "") -> dict[str, Rows]:
    """GQA decode attention per KV format and head dimension (``bf16-hd128``: each head dimension is a kernel
    compiled for it, :func:`planner.perf.kernels.head_dim_format`), split by the kernel ``engine`` runs for each
    query-head group (:func:`planner.perf.kernels.decode_attention_kernel`)."""
    df = _gqa_table(path, "step")
    out = {}
    for kv, g in _by_kv(df, path):
        g = _fastest(g, ["batch_size", "num_heads", "num_key_value_heads", "head_dim", "window_size", "step"])
        path_of = K.decode_attention_kernel(engine, g["num_heads"].to_numpy(float) / g["num_key_value_heads"].to_numpy(float))
        for (kernel, dim), k in g.groupby([path_of, g["head_dim"].to_numpy(int)]):
            b = k["batch_size"].to_numpy(float)
            s = k["step"].to_numpy(float)
            w = k["window_size"].to_numpy(float)
            s = np.where(w > 0, np.minimum(s, w), s)
            hq, hk, d = (k[c].to_numpy(float) for c in ("num_heads", "num_key_value_heads", "head_dim"))
            x = {"batch": b, "kv_bytes": b * s * 2.0 * hk * d * KV_BYTES[kv], "flops": 4.0 * b * hq * d * s,
                 "F": np.full(len(k), hw.flops("bf16")), "W": np.full(len(k), hw.hbm_bw), "units": b * hk}
            out[K.head_dim_format(_kv_name(kv), dim) + kernel] = Rows(
                x, k["latency"].to_numpy(float) * 1e-3, hq == 8, "8 query heads per GPU", _version(df), kernel)
    return out


def read_mla_decode(path: Path, hw: HardwareSpec) -> dict[str, Rows]:
    df = pd.read_parquet(path)
    cols = ("batch_size", "num_heads", "kv_cache_dtype", "step", "latency")
    _need(df, path, cols)
    out = {}
    for kv, g in _by_kv(df, path):
        g = _fastest(g, ["batch_size", "num_heads", "step"])
        b, hq, s = (g[c].to_numpy(float) for c in ("batch_size", "num_heads", "step"))
        x = {"batch": b, "kv_bytes": b * s * MLA_LATENT * KV_BYTES[kv], "flops": mla_decode_flops(b, hq, s),
             "F": np.full(len(g), hw.flops("bf16")), "W": np.full(len(g), hw.hbm_bw), "units": b}
        out[_kv_name(kv)] = Rows(x, g["latency"].to_numpy(float) * 1e-3, hq == 16, "16 heads per GPU", _version(df))
    return out


def _context_x(shape, hw: HardwareSpec) -> dict:
    """A prefill-attention curve's inputs from :func:`planner.perf.kernels.context_attention_shape`'s four arrays."""
    fl, mv, lg, un = shape
    return {"flops": fl, "bytes": mv, "longest": lg, "units": un, "F": np.full(len(fl), hw.flops("bf16")),
            "W": np.full(len(fl), hw.hbm_bw)}


def read_attn_context(path: Path, hw: HardwareSpec) -> dict[str, Rows]:
    """GQA prefill attention per KV format and head dimension (``fp8-hd128``; each head dimension is a kernel of its
    own, as in decode). Where an engine runs both BF16 and FP8 maths for an FP8 cache (TensorRT-LLM's FP8 context
    FMHA), the faster per shape, at the BF16 peak (the fitted ``compute`` then exceeds 1 where FP8 maths pays)."""
    df = _gqa_table(path, "isl")
    out = {}
    for kv, g in _by_kv(df, path):
        g = _fastest(g, ["batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "window_size"])
        for dim, k in g.groupby(g["head_dim"].to_numpy(int)):
            b, n, hq, hk, w = (k[c].to_numpy(float) for c in
                               ("batch_size", "isl", "num_heads", "num_key_value_heads", "window_size"))
            x = _context_x(K.context_attention_shape(b, n, 0.0, hq, hk, float(dim), float(dim), w), hw)
            out[K.head_dim_format(_kv_name(kv), dim)] = Rows(x, k["latency"].to_numpy(float) * 1e-3, hq == 8,
                                                            "8 query heads per GPU", _version(df))
    return out


def read_mla_context(path: Path, hw: HardwareSpec) -> dict[str, Rows]:
    """DeepSeek's context MLA per KV format: decompressed (128 + 64 query/key and 128 value dimensions a head), or
    absorbed where the collector ran that form (:data:`ABSORBED_CONTEXT_MLA`), a kernel path of its own."""
    df = pd.read_parquet(path)
    cols = ("batch_size", "isl", "num_heads", "kv_cache_dtype", "latency")
    _need(df, path, cols)
    _need_sizes(df, path, ("batch_size", "isl", "num_heads"))
    if "kernel_source" not in df.columns:
        df = df.assign(kernel_source="")
    absorbed = df["kernel_source"].astype(str).isin(ABSORBED_CONTEXT_MLA)
    out = {}
    for kv, gk in _by_kv(df, path):
        for ab, g in gk.groupby(absorbed[gk.index].to_numpy()):
            g = _fastest(g, ["batch_size", "isl", "num_heads"])
            b, n, hq = (g[c].to_numpy(float) for c in ("batch_size", "isl", "num_heads"))
            if ab:  # the latent as one shared 576-wide key (512 + 64 rotary) and 512-wide value: multi-query attention
                shape = K.context_attention_shape(b, n, 0.0, hq, 1.0, MLA_LATENT, MLA_LATENT - MLA_ROPE)
            else:
                shape = K.context_attention_shape(b, n, 0.0, hq, hq, MLA_QK_DIM, MLA_V_DIM, mla=True)
            x = _context_x(shape, hw)
            kernel = "-absorbed" if ab else ""
            out[_kv_name(kv) + kernel] = Rows(x, g["latency"].to_numpy(float) * 1e-3, hq == 16, "16 heads per GPU",
                                             _version(df), kernel)
    return out


ABSORBED_CONTEXT_MLA = {"flash_attention"}
"""``kernel_source`` of context-MLA rows measured in the absorbed form: SGLang's collector on Hopper runs its FA3 MLA
backend with the 512-wide latent (plus 64 rotary) as one key/value head shared by every query head (ai-dynamo/
aiconfigurator ``collector/sglang/collect_mla.py``), 3.4x the FLOPs a pair of the decompressed prefill SGLang runs
for prompts without a cached prefix. Fitted as its own kernel path (``sglang-absorbed``) with those FLOPs, so the
engine's prefill falls back to another engine's decompressed curve rather than to this one."""


MLA_QK_DIM, MLA_V_DIM, MLA_ROPE = 192.0, 128.0, 64.0
"""DeepSeek-V3's decompressed MLA head: 128 no-position + 64 rotary query/key dimensions, 128 value dimensions
(the shape the context-MLA collectors run)."""


def mla_decode_flops(batch, heads, context, kv_lora=512.0, rope=64.0):
    """FLOPs of absorbed MLA decode attention: scores over ``kv_lora + rope`` and values over ``kv_lora``."""
    return 2.0 * batch * heads * context * (2.0 * kv_lora + rope)


def _kv_name(kv: str) -> str:
    return "bf16" if kv in ("bfloat16", "float16") else str(kv)


# --------------------------------------------------------------------------------------------------
# predictors: the perf curves over a Rows.x
# --------------------------------------------------------------------------------------------------


def _predict_gemm(p, x):
    return K.gemm_time(p, x["m"], x["n"], x["k"], x["F"], x["W"], x["wb"])


def _predict_moe(p, x):
    load = (x["copies"], x["touched"], x["rows"]) if "copies" in x else None
    return K.moe_time(p, x["tokens"], x["hidden"], x["inter"], x["top_k"], x["experts"], x["local"], x["F"], x["W"], x["wb"],
                      routed_tokens=x.get("routed"), load=load)


def _predict_attn(p, x):
    return K.attn_decode_time(p, x["batch"], x["kv_bytes"], x["flops"], x["F"], x["W"], x["units"])


def _predict_context(p, x):
    return K.attn_context_time(p, x["flops"], x["bytes"], x["longest"], x["units"], x["F"], x["W"])


# (family, sub-folder, file stem, reader, predictor-for-format)
SOURCES: list[tuple[str, str, str, Callable, Callable[[str], Callable]]] = [
    ("gemm", "gemm", "gemm_perf", lambda p, hw, s: read_gemm(p, hw), lambda f: _predict_gemm),
    ("moe", "moe", "moe_perf", lambda p, hw, s, **kw: read_moe(p, hw, **kw), lambda f: _predict_moe),
    ("moe", "moe", "wideep_generation_moe_perf", lambda p, hw, s: read_wideep_moe(p, hw), lambda f: _predict_moe),
    ("attn_decode", "attention", "generation_attention_perf", lambda p, hw, s: read_attn_decode(p, hw, p.parent.name),
     lambda f: _predict_attn),
    ("mla_decode", "mla", "generation_mla_perf", lambda p, hw, s: read_mla_decode(p, hw), lambda f: _predict_attn),
    ("attn_context", "attention", "context_attention_perf", lambda p, hw, s: read_attn_context(p, hw),
     lambda f: _predict_context),
    ("mla_context", "mla", "context_mla_perf", lambda p, hw, s: read_mla_context(p, hw), lambda f: _predict_context),
    ("collective", "comm", "nccl_perf", read_nccl, _collective),
    ("collective", "comm", "custom_allreduce_perf", read_custom_allreduce, _collective),
    ("deepep", "comm", "wideep_deepep_ll_perf", read_deepep, lambda f: _predict_deepep),
    ("alltoall", "comm", "trtllm_alltoall_perf", read_trtllm_alltoall, lambda f: _predict_alltoall),
]


# --------------------------------------------------------------------------------------------------
# fitting
# --------------------------------------------------------------------------------------------------


ROBUST_SCALE = 0.05
"""Residual (in log of predicted over measured) beyond which the fit's soft-L1 loss grows linearly instead of
quadratically: a kernel whose engine switches tile configuration at one size does not pull the curve."""


def fit_curve(family: str, predict: Callable, x: dict, y: np.ndarray, start: dict | None = None) -> dict[str, float]:
    """Least-squares fit of ``family``'s parameters (within their physical bounds) on ``log(pred / y)``,
    robust (soft-L1) so that a few odd kernels do not pull the curve."""
    names = K.PARAMS[family]
    lo = np.array([K.BOUNDS[family][n][0] for n in names])
    hi = np.array([K.BOUNDS[family][n][1] for n in names])
    start = start or K.PRIOR[family]
    x0 = np.clip(np.array([start[n] for n in names], dtype=float), lo, hi)
    scale = hi - lo
    logy = np.log(y)

    def res(z):
        p = dict(zip(names, lo + z * scale, strict=True))
        r = np.log(np.maximum(predict(p, x), 1e-12)) - logy
        return np.nan_to_num(r, nan=5.0, posinf=5.0, neginf=-5.0)

    best = None
    for z0 in ((x0 - lo) / scale, np.full(len(names), 0.5)):
        sol = least_squares(res, np.clip(z0, 1e-6, 1 - 1e-6), bounds=(0.0, 1.0), loss="soft_l1", f_scale=ROBUST_SCALE,
                            x_scale=0.1, max_nfev=400)
        if best is None or sol.cost < best.cost:
            best = sol
    return {n: float(f"{v:.5g}") for n, v in zip(names, lo + best.x * scale, strict=True)}


def fit_rows(family: str, predict: Callable, rows: Rows) -> tuple[KernelCurve, tuple]:
    """Fit on every row (the catalog's parameters) and, where shapes are held out, once without them (scored
    on them). Returns the curve and (ratios, measured, held-out ratios, held-out measured): predicted / measured
    seconds of every row with the all-row fit, and of the held-out rows with the fit without them."""
    params = fit_curve(family, predict, rows.x, rows.y)
    ratio = predict(params, rows.x) / rows.y
    ape = np.abs(ratio - 1.0)
    hold_ratio = np.array([])
    hold_y = np.array([])
    n_hold = int(rows.hold.sum())
    if 0 < n_hold and int((~rows.hold).sum()) >= MIN_ROWS:
        train = {k: v[~rows.hold] for k, v in rows.x.items()}
        p_train = fit_curve(family, predict, train, rows.y[~rows.hold])
        held = {k: v[rows.hold] for k, v in rows.x.items()}
        hold_y = rows.y[rows.hold]
        hold_ratio = predict(p_train, held) / hold_y
    else:
        n_hold = 0
    hold_ape = np.abs(hold_ratio - 1.0)
    curve = KernelCurve(params=params, rows=len(rows.y), fit_mape=round(float(np.median(ape)), 4),
                        holdout_rows=n_hold, holdout_mape=round(float(np.median(hold_ape)), 4) if n_hold else None,
                        holdout=rows.holdout if n_hold else "", engine_version=rows.engine_version)
    return curve, (ratio, rows.y, hold_ratio, hold_y)


def system_hardware(catalog: Catalog, system: str) -> HardwareSpec | None:
    """The catalog hardware whose id or alias is the kernel data's system name."""
    for hw in catalog.hardware.values():
        if system == hw.id or system in hw.aliases:
            return hw
    return None


def fit_system(root: Path, system: str, hw: HardwareSpec, families: set[str] | None = None,
               moe_drop: dict[str, set[tuple[int, ...]]] | None = None) -> SystemReport:
    """Every curve of one system's folder. ``moe_drop``: per engine folder, the fused-MoE shapes left out
    (:func:`implausible_moe_by_engine`)."""
    rep = SystemReport(system, hw.id)
    for family, sub, stem, reader, predictor in SOURCES:
        if families and family not in families:
            continue
        for path in sorted((root / system / sub).glob(f"*/{stem}.parquet")):
            engine = path.parent.name + ("-deepep" if family == "moe" and stem.startswith("wideep_") else "")
            kw = {"drop": (moe_drop or {}).get(engine), "notes": rep.notes} if stem == "moe_perf" else {}
            try:
                sets = reader(path, hw, system, **kw)
            except InputError as exc:
                rep.notes.append(str(exc))
                continue
            except (OSError, ValueError) as exc:
                rep.notes.append(f"{path}: unreadable ({type(exc).__name__}: {exc}); the family is skipped")
                continue
            for name, rows in sets.items():
                fmt = name.removesuffix(rows.kernel)
                key = f"{family}/{engine}{rows.kernel}/{fmt}"
                if len(rows.y) < MIN_ROWS:
                    rep.notes.append(f"{key}: {len(rows.y)} rows, fewer than {MIN_ROWS}: not fitted")
                    continue
                c, errs = fit_rows(family, predictor(fmt), rows)
                rep.curves[key] = c
                rep.errors[key] = errs
                if rows.group is not None:
                    rep.groups[key] = rows.group
                log.info("%s %s: %d rows, fit %.3f, held out %s", system, key, c.rows, c.fit_mape, c.holdout_mape)
    return rep


def fit_kernels(root: Path, catalog: Catalog, systems: list[str] | None = None, families: set[str] | None = None,
                jobs: int = 1) -> list[SystemReport]:
    """Fit every system folder under ``root`` that names catalog hardware (one process per system with ``jobs``)."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"--data {root}: not a folder (expected SYSTEM/FAMILY/ENGINE/FILE.parquet)")
    names = sorted(p.name for p in root.iterdir() if p.is_dir())
    known = [(s, hw) for s in names if (hw := system_hardware(catalog, s)) is not None]
    if systems:
        unknown = [s for s in systems if s not in names]
        if unknown:
            raise InputError(f"--system {unknown[0]}: no such folder under {root} (found: {', '.join(names)})")
        names = [s for s in names if s in systems]
    todo = []
    reports = []
    for s in names:
        hw = system_hardware(catalog, s)
        if hw is None:
            reports.append(SystemReport(s, "", notes=[f"{s}: no catalog hardware has this id or alias; skipped"]))
            continue
        todo.append((s, hw))
    drop = implausible_moe_by_engine(root, known) if not families or "moe" in families else {}
    if jobs > 1 and len(todo) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs) as ex:
            futs = [ex.submit(fit_system, root, s, hw, families, drop) for s, hw in todo]
            reports += [f.result() for f in futs]
    else:
        reports += [fit_system(root, s, hw, families, drop) for s, hw in todo]
    if not any(r.curves for r in reports):
        notes = [n for r in reports for n in r.notes]
        why = notes[0] if notes else "no SYSTEM/FAMILY/ENGINE/*.parquet files of a known system"
        raise InputError(f"--data {root}: no kernel curve could be fitted ({why})")
    return reports


def kernel_block(rep: SystemReport, source: str, as_of: dt.date | None = None) -> KernelFits:
    return KernelFits(source=source, as_of=as_of or dt.date.today(), system=rep.system, curves=rep.curves, notes=rep.notes)
