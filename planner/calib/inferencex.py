"""Read SemiAnalysis InferenceX benchmark runs (``shared/calibration/inferencex/dsr1_runs.json``) into the
normalised frame ``predict`` and ``fit`` use (see :mod:`planner.calib.data`).

One JSON object per run. The benchmark's conventions, checked on the file and on the InferenceX launch
scripts, that the reading below follows:

- A worker's GPUs are ``num_*_gpu / *_num_workers`` for disaggregated runs and ``decode_tp`` for
  aggregated runs (whose ``num_*_gpu`` fields hold ``tp * ep``); ``output_tput_per_gpu`` divides the
  output tokens/s by the decode GPUs (all GPUs of an aggregated run), ``input_tput_per_gpu`` the input
  tokens/s by the prefill GPUs, and ``tput_per_gpu`` both by all GPUs (identities hold on every run).
- ``*_dp_attention`` true: attention runs data-parallel on every GPU of the worker and the experts are
  split ``*_ep`` ways (DeepEP / MoRI all-to-all); where a worker of several GPUs records tp 1 and ep 1
  (Dynamo SGLang on GB200) the fields were not filled in and the experts span the worker. Expert
  degrees that do not divide the experts run with the fewest redundant experts that make them divide
  (SGLang ``--ep-num-redundant-experts``, e.g. EP48 with 32).
- Without attention data parallelism, attention is tensor-parallel over the worker's GPUs.
- Request lengths are drawn uniformly from ``[0.8 L, L]`` (``--random-range-ratio 0.8``): the mean is
  ``0.9 L``, which the measured end-to-end latency confirms (``median_e2el`` matches
  ``median_ttft + (0.9 osl - 1) median_tpot`` within 0.4% at the median over the file).
- Speculative decoding (``spec_method: mtp``) does not record its draft count; the launch scripts set it:
  TensorRT-LLM 3 MTP layers, 1 with attention data parallelism (``dsr1_fp8_b200_trt_mtp.sh``); SGLang 2
  EAGLE steps on NVIDIA (``dsr1_fp8_b200_mtp.sh``) and its DeepSeek default of 3 on AMD
  (``dsr1_fp8_mi355x_mtp.sh`` passes no step count); ATOM the checkpoint's one MTP layer.
- KV-cache format: FP8 for TensorRT-LLM and ATOM (``kv_cache_config.dtype fp8``, ``--kv_cache_dtype fp8``) and
  for SGLang on Blackwell (``--kv-cache-dtype fp8_e4m3`` with the trtllm_mla backend); BF16 for SGLang on
  Hopper and AMD (no KV dtype flag).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from planner.catalog import Catalog
from planner.errors import InputError

FIELDS = (
    "hardware", "framework", "model", "precision", "spec_method", "disagg", "prefill_tp", "prefill_ep",
    "prefill_dp_attention", "prefill_num_workers", "decode_tp", "decode_ep", "decode_dp_attention",
    "decode_num_workers", "num_prefill_gpu", "num_decode_gpu", "isl", "osl", "conc",
)
"""Fields every run must carry to be predicted (a missing one is named in the run's note)."""
METRICS = ("median_ttft", "median_tpot", "output_tput_per_gpu")
"""Measured fields (seconds, seconds, tokens/s per GPU) compared with the predictions."""
RUN_REQUESTS_PER_CLIENT = 10.0
"""Requests in a run per client kept in flight: the launch scripts run ``--num-prompts $((CONC * 10))
--max-concurrency $CONC`` (``benchmarks/single_node/*.sh``), so a run is ten requests a client."""

LENGTH_MEAN = 0.9
"""Mean request length over the nominal ``isl`` / ``osl``: lengths are uniform in ``[0.8 L, L]``."""

PRECISION = {"fp8": ("fp8", "fp8"), "fp4": ("fp8", "fp4")}
"""``precision`` -> (dense, expert) weight formats: the FP4 checkpoints (NVFP4, MXFP4) quantise the routed
experts; attention and the dense layers stay FP8 (``SGLANG_NVFP4_CKPT_FP8_GEMM_IN_ATTN``)."""


def mtp_drafts(engine: str, vendor: str, dp_attention: bool) -> float:
    """Draft tokens per step of an InferenceX MTP run (see the module docstring for the scripts read)."""
    if engine == "trtllm":
        return 1.0 if dp_attention else 3.0
    if engine == "sglang":
        return 2.0 if vendor == "nvidia" else 3.0
    return 1.0


RANDOM_DECODE_ROUTERS = frozenset({"mori-sglang"})
"""Frameworks whose disaggregated runs send each request to a decode worker at random: AMD's MoRI launcher that the
InferenceX script ``dsr1_fp8_mi355x_sglang-disagg.sh`` checks out (billishyahao/sglang_disagg
``sglang_disagg_server.sh``) starts SGLang's router with ``--decode-policy random``. Dynamo's frontend routes round
robin by default and the InferenceX Dynamo scripts do not change it, TensorRT-LLM's disaggregated server likewise."""


def random_decode_route(framework) -> bool:
    """Whether a run of ``framework`` places its requests on decode workers at random (:data:`RANDOM_DECODE_ROUTERS`)."""
    return str(framework) in RANDOM_DECODE_ROUTERS


def kv_format(engine: str, hw) -> str:
    if engine in ("trtllm", "atom"):
        return "fp8"
    if engine == "sglang" and hw is not None and hw.vendor == "nvidia" and "fp4" in hw.dense_tflops:
        return "fp8"
    return "bf16"


def looks_like_runs(data) -> bool:
    """Whether parsed JSON is an InferenceX run list (objects with a framework, a hardware and metrics)."""
    return (
        isinstance(data, list)
        and len(data) > 0
        and any(isinstance(r, dict) and {"hardware", "framework", "metrics"} <= set(r) for r in data[:50])
    )


def read_runs(path: Path | str) -> pd.DataFrame:
    """One row per run, in file order: the run's fields, the metrics flattened as ``metrics.*``, its
    ``run_index`` and ``missing`` (the first required field it lacks, or "")."""
    from planner.catalog.inputs import load_json

    path = Path(path)
    data = load_json(path)
    if not looks_like_runs(data):
        raise InputError(
            f"{path}: not an InferenceX run list (expected a JSON array of objects with hardware, framework and "
            "metrics fields) nor the silicon_calibration.csv format"
        )
    rows = []
    for i, r in enumerate(data):
        if not isinstance(r, dict):
            rows.append({"run_index": i, "missing": "the run is not a JSON object"})
            continue
        flat = {k: v for k, v in r.items() if k != "metrics" and not isinstance(v, (dict, list))}
        metrics = r.get("metrics")
        miss = next((f for f in FIELDS if r.get(f) is None), None)
        if isinstance(metrics, dict):
            for k, v in metrics.items():
                if not isinstance(v, (dict, list)):
                    flat[f"metrics.{k}"] = v
        elif miss is None:
            miss = "metrics"
        flat["run_index"] = i
        flat["missing"] = f"missing field '{miss}'" if miss else ""
        rows.append(flat)
    df = pd.DataFrame(rows)
    for f in FIELDS:
        if f not in df.columns:
            df[f] = np.nan
    for m in METRICS:
        if f"metrics.{m}" not in df.columns:
            df[f"metrics.{m}"] = np.nan
    return df


def _int(v) -> float:
    """A positive whole number, else NaN (``True``/``False`` and strings are not layout degrees)."""
    if isinstance(v, bool) or v is None:
        return np.nan
    try:
        x = float(v)
    except (TypeError, ValueError):
        return np.nan
    return x if np.isfinite(x) and x == int(x) and x >= 0 else np.nan


def _show(v) -> str:
    """A field's value as the file wrote it (whole numbers without the float ``.0`` pandas adds)."""
    if isinstance(v, float) and np.isfinite(v) and v == int(v):
        return str(int(v))
    return str(v)


def _bool(v) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    return None


def normalise_runs(df: pd.DataFrame, catalog: Catalog) -> pd.DataFrame:
    """The normalised frame of :func:`planner.calib.data.normalise` for InferenceX runs, with the measured
    ``m_ttft``, ``m_tpot`` (ms) and ``m_otpg`` (output tokens/s per GPU) and ``n_gpus_out`` (the GPUs the
    benchmark divides output throughput by)."""
    from planner.calib.checks import finish

    cols: dict[str, list] = {k: [] for k in (
        "n_model", "n_hw", "n_engine", "n_mode", "n_dense", "n_expert", "n_kv", "n_isl", "n_osl", "n_conc", "n_spec",
        "a_tp", "a_pp", "a_dp", "a_ep", "a_red", "a_batch", "p_tp", "p_pp", "p_dp", "p_ep", "p_red", "p_workers",
        "d_tp", "d_pp", "d_dp", "d_ep", "d_red", "d_workers", "d_batch", "n_gpus_out", "reason",
    )}
    for _, r in df.iterrows():
        v = _run(r, catalog)
        for k in cols:
            cols[k].append(v.get(k, np.nan if k != "reason" else ""))
    out = pd.DataFrame(cols, index=df.index)
    out["n_workers_assumed"] = False
    # The benchmark client draws lengths in [0.8 L, L] and runs 10 x conc requests: after the first wave its
    # clients no longer arrive together (staggered arrivals, ``perf.serving.staggered_wait``).
    out["n_staggered"] = True
    out["n_requests"] = RUN_REQUESTS_PER_CLIENT * out["n_conc"]
    out["n_framework"] = df["framework"].astype(str)
    out["n_series"] = df["framework"].astype(str) + "|" + df["date"].astype(str) if "date" in df.columns else ""
    out["m_ttft"] = pd.to_numeric(df["metrics.median_ttft"], errors="coerce") * 1e3
    out["m_tpot"] = pd.to_numeric(df["metrics.median_tpot"], errors="coerce") * 1e3
    out["m_otpg"] = pd.to_numeric(df["metrics.output_tput_per_gpu"], errors="coerce")
    # the tails beside the medians, where the run records them (ms)
    for col, src in (("m_ttft_p99", "p99_ttft"), ("m_tpot_p99", "p99_tpot"), ("m_itl_p50", "median_itl"),
                     ("m_itl_p99", "p99_itl")):
        key = f"metrics.{src}"
        out[col] = pd.to_numeric(df[key], errors="coerce") * 1e3 if key in df.columns else np.nan
    reason = out.pop("reason")
    return finish(out, reason, catalog, names=_NAMES)


_NAMES = {
    "a": {"tp": "decode_tp", "ep": "decode_ep", "pp": "pp", "dp": "decode_dp_attention", "redundant": "redundant experts"},
    "p": {"tp": "prefill_tp", "ep": "prefill_ep", "pp": "pp", "dp": "prefill_dp_attention", "redundant": "redundant experts"},
    "d": {"tp": "decode_tp", "ep": "decode_ep", "pp": "pp", "dp": "decode_dp_attention", "redundant": "redundant experts"},
}


def _run(r: pd.Series, catalog: Catalog) -> dict:
    """Normalised fields of one run, or ``{"reason": ...}`` naming the field that stops it."""
    if r.get("missing"):
        return {"reason": str(r["missing"])}
    out: dict = {"reason": ""}
    mid = catalog.model_id(str(r["model"]))
    if mid is None:
        return {"reason": f"unknown model '{r['model']}' (field model)"}
    hid = catalog.hardware_id(str(r["hardware"]))
    if hid is None:
        return {"reason": f"unknown hardware '{r['hardware']}' (field hardware)"}
    eid = catalog.engine_id(str(r["framework"]))
    if eid is None:
        return {"reason": f"unknown engine '{r['framework']}' (field framework)"}
    hw = catalog.hardware[hid]
    prec = str(r["precision"]).strip().lower()
    if prec not in PRECISION:
        return {"reason": f"unknown precision '{r['precision']}' (field precision; fp8 or fp4)"}
    disagg = _bool(r["disagg"])
    if disagg is None:
        return {"reason": "field disagg must be true or false"}
    spec = str(r["spec_method"]).strip().lower()
    if spec not in ("none", "mtp"):
        return {"reason": f"unknown spec_method '{r['spec_method']}' (none or mtp)"}
    isl, osl, conc = _int(r["isl"]), _int(r["osl"]), _int(r["conc"])
    for name, x in (("isl", isl), ("osl", osl), ("conc", conc)):
        if not x > 0:
            return {"reason": f"field {name} must be a positive whole number"}
    out.update(n_model=mid, n_hw=hid, n_engine=eid, n_mode="disagg" if disagg else "agg", n_kv=kv_format(eid, hw),
               n_isl=isl * LENGTH_MEAN, n_osl=osl * LENGTH_MEAN, n_conc=conc)
    m = catalog.models[mid]
    dense, expert = PRECISION[prec]
    if not m.is_moe:
        expert = dense
    out.update(n_dense=dense, n_expert=expert)
    roles = (("p", "prefill_"), ("d", "decode_")) if disagg else (("a", "decode_"),)
    for role, pre in roles:
        tp, ep = _int(r[pre + "tp"]), _int(r[pre + "ep"])
        dpa = _bool(r[pre + "dp_attention"])
        if not tp >= 1 or not ep >= 1:
            return {"reason": f"fields {pre}tp and {pre}ep must be positive whole numbers"}
        if dpa is None:
            return {"reason": f"field {pre}dp_attention must be true or false"}
        if disagg:
            workers, gpus = _int(r[pre + "num_workers"]), _int(r[f"num_{pre}gpu"])
            if not workers >= 1:
                return {"reason": f"field {pre}num_workers is {_show(r[pre + 'num_workers'])}: a disaggregated run needs at least one"}
            if not gpus >= workers or gpus % workers:
                return {"reason": f"field num_{pre}gpu {_show(r[f'num_{pre}gpu'])} is not a multiple of {pre}num_workers {int(workers)}"}
            g = gpus / workers
        else:
            workers, g = 1.0, tp
        if dpa:
            lay = {"tp": 1.0, "dp": g, "ep": ep if ep > 1 or tp > 1 else g}
        else:
            lay = {"tp": g, "dp": 1.0, "ep": ep}
        if lay["ep"] > g:
            return {"reason": f"field {pre}ep {int(ep)} exceeds the worker's {int(g)} GPUs"}
        red = (-m.architecture.moe.experts) % lay["ep"] if m.is_moe and lay["ep"] > 1 else 0.0
        out.update({f"{role}_tp": lay["tp"], f"{role}_dp": lay["dp"], f"{role}_ep": lay["ep"], f"{role}_pp": 1.0,
                    f"{role}_red": float(red)})
        if role != "a":
            out[f"{role}_workers"] = workers
    if disagg:
        out["d_batch"] = conc / out["d_workers"]
        out["n_gpus_out"] = out["d_workers"] * out["d_tp"] * out["d_dp"]
        dpa_decode = out["d_dp"] > 1
    else:
        out["a_batch"] = conc
        out["n_gpus_out"] = out["a_tp"] * out["a_dp"]
        dpa_decode = out["a_dp"] > 1
    out["n_spec"] = mtp_drafts(eid, hw.vendor, bool(dpa_decode)) if spec == "mtp" else 0.0
    return out
