"""Catalog summaries (what ``planner catalog list/show/validate`` print)."""

from __future__ import annotations

import datetime as dt

from planner.catalog import Catalog
from planner.errors import InputError
from planner.perf.params import kv_bytes_per_token, kv_growth_bytes_per_token, model_stats, weight_bytes


def model_row(m) -> dict:
    s = model_stats(m)
    return {
        "id": m.id,
        "name": m.name,
        "hf_ids": list(m.hf_ids),
        "total_params": s.total_params,
        "active_params": s.active_params,
        "kv_bytes_per_token_bf16": kv_bytes_per_token(m, "bf16"),
        "kv_growth_bytes_per_token_bf16": kv_growth_bytes_per_token(m, "bf16"),
        "attention": m.architecture.attention.type,
        "moe": m.is_moe,
        "experts": s.experts,
        "top_k": s.top_k,
        "weights_dtype": m.weights_dtype,
        "expert_weights_dtype": m.expert_weights_dtype or m.weights_dtype,
        "native_weight_bytes": weight_bytes(m, m.weights_dtype, m.expert_weights_dtype).total,
        "max_context_tokens": m.max_context_tokens,
    }


def hardware_row(h) -> dict:
    return {
        "id": h.id,
        "name": h.name,
        "vendor": h.vendor,
        "chips_per_unit": h.purchase_unit.chips_per_unit,
        "unit_kind": h.purchase_unit.kind,
        "scale_up_domain_chips": h.scale_up_domain_chips,
        "price_usd_per_chip_hour": h.price_usd_per_chip_hour,
        "dense_tflops": dict(h.dense_tflops),
        "hbm_capacity_gb": h.hbm_capacity_gb,
        "hbm_bandwidth_tb_s": h.hbm_bandwidth_tb_s,
        "aliases": list(h.aliases),
        "efficiency_fitted_rows": h.efficiency.fitted_rows,
    }


def catalog_summary(cat: Catalog) -> dict:
    return {
        "models": [model_row(m) for m in cat.models.values()],
        "hardware": [hardware_row(h) for h in cat.hardware.values()],
    }


def entry_detail(cat: Catalog, ident: str) -> dict:
    mid = cat.model_id(ident)
    if mid is not None:
        m = cat.models[mid]
        return {"kind": "model", "file": str(cat.files[mid]), "derived": model_row(m), **m.model_dump(mode="json")}
    hid = cat.hardware_id(ident)
    if hid is not None:
        h = cat.hardware[hid]
        return {"kind": "hardware", "file": str(cat.files[hid]), **h.model_dump(mode="json")}
    from planner.catalog.loader import unknown_id_message

    raise InputError(unknown_id_message("model or hardware", ident, [*cat.models, *cat.hardware]))


def validate_catalog(cat: Catalog, today: dt.date | None = None) -> list[str]:
    """Checks beyond the schema; raises for errors, returns notes (stale prices, published-size drift)."""
    today = today or dt.date.today()
    notes: list[str] = []
    for h in cat.hardware.values():
        if h.price is None:
            notes.append(f"{h.id}: no public price; give one in a scenario to use it")
        elif (today - h.price.as_of).days > 365:
            notes.append(f"{h.id}: price is from {h.price.as_of}, over a year old")
        if h.efficiency.fitted_rows == 0:
            notes.append(f"{h.id}: efficiency transferred, not fitted ({h.efficiency.source[:60]}...)")
    for m in cat.models.values():
        pub = m.published
        if pub and pub.total_params_b:
            s = model_stats(m)
            rel = s.total_params / (pub.total_params_b * 1e9) - 1.0
            if abs(rel) > 0.05:
                raise InputError(
                    f"{cat.files[m.id]}: architecture gives {s.total_params / 1e9:.1f}B parameters but "
                    f"published.total_params_b says {pub.total_params_b} ({100 * rel:+.1f}%); fix the architecture"
                )
    return notes
