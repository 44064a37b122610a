"""Every valid input plans or is named, and costs say what they mean (issue 45, deliver 2 and 4): each
reproducer of the issue pinned."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from planner.cli import main
from tests.conftest import ROOT

BASE = {"model": "llama-3.1-70b", "weights": ["fp8"], "kv_cache": ["fp8"], "hardware": ["h100-sxm", "h200-sxm"],
        "serving": ["aggregated"]}


def wl(name: str, rps, ttft=1500, tpot=40) -> dict:
    return {"name": name, "requests_per_s": rps, "input_tokens": 1500, "output_tokens": 300,
            "slo": {"ttft_ms": ttft, "tpot_ms": tpot}}


def cli(capsys, *args) -> tuple[int, str, str]:
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path, name: str, doc: dict, raw: str | None = None):
    p = tmp_path / f"{name}.yaml"
    p.write_text(raw if raw is not None else yaml.safe_dump({"name": name, **doc}, sort_keys=False))
    return p


def one_line(err: str, *needles: str) -> None:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert "Traceback" not in err and "internal error" not in err


def test_a_workload_without_demand_in_a_period_plans(tmp_path, capsys):
    sc = write(tmp_path, "zero-period", {**BASE, "workloads": [wl("chat", [2, 50]), wl("batch", [10, 0], 5000, 100)]})
    code, _, err = cli(capsys, "plan", sc, "--out", tmp_path / "p")
    assert code == 0, err
    doc = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert all(p["recheck_ok"] for p in doc["periods"])
    assert doc["periods"][1]["requests_per_s"]["batch"] == 0
    assert doc["periods"][1]["capacity_rps"]["chat"] >= 50


@pytest.mark.parametrize("rps", [1e-6, 1e-9, 0.5])
def test_any_positive_demand_plans(tmp_path, capsys, rps):
    sc = write(tmp_path, "tiny", {**BASE, "workloads": [wl("chat", rps)]})
    code, _, err = cli(capsys, "plan", sc, "--out", tmp_path / "p")
    assert code == 0, err
    doc = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert doc["pools"] and doc["recheck"]["ok"]


def test_demand_below_the_documented_share_is_named(tmp_path, capsys):
    sc = write(tmp_path, "spread", {**BASE, "workloads": [wl("big", 100), wl("small", 1e-7)]})
    code, _, err = cli(capsys, "plan", sc, "--out", tmp_path / "p")
    assert code == 1
    one_line(err, "spread.yaml", "workloads.1.requests_per_s", "1e-06")


@pytest.mark.parametrize("value", ["true", '"10"', "yes"])
def test_no_bool_or_string_where_a_number_goes(tmp_path, capsys, value):
    text = yaml.safe_dump({"name": "strict", **BASE, "workloads": [wl("chat", 12345)]}, sort_keys=False)
    sc = write(tmp_path, "strict", {}, raw=text.replace("12345", value))
    code, _, err = cli(capsys, "plan", sc, "--out", tmp_path / "p")
    assert code == 1
    one_line(err, "strict.yaml", "requests_per_s", "valid number")


def test_exponent_without_a_point_is_a_number(tmp_path, capsys):
    text = yaml.safe_dump({"name": "expo", **BASE, "workloads": [wl("chat", 12345)]}, sort_keys=False)
    sc = write(tmp_path, "expo", {}, raw=text.replace("12345", "2e1"))
    code, _, err = cli(capsys, "plan", sc, "--out", tmp_path / "p")
    assert code == 0, err
    assert json.loads((tmp_path / "p" / "plan.json").read_text())["workloads"][0]["requests_per_s"] == 20


def test_an_over_long_integer_names_file_and_line(tmp_path, capsys):
    text = yaml.safe_dump({"name": "long", **BASE, "workloads": [wl("chat", 12345)]}, sort_keys=False)
    sc = write(tmp_path, "long", {}, raw=text.replace("12345", "9" * 5001))
    code, _, err = cli(capsys, "plan", sc, "--out", tmp_path / "p")
    assert code == 1
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "12345" in ln)
    one_line(err, "long.yaml", f"line {line}", "5,001 digits")


@pytest.mark.parametrize("key,value,bound", [("hbm_capacity_gb", "1e300", "10000"), ("hbm_capacity_gb", "1.0e300", "10000"),
                                             ("usd_per_chip_hour", "1e300", "10000")])
def test_catalog_numbers_beyond_physics_are_refused(tmp_path, capsys, key, value, bound):
    cat = tmp_path / "cat"
    shutil.copytree(ROOT / "catalogs", cat, ignore=shutil.ignore_patterns("scenarios"))
    f = cat / "hardware" / "h100-sxm.yaml"
    lines = f.read_text().splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.strip().startswith(key + ":"))
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    lines[i] = f"{indent}{key}: {value}"
    f.write_text("\n".join(lines) + "\n")
    code, _, err = cli(capsys, "--catalog", cat, "--catalog-alone", "catalog", "validate")
    assert code == 1
    one_line(err, "h100-sxm.yaml", key, bound)


def test_exit_3_only_for_a_real_limit():
    from types import SimpleNamespace

    from planner.errors import PlannerError, SolverLimitError
    from planner.pipeline.diagnose import no_plan

    with pytest.raises(SolverLimitError):
        no_plan(SimpleNamespace(termination="maxTimeLimit"), "limit")
    with pytest.raises(PlannerError) as exc:
        no_plan(SimpleNamespace(termination="error"), "limit")
    assert exc.value.exit_code == 1 and "without reaching a limit" in str(exc.value)


def test_profile_headline_is_the_day(tmp_path, capsys):
    code, _, err = cli(capsys, "plan", ROOT / "catalogs" / "scenarios" / "llama-70b-day.yaml", "--out", tmp_path / "p")
    assert code == 0, err
    assert "/day" in err and "over the day" in err and "peak period" in err
    doc = json.loads((tmp_path / "p" / "plan.json").read_text())
    day = doc["day"]
    # identities: the day's $ are the periods' $/h over 24 h; the $/M is that over the day's tokens
    T = len(doc["periods"])
    assert day["usd_per_day"] == pytest.approx(sum(p["usd_per_hour"] for p in doc["periods"]) * 24 / T)
    toks = sum(r * (1500 + 300) * 86400 / T for p in doc["periods"] for r in p["requests_per_s"].values())
    assert day["tokens_per_day"] == pytest.approx(toks)
    assert day["usd_per_mtok"] == pytest.approx(day["usd_per_day"] / toks * 1e6)
    assert day["peak_usd_per_mtok"] == pytest.approx(doc["objective"]["usd_per_mtok"])
    assert day["usd_per_mtok"] > day["peak_usd_per_mtok"]  # off-peak hours carry idle reserved capacity
    md = (tmp_path / "p" / "plan.md").read_text()
    first = md.split("\n\n")[1]
    assert first.index("/day") < first.index("at the peak period")


def test_price_curve_takes_weights_and_kv(capsys):
    code, out, err = cli(capsys, "price-curve", "--model", "llama-3.1-70b", "--hardware", "h200-sxm",
                         "--weights", "fp8", "--kv", "fp8", "--json")
    assert code == 0, err
    pts = json.loads(out)["points"]
    assert pts and {p["weights_dtype"] for p in pts} == {"fp8"} and {p["kv_dtype"] for p in pts} == {"fp8"}
    code, out, _ = cli(capsys, "price-curve", "--model", "llama-3.1-70b", "--hardware", "h200-sxm")
    assert code == 0 and "weights bf16 (native" in out
    code, _, err = cli(capsys, "price-curve", "--model", "llama-3.1-70b", "--weights", "fp9")
    assert code == 1
    one_line(err, "--weights", "fp9")


def test_roofline_of_a_misfit_layout_has_no_price(capsys):
    args = ["roofline", "--model", "llama-3.1-405b", "--hardware", "h100-sxm", "--batch", "64", "--context", "4096"]
    code, out, err = cli(capsys, *args)
    assert code == 1 and out == ""
    one_line(err, "does not fit", "--allow-misfit")
    code, out, _ = cli(capsys, *args, "--allow-misfit")
    assert code == 0 and "DOES NOT FIT" in out and "$/M" not in out and "$/h" not in out
    code, out, _ = cli(capsys, *args, "--allow-misfit", "--json")
    doc = json.loads(out)
    assert doc["fits"] is False and doc["usd_per_hour"] is None and doc["usd_per_mtok"] is None


def test_balance_batch_has_units(capsys):
    code, out, _ = cli(capsys, "roofline", "--model", "llama-3.1-70b", "--hardware", "h200-sxm", "--batch", "32",
                       "--context", "128", "--tp", "4", "--weights", "fp8")
    assert code == 0
    line = next(ln for ln in out.splitlines() if "balance batch" in ln)
    assert "sequences" in line and "per replica" in line
