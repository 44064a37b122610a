"""No silent wrong answers: every reproducer of the robustness issue, as a regression test.

Each bad input exits 1 with one line that names the field, flag or file (no traceback); outputs are
refused before any solve; what a user owns is never lost. Commands run in-process through
``planner.cli.main`` (the same entry point as ``python -m planner``).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import yaml

from planner.cli import main
from tests.conftest import CALIB, ROOT

SMALL = {
    "name": "small",
    "model": "llama-3.1-70b",
    "weights": ["fp8"],
    "kv_cache": ["fp8"],
    "hardware": ["h100-sxm"],
    "serving": ["aggregated"],
    "workloads": [{"name": "chat", "requests_per_s": 20, "input_tokens": 1000, "output_tokens": 200,
                   "slo": {"ttft_ms": 2000, "tpot_ms": 50}}],
}


def cli(capsys, *args) -> tuple[int, str, str]:
    """Run the CLI in-process: (exit code, stdout, stderr)."""
    try:
        main([*map(str, args)])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str, *needles: str) -> None:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("error: "), err
    assert "Traceback" not in err, err
    assert len([ln for ln in lines if ln.startswith("error:")]) == 1, err
    for n in needles:
        assert n in lines[-1], (n, err)


def scenario(tmp_path: Path, **changes) -> Path:
    doc = json.loads(json.dumps(SMALL))
    for path, value in changes.items():
        node = doc
        keys = path.split("__")
        for k in keys[:-1]:
            node = node[int(k)] if isinstance(node, list) else node[k]
        node[keys[-1]] = value
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


# -- a plan's status is true ------------------------------------------------------------------------


@pytest.mark.parametrize("field,value,needle", [
    ("workloads__0__requests_per_s", 1e20, "requests_per_s"),
    ("workloads__0__requests_per_s", float("nan"), "requests_per_s"),
    ("workloads__0__requests_per_s", float("inf"), "requests_per_s"),
    ("utilisation_cap", 0.0, "utilisation_cap"),
    ("utilisation_cap", 1.5, "utilisation_cap"),
])
def test_unrepresentable_inputs_exit_1_naming_the_field(tmp_path, capsys, field, value, needle):
    code, out, err = cli(capsys, "plan", scenario(tmp_path, **{field: value}), "--out", tmp_path / "p")
    assert code == 1
    one_line_error(err, needle)
    assert not (tmp_path / "p").exists()


def test_huge_prefix_working_set_is_refused(tmp_path, capsys):
    s = scenario(tmp_path)
    doc = yaml.safe_load(s.read_text())
    doc["workloads"][0]["prefix_cache"] = {"hit_rate": 0.5, "working_set_gb": 1e15}
    s.write_text(yaml.safe_dump(doc))
    code, _, err = cli(capsys, "plan", s, "--out", tmp_path / "p")
    assert code == 1
    one_line_error(err, "working_set_gb")


def test_utilisation_cap_one_plans(tmp_path, capsys):
    code, _, err = cli(capsys, "plan", scenario(tmp_path, utilisation_cap=1.0), "--out", tmp_path / "p", "--no-analysis")
    assert code == 0, err
    doc = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert doc["objective"]["usd_per_hour"] > 0 and doc["recheck"]["ok"]
    # the TTFT queueing term uses the load the pool carries, not the cap
    for pool in doc["pools"]:
        assert pool["predicted"]["utilisation"] <= 1.0 + 1e-9


# -- one input layer ----------------------------------------------------------------------------------


def test_non_utf8_scenario(tmp_path, capsys):
    p = tmp_path / "s.yaml"
    p.write_bytes(b"name: caf\xe9\n")
    code, _, err = cli(capsys, "plan", p)
    assert code == 1
    one_line_error(err, str(p), "UTF-8")


def test_deeply_nested_yaml(tmp_path, capsys):
    p = tmp_path / "s.yaml"
    p.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    code, _, err = cli(capsys, "plan", p)
    assert code == 1
    one_line_error(err, str(p))


def test_duplicate_keys_are_refused(tmp_path, capsys):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(SMALL) + "model: deepseek-v3\n")
    code, _, err = cli(capsys, "plan", p)
    assert code == 1
    one_line_error(err, str(p), "model")


def test_endless_expert_load_file_is_not_read_forever(tmp_path, capsys):
    code, _, err = cli(capsys, "experts", "--model", "deepseek-v3", "--gpus", "64", "--load", "/dev/zero")
    assert code == 1
    one_line_error(err, "/dev/zero")


def test_infinite_catalog_numbers_are_refused(tmp_path, capsys):
    import shutil

    cat = tmp_path / "catalogs"
    shutil.copytree(ROOT / "catalogs", cat)
    f = cat / "hardware" / "h100-sxm.yaml"
    text = f.read_text()
    key = next(ln.split(":")[0] for ln in text.splitlines() if ln.strip().startswith("hbm_bandwidth_tb_s"))
    f.write_text("\n".join((key + ": .inf") if ln.startswith(key + ":") else ln for ln in text.splitlines()) + "\n")
    code, _, err = cli(capsys, "--catalog", cat, "catalog", "validate")
    assert code == 1
    one_line_error(err, "h100-sxm.yaml", "hbm_bandwidth_tb_s")


def _calib_rows(tmp_path: Path, **cells) -> Path:
    import csv

    src = CALIB
    with src.open(newline="") as fh:
        rows = list(csv.reader(fh))
    head, row = rows[0], list(rows[1])
    for k, v in cells.items():
        row[head.index(k)] = v
    out = tmp_path / "rows.csv"
    with out.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(head)
        w.writerow(row)
    return out


def test_infinite_parallel_degree_in_measured_rows(tmp_path, capsys):
    data = _calib_rows(tmp_path, tp_size="inf")
    code, _, err = cli(capsys, "predict", "--data", data, "--out", tmp_path / "p.csv")
    assert code == 0, err
    import pandas as pd

    res = pd.read_csv(tmp_path / "p.csv")
    assert res["predicted_tpot_ms"].isna().all() and "tp_size must be a whole number" in res["prediction_note"][0]
    code, _, err = cli(capsys, "validate", "--data", data)
    assert code == 1
    one_line_error(err, "none of its 1 rows can be predicted", "tp_size")


def test_validate_header_only_csv(tmp_path, capsys):
    src = CALIB
    p = tmp_path / "h.csv"
    p.write_text(src.read_text().splitlines()[0] + "\n")
    code, out, err = cli(capsys, "validate", "--data", p)
    assert code == 1 and "nan" not in out.lower()
    one_line_error(err, str(p))


@pytest.mark.parametrize("flag,value", [("--batch", "nan"), ("--batch", "inf"), ("--context", "nan"), ("--context", "-inf")])
def test_roofline_non_finite_numbers(capsys, flag, value):
    args = {"--batch": "8", "--context": "1024"}
    args[flag] = value
    code, out, err = cli(capsys, "roofline", "--model", "llama-3.1-70b", "--hardware", "h100-sxm", "--tp", "8",
                         *[x for kv in args.items() for x in kv], "--json")
    assert code == 1 and out == ""
    one_line_error(err, flag)


def test_models_import_is_strict(tmp_path, capsys):
    cfg = {"architectures": ["MixtralForCausalLM"], "hidden_size": 1024, "intermediate_size": 2048,
           "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 1000,
           "num_local_experts": 8, "num_experts_per_tok": 0, "max_position_embeddings": 4096}
    p = tmp_path / "org--m.json"
    p.write_text(json.dumps(cfg))
    code, _, err = cli(capsys, "models", "import", p, "--id", "m", "--out", "-")
    assert code == 1
    one_line_error(err, "num_experts_per_tok")
    cfg["num_experts_per_tok"] = 2
    cfg["tie_word_embeddings"] = "abc"
    p.write_text(json.dumps(cfg))
    code, _, err = cli(capsys, "models", "import", p, "--id", "m", "--out", "-")
    assert code == 1
    one_line_error(err, "tie_word_embeddings")


# -- exit codes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("args,needle", [
    (["plan"], "scenario"),
    (["roofline", "--model", "llama-3.1-70b"], "--hardware"),
    (["experts", "--model", "deepseek-v3", "--gpus", "64", "--seed", "-1"], "--seed"),
    (["sweep", "x.yaml", "--vary", "a=1", "--jobs", "0"], "--jobs"),
    (["no-such-command"], "no-such-command"),
])
def test_usage_errors_exit_1_on_one_line(capsys, args, needle):
    code, _, err = cli(capsys, *args)
    assert code == 1
    one_line_error(err.lower(), needle)  # typer writes a missing argument's name upper case in some versions


def test_missing_file_exits_1(tmp_path, capsys):
    code, _, err = cli(capsys, "plan", tmp_path / "nope.yaml")
    assert code == 1
    one_line_error(err, "nope.yaml")


# -- outputs checked before any solve -------------------------------------------------------------------


def test_out_that_is_a_file(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("mine")
    code, _, err = cli(capsys, "plan", scenario(tmp_path), "--out", f)
    assert code == 1
    one_line_error(err, "--out", "is a file")
    assert f.read_text() == "mine"


def test_lp_and_map_paths_checked_before_solving(tmp_path, capsys):
    code, _, err = cli(capsys, "plan", scenario(tmp_path), "--out", tmp_path / "p", "--lp", tmp_path / "missing" / "f" / "m.lp")
    # a missing folder is created; a file in the way is not
    (tmp_path / "blocker").write_text("x")
    code, _, err = cli(capsys, "plan", scenario(tmp_path), "--out", tmp_path / "p2", "--lp", tmp_path / "blocker" / "m.lp")
    assert code == 1
    one_line_error(err, "--lp", "not a folder")
    assert not (tmp_path / "p2").exists()
    code, _, err = cli(capsys, "experts", "--model", "deepseek-v3", "--gpus", "8", "--map", tmp_path / "blocker" / "m.json")
    assert code == 1
    one_line_error(err, "--map")


def test_lp_symlink_is_not_written_through(tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "m.lp"
    link.symlink_to(victim)
    code, _, err = cli(capsys, "plan", scenario(tmp_path), "--out", tmp_path / "p", "--lp", link, "--force")
    assert code == 1
    one_line_error(err, "symbolic link")
    assert victim.read_text() == "precious"


def test_outputs_follow_the_umask(tmp_path, capsys):
    old = os.umask(0o027)
    try:
        code, _, err = cli(capsys, "plan", scenario(tmp_path), "--out", tmp_path / "p", "--no-analysis")
    finally:
        os.umask(old)
    assert code == 0, err
    for name in ("plan.json", "plan.md"):
        assert stat.S_IMODE((tmp_path / "p" / name).stat().st_mode) == 0o640


# -- outputs as a unit ------------------------------------------------------------------------------------


def test_plan_folder_is_replaced_whole_and_keeps_user_files(tmp_path, capsys):
    out = tmp_path / "p"
    code, _, err = cli(capsys, "plan", scenario(tmp_path), "--out", out, "--no-analysis")
    assert code == 0, err
    (out / "notes.md").write_text("mine")
    code, _, err = cli(capsys, "plan", scenario(tmp_path), "--out", out, "--no-analysis")
    assert code == 1
    one_line_error(err, "--force")
    s2 = scenario(tmp_path, workloads__0__requests_per_s=40)
    code, _, err = cli(capsys, "plan", s2, "--out", out, "--no-analysis", "--force")
    assert code == 0, err
    doc = json.loads((out / "plan.json").read_text())
    assert doc["workloads"][0]["requests_per_s"] == 40
    assert "40 req/s" in (out / "plan.md").read_text()  # md and json of the same run
    assert (out / "notes.md").read_text() == "mine"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".p.")]  # no staging folder left


def test_insights_refuse_to_overwrite_plots_without_force(tmp_path, capsys):
    args = ["insights", "--model", "llama-3.1-70b", "--hardware", "h100-sxm", "--out", tmp_path]
    code, _, err = cli(capsys, *args)
    assert code == 0, err
    png = next((tmp_path / "insights").glob("*.png"))
    (tmp_path / "insights.md").unlink()  # the Markdown gone, the plots still there
    png.write_bytes(b"my edited plot")
    code, _, err = cli(capsys, *args)
    assert code == 1
    one_line_error(err, "exists", "--force")
    assert png.read_bytes() == b"my edited plot"
    code, _, err = cli(capsys, *args, "--force")
    assert code == 0 and png.read_bytes() != b"my edited plot"


# -- sweeps -----------------------------------------------------------------------------------------------


def test_sweep_with_too_many_points_is_refused_at_once(tmp_path, capsys):
    vary = [f"--vary=workloads.chat.{k}=1:1000:lin:1000" for k in ("requests_per_s", "input_tokens", "output_tokens")]
    code, _, err = cli(capsys, "sweep", scenario(tmp_path), *vary, "--out", tmp_path / "sw")
    assert code == 1
    one_line_error(err, "1,000,000,000 points", "--max-points")


def test_sweep_interrupted_keeps_the_points_done(tmp_path, capsys, monkeypatch):
    import planner.sweep as sw

    real = sw.iter_sweep

    def interrupted(*a, **k):
        for n, item in enumerate(real(*a, **k)):
            if n == 2:
                raise KeyboardInterrupt
            yield item

    monkeypatch.setattr(sw, "iter_sweep", interrupted)
    code, _, err = cli(capsys, "sweep", scenario(tmp_path), "--vary", "workloads.chat.requests_per_s=10,20,30,40",
                       "--out", tmp_path / "sw", "--no-tornado")
    assert code == 1
    assert "interrupted: kept 2 of 4 points" in err and "Traceback" not in err
    import pandas as pd

    df = pd.read_csv(tmp_path / "sw" / "sweep.csv")
    assert len(df) == 4 and (df["status"] == "not run").sum() == 2
    assert df["workloads.chat.requests_per_s"].tolist() == [10, 20, 30, 40]


def test_sweep_without_a_terminal_logs_progress(tmp_path, capsys):
    code, _, err = cli(capsys, "sweep", scenario(tmp_path), "--vary", "workloads.chat.requests_per_s=10,20",
                       "--out", tmp_path / "sw", "--no-tornado")
    assert code == 0, err
    assert "sweep: 2/2 points (100%)" in err


def test_sweep_point_order_groups_work_and_keeps_product_order():
    from planner.sweep import Vary, iter_points

    base = json.loads(json.dumps(SMALL))
    varies = [Vary("workloads.chat.requests_per_s", (10.0, 20.0, 30.0)), Vary("workloads.chat.input_tokens", (500.0, 1000.0))]
    pts = list(iter_points(base, varies))
    # input_tokens changes the candidates: outermost; demand is a parameter: innermost
    assert [p[1]["workloads.chat.input_tokens"] for p in pts] == [500.0] * 3 + [1000.0] * 3
    assert sorted(p[0] for p in pts) == list(range(6))
    by_index = {i: inputs for i, inputs, _ in pts}
    assert by_index[1] == {"workloads.chat.requests_per_s": 10.0, "workloads.chat.input_tokens": 1000.0}


@pytest.mark.parametrize("text,needle", [
    ("name: x\nmodel: llama-3.1-8b\nworkloads: 1\n", "workloads"),
    ("name: x\nmodel: llama-3.1-8b\nworkloads: [{name: a, requests_per_s: {file: 3}}]\n", "requests_per_s"),
    ("name: x\nmodel: llama-3.1-8b\nworkloads: [{name: a, requests_per_s: [1, -2]}]\n", "profile"),
])
def test_malformed_workloads_and_profiles(tmp_path, capsys, text, needle):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    code, _, err = cli(capsys, "plan", p)
    assert code == 1
    one_line_error(err, needle)
