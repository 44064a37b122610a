"""Readers and predictors of the communication kernel families (:mod:`planner.calib.kernels`): NCCL's and the
engines' collectives, DeepEP's low-latency dispatch and combine, and TensorRT-LLM's NVLink MoE all-to-all."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from planner.calib.kernel_rows import SYSTEM_GPUS_PER_NODE, Rows, _fastest, _need, _need_sizes, _version
from planner.catalog.schemas import HardwareSpec
from planner.errors import InputError
from planner.perf import kernels as K

ELEM_BYTES = {"half": 2.0, "float16": 2.0, "bfloat16": 2.0, "int8": 1.0, "float": 4.0, "fp8": 1.0}


def _collective_rows(df: pd.DataFrame, path: Path, hw: HardwareSpec, dtype_col: str) -> dict[str, Rows]:
    _need(df, path, ("op_name", "num_gpus", "message_size", dtype_col, "latency"))
    out = {}
    top = int(df["num_gpus"].max())
    for op, g in df.groupby("op_name"):
        if op not in K.BUS_FACTOR:
            continue
        unknown = set(g[dtype_col].astype(str)) - set(ELEM_BYTES)
        if unknown:
            raise InputError(f"{path}: {dtype_col} {sorted(unknown)[0]!r} is unknown (known: {', '.join(ELEM_BYTES)})")
        g = g.assign(bytes=g["message_size"].to_numpy(float) * g[dtype_col].map(ELEM_BYTES).to_numpy(float))
        g = _fastest(g, ["num_gpus", "bytes"])
        gp = g["num_gpus"].to_numpy(float)
        x = {"gpus": gp, "bytes": g["bytes"].to_numpy(float), "U": np.full(len(g), hw.scale_up_bw)}
        out[str(op)] = Rows(x, g["latency"].to_numpy(float) * 1e-3, gp == top, f"{top} GPUs (fitted on fewer)", _version(df))
    return out


def read_nccl(path: Path, hw: HardwareSpec, system: str) -> dict[str, Rows]:
    return _collective_rows(pd.read_parquet(path), path, hw, "nccl_dtype")


def read_custom_allreduce(path: Path, hw: HardwareSpec, system: str) -> dict[str, Rows]:
    df = pd.read_parquet(path)
    df = df.assign(op_name="all_reduce")
    return _collective_rows(df, path, hw, "allreduce_dtype")


def read_deepep(path: Path, hw: HardwareSpec, system: str) -> dict[str, Rows]:
    df = pd.read_parquet(path)
    cols = ("node_num", "num_token", "hidden_size", "num_topk", "num_experts", "dispatch_avg_t_us", "combine_avg_t_us")
    _need(df, path, cols)
    per_node = SYSTEM_GPUS_PER_NODE.get(system, 8)
    y = (df["dispatch_avg_t_us"].to_numpy(float) + df["combine_avg_t_us"].to_numpy(float)) * 1e-6
    ok = np.isfinite(y) & (y > 0)
    df, y = df[ok], y[ok]
    h = df["hidden_size"].to_numpy(float)
    x = {"tokens": df["num_token"].to_numpy(float), "hidden": h, "top_k": df["num_topk"].to_numpy(float),
         "gpus": df["node_num"].to_numpy(float) * per_node, "U": np.full(len(df), hw.scale_up_bw),
         "experts": df["num_experts"].to_numpy(float)}
    return {"fp8": Rows(x, y, h == 7168, "hidden 7168", _version(df))}


ALLTOALL_PAYLOAD = {"bfloat16": 2.0, "float16": 2.0, "fp8": 1.0 + 4.0 / 128.0, "nvfp4": 0.5 + 1.0 / 16.0}
"""Bytes per hidden element a TensorRT-LLM all-to-all dispatch moves in each ``moe_dtype`` of its collector (FP8
with a 4-byte scale per 128, NVFP4 with a 1-byte scale per 16); the combine returns bf16."""
ALLTOALL_KERNELS = {"NVLinkTwoSided": "", "NVLinkOneSided": "-onesided"}
"""Kernel path of each ``kernel_source``: the two-sided kernel is the one TensorRT-LLM's wide-EP MoE runs on a
multi-node NVLink domain (``select_alltoall_method_type``), so it carries the engine's name."""
ALLTOALL_HOLDOUT = 32
"""Ranks held out of the all-to-all fit: between 16 and 64 for the two-sided kernel, beyond its largest other group
(16) for the one-sided kernel, which was measured up to 32."""


def bench_fanout(tokens, experts, top_k, gpus) -> np.ndarray:
    """Mean distinct ranks per token of the collector's balanced routing (token ``i`` takes experts ``i k`` to
    ``i k + k - 1`` modulo ``E``, split contiguously over the ranks): one rank while a rank holds ``k`` or more
    experts, more beyond."""
    out = np.empty(len(tokens))
    for j, (n, e, k, g) in enumerate(zip(tokens, experts, top_k, gpus, strict=True)):
        e, k, g = int(e), int(k), max(int(g), 1)
        per = max(e // g, 1)
        i = np.arange(min(int(n), max(e // max(k, 1), 1)))
        first = (i * k) % e
        ranks = ((first[:, None] + np.arange(k)[None, :]) % e) // per
        out[j] = float(np.mean([len(set(r)) for r in ranks]))
    return out


def read_trtllm_alltoall(path: Path, hw: HardwareSpec, system: str) -> dict[str, Rows]:
    """TensorRT-LLM's NVLink MoE all-to-all (``comm/trtllm/trtllm_alltoall_perf``), one curve per kernel source over
    its dispatch calls (with the two-sided kernel's ``prepare``, which every dispatch runs first) and combine calls,
    all payload formats; held out: :data:`ALLTOALL_HOLDOUT` ranks."""
    df = pd.read_parquet(path)
    cols = ("op_name", "kernel_source", "moe_dtype", "num_tokens", "hidden_size", "topk", "num_experts", "moe_ep_size",
            "latency")
    _need(df, path, cols)
    _need_sizes(df, path, ("num_tokens", "hidden_size", "topk", "num_experts", "moe_ep_size"))
    for col, known in (("moe_dtype", ALLTOALL_PAYLOAD), ("kernel_source", ALLTOALL_KERNELS)):
        unknown = sorted(set(df[col].astype(str)) - set(known))
        if unknown:
            raise InputError(f"{path}: column {col} has unknown value {unknown[0]!r} (known: "
                             f"{', '.join(known)}); the family is skipped for this system")
    if "distribution" in df.columns:
        df = df[df["distribution"].astype(str) == "balanced"]
    keys = ["kernel_source", "moe_dtype", "num_tokens", "hidden_size", "topk", "num_experts", "moe_ep_size"]
    t = df.assign(latency=df["latency"].astype(float)).pivot_table(index=keys, columns="op_name", values="latency",
                                                                    aggfunc="median").reset_index()
    # the tray size prediction uses (planner.perf.compose.trtllm_exchange), so fit and use agree by construction
    node = float(hw.purchase_unit.host_chips)
    out: dict[str, Rows] = {}
    for src, g in t.groupby("kernel_source"):
        dispatch = g.get("alltoall_dispatch", pd.Series(np.nan, index=g.index)) + g.get(
            "alltoall_prepare", pd.Series(0.0, index=g.index)).fillna(0.0)
        parts = [(g, dispatch, g["moe_dtype"].map(ALLTOALL_PAYLOAD).to_numpy(float)),
                 (g, g.get("alltoall_combine", pd.Series(np.nan, index=g.index)), np.full(len(g), 2.0))]
        xs, ys = [], []
        for frame, sec, per_el in parts:
            y = np.asarray(sec, dtype=float) * 1e-3
            ok = np.isfinite(y) & (y > 0)
            f = frame[ok]
            gpus = f["moe_ep_size"].to_numpy(float)
            tok = f["num_tokens"].to_numpy(float)
            xs.append({"tokens": tok, "payload": f["hidden_size"].to_numpy(float) * per_el[ok],
                       "fanout": bench_fanout(tok, f["num_experts"].to_numpy(float), f["topk"].to_numpy(float), gpus),
                       "gpus": gpus, "node": np.full(len(f), node)})
            ys.append(y[ok])
        x = {k: np.concatenate([d[k] for d in xs]) for k in xs[0]}
        y = np.concatenate(ys)
        kernel = ALLTOALL_KERNELS[src]
        out["nvlink" + kernel] = Rows(x, y, x["gpus"] == ALLTOALL_HOLDOUT, f"{ALLTOALL_HOLDOUT} ranks",
                                      _version(df), kernel=kernel)
    return out


def _collective(op: str):
    def f(p, x):
        return K.collective_time(p, op, x["gpus"], x["bytes"], x["U"])

    return f


def _predict_deepep(p, x):
    return K.deepep_time(p, x["tokens"], x["hidden"], x["top_k"], x["gpus"], x["U"], experts=x["experts"])


def _predict_alltoall(p, x):
    return K.alltoall_time(p, x["tokens"], x["payload"], x["fanout"], x["gpus"], x["node"])
