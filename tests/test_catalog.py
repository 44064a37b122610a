from __future__ import annotations

import shutil

import pytest
import yaml

from planner.catalog import load_catalog
from planner.catalog.loader import clear_cache
from planner.errors import InputError
from tests.conftest import ROOT

HARDWARE = [
    "h100-sxm", "h200-sxm", "h800-sxm", "b200-sxm", "b300-sxm", "gb200-nvl72", "gb300-nvl72", "mi300x", "mi325x",
    "mi355x", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-v7", "trn2",
]
MODELS = [
    "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "deepseek-v3", "kimi-k2", "kimi-k2.5", "qwen3-235b-a22b",
    "qwen3-30b-a3b", "qwen3-32b", "qwen3.5-397b-a17b", "mixtral-8x7b", "mixtral-8x22b", "gpt-oss-120b", "gpt-oss-20b",
    "glm-5", "minimax-m2.5", "palm-540b",
]


def test_every_required_entry_is_present(catalog):
    assert sorted(catalog.hardware) == sorted(HARDWARE)
    assert sorted(catalog.models) == sorted(MODELS)


def test_every_entry_has_source_and_date(catalog):
    for entry in [*catalog.hardware.values(), *catalog.models.values()]:
        assert len(entry.source) > 10
        assert entry.as_of.year >= 2025
    for hw in catalog.hardware.values():
        assert hw.efficiency.source and hw.efficiency.as_of
        if hw.price is not None:
            assert hw.price.source and hw.price.as_of


@pytest.mark.parametrize(
    "alias,expected",
    [("h100_sxm", "h100-sxm"), ("gb200", "gb200-nvl72"), ("b300_sxm", "b300-sxm"), ("gb300", "gb300-nvl72"),
     ("H200_SXM", "h200-sxm"), ("b200_sxm", "b200-sxm")],
)
def test_hardware_aliases(catalog, alias, expected):
    assert catalog.get_hardware(alias).id == expected


@pytest.mark.parametrize(
    "hf,expected",
    [("nvidia/DeepSeek-R1-NVFP4", "deepseek-v3"), ("deepseek-ai/DeepSeek-R1", "deepseek-v3"),
     ("zhipuai/GLM-5", "glm-5"), ("Qwen/Qwen3-235B-A22B-FP8", "qwen3-235b-a22b"),
     ("nvidia/Llama-3.1-8B-Instruct-FP8", "llama-3.1-8b"), ("openai/gpt-oss-120b", "gpt-oss-120b")],
)
def test_hf_ids_resolve(catalog, hf, expected):
    assert catalog.get_model(hf).id == expected


def test_no_dtype_is_guessed(catalog):
    # Hopper and AMD CDNA3 have no FP4 tensor cores; TPU v5p/v6e list FP8 at the bf16 rate.
    for hid in ("h100-sxm", "h200-sxm", "h800-sxm", "mi300x", "mi325x"):
        assert "fp4" not in catalog.hardware[hid].dense_tflops
    assert catalog.hardware["tpu-v5p"].dense_tflops["fp8"] == catalog.hardware["tpu-v5p"].dense_tflops["bf16"]
    assert catalog.hardware["b200-sxm"].dense_tflops == {"bf16": 2250, "fp8": 4500, "fp4": 9000, "int8": 4500}


def test_unknown_id_names_what_to_fix(catalog):
    with pytest.raises(InputError, match="unknown hardware id 'h100x'.*did you mean h100-sxm"):
        catalog.get_hardware("h100x")  # no alias h100x
    with pytest.raises(InputError, match="unknown model id"):
        catalog.get_model("llama-9")


def _copy_catalog(tmp_path):
    dst = tmp_path / "catalogs"
    shutil.copytree(ROOT / "catalogs", dst)
    clear_cache()
    return dst


def _edit(path, fn):
    data = yaml.safe_load(path.read_text())
    fn(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda d: d.pop("hbm_bandwidth_tb_s"), "hbm_bandwidth_tb_s"),
        (lambda d: d.__setitem__("hbm_capacity_gb", -80), "hbm_capacity_gb"),
        (lambda d: d.__setitem__("hbm_speed", 3), "hbm_speed"),
        (lambda d: d["price"].__setitem__("usd_per_chip_hour", 0), "price.usd_per_chip_hour"),
    ],
)
def test_bad_hardware_file_names_file_and_field(tmp_path, mutate, field):
    root = _copy_catalog(tmp_path)
    path = root / "hardware" / "h100-sxm.yaml"
    _edit(path, mutate)
    with pytest.raises(InputError) as exc:
        load_catalog(root)
    msg = str(exc.value)
    assert "h100-sxm.yaml" in msg and field in msg
    assert "\n" not in msg
    clear_cache()


def test_model_file_with_wrong_layer_sum(tmp_path):
    root = _copy_catalog(tmp_path)
    path = root / "models" / "llama-3.1-8b.yaml"
    _edit(path, lambda d: d["architecture"]["attention"].__setitem__("full_layers", 31))
    with pytest.raises(InputError, match="llama-3.1-8b.yaml.*full_layers"):
        load_catalog(root)
    clear_cache()


def test_duplicate_alias_is_rejected(tmp_path):
    root = _copy_catalog(tmp_path)
    _edit(root / "hardware" / "h200-sxm.yaml", lambda d: d["aliases"].append("h100_sxm"))
    with pytest.raises(InputError, match="aliases.*h100_sxm"):
        load_catalog(root)
    clear_cache()
