"""Published production deployments against the performance model (the catalog's fitted factors, no lookup).

Each case is a deployment an operator or engine team published with its layout and its measured throughput or
speed; the model predicts the same deployment from physics (kernel curves where the hardware has them) and the
fitted end-to-end factors, and the script prints predicted / published. A plan sizes fleets from exactly these
numbers, so a ratio of 0.5 here is a fleet planned twice too large, and 1.5 one planned a third too small.
Parameters a source does not publish are guessed and the case says so (``guessed``).

Sources (``../shared/reference/hardware-models.md`` section 8 names them): DS6 (DeepSeek's inference-system
overview), LMSYS-EP (SGLang, 96 H100, 2025-05-05), LMSYS-GB1 / LMSYS-GB2 (SGLang on GB200 NVL72, 2025-06-16 and
2025-09-25), TRTLLM-DSR1 (TensorRT-LLM's DeepSeek-R1 best-practice blog and its B200 min-latency tech blog),
TRTLLM-GPTOSS (NVIDIA/TensorRT-LLM ``docs/source/blogs/tech_blog/blog9_Deploying_GPT_OSS_on_TRTLLM.md`` @fbbc05dd),
TRN2-NXDI (aws-neuron/aws-neuron-sdk ``libraries/nxd-inference/tutorials/trn2-llama3.3-70b-tutorial.rst`` and
``llama70b_perf_comparison.csv`` @06f33784), POPE (Pope et al. 2022, "Efficiently Scaling Transformer Inference", PaLM 540B on TPU v4; values through the
secondary transcription the reference names), TRTLLM-BP (NVIDIA/TensorRT-LLM
``docs/source/blogs/Best_perf_practice_on_DeepSeek-R1_in_TensorRT-LLM.md`` @01c4ece9) and TRTLLM-PERF
(``docs/source/developer-guide/perf-overview.md`` @03e27c7d).

Cases:

- ``ds6-decode``: DeepSeek V3/R1 decode on H800, attention-DP144 EP144 (+32 redundant), two micro-batch overlap,
  one MTP draft, FP8, mean KV length 4,989: 14.8k output tokens/s per node at >= 20 tokens/s per user. Predicted:
  the largest batch meeting that speed.
- ``ds6-prefill``: prefill on H800 at attention-DP32 EP32 with overlap: 73.7k input tokens/s per node including
  cache hits (56.3%). Guessed: 4,096-token prompts, 16,384 tokens per GPU and pass.
- ``lmsys-prefill-{1k,2k,4k}``: SGLang on H100 at attention-DP32 EP32 with overlap: 57,674 / 54,543 / 50,302 input
  tokens/s per node. Guessed: 16,384 tokens per GPU and pass.
- ``lmsys-decode``: SGLang on H100 at attention-DP72 EP72 (+32 redundant), overlap, 2K inputs: 22,282 output
  tokens/s per node. Guessed: 256 sequences per GPU (or what the BF16 KV cache holds).
- ``gb200-decode-p1``: SGLang on GB200 NVL72, decode attention-DP48 EP48, FP8 experts and dense layers, BF16 KV,
  2,000-token inputs: 7,583 output tokens/s per GPU (LMSYS-GB1). Guessed: 32 redundant experts, overlap on, the
  batch the KV cache holds up to 1,024 per GPU.
- ``gb200-decode-p2-bf16kv`` / ``-fp8kv-nvfp4``: LMSYS-GB2, the same deployment with BF16 KV and FP8 experts (9,087
  output tokens/s per GPU) and with FP8 KV and NVFP4 experts (13,386). Guessed as above.
- ``gb200-prefill-p2-fp8`` / ``-nvfp4``: LMSYS-GB2 prefill of 2,000-token prompts: 18,471 and 26,156 input tokens/s
  per GPU. Guessed: attention-DP8 EP8 with overlap, 16,384 tokens per GPU and pass.
- ``trtllm-b200-maxtput-bf16kv`` / ``-fp8kv``, ``trtllm-h200-maxtput``, ``trtllm-b200-minlat``, ``trtllm-h200-minlat``:
  TensorRT-LLM's DeepSeek-R1 best-practice runs (TRTLLM-BP), each with its published trtllm-bench command: R1-FP4
  (FP8 dense, NVFP4 experts) on 8 B200 at attention-DP8 EP8, 3,072 requests in flight (384 a rank), BF16 KV, 1K/2K:
  4,548 output tokens/s per GPU; R1-0528-FP4 with FP8 KV, 7,168 in flight (896 a rank): 5,393; R1 FP8 on 8 H200 at
  attention-DP8 EP8, 1,024 in flight: 1,436; batch 1 with three MTP drafts at TP8 EP2 (B200) / TP8 EP4 (H200): 274.7
  / 158.1 tokens/s per user (output over the request's latency, prefill included). These are aggregated closed loops
  (each request's 1K prefill runs in the same engine), predicted as ``planner validate`` predicts a measured run
  (:func:`benchmark_run`). Guessed: the KV format where the command leaves the checkpoint's default, and the lengths of
  the FP8-KV run (the blog's 1K/2K). Their commands leave attention-DP balancing off (the engine's default), so these
  runs are predicted without it. The GTC claim of "over 30,000 tokens/s per node" that this file used before, with
  a guessed batch, is replaced by these.
- ``trt-<model>-<gpu>-<layout>-<isl><osl>``: TensorRT-LLM's perf overview (TRTLLM-PERF): maximum-throughput
  trtllm-bench runs of DeepSeek-R1-0528, gpt-oss-120b, Llama 3.3 70B (evaluated as Llama 3.1 70B, the same
  architecture) and Qwen3-235B-A22B on B200, GB200, H200 and H100 at the published layout and precision, every request
  of the dataset queued at once. The commands give no batch, so each rank admits at most what trtllm-bench's own
  heuristic picks (:func:`trtllm_bench_settings`, ``tensorrt_llm/bench/build/tuning.py``: ``calc_engine_setting``),
  and no more than the KV cache holds. That heuristic charges DeepSeek's MLA cache as 128 heads of 56 elements, ~25x
  what the latent cache keeps (and the FP8 checkpoint's, which records no KV format, at 2 bytes an element), so DeepSeek
  runs at 64-384 sequences a rank, not the ~1,000 the cache would hold; gpt-oss's
  MXFP4 checkpoint has no heuristic and gets the default 2,048. Guessed: ``--kv_cache_free_gpu_mem_fraction 0.95`` (the
  overview's "in many cases") and the checkpoint's element count from the catalog's parameters. The DeepSeek runs
  balance prompts over attention-DP ranks (``attention_dp_config.enable_balance``, as published).
- ``trtllm-gptoss-b200-bs1`` / ``trtllm-gptoss-b200-dep4-maxtput``: TensorRT-LLM's gpt-oss-120b deployment blog
  (TRTLLM-GPTOSS), trtllm-bench on 1K/2K requests: one request at a time on 8 B200 at TP8 EP1 (its low-latency
  command): 420 tokens/s per user; 2,560 in flight (640 a rank) on 4 B200 at attention-DP4 EP4: 19.5k output tokens/s
  per GPU. MXFP4 experts, bf16 dense layers. Guessed: BF16 KV (the commands leave the checkpoint's default), per-user
  speed as output over the request's latency (prefill included), as for the DeepSeek batch-1 runs.
- ``trn2-llama70b-bs1-tpot`` / ``-ttft``: AWS Neuron's Llama-3.3-70B tutorial on one trn2.48xlarge (TRN2-NXDI:
  16 Trainium2 chips, BF16, TP64 over the 64 logical cores, NxD Inference under vLLM), LLMPerf at one request at a
  time, 10,000 input and 1,500 output tokens: p50 TPOT 19.8 ms and p50 TTFT 575.6 ms, given as 1 / TPOT (tokens/s per
  user) and 1 / TTFT (prefills/s) so that above 1 is too fast as everywhere here. Our layout: TP16 over the 16 chips
  (the chip is the planner's unit), evaluated as Llama 3.1 70B (the same architecture). Trainium2's factors are
  transferred, with its per-step cost and prefill rate anchored on the same series' Llama-3.1-405B run
  (``catalogs/measured/trn2-nxdi.csv``, :mod:`planner.calib.anchor`); this 70B run is in no fit, so it checks the
  anchor on a model it has not seen.
- ``palm-tpu-v4-decode``: PaLM 540B, int8 weights, 64 TPU v4 chips, batch 64, 2,048-token context: 1.82 s for 64
  generated tokens, 35.2 tokens/s per user (POPE Table 2, low-latency). Our layout: TP64 is not a divisor of 48
  heads (the paper pads them to 64) and the paper's 2D weight-stationary layout is not one of ours: the case
  uses TP64 over the 48 heads, a guess.

Usage: ``python bench/production_check.py [--json]``: the table, then median error factor and share within
[0.85, 1.15].
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.calib.predict import predict_normalised, queued_run  # noqa: E402
from planner.catalog import load_catalog  # noqa: E402
from planner.perf.layout import Layout, expert_copies  # noqa: E402
from planner.perf.params import weight_bytes  # noqa: E402
from planner.perf.report import prefill_roofline, roofline  # noqa: E402
from planner.perf.roofline import Setup  # noqa: E402
from planner.perf.serving import kv_capacity_sequences  # noqa: E402
from planner.units import dtype_bytes  # noqa: E402

GPUS_PER_NODE = 8
TOKENS_PER_GPU_PASS = 16384


def _setup(cat, model: str, hw: str, engine: str, *, dense="fp8", expert=None, kv="fp8", spec=0, tbo=1.0) -> Setup:
    h = cat.hardware[hw]
    m = cat.models[model]
    return Setup(m, h, h.efficiency.for_engine(engine), dense, expert or dense, kv, spec_tokens=spec, tbo=tbo,
                 engine=engine)


def decode_at_speed(setup: Setup, layout: Layout, context: float, min_user_tps: float) -> dict:
    """Per-node output tokens/s at the largest batch (per GPU, 1 to 512) whose per-user speed meets ``min_user_tps``."""
    best = None
    for per_gpu in range(1, 513):
        r = roofline(setup, layout, per_gpu * layout.chips, context, mode="calibrated", engine=setup.engine)
        if not r.fits or r.tokens_per_s_per_user < min_user_tps:
            break
        best = (per_gpu, r)
    if best is None:
        return {"predicted": 0.0, "batch_per_gpu": 0, "user_tps": 0.0}
    per_gpu, r = best
    return {"predicted": r.tokens_per_s / layout.chips * GPUS_PER_NODE, "batch_per_gpu": per_gpu,
            "user_tps": r.tokens_per_s_per_user, "step_ms": r.step_time_s * 1e3}


def decode_at_batch(setup: Setup, layout: Layout, context: float, per_gpu: float, per: int = GPUS_PER_NODE) -> dict:
    """Output tokens/s per ``per`` GPUs at ``per_gpu`` sequences per GPU, or what the KV cache holds."""
    s = replace(setup, expert_copies=expert_copies(setup.model, layout.redundant))
    cap = float(np.asarray(kv_capacity_sequences(s, layout.tp, layout.ep, layout.pp, layout.dp, context)))
    batch = min(per_gpu * layout.chips, cap)
    r = roofline(setup, layout, batch, context, mode="calibrated", engine=setup.engine)
    return {"predicted": r.tokens_per_s / layout.chips * per, "batch_per_gpu": batch / layout.chips,
            "user_tps": r.tokens_per_s_per_user, "step_ms": r.step_time_s * 1e3}


def user_speed(setup: Setup, layout: Layout, context: float, batch: float) -> dict:
    r = roofline(setup, layout, batch, context, mode="calibrated", engine=setup.engine)
    return {"predicted": r.tokens_per_s_per_user, "batch_per_gpu": batch / layout.chips, "step_ms": r.step_time_s * 1e3,
            "fits": r.fits}


def prefill(setup: Setup, layout: Layout, prompt: float, cached_share: float = 0.0, per: int = GPUS_PER_NODE) -> dict:
    new = prompt * (1.0 - cached_share)
    prompts = TOKENS_PER_GPU_PASS * layout.chips / new
    r = prefill_roofline(setup, layout, prompts, new, prefix=prompt - new, mode="calibrated", engine=setup.engine)
    return {"predicted": r.tokens_per_s_per_gpu * per * prompt / new, "pass_s": r.pass_time_s,
            "mfu": r.model_flops_utilisation}


def benchmark_row(model: str, hw: str, engine: str, *, dense: str, expert: str, kv: str, isl: float, osl: float,
                  conc: float, tp: int, ep: int, dp: int, spec: float = 0.0, balance: bool | None = None) -> dict:
    """The normalised row (``planner.calib.data`` columns) of an aggregated closed-loop run of ``conc`` clients on one
    replica of ``tp x dp`` GPUs (see :func:`benchmark_run`)."""
    return dict(n_model=model, n_hw=hw, n_engine=engine, n_mode="agg", n_dense=dense, n_expert=expert, n_kv=kv,
                n_isl=float(isl), n_osl=float(osl), n_conc=float(conc), n_spec=float(spec), a_tp=float(tp), a_pp=1.0,
                a_dp=float(dp), a_ep=float(ep), a_batch=float(conc), a_red=0.0, n_workers_assumed=False,
                n_gpus_out=float(tp * dp), n_staggered=False, reason="", d_batch=np.nan, d_workers=np.nan,
                n_adp_balance=balance)


def benchmark_run(cat, model: str, hw: str, engine: str, *, dense: str, expert: str, kv: str, isl: float, osl: float,
                  conc: float, tp: int, ep: int, dp: int, spec: float = 0.0, per_user: bool = False,
                  balance: bool | None = None, requests: float | None = None) -> dict:
    """An aggregated benchmark (``trtllm-bench throughput``: ``conc`` requests in flight, each a prefill of ``isl``
    tokens and ``osl`` decode steps on the same engine, admitted as the KV cache allows) predicted as ``planner
    validate`` predicts a measured run: output tokens/s per GPU, or per user (``per_user``: ``osl`` over the request's
    latency, its prefill included, as trtllm-bench reports it). ``balance``: whether the run's attention-DP ranks take
    their prompts in the same steps (``attention_dp_config.enable_balance``; None: the engine's catalog default).
    ``requests``: the dataset's request count, all queued at once with equal lengths, so the run is waves of what fits
    and a last partial wave (:func:`planner.calib.predict.queued_run`); None: the steady closed loop."""
    row = pd.DataFrame([benchmark_row(model, hw, engine, dense=dense, expert=expert, kv=kv, isl=isl, osl=osl,
                                      conc=conc, tp=tp, ep=ep, dp=dp, spec=spec, balance=balance)])
    p = (predict_normalised(row, cat) if requests is None else queued_run(row, cat, requests)).iloc[0]
    ttft_s, tpot_s = p["predicted_ttft_ms"] / 1e3, p["predicted_tpot_ms"] / 1e3
    out = {"ttft_s": ttft_s, "tpot_ms": tpot_s * 1e3}
    if requests is not None:
        out["waves"] = f"{int(p['waves'])} x {int(p['in_flight'])} + {int(p['last_wave'])}"
    if per_user:
        return {"predicted": osl / (ttft_s + (osl - 1.0) * tpot_s), **out}
    return {"predicted": float(p["predicted_output_tput_per_gpu"]), **out}


def cases(cat) -> list[dict]:
    ds = "deepseek-v3"
    ep144, ep32, ep72 = Layout(1, 144, 1, 144, 32), Layout(1, 32, 1, 32, 0), Layout(1, 72, 1, 72, 32)
    ep48, ep8 = Layout(1, 48, 1, 48, 32), Layout(1, 8, 1, 8, 0)
    out = [dict(case="ds6-decode", published=14_800.0, unit="output tok/s/node", source="DS6",
                **decode_at_speed(_setup(cat, ds, "h800-sxm", "sglang", spec=1), ep144, 4989.0, 20.0)),
           dict(case="ds6-prefill", published=73_700.0, unit="input tok/s/node (cache hits included)", source="DS6",
                guessed="prompt 4,096 tokens; 16,384 tokens per GPU and pass",
                **prefill(_setup(cat, ds, "h800-sxm", "sglang"), ep32, 4096.0, cached_share=0.563))]
    for k, pub in ((1024, 57_674.0), (2048, 54_543.0), (4096, 50_302.0)):
        out.append(dict(case=f"lmsys-prefill-{k // 1024}k", published=pub, unit="input tok/s/node", source="LMSYS-EP",
                        guessed="16,384 tokens per GPU and pass",
                        **prefill(_setup(cat, ds, "h100-sxm", "sglang"), ep32, float(k))))
    out.append(dict(case="lmsys-decode", published=22_282.0, unit="output tok/s/node", source="LMSYS-EP",
                    guessed="256 sequences per GPU or what BF16 KV holds",
                    **decode_at_batch(_setup(cat, ds, "h100-sxm", "sglang", kv="bf16"), ep72, 2048.0 + 50.0, 256.0)))
    gb = "gb200-nvl72"
    guess_gb = "32 redundant experts; overlap on; the batch the KV cache holds up to 1,024 per GPU"
    out.append(dict(case="gb200-decode-p1", published=7_583.0, unit="output tok/s/GPU", source="LMSYS-GB1",
                    guessed=guess_gb,
                    **decode_at_batch(_setup(cat, ds, gb, "sglang", kv="bf16"), ep48, 2000.0 + 50.0, 1024.0, per=1)))
    out.append(dict(case="gb200-decode-p2-bf16kv", published=9_087.0, unit="output tok/s/GPU", source="LMSYS-GB2",
                    guessed=guess_gb,
                    **decode_at_batch(_setup(cat, ds, gb, "sglang", kv="bf16"), ep48, 2000.0 + 50.0, 1024.0, per=1)))
    out.append(dict(case="gb200-decode-p2-fp8kv-nvfp4", published=13_386.0, unit="output tok/s/GPU", source="LMSYS-GB2",
                    guessed=guess_gb,
                    **decode_at_batch(_setup(cat, ds, gb, "sglang", expert="fp4", kv="fp8"), ep48, 2000.0 + 50.0,
                                      1024.0, per=1)))
    guess_pf = "attention-DP8 EP8 with overlap; 16,384 tokens per GPU and pass"
    out.append(dict(case="gb200-prefill-p2-fp8", published=18_471.0, unit="input tok/s/GPU", source="LMSYS-GB2",
                    guessed=guess_pf, **prefill(_setup(cat, ds, gb, "sglang", kv="bf16"), ep8, 2000.0, per=1)))
    out.append(dict(case="gb200-prefill-p2-nvfp4", published=26_156.0, unit="input tok/s/GPU", source="LMSYS-GB2",
                    guessed=guess_pf, **prefill(_setup(cat, ds, gb, "sglang", expert="fp4"), ep8, 2000.0, per=1)))
    out += trtllm_cases(cat)
    out += small_moe_and_trainium_cases(cat)
    palm = _setup(cat, "palm-540b", "tpu-v4", "jetstream" if "jetstream" in cat.engines else "vllm",
                  dense="int8", kv="bf16", tbo=0.0)
    out.append(dict(case="palm-tpu-v4-decode", published=64 / 1.82, unit="output tok/s/user", source="POPE",
                    guessed="TP64 over the 48 heads (the paper pads them to 64 and uses a 2D weight-stationary layout)",
                    **user_speed(palm, Layout(64, 1, 1, 1, 0), 2048.0 + 32.0, 64.0)))
    for c in out:
        c["ratio"] = c["predicted"] / c["published"]
    return out


TRT_BP = ("TRTLLM-BP: NVIDIA/TensorRT-LLM docs/source/blogs/Best_perf_practice_on_DeepSeek-R1_in_TensorRT-LLM.md "
          "@01c4ece9 (trtllm-bench; B200 max-throughput reproduced at TensorRT-LLM b6261862)")
TRT_PERF = ("TRTLLM-PERF: NVIDIA/TensorRT-LLM docs/source/developer-guide/perf-overview.md @03e27c7d (trtllm-bench "
            "throughput, all requests queued at once)")
PERF_GUESS = ("requests in flight: the dataset's count (3,000 at 1K/1K, 1,500 at 8K/1K and 1K/8K), at most trtllm-bench's "
              "heuristic max_batch_size a rank and what the KV cache holds; KV memory fraction 0.95; the NVIDIA checkpoints' "
              "KV format FP8 in that heuristic (as nvidia/Qwen3-235B-A22B-NVFP4's and nvidia/Llama-3.1-70B-Instruct-FP8's "
              "configs record, and the R1-0528 FP4 checkpoints per TRTLLM-BP)")
PERF_REQUESTS = {(1024, 1024): 3000.0, (8192, 1024): 1500.0, (1024, 8192): 1500.0}
BENCH_QUANT_BYTES = {"nvfp4": 0.5, "fp8": 1.0, "bf16": 2.0}
"""Bytes per stored element trtllm-bench's heuristic charges a checkpoint of each quantisation (``BYTES_PER_ELEM`` of
``tensorrt_llm/bench/build/tuning.py``); a quantisation it has no entry for (MXFP4: gpt-oss) gets no heuristic."""
BENCH_DEFAULT = (2048, 8192)
"""(max_batch_size, max_num_tokens) of ``BuildConfig``: what trtllm-bench uses for a quantisation without a heuristic."""
BENCH_MEM_FRACTION = 0.95
"""``--kv_cache_free_gpu_mem_fraction`` of the perf overview's runs ("in many cases ... 0.95"; guessed for each)."""


def _round_up(x: float, step: int) -> int:
    return int(step * math.ceil(x / step))


def trtllm_bench_settings(cat, model: str, hw: str, *, quant: str, dense: str, expert: str, kv: str, tp: int, pp: int,
                          isl: float, osl: float, checkpoint_kv: str | None = None) -> tuple[int, int]:
    """(max_batch_size per rank, max_num_tokens) that ``trtllm-bench throughput`` picks when the command gives neither
    (``get_benchmark_engine_settings`` -> ``calc_engine_setting`` and ``finetune_setting``, read at NVIDIA/TensorRT-LLM
    @04cba882), from the quantities it reads: the checkpoint's stored element count (safetensors: packed FP4 counts
    one element a byte, so an NVFP4 checkpoint counts about half its parameters) times the quantisation's bytes, the
    GPUs' memory (NVML, GiB) times ``tp x pp``, and a KV cost per token of ``2 x layers x max(tp, kv_heads) x
    head_size`` elements, with the Hugging Face config's heads: an MLA model lists 128 KV heads of ``hidden / heads``
    = 56 (no ``head_dim``), so the heuristic charges DeepSeek about 25x the latent cache it really keeps, and caps its
    batch far below what the cache holds. The KV element's bytes are the checkpoint's (``kv_cache_quant_algo`` of its
    quantisation config; none: 2 bytes), not the run's ``kv_cache_config.dtype``: ``checkpoint_kv`` names that format
    where it differs from ``kv`` (deepseek-ai/DeepSeek-R1-0528 is block FP8 without a KV format, so the heuristic
    charges its FP8-KV runs 2 bytes an element). With attention data parallelism each rank schedules up to the result.
    ``max_num_tokens`` is returned for the record (the tests pin it): the closed-loop prediction has no per-step
    token cap to apply it to."""
    if quant not in BENCH_QUANT_BYTES:
        return BENCH_DEFAULT
    m, h = cat.models[model], cat.hardware[hw]
    w = weight_bytes(m, dense, expert)
    half = ("bf16", "fp16")
    elements = (w.nonexpert / (2.0 if dense in half else 1.0) + (w.embed + w.lm_head) / 2.0
                + w.expert / (2.0 if expert in half else 1.0))
    gib = 1024.0 ** 3
    att = m.architecture.attention
    head = m.architecture.hidden_size / att.heads if att.type == "mla" else att.head_dim
    per_token = 2.0 * m.architecture.layers * max(tp, att.kv_heads) * head * dtype_bytes(checkpoint_kv or kv) / gib
    available = h.hbm_bytes / gib * tp * pp - elements * BENCH_QUANT_BYTES[quant] / gib
    requests = available * BENCH_MEM_FRACTION / (per_token * (isl + osl))
    raw_bs = min(requests, 4096) / pp
    raw_tok = min(raw_bs * (1 + isl / osl), 32768)
    bs = (max(64, _round_up(raw_bs, 32)) if raw_bs < 256 else _round_up(raw_bs, 128) if raw_bs < 1024
          else _round_up(raw_bs, 256))
    tok = (max(2048, _round_up(raw_tok, 256)) if raw_tok < 4096 else _round_up(raw_tok, 512) if raw_tok < 8192
           else _round_up(raw_tok, 1024))
    return bs, tok


def trtllm_cases(cat) -> list[dict]:
    """TensorRT-LLM's published DeepSeek-R1 runs (each with its whole configuration) and its perf overview's
    maximum-throughput table for other models: closed-loop aggregated benchmarks, predicted with their prefills."""
    ds = "deepseek-v3"
    out = [
        dict(case="trtllm-b200-maxtput-bf16kv", published=4_548.0, unit="output tok/s/GPU", source=TRT_BP,
             **benchmark_run(cat, ds, "b200-sxm", "trtllm", dense="fp8", expert="fp4", kv="bf16", isl=1024, osl=2048,
                             conc=3072, tp=1, ep=8, dp=8, balance=False, requests=49_152)),
        dict(case="trtllm-b200-maxtput-fp8kv", published=5_393.0, unit="output tok/s/GPU", source=TRT_BP,
             guessed="1K/2K (the blog's benchmark lengths; this section does not restate them)",
             **benchmark_run(cat, ds, "b200-sxm", "trtllm", dense="fp8", expert="fp4", kv="fp8", isl=1024, osl=2048,
                             conc=7168, tp=1, ep=8, dp=8, balance=False, requests=114_688)),
        dict(case="trtllm-h200-maxtput", published=1_436.0, unit="output tok/s/GPU", source=TRT_BP,
             guessed="BF16 KV (the FP8 checkpoint's default)",
             **benchmark_run(cat, ds, "h200-sxm", "trtllm", dense="fp8", expert="fp8", kv="bf16", isl=1024, osl=2048,
                             conc=1024, tp=1, ep=8, dp=8, balance=False, requests=5_120)),
        dict(case="trtllm-b200-minlat", published=274.7, unit="output tok/s/user", source=TRT_BP,
             guessed="BF16 KV (the R1-FP4 checkpoint's default); the catalog's published MTP acceptance",
             **benchmark_run(cat, ds, "b200-sxm", "trtllm", dense="fp8", expert="fp4", kv="bf16", isl=1024, osl=2048,
                             conc=1, tp=8, ep=2, dp=1, spec=3, per_user=True)),
        dict(case="trtllm-h200-minlat", published=158.1, unit="output tok/s/user", source=TRT_BP,
             guessed="BF16 KV; the catalog's published MTP acceptance",
             **benchmark_run(cat, ds, "h200-sxm", "trtllm", dense="fp8", expert="fp8", kv="bf16", isl=1024, osl=2048,
                             conc=1, tp=8, ep=4, dp=1, spec=3, per_user=True)),
    ]
    # perf overview (model, hardware, dtypes (dense, expert, kv), layout (tp, ep, dp), {(isl, osl): published})
    table = [
        (ds, "b200-sxm", ("fp8", "fp4", "fp8"), (1, 4, 4), {(1024, 1024): 6_430.0, (8192, 1024): 1_168.0}),
        (ds, "gb200-nvl72", ("fp8", "fp4", "fp8"), (1, 4, 4), {(1024, 1024): 6_924.0, (1024, 8192): 4_379.0}),
        # deepseek-ai/DeepSeek-R1-0528: block FP8 weights, no KV format in its config (the run sets FP8 KV)
        (ds, "h200-sxm", ("fp8", "fp8", "fp8", "bf16"), (1, 8, 8), {(1024, 1024): 1_620.0, (1024, 8192): 1_218.0}),
        ("gpt-oss-120b", "b200-sxm", ("bf16", "fp4", "fp8"), (1, 2, 2), {(1024, 1024): 25_870.0, (8192, 1024): 6_111.0}),
        ("gpt-oss-120b", "h200-sxm", ("bf16", "fp4", "bf16"), (1, 1, 1), {(1024, 1024): 6_798.0, (8192, 1024): 1_828.0}),
        ("gpt-oss-120b", "h100-sxm", ("bf16", "fp4", "bf16"), (1, 4, 4), {(1024, 1024): 4_715.0}),
        ("llama-3.1-70b", "b200-sxm", ("fp4", "fp4", "fp8"), (1, 1, 1), {(1024, 1024): 6_842.0, (8192, 1024): 1_362.0}),
        ("llama-3.1-70b", "h200-sxm", ("fp8", "fp8", "fp8"), (2, 1, 1), {(1024, 1024): 2_582.0, (8192, 1024): 537.0}),
        ("qwen3-235b-a22b", "b200-sxm", ("fp4", "fp4", "fp8"), (1, 4, 4), {(1024, 1024): 5_756.0}),
        ("qwen3-235b-a22b", "h200-sxm", ("fp8", "fp8", "fp8"), (1, 4, 4), {(1024, 1024): 3_268.0}),
        ("qwen3-235b-a22b", "h100-sxm", ("fp8", "fp8", "fp8"), (1, 8, 8), {(1024, 1024): 1_935.0}),
    ]
    for model, hw, (dense, expert, kv, *ckpt), (tp, ep, dp), runs in table:
        quant = "mxfp4" if model.startswith("gpt-oss") else "nvfp4" if expert == "fp4" else "fp8"
        for (isl, osl), pub in runs.items():
            bs, _ = trtllm_bench_settings(cat, model, hw, quant=quant, dense=dense, expert=expert, kv=kv,
                                          tp=tp * dp, pp=1, isl=isl, osl=osl, checkpoint_kv=next(iter(ckpt), None))
            conc = min(PERF_REQUESTS[(isl, osl)], float(bs * dp))
            lay = f"TP{tp}" if dp == 1 and ep == 1 else f"DEP{dp}" if tp == 1 else f"TP{tp} EP{ep}"
            out.append(dict(case=f"trt-{model}-{hw.split('-')[0]}-{lay}-{isl // 1024}k{osl // 1024}k", published=pub,
                            unit="output tok/s/GPU", source=TRT_PERF,
                            guessed=PERF_GUESS + ("; Llama 3.3 70B as Llama 3.1 70B (same architecture)"
                                                  if model.startswith("llama") else ""),
                            **benchmark_run(cat, model, hw, "trtllm", dense=dense, expert=expert, kv=kv, isl=isl,
                                            osl=osl, conc=conc, tp=tp, ep=ep, dp=dp, balance=model == ds,
                                            requests=PERF_REQUESTS[(isl, osl)]),
                            batch_limit=bs))
    return out


GPTOSS = "TRTLLM-GPTOSS: NVIDIA/TensorRT-LLM docs/source/blogs/tech_blog/blog9_Deploying_GPT_OSS_on_TRTLLM.md @fbbc05dd"
TRN2 = ("TRN2-NXDI: aws-neuron/aws-neuron-sdk libraries/nxd-inference/tutorials/trn2-llama3.3-70b-tutorial.rst and "
        "llama70b_perf_comparison.csv @06f33784 (LLMPerf, one request at a time)")


def small_moe_and_trainium_cases(cat) -> list[dict]:
    """Single-stream and maximum-throughput gpt-oss-120b on B200 (TensorRT-LLM's deployment blog) and a dense model on
    Trainium2 at batch 1 (AWS Neuron's Llama-3.3-70B tutorial)."""
    oss = dict(dense="bf16", expert="fp4", kv="bf16", isl=1024, osl=2048)
    guess = "BF16 KV (the commands leave the checkpoint's default)"
    out = [dict(case="trtllm-gptoss-b200-bs1", published=420.0, unit="output tok/s/user", source=GPTOSS,
                guessed=guess + "; tokens/s per user as output over the request's latency (prefill included)",
                **benchmark_run(cat, "gpt-oss-120b", "b200-sxm", "trtllm", **oss, conc=1, tp=8, ep=1, dp=1,
                                per_user=True)),
           dict(case="trtllm-gptoss-b200-dep4-maxtput", published=19_500.0, unit="output tok/s/GPU", source=GPTOSS,
                guessed=guess, **benchmark_run(cat, "gpt-oss-120b", "b200-sxm", "trtllm", **oss, conc=2560, tp=1,
                                               ep=4, dp=4, balance=False))]
    r = benchmark_run(cat, "llama-3.1-70b", "trn2", "vllm", dense="bf16", expert="bf16", kv="bf16", isl=10_000.0,
                      osl=1_500.0, conc=1, tp=16, ep=1, dp=1)
    guess = "TP16 over the 16 chips for the tutorial's TP64 over 64 logical cores; Llama 3.3 70B as Llama 3.1 70B"
    out.append(dict(case="trn2-llama70b-bs1-tpot", published=1e3 / 19.8, unit="1 / TPOT p50 (tok/s/user)", source=TRN2,
                    guessed=guess, **{**r, "predicted": 1e3 / r["tpot_ms"]}))
    out.append(dict(case="trn2-llama70b-bs1-ttft", published=1.0 / 0.5756, unit="1 / TTFT p50 (prefills/s)",
                    source=TRN2, guessed=guess, **{**r, "predicted": 1.0 / r["ttft_s"]}))
    return out


def summary(res: list[dict]) -> dict:
    r = np.array([c["ratio"] for c in res], dtype=float)
    factor = np.exp(np.abs(np.log(np.maximum(r, 1e-9))))
    return {"cases": len(r), "median_error_factor": float(np.median(factor)),
            "within_15pct": float(np.mean((r >= 0.85) & (r <= 1.15))),
            "outside_0.67_1.5": int(np.sum((r < 0.67) | (r > 1.5)))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = cases(load_catalog(ROOT / "catalogs"))
    sm = summary(res)
    if args.json:
        print(json.dumps({"cases": res, "summary": sm}, indent=1))
        return 0
    print(f"{'case':<28} {'published':>10} {'predicted':>10} {'ratio':>6}  detail")
    for c in res:
        detail = ", ".join(f"{k} {v:.3g}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in c.items()
                           if k not in ("case", "published", "predicted", "ratio", "unit", "source", "guessed")
                           and isinstance(v, (int, float, str)))
        print(f"{c['case']:<28} {c['published']:>10,.0f} {c['predicted']:>10,.0f} {c['ratio']:>6.2f}  {c['unit']}; {detail}")
    print(f"\nmedian error factor {sm['median_error_factor']:.3f} over {sm['cases']} cases; "
          f"{sm['within_15pct']:.0%} within [0.85, 1.15]; {sm['outside_0.67_1.5']} outside [0.67, 1.5]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
