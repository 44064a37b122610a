"""CLI contract: JSON keys, exit codes and one-line messages for user errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from tests.conftest import CALIB, HF_CONFIGS, ROOT

ROOFLINE_KEYS = {
    "chips", "step_time_s", "compute_time_s", "memory_time_s", "comm_time_s", "bound", "tokens_per_s",
    "weight_bytes_per_chip", "kv_bytes_per_chip", "fits", "usd_per_hour", "usd_per_mtok", "balance_batch",
    "latency_floor_s",
}


def run(*args, check=True):
    p = subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, cwd=ROOT)
    if check and p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}: {p.stderr}")
    return p


def test_roofline_json():
    p = run("roofline", "--model", "llama-3.1-70b", "--hardware", "h100_sxm", "--batch", "64", "--context", "2048",
            "--tp", "8", "--json")
    d = json.loads(p.stdout)
    assert ROOFLINE_KEYS <= set(d)
    assert d["chips"] == 8 and d["bound"] in ("compute", "memory", "communication") and d["fits"] is True


def test_roofline_speculative_decoding_json():
    args = ("roofline", "--model", "deepseek-v3", "--hardware", "h200-sxm", "--batch", "32", "--context", "2048",
            "--tp", "8", "--ep", "8", "--weights", "fp8", "--json")
    plain = json.loads(run(*args).stdout)
    spec = json.loads(run(*args, "--spec-tokens", "3", "--spec-accept", "0.7").stdout)
    assert plain["tokens_per_step"] == 1.0 and plain["draft_time_s"] == 0.0
    assert spec["tokens_per_step"] == pytest.approx(2.533) and spec["draft_time_s"] > 0
    assert spec["step_time_s"] < plain["step_time_s"] and spec["tokens_per_s"] > plain["tokens_per_s"]


def test_roofline_ideal_text():
    p = run("roofline", "--model", "deepseek-v3", "--hardware", "gb200-nvl72", "--batch", "2048", "--context", "4096",
            "--tp", "1", "--dp", "32", "--ep", "32", "--ideal")
    assert "step time" in p.stdout and "latency floor" in p.stdout


@pytest.mark.parametrize(
    "args,pattern",
    [
        (["--model", "llama-3.1-70b", "--hardware", "h100-sxm", "--batch", "8", "--context", "1", "--tp", "128"], "--tp 128"),
        (["--model", "deepseek-v3", "--hardware", "h100-sxm", "--batch", "8", "--context", "1", "--tp", "8", "--ep", "6"],
         "--ep 6"),
        (["--model", "llama-9", "--hardware", "h100-sxm", "--batch", "8", "--context", "1"], "unknown model id"),
        (["--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--batch", "0", "--context", "1"], "--batch"),
        (["--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--batch", "1", "--context", "1", "--spec-tokens", "40"],
         "--spec-tokens"),
        (["--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--batch", "1", "--context", "1", "--spec-accept", "1.5"],
         "--spec-accept"),
        (["--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--batch", "1", "--context", "1", "--weights", "fp3"],
         "--weights"),
    ],
)
def test_roofline_bad_input_exit_1(args, pattern):
    p = run("roofline", *args, check=False)
    assert p.returncode == 1
    assert pattern in p.stderr
    assert "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_catalog_list_json():
    d = json.loads(run("catalog", "list", "--json").stdout)
    m = {x["id"]: x for x in d["models"]}
    h = {x["id"]: x for x in d["hardware"]}
    assert {"id", "hf_ids", "total_params", "active_params", "kv_bytes_per_token_bf16"} <= set(m["deepseek-v3"])
    assert {"id", "chips_per_unit", "scale_up_domain_chips", "price_usd_per_chip_hour"} <= set(h["gb200-nvl72"])
    assert h["gb200-nvl72"]["chips_per_unit"] == 72 and h["gb200-nvl72"]["scale_up_domain_chips"] == 72


def test_catalog_show_and_validate():
    assert "kv_lora_rank" in run("catalog", "show", "deepseek-v3").stdout
    assert run("catalog", "validate").stdout.startswith("ok:")
    p = run("catalog", "show", "nope", check=False)
    assert p.returncode == 1 and "unknown" in p.stderr


def test_models_import(tmp_path):
    cfg = HF_CONFIGS / "Qwen--Qwen3-30B-A3B.json"
    out = tmp_path / "q.yaml"
    run("models", "import", str(cfg), "--id", "qwen3-30b-test", "--out", str(out))
    assert "expert_intermediate: 768" in out.read_text()
    p = run("models", "import", str(cfg), "--id", "qwen3-30b-test", "--out", str(out), check=False)
    assert p.returncode == 1 and "--force" in p.stderr
    p = run("models", "import", str(cfg), "--id", "Bad_Id", "--out", "-", check=False)
    assert p.returncode == 1


def test_predict_and_validate_small(tmp_path):
    src = CALIB
    df = pd.read_csv(src)
    sample = pd.concat([df.head(40), df[df["mode"] == "disagg"].head(20)])
    sample.loc[sample.index[0], "model_path"] = "some-org/unknown-model"
    data = tmp_path / "rows.csv"
    sample.to_csv(data, index=False)
    out = tmp_path / "pred.csv"
    run("predict", "--data", str(data), "--out", str(out))
    res = pd.read_csv(out)
    assert {"predicted_ttft_ms", "predicted_tpot_ms", "prediction_note"} <= set(res.columns)
    assert res["predicted_tpot_ms"].notna().sum() == len(res) - 1
    assert "unknown model" in str(res.loc[0, "prediction_note"])
    p = run("predict", "--data", str(data), "--out", str(out), check=False)
    assert p.returncode == 1
    v = json.loads(run("validate", "--data", str(data), "--json").stdout)
    assert v["overall"]["rows"] == len(sample) and {"by_system", "by_backend"} <= set(v)


def test_validate_reports_assumed_deployments_apart(tmp_path):
    """Disaggregated rows without worker counts are predicted on an assumed deployment; validate reports them
    in their own group, beside the rows that record theirs, in the table and in --json."""
    df = pd.read_csv(CALIB)
    dis = df[(df["mode"] == "disagg") & df["decode_num_workers"].notna()].head(12).copy()
    blank = dis.index[:5]
    dis.loc[blank, ["prefill_num_workers", "decode_num_workers"]] = float("nan")
    sample = pd.concat([df[df["mode"] == "agg"].head(10), dis])
    data = tmp_path / "rows.csv"
    sample.to_csv(data, index=False)
    v = json.loads(run("validate", "--data", str(data), "--json").stdout)
    groups = {r["deployment"]: r["rows"] for r in v["by_deployment"]}
    assert groups == {"recorded": len(sample) - len(blank), "workers assumed": len(blank)}
    text = run("validate", "--data", str(data)).stdout
    assert "Deployment recorded in the file or assumed" in text and "| workers assumed | 5 |" in text


def test_predict_missing_file(tmp_path):
    p = run("predict", "--data", str(tmp_path / "nope.csv"), "--out", str(tmp_path / "o.csv"), check=False)
    assert p.returncode == 1 and "not found" in p.stderr


def test_roofline_rejects_native_kv():
    p = run("roofline", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--batch", "1", "--context", "1",
            "--kv", "native", check=False)
    assert p.returncode == 1 and "--kv" in p.stderr and "Traceback" not in p.stderr


def test_fit_refuses_data_without_usable_rows(tmp_path):
    data = tmp_path / "rows.csv"
    data.write_text("model_path,system,backend,mode,isl,osl,silicon_ttft_ms,silicon_tpot_ms\n"
                    "foo/bar,h100_sxm,vllm,agg,10,10,1,1\n")
    p = run("calibrate", "fit", "--data", str(data), "--write", check=False)
    assert p.returncode == 1 and "can be fitted" in p.stderr


@pytest.mark.parametrize("cmd", [["validate"], ["calibrate", "fit"], ["calibrate", "report", "--no-cv"]])
def test_measured_columns_required(tmp_path, cmd):
    df = pd.read_csv(CALIB).head(30).drop(columns=["silicon_ttft_ms"])
    data = tmp_path / "rows.csv"
    df.to_csv(data, index=False)
    extra = ["--out", str(tmp_path / "v.md")] if "report" in cmd else []
    p = run(*cmd, "--data", str(data), *extra, check=False)
    assert p.returncode == 1 and "silicon_ttft_ms" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "v.md").exists()
