"""Turn a Hugging Face ``config.json`` into a model catalog entry.

Covers dense (Llama, Qwen3), GQA, MoE with shared experts and leading dense layers (DeepSeek, Kimi,
GLM), MLA, DeepSeek sparse attention (GLM-5), sliding-window layers (gpt-oss), linear-attention
hybrids (Qwen3.5) and multimodal wrappers whose language model sits under ``text_config``.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.catalog.loader import format_validation_error
from planner.catalog.schemas import ModelSpec
from planner.errors import InputError


def _quant_dtypes(cfg: dict[str, Any], dtype_default: str) -> tuple[str, str | None]:
    """(dense weights dtype, expert weights dtype or None) from ``quantization_config``."""
    q = cfg.get("quantization_config") or {}
    method = str(q.get("quant_method", "")).lower()
    if method == "fp8":
        return "fp8", None
    if method == "mxfp4":  # gpt-oss: experts MXFP4, attention/router/embeddings left bf16
        return dtype_default, "fp4"
    if method in ("modelopt", "nvfp4") or "nvfp4" in str(q.get("quant_algo", "")).lower():
        return "fp8", "fp4"
    if method == "compressed-tensors":
        bits = None
        for group in (q.get("config_groups") or {}).values():
            bits = (group.get("weights") or {}).get("num_bits", bits)
        if bits == 4:  # Kimi K2.5: routed experts INT4 (group 32), the rest bf16
            return dtype_default, "int4"
        if bits == 8:
            return "fp8", None
    return dtype_default, None


def _dtype(cfg: dict[str, Any]) -> str:
    raw = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").lower()
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(raw, "bf16")


def config_to_entry(cfg: dict[str, Any], *, model_id: str, hf_id: str, name: str | None = None) -> dict[str, Any]:
    """Catalog entry (a plain dict, YAML-ready) for a Hugging Face configuration."""
    outer = cfg
    if "text_config" in cfg and isinstance(cfg["text_config"], dict):
        cfg = {**cfg["text_config"], **{k: v for k, v in outer.items() if k == "quantization_config"}}
        if "quantization_config" in outer["text_config"]:
            cfg["quantization_config"] = outer["text_config"]["quantization_config"]
    try:
        layers = int(cfg["num_hidden_layers"])
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        vocab = int(cfg["vocab_size"])
    except KeyError as exc:
        raise InputError(f"config has no '{exc.args[0]}' (is it a decoder-only language model config?)") from None
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)

    # Layer kinds ------------------------------------------------------------------------------
    layer_types = cfg.get("layer_types") or []
    n_sliding = sum(1 for t in layer_types if "sliding" in str(t))
    n_linear = sum(1 for t in layer_types if "linear" in str(t))
    if not layer_types and cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        n_sliding = int(cfg.get("max_window_layers") or layers)
    n_full = layers - n_sliding - n_linear

    attention: dict[str, Any]
    if cfg.get("kv_lora_rank"):
        nope = int(cfg.get("qk_nope_head_dim") or 128)
        rope = int(cfg.get("qk_rope_head_dim") or 64)
        attention = {
            "type": "mla",
            "heads": heads,
            "kv_heads": heads,
            "head_dim": nope + rope,
            "v_head_dim": int(cfg.get("v_head_dim") or nope),
            "kv_lora_rank": int(cfg["kv_lora_rank"]),
            "qk_rope_head_dim": rope,
        }
        if cfg.get("q_lora_rank"):
            attention["q_lora_rank"] = int(cfg["q_lora_rank"])
        if cfg.get("index_topk"):
            attention["sparse_topk_tokens"] = int(cfg["index_topk"])
            attention["indexer_heads"] = int(cfg.get("index_n_heads") or 64)
            attention["indexer_head_dim"] = int(cfg.get("index_head_dim") or 128)
    else:
        attention = {"type": "gqa", "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim}
        if cfg.get("attn_output_gate"):
            attention["output_gate"] = True
    attention["full_layers"] = n_full
    if n_sliding:
        attention["sliding_layers"] = n_sliding
        attention["sliding_window_tokens"] = int(cfg["sliding_window"])
    if n_linear:
        attention["linear_layers"] = n_linear
        attention["linear_key_heads"] = int(cfg["linear_num_key_heads"])
        attention["linear_value_heads"] = int(cfg["linear_num_value_heads"])
        attention["linear_key_head_dim"] = int(cfg["linear_key_head_dim"])
        attention["linear_value_head_dim"] = int(cfg["linear_value_head_dim"])
        attention["linear_conv_kernel"] = int(cfg.get("linear_conv_kernel_dim") or 4)

    # FFN / MoE ----------------------------------------------------------------------------------
    experts = cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts")
    moe = None
    dense_inter = int(cfg.get("intermediate_size") or 0)
    if experts:
        experts = int(experts)
        top_k = int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or cfg.get("moe_top_k") or 2)
        expert_inter = int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size"))
        first_dense = int(cfg.get("first_k_dense_replace") or 0)
        mlp_only = list(cfg.get("mlp_only_layers") or [])
        step = int(cfg.get("decoder_sparse_step") or cfg.get("moe_layer_freq") or 1)
        moe_layer_ids = [
            i for i in range(layers) if i >= first_dense and i not in mlp_only and (i - first_dense) % step == 0
        ]
        shared = int(cfg.get("n_shared_experts") or 0)
        shared_inter = int(cfg.get("shared_expert_intermediate_size") or cfg.get("shared_intermediate_size") or 0)
        if shared_inter and not shared:
            shared = 1
        moe = {
            "experts": experts,
            "top_k": top_k,
            "shared_experts": shared,
            "expert_intermediate": expert_inter,
            "shared_intermediate": shared_inter if shared_inter else shared * expert_inter,
            "layers": len(moe_layer_ids),
        }
        groups = int(cfg.get("n_group") or 1)
        if groups > 1 and experts % groups == 0:
            # Group-limited routing: each token's experts come from ``topk_group`` of ``n_group`` groups.
            moe["groups"] = groups
            moe["groups_per_token"] = min(int(cfg.get("topk_group") or groups), groups)
        if len(moe_layer_ids) == layers:
            dense_inter = 0
    mtp = int(cfg.get("num_nextn_predict_layers") or cfg.get("mtp_num_hidden_layers") or 0)
    if cfg.get("use_mtp"):
        mtp = int(cfg.get("num_mtp_modules") or 1)

    base_dtype = _dtype(cfg if ("torch_dtype" in cfg or "dtype" in cfg) else outer)
    wdtype, edtype = _quant_dtypes(cfg, base_dtype)
    rope_scaling = cfg.get("rope_scaling") or {}
    max_ctx = int(cfg.get("max_position_embeddings") or 4096)
    arch: dict[str, Any] = {
        "layers": layers,
        "hidden_size": hidden,
        "vocab_size": vocab,
        "tie_embeddings": bool(outer.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
        "attention": attention,
        "dense_intermediate": dense_inter,
    }
    if moe:
        arch["moe"] = moe
    if mtp:
        arch["mtp_layers"] = mtp
    entry: dict[str, Any] = {
        "id": model_id,
        "name": name or hf_id.split("/")[-1],
        "hf_ids": [hf_id],
        "source": f"Hugging Face config.json of {hf_id}",
        "as_of": dt.date.today().isoformat(),
        "architecture": arch,
        "weights_dtype": wdtype,
        "max_context_tokens": max_ctx,
    }
    if edtype:
        entry["expert_weights_dtype"] = edtype
    if rope_scaling.get("original_max_position_embeddings"):
        entry["notes"] = (
            f"RoPE scaling {rope_scaling.get('type') or rope_scaling.get('rope_type')} x{rope_scaling.get('factor')}"
            f" from {rope_scaling['original_max_position_embeddings']} tokens."
        )
    return entry


def hf_id_from_path(path: Path) -> str:
    """``org--name.json`` -> ``org/name`` (the convention of the calibration folder)."""
    stem = path.stem
    if stem.endswith("_config"):
        stem = stem[: -len("_config")]
    return stem.replace("--", "/", 1) if "--" in stem else stem


def import_config(path: Path, *, model_id: str, hf_id: str | None = None, name: str | None = None) -> ModelSpec:
    """Read ``config.json`` at ``path`` and return a validated :class:`ModelSpec`."""
    try:
        cfg = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{path}: expected a JSON object")
    try:
        entry = config_to_entry(cfg, model_id=model_id, hf_id=hf_id or hf_id_from_path(Path(path)), name=name)
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None
    try:
        return ModelSpec.model_validate(entry)
    except ValidationError as err:
        raise InputError(format_validation_error(path, err)) from None
