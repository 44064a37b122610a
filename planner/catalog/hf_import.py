"""Turn a Hugging Face ``config.json`` into a model catalog entry.

Covers dense (Llama, Qwen3), GQA, MoE with shared experts and leading dense layers (DeepSeek, Kimi,
GLM), MLA, DeepSeek sparse attention (GLM-5), sliding-window layers (gpt-oss), linear-attention
hybrids (Qwen3.5) and multimodal wrappers whose language model sits under ``text_config``.
"""

from __future__ import annotations

import datetime as dt
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


def _int(cfg: dict[str, Any], *keys: str, default: int | None = None, minimum: int = 1) -> int:
    """The first of ``keys`` present (and not null) as a whole number >= ``minimum``; ``default`` when none
    is present. A zero, a negative, a fraction, a boolean or a string is an error naming the key, never
    silently replaced by a default."""
    for k in keys:
        v = cfg.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or int(v) < minimum:
            raise InputError(f"config field '{k}' must be a whole number >= {minimum}, got {v!r}")
        return int(v)
    if default is None:
        raise InputError(f"config has no '{keys[0]}' (is it a decoder-only language model config?)")
    return default


def _flag(cfg: dict[str, Any], key: str, default: bool) -> bool:
    v = cfg.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise InputError(f"config field '{key}' must be true or false, got {v!r}")
    return v


def _dtype(cfg: dict[str, Any]) -> str:
    raw = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").lower()
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(raw, "bf16")


def _attention(cfg: dict[str, Any], layers: int, hidden: int, heads: int) -> dict[str, Any]:
    """The attention block of the entry: MLA or GQA, with sliding-window and linear-attention layers counted."""
    kv_heads = _int(cfg, "num_key_value_heads", default=heads)
    head_dim = _int(cfg, "head_dim", default=max(hidden // heads, 1))
    # Layer kinds ------------------------------------------------------------------------------
    layer_types = cfg.get("layer_types") or []
    n_sliding = sum(1 for t in layer_types if "sliding" in str(t))
    n_linear = sum(1 for t in layer_types if "linear" in str(t))
    if not layer_types and cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        n_sliding = int(cfg.get("max_window_layers") or layers)
    n_full = layers - n_sliding - n_linear

    attention: dict[str, Any]
    if cfg.get("kv_lora_rank") is not None:
        nope = _int(cfg, "qk_nope_head_dim", default=128)
        rope = _int(cfg, "qk_rope_head_dim", default=64)
        attention = {
            "type": "mla",
            "heads": heads,
            "kv_heads": heads,
            "head_dim": nope + rope,
            "v_head_dim": _int(cfg, "v_head_dim", default=nope),
            "kv_lora_rank": _int(cfg, "kv_lora_rank"),
            "qk_rope_head_dim": rope,
        }
        if cfg.get("q_lora_rank") is not None:
            attention["q_lora_rank"] = _int(cfg, "q_lora_rank")
        if cfg.get("index_topk") is not None:
            attention["sparse_topk_tokens"] = _int(cfg, "index_topk")
            attention["indexer_heads"] = _int(cfg, "index_n_heads", default=64)
            attention["indexer_head_dim"] = _int(cfg, "index_head_dim", default=128)
    else:
        attention = {"type": "gqa", "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim}
        if _flag(cfg, "attn_output_gate", False):
            attention["output_gate"] = True
    attention["full_layers"] = n_full
    if n_sliding:
        attention["sliding_layers"] = n_sliding
        attention["sliding_window_tokens"] = _int(cfg, "sliding_window")
    if n_linear:
        attention["linear_layers"] = n_linear
        attention["linear_key_heads"] = _int(cfg, "linear_num_key_heads")
        attention["linear_value_heads"] = _int(cfg, "linear_num_value_heads")
        attention["linear_key_head_dim"] = _int(cfg, "linear_key_head_dim")
        attention["linear_value_head_dim"] = _int(cfg, "linear_value_head_dim")
        attention["linear_conv_kernel"] = _int(cfg, "linear_conv_kernel_dim", default=4)

    return attention


def _moe(cfg: dict[str, Any], layers: int) -> tuple[dict[str, Any] | None, int]:
    """The MoE block of the entry (``None`` for a dense model) and the dense FFN's intermediate size (0 where every
    layer is MoE)."""
    # FFN / MoE ----------------------------------------------------------------------------------
    experts = _int(cfg, "n_routed_experts", "num_local_experts", "num_experts", default=0, minimum=0)
    moe = None
    dense_inter = _int(cfg, "intermediate_size", default=0, minimum=0)
    if experts:
        top_k = _int(cfg, "num_experts_per_tok", "experts_per_token", "moe_top_k", default=2)
        expert_inter = _int(cfg, "moe_intermediate_size", "intermediate_size")
        first_dense = _int(cfg, "first_k_dense_replace", default=0, minimum=0)
        mlp_only = cfg.get("mlp_only_layers") or []
        if not isinstance(mlp_only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in mlp_only):
            raise InputError(f"config field 'mlp_only_layers' must be a list of layer indices, got {mlp_only!r}")
        step = _int(cfg, "decoder_sparse_step", "moe_layer_freq", default=1)
        moe_layer_ids = [
            i for i in range(layers) if i >= first_dense and i not in mlp_only and (i - first_dense) % step == 0
        ]
        shared = _int(cfg, "n_shared_experts", default=0, minimum=0)
        shared_inter = _int(cfg, "shared_expert_intermediate_size", "shared_intermediate_size", default=0, minimum=0)
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
        groups = _int(cfg, "n_group", default=1)
        if groups > 1 and experts % groups == 0:
            # Group-limited routing: each token's experts come from ``topk_group`` of ``n_group`` groups.
            moe["groups"] = groups
            moe["groups_per_token"] = min(_int(cfg, "topk_group", default=groups), groups)
        if len(moe_layer_ids) == layers:
            dense_inter = 0
    return moe, dense_inter


def config_to_entry(cfg: dict[str, Any], *, model_id: str, hf_id: str, name: str | None = None) -> dict[str, Any]:
    """Catalog entry (a plain dict, YAML-ready) for a Hugging Face configuration."""
    outer = cfg
    if "text_config" in cfg and isinstance(cfg["text_config"], dict):
        cfg = {**cfg["text_config"], **{k: v for k, v in outer.items() if k == "quantization_config"}}
        if "quantization_config" in outer["text_config"]:
            cfg["quantization_config"] = outer["text_config"]["quantization_config"]
    layers = _int(cfg, "num_hidden_layers")
    hidden = _int(cfg, "hidden_size")
    heads = _int(cfg, "num_attention_heads")
    vocab = _int(cfg, "vocab_size")
    attention = _attention(cfg, layers, hidden, heads)
    moe, dense_inter = _moe(cfg, layers)
    mtp = _int(cfg, "num_nextn_predict_layers", "mtp_num_hidden_layers", default=0, minimum=0)
    if _flag(cfg, "use_mtp", False):
        mtp = _int(cfg, "num_mtp_modules", default=1)

    base_dtype = _dtype(cfg if ("torch_dtype" in cfg or "dtype" in cfg) else outer)
    wdtype, edtype = _quant_dtypes(cfg, base_dtype)
    rope_scaling = cfg.get("rope_scaling") if isinstance(cfg.get("rope_scaling"), dict) else {}
    max_ctx = _int(cfg, "max_position_embeddings", default=4096)
    arch: dict[str, Any] = {
        "layers": layers,
        "hidden_size": hidden,
        "vocab_size": vocab,
        "tie_embeddings": _flag(outer, "tie_word_embeddings", _flag(cfg, "tie_word_embeddings", False)),
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
    q = cfg.get("quantization_config") or {}
    if wdtype == "fp8" and str(q.get("quant_method", "")).lower() == "fp8" and not q.get("weight_block_size"):
        entry["fp8_scales"] = "tensor"  # an FP8 config without weight blocks scales whole tensors
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
    from planner.catalog.inputs import MAX_YAML_BYTES, load_json

    cfg = load_json(path, limit=MAX_YAML_BYTES)
    if not isinstance(cfg, dict):
        raise InputError(f"{path}: expected a JSON object")
    import re

    from planner.catalog.ids import HF_ID

    hf = hf_id or hf_id_from_path(Path(path))
    try:
        entry = config_to_entry(cfg, model_id=model_id, hf_id=hf, name=name)
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None
    except (TypeError, AttributeError, ValueError, ZeroDivisionError) as exc:
        raise InputError(f"{path}: a field of the config has an unexpected shape ({type(exc).__name__}: {exc})") from None
    if not re.match(HF_ID, hf):
        where = "--hf-id" if hf_id else f"{path}: the file name"
        raise InputError(f"{where} gives {hf!r}, not a Hugging Face id (org/name: letters, digits, '.', '_', '-'); "
                         "pass --hf-id org/name")
    try:
        return ModelSpec.model_validate(entry)
    except ValidationError as err:
        raise InputError(format_validation_error(path, err)) from None
