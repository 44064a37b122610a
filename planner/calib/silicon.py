"""Silicon factors from a system's own kernel curves, where its end-to-end rows cannot set them.

The end-to-end fit (:mod:`planner.calib.fit`) sets each hardware's compute and memory factors from measured serving
rows. Two cases have no such row: a maths format that none of the hardware's rows runs (FP4 experts on H100/H200,
whose MXFP4 MoE kernels dequantise to bf16 maths), and hardware without serving rows at all (B300, GB300), which
took its relative's factors whole, datasheet ratios included. Both have measured kernels, so their silicon comes
from those:

- **absolute** (a format without rows on a measured hardware): the factor is the fraction of the format's datasheet
  peak that the system's fitted kernel curves reach on a large reference shape (:data:`GEMM_REF`, :data:`MOE_REF`);
- **relative** (a hardware transferred from a measured relative): the relative's fitted factor times the ratio of
  the two systems' kernel fractions, so the engine behaviour the fit absorbed carries over and the silicon
  difference comes from the kernels (B300's FP4 tensor peak is 1.56x B200's on the datasheet; its measured FP4
  GEMMs run 1.08-1.16x faster; `python bench/kernel_silicon.py`).

Each fraction is the geometric mean over the two kernel families that run the format (dense GEMM and fused MoE;
one where the system has only one), with this engine's curves where it has them (else another engine's, as
:meth:`planner.catalog.kernel_fits.KernelFits.curve` picks). Where the roofline step times the fused MoE layers by the
system's own curve (``KernelFits.terms`` holds ``moe``, every NVIDIA block today) the compute factors time only the
other GEMMs (attention projections, dense layers, shared experts), so they take the dense GEMM curve's fraction alone
(the MoE curve's, far lower, once set B200's FP8 factor to 0.31 where its GEMMs reach 0.58). Memory: the
weight-streaming rate of a decode-sized bf16 GEMM over the datasheet bandwidth.
"""

from __future__ import annotations

import math

from planner.catalog import EngineEfficiency
from planner.catalog.schemas import HardwareSpec
from planner.perf import kernels as K
from planner.perf.compose import GEMM_FORMAT, MATHS, MOE_FORMAT, pick
from planner.units import dtype_bytes

FORMAT_FACTORS = {"compute": "bf16", "compute_fp8": "fp8", "compute_fp4": "fp4"}
"""Compute factors of the efficiency block and the weight format each one times."""
SILICON_FACTORS = (*FORMAT_FACTORS, "memory")
GEMM_REF = (4096.0, 8192.0, 8192.0)
"""(m, n, k) of the reference dense GEMM: large enough that tiles fill the machine."""
MOE_REF = (16384.0, 4096.0, 2048.0, 8.0, 128.0)
"""(tokens, hidden, expert columns, top-k, experts) of the reference fused MoE layer: 1,024 rows per expert."""
STREAM_REF = (16.0, 8192.0, 8192.0)
"""(m, n, k) of the reference weight-streaming GEMM (a decode batch of 16)."""


def _gemm_fraction(hw: HardwareSpec, engine: str | None, fmt: str) -> float | None:
    p, f = pick(hw.efficiency.kernels, "gemm", engine, GEMM_FORMAT.get(fmt, (fmt,)))
    if p is None:
        return None
    m, n, k = GEMM_REF
    t = float(K.gemm_time(p, m, n, k, hw.flops(MATHS[f]), hw.hbm_bw, dtype_bytes(fmt)))
    return 2.0 * m * n * k / (t * hw.flops(fmt))


def _moe_fraction(hw: HardwareSpec, engine: str | None, fmt: str) -> float | None:
    p, f = pick(hw.efficiency.kernels, "moe", engine, MOE_FORMAT.get(fmt, (fmt,)))
    if p is None:
        return None
    tokens, hidden, inter, top_k, experts = MOE_REF
    t = float(K.moe_time(p, tokens, hidden, inter, top_k, experts, experts, hw.flops(MATHS[f]), hw.hbm_bw,
                         dtype_bytes(fmt)))
    return 2.0 * tokens * top_k * 3.0 * hidden * inter / (t * hw.flops(fmt))


def kernel_fractions(hw: HardwareSpec, engine: str | None) -> dict[str, float]:
    """The silicon factors (:data:`SILICON_FACTORS`) that ``hw``'s kernel curves set for ``engine``: a factor is
    missing where no curve runs its format."""
    if hw.efficiency.kernels is None:
        return {}
    out: dict[str, float] = {}
    # where the step times the fused MoE layers by the system's own curve, the compute factors time the other GEMMs
    # alone: the dense GEMM curve's fraction, not its mean with the MoE curve's
    moe_timed = "moe" in (hw.efficiency.kernels.terms or [])
    for factor, fmt in FORMAT_FACTORS.items():
        gemm, moe = _gemm_fraction(hw, engine, fmt), _moe_fraction(hw, engine, fmt)
        vals = [gemm] if moe_timed and gemm and gemm > 0 else [v for v in (gemm, moe) if v and v > 0]
        if vals:
            out[factor] = math.exp(sum(math.log(v) for v in vals) / len(vals))
    p, _ = pick(hw.efficiency.kernels, "gemm", engine, ("bf16",))
    if p is not None:
        m, n, k = STREAM_REF
        t = float(K.gemm_time(p, m, n, k, hw.flops("bf16"), hw.hbm_bw, 2.0)) - p["t0_us"] * K.US
        out["memory"] = (2.0 * n * k + 2.0 * m * (n + k)) / (t * hw.hbm_bw)
    return out


def _clip(v: float) -> float:
    return float(round(min(max(v, 0.05), 1.0), 4))


def absolute(block: EngineEfficiency, hw: HardwareSpec, engine: str | None, factors) -> tuple[EngineEfficiency, list[str]]:
    """``block`` with each of ``factors`` set to ``hw``'s kernel fraction (where a curve runs its format), and the
    factors set."""
    kf = kernel_fractions(hw, engine)
    upd = {f: _clip(kf[f]) for f in factors if f in kf}
    return block.model_copy(update=upd), sorted(upd)


def relative(block: EngineEfficiency, hw: HardwareSpec, rel: HardwareSpec, engine: str | None,
             factors=SILICON_FACTORS) -> tuple[EngineEfficiency, list[str]]:
    """``block`` (fitted on ``rel``) moved to ``hw``: each factor times ``hw``'s kernel fraction over ``rel``'s (both
    systems need a curve of the format), and the factors moved. A format factor of 0 (``as compute``) is resolved
    first, so each format scales by its own ratio."""
    own, theirs = kernel_fractions(hw, engine), kernel_fractions(rel, engine)
    upd = {}
    for f in factors:
        if f in own and f in theirs and theirs[f] > 0:
            base = getattr(block, f) or block.compute
            upd[f] = _clip(base * own[f] / theirs[f])
    return block.model_copy(update=upd), sorted(upd)
