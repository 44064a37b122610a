from __future__ import annotations

import pytest

from planner.catalog.hf_import import hf_id_from_path, import_config
from planner.errors import InputError
from planner.perf.params import model_stats
from tests.conftest import HF_CONFIGS

CATALOG_OF = {
    "meta-llama--Meta-Llama-3.1-8B.json": "llama-3.1-8b",
    "meta-llama--Meta-Llama-3.1-70B.json": "llama-3.1-70b",
    "meta-llama--Meta-Llama-3.1-405B.json": "llama-3.1-405b",
    "deepseek-ai--DeepSeek-V3.json": "deepseek-v3",
    "deepseek-ai--DeepSeek-R1.json": "deepseek-v3",
    "moonshotai--Kimi-K2-Instruct.json": "kimi-k2",
    "moonshotai--Kimi-K2.5.json": "kimi-k2.5",
    "Qwen--Qwen3-235B-A22B.json": "qwen3-235b-a22b",
    "Qwen--Qwen3-30B-A3B.json": "qwen3-30b-a3b",
    "Qwen--Qwen3-32B.json": "qwen3-32b",
    "Qwen--Qwen3.5-397B-A17B.json": "qwen3.5-397b-a17b",
    "mistralai--Mixtral-8x7B-v0.1.json": "mixtral-8x7b",
    "mistralai--Mixtral-8x22B-v0.1.json": "mixtral-8x22b",
    "openai--gpt-oss-120b.json": "gpt-oss-120b",
    "openai--gpt-oss-20b.json": "gpt-oss-20b",
    "zai-org--GLM-5.json": "glm-5",
    "MiniMaxAI--MiniMax-M2.5.json": "minimax-m2.5",
}


def test_every_shared_config_is_covered():
    d = HF_CONFIGS
    assert sorted(p.name for p in d.glob("*.json")) == sorted(CATALOG_OF)


@pytest.mark.parametrize("fname", sorted(CATALOG_OF))
def test_import_matches_catalog(catalog, fname):
    path = HF_CONFIGS / fname
    spec = import_config(path, model_id="x")
    entry = catalog.models[CATALOG_OF[fname]]
    assert spec.architecture == entry.architecture
    assert model_stats(spec).total_params == pytest.approx(model_stats(entry).total_params)
    assert hf_id_from_path(path) in entry.hf_ids or fname.startswith("deepseek-ai--DeepSeek-R1")


def test_import_features():
    ds = import_config(HF_CONFIGS / "deepseek-ai--DeepSeek-V3.json", model_id="x")
    assert ds.architecture.attention.type == "mla" and ds.architecture.dense_layers == 3
    assert ds.architecture.moe.shared_experts == 1 and ds.weights_dtype == "fp8"
    oss = import_config(HF_CONFIGS / "openai--gpt-oss-120b.json", model_id="x")
    assert oss.architecture.attention.sliding_layers == 18 and oss.architecture.attention.sliding_window_tokens == 128
    assert oss.expert_weights_dtype == "fp4" and oss.weights_dtype == "bf16"
    q35 = import_config(HF_CONFIGS / "Qwen--Qwen3.5-397B-A17B.json", model_id="x")
    assert q35.architecture.attention.linear_layers == 45 and q35.architecture.attention.output_gate
    glm = import_config(HF_CONFIGS / "zai-org--GLM-5.json", model_id="x")
    assert glm.architecture.attention.sparse_topk_tokens == 2048


def test_an_fp8_config_without_weight_blocks_scales_whole_tensors(tmp_path):
    """``fp8_scales``: DeepSeek's FP8 config names 128x128 weight blocks (block, the default); an FP8 config without
    ``weight_block_size`` scales whole tensors; a bf16 config says nothing of FP8 scales."""
    import json

    ds = import_config(HF_CONFIGS / "deepseek-ai--DeepSeek-V3.json", model_id="x")
    assert ds.fp8_scales == "block"
    cfg = json.loads((HF_CONFIGS / "meta-llama--Meta-Llama-3.1-70B.json").read_text())
    assert import_config(HF_CONFIGS / "meta-llama--Meta-Llama-3.1-70B.json", model_id="x").fp8_scales == "block"
    p = tmp_path / "org--model-FP8.json"
    p.write_text(json.dumps({**cfg, "quantization_config": {"quant_method": "fp8", "activation_scheme": "static"}}))
    spec = import_config(p, model_id="x")
    assert spec.weights_dtype == "fp8" and spec.fp8_scales == "tensor"
    p.write_text(json.dumps({**cfg, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}))
    assert import_config(p, model_id="x").fp8_scales == "block"


def test_bad_config(tmp_path):
    p = tmp_path / "cfg.json"
    p.write_text('{"hidden_size": 4096}')
    with pytest.raises(InputError, match="cfg.json.*num_hidden_layers"):
        import_config(p, model_id="x")
    p.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        import_config(p, model_id="x")
