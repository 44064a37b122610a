"""Nothing from a file reaches a shell or a path unchecked (issue 45, deliver 1).

Two walls: ids match strict patterns where they are read (catalog, scenario, plan.json, imported config
names), and export quotes every shell word with the standard library and checks every output path. The
campaign (``bench/hostile_campaign.py``) feeds generated hostile values to both; each reproducer of the
issue is pinned here.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from planner.catalog.ids import HF_ID, LABEL
from planner.cli import main
from planner.export import launch
from planner.export.bundle import read_plan
from planner.export.deploy import deployments
from tests.conftest import ROOT

PLAN = ROOT / "plans" / "deepseek-skewed"
PWN = "x$(touch /tmp/PWNED_planner_test)"

# Checkpoint ids of shared/reference/checkpoints.md (read 2026-11-26; the file is the project's own notes):
# every one must pass the Hugging Face id pattern.
CHECKPOINTS = """deepseek-ai/DeepSeek-R1 deepseek-ai/DeepSeek-R1-0528 deepseek-ai/DeepSeek-V3 deepseek-ai/DeepSeek-V3-0324
nvidia/DeepSeek-R1-0528-FP4 nvidia/DeepSeek-R1-0528-FP4-v2 nvidia/DeepSeek-R1-0528-NVFP4 nvidia/DeepSeek-R1-FP4
nvidia/DeepSeek-R1-FP4-v2 nvidia/DeepSeek-V3-0324-FP4 amd/DeepSeek-R1-0528-MXFP4 amd/DeepSeek-R1-0528-MXFP4-Preview
meta-llama/Llama-3.1-405B meta-llama/Llama-3.1-70B meta-llama/Llama-3.1-8B meta-llama/Llama-3.1-8B-Instruct
meta-llama/Meta-Llama-3.1-405B-Instruct-FP8 nvidia/Llama-3.1-405B-Instruct-FP4 nvidia/Llama-3.1-405B-Instruct-FP8
nvidia/Llama-3.1-70B-Instruct-FP8 nvidia/Llama-3.1-8B-Instruct-FP8 RedHatAI/Meta-Llama-3.1-8B-quantized.w8a8
RedHatAI/Kimi-K2-Instruct-quantized.w4a16 RedHatAI/gpt-oss-20b-speculator.eagle3 moonshotai/Kimi-K2-Instruct
moonshotai/Kimi-K2-Instruct-0905 moonshotai/Kimi-K2-Thinking nvidia/Kimi-K2.5-NVFP4 nvidia/Kimi-K2.6-NVFP4
Qwen/Qwen3-235B-A22B Qwen/Qwen3-235B-A22B-FP8 Qwen/Qwen3-235B-A22B-Instruct-2507-FP8 Qwen/Qwen3-30B-A3B-FP8
nvidia/Qwen3-235B-A22B-NVFP4 mistralai/Mixtral-8x22B-v0.1 mistralai/Mixtral-8x7B-Instruct-v0.1
nm-testing/Mixtral-8x7B-Instruct-v0.1-FP8 openai/gpt-oss-120b openai/gpt-oss-20b zai-org/GLM-5-FP8
nvidia/GLM-5-NVFP4 MiniMaxAI/MiniMax-M2.5 nvidia/MiniMax-M2.5-NVFP4""".split()


def run(argv: list[str]) -> int:
    try:
        main([str(a) for a in argv])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def _campaign():
    spec = importlib.util.spec_from_file_location("hostile_campaign", ROOT / "bench" / "hostile_campaign.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_real_id_passes(catalog):
    for cid in CHECKPOINTS:
        assert re.match(HF_ID, cid), cid
    for m in catalog.models.values():
        assert all(re.match(HF_ID, h) for h in m.hf_ids), m.id
        assert re.match(LABEL, m.name)
    for h in catalog.hardware.values():
        assert re.match(LABEL, h.name)


def test_campaign_finds_no_injection_or_escape(tmp_path):
    """A few hundred generated values per CI run (bench/hostile_campaign.py runs 2,000 per family)."""
    rep = _campaign().run(per_family=60, seed=45, tmp=tmp_path)
    assert rep["failures"] == []
    for fam, c in rep["families"].items():
        assert c["values"] == 60 and c["wall_checks"] >= 50, fam
        assert c["refused"] > 0, fam  # the generator does produce values the schema must refuse


def _catalog_copy(tmp_path: Path) -> Path:
    dest = tmp_path / "cat"
    shutil.copytree(ROOT / "catalogs", dest, ignore=shutil.ignore_patterns("scenarios"))
    return dest


def test_hf_id_with_command_substitution_is_refused(tmp_path, capsys):
    cat = _catalog_copy(tmp_path)
    f = cat / "models" / "llama-3.1-70b.yaml"
    doc = yaml.safe_load(f.read_text())
    doc["hf_ids"] = [f'org/{PWN}"; echo owned']
    f.write_text(yaml.safe_dump(doc))
    assert run(["--catalog", str(cat), "catalog", "validate"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "llama-3.1-70b.yaml" in err[0] and "hf_ids" in err[0]


def test_import_takes_no_id_from_a_crafted_file_name(tmp_path, capsys):
    camp = _campaign()
    bad = tmp_path / "org--x$(touch PWNED_planner_test).json"
    bad.write_text(json.dumps(camp.CONFIG))
    code = run(["models", "import", str(bad), "--id", "imported", "--out", str(tmp_path / "m.yaml")])
    assert code in (1, 2)
    err = capsys.readouterr().err
    assert "--hf-id" in err and "Traceback" not in err
    assert not (tmp_path / "m.yaml").exists()


def _plan_with(tmp_path: Path, edit) -> Path:
    dest = tmp_path / "plan"
    shutil.copytree(PLAN, dest)
    doc = json.loads((dest / "plan.json").read_text())
    edit(doc)
    (dest / "plan.json").write_text(json.dumps(doc))
    return dest


@pytest.mark.parametrize("field,value", [("workload", "chat\necho owned"), ("id", "/abs/path"),
                                         ("id", "../../dir"), ("model", PWN), ("engine", "vllm; id"),
                                         ("hardware", "../h200")])
def test_plan_json_is_read_back_through_the_strict_schema(tmp_path, capsys, field, value):
    def edit(doc):
        doc["pools"][0][field] = value

    plan = _plan_with(tmp_path, edit)
    out = tmp_path / "export"
    assert run(["export", str(plan), "--target", "all", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "plan.json" in err[0] and field in err[0]
    assert not out.exists() and not Path("/abs/path").exists() and not (tmp_path.parent / "dir").exists()


def test_map_file_cannot_name_a_path(tmp_path, capsys):
    def edit(doc):
        doc["pools"][0]["expert_placement"]["map_file"] = "../../../../etc/passwd.json"

    plan = _plan_with(tmp_path, edit)
    assert run(["export", str(plan), "--target", "sglang", "--out", str(tmp_path / "e")]) == 1
    assert "map_file" in capsys.readouterr().err


def test_export_paths_stay_inside_out_even_past_the_schema(tmp_path, catalog, monkeypatch):
    """The second wall: a pool id that reached export anyway (schema bypassed) is refused before writing."""
    from planner.errors import InputError
    from planner.export import bundle

    real = bundle.deployments

    def hostile(plan, cat, *args):
        return [dataclasses.replace(d, pool="../../escaped") for d in real(plan, cat, *args)]

    monkeypatch.setattr(bundle, "deployments", hostile)
    with pytest.raises(InputError, match="outside"):
        bundle.export_plan(PLAN, ["vllm"], tmp_path / "out", catalog)
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "out").exists()


def test_export_refuses_to_overwrite_without_force(tmp_path, capsys):
    out = tmp_path / "export"
    assert run(["export", str(PLAN), "--target", "vllm", "--out", str(out)]) == 0
    assert run(["export", str(PLAN), "--target", "vllm", "--out", str(out)]) == 1
    assert "--force" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("value", [PWN, 'org/x"; touch /tmp/PWNED_planner_test; "', "org/`touch /tmp/PWNED_planner_test`",
                                   "org/x\ntouch /tmp/PWNED_planner_test", "org/$HOME'$(id)'"])
def test_scripts_run_with_hostile_values_as_plain_data(tmp_path, catalog, value):
    """Run each exported script for real with fake engine binaries that record their arguments: the hostile
    model path arrives as one argument, byte for byte, and nothing else runs."""
    sentinel = Path("/tmp/PWNED_planner_test")
    sentinel.unlink(missing_ok=True)
    plan = read_plan(PLAN)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "argv.json"
    for exe in ("python3", "vllm", "trtllm-serve"):
        f = bin_dir / exe
        f.write_text(f"#!{shutil.which('python3') or '/usr/bin/python3'}\nimport json, sys\n"
                     f"json.dump(sys.argv[1:], open({str(record)!r}, 'w'))\n")
        f.chmod(0o755)
    for d in deployments(plan, catalog, PLAN)[:2]:
        d = dataclasses.replace(d, model_path=value, workload="w\necho injected")
        for t in launch.TARGETS:
            args = launch.command(d, t)
            script = tmp_path / f"{t}.sh"
            script.write_text(launch.script(d, t, args, notes=["a note\nwith a newline; touch /tmp/PWNED_planner_test"]))
            env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "NODE_RANK": "1", "LEADER_ADDR": "10.0.0.1"}
            env.pop("MODEL_PATH", None)
            r = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, r.stderr
            got = json.loads(record.read_text())
            assert value in got, (t, got)
            assert "injected" not in r.stdout
            assert not sentinel.exists(), (t, value)
