"""SI constants and converters.

Catalog files carry their unit in each key (``hbm_bandwidth_tb_s``); the loader converts to SI once
with these constants. Inside ``perf/`` and ``model/`` everything is SI: bytes, seconds, FLOP/s, USD.
Decimal prefixes (GB = 1e9 bytes) are used throughout, as datasheets do.
"""

from __future__ import annotations

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
GIB = 2.0**30

TFLOPS = 1e12
"""One TFLOP/s in FLOP/s."""

US = 1e-6
MS = 1e-3
HOUR_S = 3600.0
MTOK = 1e6

# Bytes per element of each number format, including the block-scale overhead of the
# micro-scaled formats: NVFP4 stores one FP8 scale per 16 values, MXFP4 one E8M0 scale per 32.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "fp4": 0.5 + 1.0 / 16.0,
    "int4": 0.5 + 2.0 / 32.0,
}

# Which compute format a weight format runs its matrix multiplications in, in order of preference.
# A chip without FP4 tensor cores runs FP4 (and INT4) weights with BF16 maths after dequantisation (W4A16).
COMPUTE_FALLBACK: dict[str, tuple[str, ...]] = {
    "fp32": ("bf16",),
    "bf16": ("bf16",),
    "fp16": ("bf16",),
    "fp8": ("fp8", "int8", "bf16"),
    "int8": ("int8", "fp8", "bf16"),
    "fp4": ("fp4", "bf16"),
    "int4": ("bf16",),
}

DTYPES = tuple(DTYPE_BYTES)


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of ``dtype`` (KeyError for an unknown format)."""
    return DTYPE_BYTES[dtype]
