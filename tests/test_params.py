"""Parameter and KV-cache sizes pinned to published and hand-computed numbers."""

from __future__ import annotations

import datetime as dt

import pytest

from planner.catalog.schemas import ModelSpec
from planner.perf.params import (
    expected_experts_touched,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    kv_growth_bytes_per_token,
    model_stats,
)

# (total B, active B) as derived in shared/reference/hardware-models.md section 2.4 (matches published < 1%).
SIZES = {
    "llama-3.1-8b": (8.03, 8.03),
    "llama-3.1-70b": (70.55, 70.55),
    "llama-3.1-405b": (405.85, 405.85),
    "mixtral-8x7b": (46.70, 12.88),
    "mixtral-8x22b": (140.62, 39.15),
    "qwen3-235b-a22b": (235.09, 22.19),
    "qwen3-30b-a3b": (30.53, 3.35),
    "deepseek-v3": (671.0, 37.5),
    "kimi-k2": (1026.0, 32.9),
    "gpt-oss-120b": (116.8, 5.71),
    "gpt-oss-20b": (20.9, 4.19),
    "palm-540b": (540.35, 540.35),
}
KV_BF16 = {  # bytes per token, all layers
    "llama-3.1-8b": 131_072,
    "llama-3.1-70b": 327_680,
    "llama-3.1-405b": 516_096,
    "mixtral-8x22b": 229_376,
    "qwen3-235b-a22b": 192_512,
    "deepseek-v3": 70_272,
    "kimi-k2": 70_272,
    "gpt-oss-120b": 73_728,
    "gpt-oss-20b": 49_152,
}


@pytest.mark.parametrize("mid", sorted(SIZES))
def test_parameter_counts(catalog, mid):
    s = model_stats(catalog.models[mid])
    total, active = SIZES[mid]
    assert s.total_params / 1e9 == pytest.approx(total, rel=0.005)
    assert s.active_params / 1e9 == pytest.approx(active, rel=0.005)


@pytest.mark.parametrize("mid", sorted(KV_BF16))
def test_kv_bytes_per_token(catalog, mid):
    assert kv_bytes_per_token(catalog.models[mid], "bf16") == KV_BF16[mid]
    assert kv_bytes_per_token(catalog.models[mid], "fp8") == KV_BF16[mid] / 2


def test_sliding_window_stops_growing(catalog):
    m = catalog.models["gpt-oss-120b"]
    assert kv_growth_bytes_per_token(m) == 36_864
    # 18 sliding layers hold 128 tokens, 18 full layers hold everything.
    assert float(kv_bytes_per_sequence(m, 10_000)) == 18 * 2048 * 10_000 + 18 * 2048 * 128


def test_engine_sizing_of_sliding_layers(catalog):
    """What a sequence holds depends on how the engine sizes the sliding layers' cache: TensorRT-LLM as full layers
    (share 1), SGLang a pool of 0.8 tokens per full-pool token (``--swa-full-tokens-ratio``), vLLM the window; the
    planner's capacity follows, while the bytes a decode step reads stay the window's."""
    from planner.perf.params import kv_read_bytes_per_sequence
    from planner.perf.serving import kv_capacity_sequences
    from planner.perf.setup import Setup

    m = catalog.models["gpt-oss-120b"]
    assert float(kv_bytes_per_sequence(m, 10_000, sliding_share=1.0)) == 36 * 2048 * 10_000
    assert float(kv_bytes_per_sequence(m, 10_000, sliding_share=0.8)) == pytest.approx((18 + 0.8 * 18) * 2048 * 10_000)
    # shorter than the window, the sliding pool binds: 100 tokens need 100 / 0.8 full-pool tokens' worth
    assert float(kv_bytes_per_sequence(m, 100, sliding_share=0.8)) == pytest.approx((18 + 0.8 * 18) * 2048 * 125)
    assert {e: catalog.engines[e].features.sliding_kv_share for e in ("trtllm", "sglang", "vllm")} == {
        "trtllm": 1.0, "sglang": 0.8, "vllm": None}
    hw = catalog.hardware["h200-sxm"]
    caps = {}
    for e in ("trtllm", "sglang", "vllm"):
        s = Setup.make(m, hw, kv="bf16", engine=e, sliding_kv_share=catalog.engines[e].features.sliding_kv_share)
        caps[e] = float(kv_capacity_sequences(s, 1, 1, 1, 1, 2048.0))
    # at 2,048 tokens the window-sized cache holds (36 / (18 + 18 * 128 / 2048)) = 1.88x the full-sized one
    assert caps["vllm"] / caps["trtllm"] == pytest.approx(36 / (18 + 18 * 128 / 2048))
    assert caps["sglang"] / caps["trtllm"] == pytest.approx(36 / 32.4)
    assert float(kv_read_bytes_per_sequence(m, 10_000)) == 18 * 2048 * 10_000 + 18 * 2048 * 128


def test_llama13b_kv_at_8192_is_6_7_gb():
    """The worked number from llm-analysis: LLaMA-13B KV cache at 8,192 tokens in bf16 = 6.7 GB."""
    m = ModelSpec.model_validate(
        {
            "id": "llama-13b", "name": "LLaMA 13B", "hf_ids": [], "source": "LLaMA paper", "as_of": dt.date(2023, 2, 27),
            "weights_dtype": "bf16", "max_context_tokens": 8192,
            "architecture": {
                "layers": 40, "hidden_size": 5120, "vocab_size": 32000, "dense_intermediate": 13824,
                "attention": {"type": "gqa", "heads": 40, "kv_heads": 40, "head_dim": 128, "full_layers": 40},
            },
        }
    )
    assert float(kv_bytes_per_sequence(m, 8192, "bf16")) / 1e9 == pytest.approx(6.71, abs=0.01)


def test_linear_attention_state_is_constant(catalog):
    m = catalog.models["qwen3.5-397b-a17b"]
    a, b = float(kv_bytes_per_sequence(m, 0)), float(kv_bytes_per_sequence(m, 1000))
    assert a > 0  # the recurrent state of 45 linear layers
    assert b - a == 1000 * 15 * 2 * 2 * 256 * 2


def test_experts_touched():
    assert float(expected_experts_touched(256, 8, 1)) == pytest.approx(8.0)
    assert float(expected_experts_touched(256, 8, 10_000)) == pytest.approx(256.0)
    assert float(expected_experts_touched(8, 2, 2)) == pytest.approx(8 * (1 - 0.75**2))
