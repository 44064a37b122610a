"""Engine launch commands for a pool: SGLang, vLLM and TensorRT-LLM (``trtllm-serve``).

Each function maps a :class:`Deployment` onto the engine's own flags for the release the engine's catalog entry
targets (``release``); :mod:`planner.export.checks` checks every command against that release's flag table and
start-up rules before anything is written. A command is
a list of arguments; :func:`script` wraps it in a shell script whose multi-host variables come from the
environment (``NODE_RANK``, ``LEADER_ADDR``: set by the LeaderWorkerSet manifests, or by hand).

Engine specifics that are not flags:

- SGLang counts ``--tp-size`` over all GPUs of the instance; with attention data parallelism
  ``--attn-dp-size`` groups each run attention on ``tp-size / attn-dp-size`` GPUs (the 0.5.22+ spelling of the
  deprecated ``--dp-size N --enable-dp-attention``).
- vLLM runs attention data parallelism as ``--data-parallel-size`` engine ranks of ``--tensor-parallel-size``
  GPUs; ``--enable-expert-parallel`` spreads experts over all of them. It takes no explicit expert map:
  redundant experts go to ``--eplb-config`` and the balancer places them at run time.
- TensorRT-LLM takes parallelism on the command line and everything else in the ``--config`` YAML
  (attention DP, MoE load balancer with the plan's placement, MTP, KV cache format).
"""

from __future__ import annotations

import json
import re
import shlex

from planner.export.deploy import PORT, SGLANG_BOOTSTRAP_PORT, TIERS, Deployment

TARGETS = ("sglang", "vllm", "trtllm")

_SGL_KV = {"fp8": "fp8_e4m3", "bf16": "auto", "fp16": "auto"}
_VLLM_KV = {"fp8": "fp8", "bf16": "auto", "fp16": "auto"}
_SGL_QUANT = {("fp8", "nvidia"): "fp8", ("fp8", "amd"): "fp8", ("fp4", "nvidia"): "modelopt_fp4",
              ("fp4", "amd"): "mxfp4", ("int8", "nvidia"): "w8a8_int8", ("int8", "amd"): "w8a8_int8",
              ("int4", "nvidia"): "gptq_marlin", ("int4", "amd"): "moe_wna16"}
_VLLM_QUANT = {("fp8", "nvidia"): "fp8_per_tensor", ("fp8", "amd"): "fp8_per_tensor", ("fp8", "google"): "fp8_per_tensor",
               ("fp4", "nvidia"): "modelopt_fp4", ("fp4", "amd"): "mxfp4", ("int4", "nvidia"): "gptq_marlin",
               ("int8", "nvidia"): "fp8"}


def _extension(d: Deployment) -> dict:
    """The config override that serves beyond the checkpoint's own length: the rope scaling the model card
    documents and ``max_position_embeddings`` raised to match (SGLang and vLLM 0.33 derive the limit from
    ``max_position_embeddings`` alone for YaRN with ``original_max_position_embeddings``: engine-rules.md 1.5,
    2.3)."""
    return {"rope_scaling": d.rope_scaling, "max_position_embeddings": d.engine_context}


def context_note(d: Deployment, target: str) -> str | None:
    """What the launch command does about a context beyond the checkpoint's own length."""
    if d.native_context_tokens is None:
        return None
    if not d.extends_context:
        return (f"context capped at the checkpoint's own {d.native_context_tokens:,} tokens (requests of this workload "
                f"need {d.context_tokens:,}; {d.max_context_tokens:,} would need rope scaling)")
    if target == "trtllm":
        return (f"context capped at the checkpoint's own {d.native_context_tokens:,} tokens: the workload needs "
                f"{d.context_tokens:,}; give TensorRT-LLM a checkpoint whose config carries the rope scaling "
                f"{json.dumps(d.rope_scaling)} to serve {d.max_context_tokens:,}")
    return (f"context {d.engine_context:,} tokens through rope scaling {json.dumps(d.rope_scaling)} over the "
            f"checkpoint's own {d.native_context_tokens:,}")


def _quant(d: Deployment, table: dict) -> str | None:
    """The quantisation method to name where the engine quantises the native checkpoint as it loads it; a
    pre-quantised checkpoint carries its method in its config, which the engines read (naming another one is
    refused as a mismatch)."""
    if d.weights_source != "on-load":
        return None
    return table.get((d.weights_dtype, d.vendor))


def checkpoint_note(d: Deployment) -> str | None:
    """Where the pool's weights come from, when not the model's own checkpoint in its own format."""
    if d.weights_source == "native":
        return None
    how = {"published": f"the published {d.weights_dtype} checkpoint {d.model_path} (its quantisation read from its config)",
           "on-load": f"quantised to {d.weights_dtype} on load from {d.model_path}",
           "given": f"the {d.weights_dtype} checkpoint given with --checkpoint ({d.model_path})"}[d.weights_source]
    return f"weights {d.weights_dtype} ({d.weights_mode}): {how}"


def sglang(d: Deployment, *, expert_location: str | None = None) -> list[str]:
    args = ["python3", "-m", "sglang.launch_server", "--model-path", "${MODEL_PATH}",
            "--served-model-name", d.model_id, "--host", "0.0.0.0", "--port", str(PORT),
            "--tp-size", str(d.tp * d.attn_dp), "--max-running-requests", str(d.batch),
            "--mem-fraction-static", f"{d.static_fraction:.2f}",
            "--kv-cache-dtype", _SGL_KV[d.kv_dtype], "--context-length", str(d.engine_context),
            "--trust-remote-code", "--enable-metrics"]
    if d.extends_context:
        args += ["--json-model-override-args", json.dumps(_extension(d))]
    if d.pp > 1:
        args += ["--pp-size", str(d.pp)]
    if d.attn_dp > 1:  # SGLang >= 0.5.22: attention-DP groups inside the TP group (--dp-size now means replicas)
        args += ["--attn-dp-size", str(d.attn_dp)]
    if d.ep > 1:
        args += ["--ep-size", str(d.ep)]
        if d.multi_host or d.attn_dp > 1 or d.two_batch_overlap:
            args += ["--moe-a2a-backend", "mori" if d.vendor == "amd" else "deepep"]
        if d.redundant_experts:
            args += ["--ep-num-redundant-experts", str(d.redundant_experts)]
        if expert_location:
            args += ["--init-expert-location", expert_location]
    if d.two_batch_overlap:
        args += ["--enable-two-batch-overlap"]
    q = _quant(d, _SGL_QUANT)
    if q:
        args += ["--quantization", q]
    if d.spec_tokens:
        # MTP runs as SGLang's EAGLE path with the model's next-token layers as the draft (topk 1: a chain)
        args += ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(d.spec_tokens),
                 "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(d.spec_tokens + 1)]
    if d.role in ("prefill", "decode"):
        args += ["--disaggregation-mode", d.role,
                 "--disaggregation-transfer-backend", "mori" if d.vendor == "amd" else "nixl"]
        if d.role == "prefill":  # pinned: the PD router reads it from the pod's annotation
            args += ["--disaggregation-bootstrap-port", str(SGLANG_BOOTSTRAP_PORT)]
    if d.prefix_tier in TIERS or d.kv_tier in TIERS:
        ratio = max(2.0, (d.prefix_bytes_per_replica / d.gpus + d.host_kv_bytes) / max(d.kv_bytes, 1.0))
        args += ["--enable-hierarchical-cache", "--hicache-ratio", f"{ratio:.1f}"]
        if d.prefix_tier == "nvme":
            args += ["--hicache-storage-backend", "file"]
    if d.multi_host:
        args += ["--nnodes", str(d.hosts), "--node-rank", "${NODE_RANK}", "--dist-init-addr", "${LEADER_ADDR}:20000"]
    return args


def vllm(d: Deployment) -> list[str]:
    args = ["vllm", "serve", "${MODEL_PATH}", "--served-model-name", d.model_id, "--host", "0.0.0.0",
            "--port", str(PORT), "--tensor-parallel-size", str(d.tp),
            "--max-num-seqs", str(max(1, d.batch // d.attn_dp)),
            "--gpu-memory-utilization", f"{d.total_fraction:.2f}",
            "--kv-cache-dtype", _VLLM_KV[d.kv_dtype], "--max-model-len", str(d.engine_context),
            "--trust-remote-code"]
    if d.extends_context:
        args += ["--hf-overrides", json.dumps(_extension(d))]
    if d.pp > 1:
        args += ["--pipeline-parallel-size", str(d.pp)]
    if d.attn_dp > 1:
        args += ["--data-parallel-size", str(d.attn_dp)]
        if d.multi_host:
            args += ["--data-parallel-size-local", str(d.dp_ranks_per_host), "--data-parallel-address", "${LEADER_ADDR}",
                     "--data-parallel-rpc-port", "13345", "--data-parallel-start-rank", "${DP_START_RANK}"]
    elif d.multi_host:
        # one engine's TP x PP over hosts: multiprocessing across nodes (vLLM refuses a world larger than the node's
        # GPUs without --nnodes); the hosts after the leader run headless workers
        args += ["--nnodes", str(d.hosts), "--node-rank", "${NODE_RANK}", "--master-addr", "${LEADER_ADDR}",
                 "--master-port", "29501", WORKER_ARGS]
    if d.ep > 1:
        args += ["--enable-expert-parallel"]
        if d.redundant_experts:
            args += ["--enable-eplb", "--eplb-config", json.dumps({"num_redundant_experts": d.redundant_experts})]
    if d.two_batch_overlap:
        # vLLM micro-batches (DBO) only over these all-to-all backends (config/vllm.py, "Microbatching currently
        # only supports ..."; shared/reference/engine-rules.md 2.1): DeepEP on NVIDIA (low latency for decode,
        # high throughput where prompts are batched), allgather/reduce-scatter on ROCm
        a2a = ("allgather_reducescatter" if d.vendor == "amd" else
               "deepep_high_throughput" if d.role == "prefill" else "deepep_low_latency")
        args += ["--enable-dbo", "--all2all-backend", a2a]
    q = _quant(d, _VLLM_QUANT)
    if q:
        args += ["--quantization", q]
    if d.spec_tokens:
        args += ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": d.spec_tokens})]
    connectors = []
    if d.role in ("prefill", "decode"):
        connectors.append({"kv_connector": "NixlConnector", "kv_role": "kv_both"})
    if d.prefix_tier in TIERS or d.kv_tier in TIERS or d.pair_tier_connector:
        # a prefill and a decode pool of one workload carry the same connectors: NIXL's handshake refuses a pair whose
        # kv_transfer_config differs (rules.yaml vllm.pd-same-kv-dtype)
        connectors.append({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"})
    if len(connectors) == 1:
        args += ["--kv-transfer-config", json.dumps(connectors[0])]
    elif connectors:
        args += ["--kv-transfer-config", json.dumps({"kv_connector": "MultiConnector", "kv_role": "kv_both",
                                                     "kv_connector_extra_config": {"connectors": connectors}})]
    if d.prefix_tier in TIERS or d.kv_tier in TIERS:
        args += ["--enable-prefix-caching"]
    return args


def trtllm(d: Deployment) -> list[str]:
    args = ["trtllm-serve", "${MODEL_PATH}", "--host", "0.0.0.0", "--port", str(PORT), "--backend", "pytorch",
            "--tensor_parallel_size", str(d.tp * d.attn_dp), "--pipeline_parallel_size", str(d.pp),
            "--max_batch_size", str(max(1, d.batch // d.attn_dp)),
            "--max_seq_len", str(d.native_context_tokens or d.max_context_tokens), "--trust_remote_code",
            "--config", "config.yaml"]
    if d.ep > 1:
        args += ["--moe_expert_parallel_size", str(d.ep)]
    if d.multi_host:
        args += ["--gpus_per_node", str(d.gpus_per_host)]
    return args


def trtllm_config(d: Deployment, assignments: dict[int, list[int]] | None = None) -> dict:
    """The ``--config`` (extra LLM API options) YAML of a pool: keys as read from ``llm_args.py``."""
    cfg: dict = {
        "enable_attention_dp": d.attn_dp > 1,
        "kv_cache_config": {"dtype": "fp8" if d.kv_dtype == "fp8" else "auto",
                            "free_gpu_memory_fraction": round(d.kv_free_fraction, 2),
                            "enable_block_reuse": d.prefix_tier != "none"},
        "enable_chunked_prefill": d.role != "decode",
    }
    if d.attn_dp > 1 and d.role not in ("prefill", "decode"):
        # the ranks take their prompts in the same steps, as the plan priced them (attention_dp_prefill_balance)
        cfg["attention_dp_config"] = {"enable_balance": True}
    if d.prefix_tier in TIERS:
        cfg["kv_cache_config"]["host_cache_size"] = int(d.prefix_bytes_per_replica / d.gpus)
    if d.ep > 1 and (d.redundant_experts or assignments):
        lb: dict = {"num_slots": d.experts + d.redundant_experts, "layer_updates_per_iter": 0}
        if assignments:
            lb["initial_global_assignments"] = {int(k): v for k, v in assignments.items()}
        cfg["moe_config"] = {"load_balancer": lb}
    if d.spec_tokens:
        cfg["speculative_config"] = {"decoding_type": "MTP", "max_draft_len": d.spec_tokens}
    if d.role in ("prefill", "decode"):
        cfg["cache_transceiver_config"] = {"backend": "NIXL"}
    if d.role == "prefill":  # "not yet supported in disaggregated context server architectures" (README)
        cfg["disable_overlap_scheduler"] = True
    return cfg


_CHECKPOINT_QUANT = {("fp8", "nvidia"): "fp8", ("fp8", "amd"): "fp8", ("fp4", "nvidia"): "modelopt_fp4",
                     ("fp4", "amd"): "mxfp4", ("int4", "nvidia"): "gptq_marlin", ("int4", "amd"): "moe_wna16",
                     ("int8", "nvidia"): "w8a8_int8", ("int8", "amd"): "w8a8_int8"}


def facts(d: Deployment) -> dict:
    """What the start-up rules (``engines/releases/rules.yaml``) know of a pool besides its command: its layout,
    its hardware's vendor, the checkpoint's own length and quantisation (``none``: a checkpoint without a
    quantisation config; ``unknown``: one given with ``--checkpoint``)."""
    if d.weights_source == "given":
        quant = "unknown"
    elif d.weights_source == "on-load" or d.native_dtype in ("bf16", "fp16") and d.weights_source == "native":
        quant = _CHECKPOINT_QUANT.get((d.native_dtype, d.vendor), "none")
    else:
        quant = _CHECKPOINT_QUANT.get((d.weights_dtype, d.vendor), "unknown")
    return {"vendor": d.vendor, "role": d.role, "gpus": d.gpus, "hosts": d.hosts, "tp": d.tp, "ep": d.ep, "pp": d.pp,
            "attn_dp": d.attn_dp, "max_position_embeddings": d.native_context_tokens, "checkpoint_quant": quant,
            "gpus_per_host": d.gpus_per_host, "mtp_layers": d.mtp_layers,
            "bootstrap_port_annotation": SGLANG_BOOTSTRAP_PORT}


def environment(d: Deployment, target: str) -> dict[str, str]:
    """Variables a pool's launch script exports (name -> the shell default used when the caller sets none)."""
    env: dict[str, str] = {}
    if target == "vllm" and d.role in ("prefill", "decode"):
        # NIXL's handshake side channel listens on localhost unless told the address peers reach (engine-rules 2.4)
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = "$(hostname -i | cut -d' ' -f1)"
    return env


def command(d: Deployment, target: str, *, expert_location: str | None = None) -> list[str]:
    if target == "sglang":
        return sglang(d, expert_location=expert_location)
    if target == "vllm":
        return vllm(d)
    if target == "trtllm":
        return trtllm(d)
    raise ValueError(target)


WORKER_ARGS = "${WORKER_ARGS[@]}"
"""Arguments only the hosts after the leader take (vLLM's ``--headless``): a bash array the script fills."""

_LIVE = re.compile(r"^\$\{[A-Z_]+\}[A-Za-z0-9._/:-]*$")
"""The only words left to the shell to expand: ``${VAR}``, optionally followed by a plain path or port.
Everything else is quoted by :func:`shlex.quote`."""


def _quote(arg: str) -> str:
    """One shell word: a live expansion of this module's own making in double quotes, anything else quoted
    by the standard library (no command substitution, no word splitting, whatever the value holds)."""
    if _LIVE.match(arg) or arg == WORKER_ARGS:
        return f'"{arg}"'
    return shlex.quote(arg)


def _comment(text: str) -> str:
    """Text for a ``#`` comment line: control characters (a newline would end the comment) become spaces."""
    return "".join(c if c.isprintable() else " " for c in text)


def script(d: Deployment, target: str, args: list[str], *, notes: list[str]) -> str:
    lines = ["#!/usr/bin/env bash", _comment(f"# {d.pool}: {d.replicas} replica(s) of {d.role} for workload "
                                             f"'{d.workload}' on {d.hardware}, {d.gpus} GPU(s) each over {d.hosts} "
                                             f"host(s) of {d.gpus_per_host}."),
             "# Written by `planner export` from plan.json; run once per host of a replica"
             + (" (NODE_RANK 0 on the leader, LEADER_ADDR its address)." if d.multi_host else "."), "set -euo pipefail"]
    lines += [_comment(f"# {n}") for n in notes]
    lines += ['MODEL_PATH="${MODEL_PATH:-}"', f'[ -n "$MODEL_PATH" ] || printf -v MODEL_PATH %s {shlex.quote(d.model_path)}',
              'PLANNER_DIR="${PLANNER_DIR:-$(cd "$(dirname "$0")" && pwd)}"  # this script\'s folder: maps and configs']
    for name, default in environment(d, target).items():
        lines.append(f'export {name}="${{{name}:-{default}}}"')
    if d.multi_host:
        lines += ['NODE_RANK="${NODE_RANK:?set NODE_RANK (0 on the leader host)}"',
                  'LEADER_ADDR="${LEADER_ADDR:?set LEADER_ADDR to the leader host address}"']
    if WORKER_ARGS in args:
        lines += ['WORKER_ARGS=()', '[ "$NODE_RANK" = "0" ] || WORKER_ARGS=(--headless)  # the leader serves HTTP']
    if "${DP_START_RANK}" in args:
        # first data-parallel rank on this host: NODE_RANK x the ranks each host runs (an integer variable)
        lines += ['test -n "$NODE_RANK" -a -z "${NODE_RANK//[0-9]/}" || { echo "NODE_RANK must be a whole number" >&2; exit 1; }',
                  f'declare -i DP_START_RANK="NODE_RANK * {d.dp_ranks_per_host}"']
    groups: list[str] = []
    i = 0
    while i < len(args):
        # a flag and its value on one line; the program and its sub-command on the first
        if args[i].startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
            groups.append(f"{_quote(args[i])} {_quote(args[i + 1])}")
            i += 2
        elif not groups or not args[i].startswith("--") and not groups[-1].startswith("--"):
            if groups and not args[i].startswith("--"):
                groups[-1] += " " + _quote(args[i])
            else:
                groups.append(_quote(args[i]))
            i += 1
        else:
            groups.append(_quote(args[i]))
            i += 1
    body = " \\\n  ".join(groups)
    lines += ["exec " + body, ""]
    return "\n".join(lines)
