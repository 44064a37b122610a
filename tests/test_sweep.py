"""Sweeps and price curves (issue 5)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from planner.catalog import load_catalog
from planner.catalog.loader import read_yaml
from planner.catalog.scenario import Scenario, resolve_scenario
from planner.errors import InputError
from planner.options import PlanOptions
from planner.pipeline.plan import make_plan
from planner.studies.pricing import frontier, price_curve, speed_tiers
from planner.sweep import Vary, keys_of, parse_values, parse_vary, run_sweep, set_path

ROOT = Path(__file__).resolve().parents[1]
LLAMA = ROOT / "catalogs" / "scenarios" / "llama-70b-chat.yaml"


def test_parse_values():
    assert parse_values("100,200,400") == (100.0, 200.0, 400.0)
    assert parse_values("10:1000:log:3") == pytest.approx((10.0, 100.0, 1000.0))
    assert parse_values("2:4:lin:5") == pytest.approx((2.0, 2.5, 3.0, 3.5, 4.0))
    for bad in ("1:2:cubic:3", "a,b", "0:10:log:3", ""):
        with pytest.raises(InputError):
            parse_values(bad)
    with pytest.raises(InputError, match="PATH=VALUES"):
        parse_vary("workloads.chat.requests_per_s")


def test_set_path_addresses_workloads_by_name():
    doc = {"workloads": [{"name": "chat", "slo": {"tpot_ms": 40}}], "prices": {}}
    set_path(doc, "workloads.chat.slo.tpot_ms", 20)
    set_path(doc, "prices.h100-sxm", 2.5)
    assert doc["workloads"][0]["slo"]["tpot_ms"] == 20 and doc["prices"]["h100-sxm"] == 2.5
    with pytest.raises(InputError, match="no item named 'code'"):
        set_path(doc, "workloads.code.requests_per_s", 1)


def test_grouping_keys_separate_structure_from_parameters():
    base = read_yaml(LLAMA)
    a, b, c = (copy.deepcopy(base) for _ in range(3))
    set_path(b, "workloads.chat.requests_per_s", 999)
    set_path(c, "workloads.chat.slo.tpot_ms", 12)
    d = copy.deepcopy(base)
    set_path(d, "workloads.chat.slo.ttft_ms", 900)
    assert keys_of(a) == keys_of(b)  # traffic is a mutable parameter: same pool, same model
    assert keys_of(a)[0] == keys_of(d)[0] and keys_of(a)[1] != keys_of(d)[1]  # TTFT: same pool, new model
    # TPOT: a pool of its own (its rows at the batch that meets the target, as a plan of the point has them)
    assert keys_of(a)[0] != keys_of(c)[0]


def test_persistent_resolve_matches_fresh_build():
    """Every point of a small sweep (traffic x price, TPOT) solved by updating one model equals a
    fresh build and solve of that point's scenario."""
    cat = load_catalog(None)
    base = read_yaml(LLAMA)
    varies = [Vary("workloads.chat.requests_per_s", (10.0, 35.0, 80.0)), Vary("prices.mi355x", (1.2, 3.0)),
              Vary("workloads.chat.slo.tpot_ms", (25.0, 40.0))]
    df = run_sweep(base, LLAMA, varies, cat, opts=PlanOptions(analysis=False, mip_gap=1e-9))
    assert len(df) == 12 and (df["status"] == "optimal").all()
    assert (df["update_s"] > 0).sum() >= 8  # most points re-used a built model
    for row in df.itertuples(index=False):
        doc = copy.deepcopy(base)
        set_path(doc, "workloads.chat.requests_per_s", row[0])
        set_path(doc, "prices.mi355x", row[1])
        set_path(doc, "workloads.chat.slo.tpot_ms", row[2])
        rs = resolve_scenario(Scenario.model_validate(doc), cat, LLAMA)
        fresh = make_plan(rs, PlanOptions(analysis=False, mip_gap=1e-9)).plan
        assert row.usd_per_hour == pytest.approx(fresh.objective.usd_per_hour, rel=1e-9)


def test_infeasible_points_are_rows_not_crashes():
    cat = load_catalog(None)
    base = read_yaml(LLAMA)
    df = run_sweep(base, LLAMA, [Vary("workloads.chat.slo.tpot_ms", (0.5, 40.0))], cat)
    assert list(df["status"]) == ["infeasible", "optimal"]
    assert "tpot_ms" in df["diagnosis"].iloc[0]


def test_frontier_and_tiers():
    df = pd.DataFrame({"tokens_per_s_per_user": [10, 20, 20, 30, 15], "usd_per_mtok_output": [1.0, 2.0, 3.0, 5.0, 4.0],
                       "hardware": ["a"] * 5})
    f = frontier(df)
    assert list(f["tokens_per_s_per_user"]) == [10, 20, 30] and list(f["usd_per_mtok_output"]) == [1.0, 2.0, 5.0]
    t = speed_tiers(f)
    assert [x["price_multiple"] for x in t] == [1.0, 2.0, 2.0, 5.0, 5.0]
    t4 = speed_tiers(f, (4.0,))
    assert t4[0]["price_multiple"] == "unreachable"


def test_price_curve_is_monotone_and_bounded_by_the_latency_floor():
    pc = price_curve(load_catalog(None), "llama-3.1-70b", ["h100-sxm"], input_tokens=1000, output_tokens=200)
    x = pc.points["tokens_per_s_per_user"].to_numpy()
    y = pc.points["usd_per_mtok_output"].to_numpy()
    assert (np.diff(x) > 0).all() and (np.diff(y) > 0).all()
    js = pc.to_json()
    assert {"tokens_per_s_per_user", "usd_per_mtok_output", "hardware", "layout", "batch"} <= set(js["points"][0])
    assert js["tiers"][0] == {**js["tiers"][0], "speed_multiple": 1.0, "price_multiple": 1.0}
    # the fastest point cannot beat the latency floor of its layout (weights per chip / HBM bandwidth)
    from planner.perf.layout import weight_bytes_per_chip
    from planner.perf.roofline import Setup

    cat = load_catalog(None)
    fast = pc.points.iloc[-1]
    s = Setup.make(cat.get_model("llama-3.1-70b"), cat.get_hardware("h100-sxm"), weights=str(fast.weights_dtype))
    floor = float(weight_bytes_per_chip(s.wb, fast.tp, fast.ep, fast.pp, fast.attn_dp)) / s.hw.hbm_bw
    assert fast.tpot_s >= floor


def test_cli_sweep_writes_csv_and_plots(tmp_path):
    out = tmp_path / "sw"
    p = subprocess.run([sys.executable, "-m", "planner", "sweep", str(LLAMA), "--vary",
                        "workloads.chat.requests_per_s=10:100:log:3", "--vary", "workloads.chat.slo.tpot_ms=0.5,40",
                        "--out", str(out), "--jobs", "2", "--no-tornado"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    df = pd.read_csv(out / "sweep.csv")
    assert len(df) == 6 and set(df["status"]) == {"optimal", "infeasible"}
    assert {"chat.hardware", "chat.layout", "chat.batch", "chat.kv_tier", "chat.ttft_ms", "chat.tpot_ms",
            "usd_per_mtok_input", "usd_per_mtok_output", "build_s", "update_s", "solve_s"} <= set(df.columns)
    assert (out / "cost.png").stat().st_size > 1000 and (out / "pareto.png").exists()
    again = subprocess.run([sys.executable, "-m", "planner", "sweep", str(LLAMA), "--vary",
                            "workloads.chat.requests_per_s=10", "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert again.returncode == 1 and "--force" in again.stderr
    bad = subprocess.run([sys.executable, "-m", "planner", "sweep", str(LLAMA), "--vary", "workloads.chat.bogus=1",
                          "--out", str(tmp_path / "b")], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 1 and "bogus" in bad.stderr and "Traceback" not in bad.stderr


def test_cli_price_curve_json():
    p = subprocess.run([sys.executable, "-m", "planner", "price-curve", "--model", "llama-3.1-8b", "--hardware",
                        "h100-sxm", "--json"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    js = json.loads(p.stdout)
    assert [t["speed_multiple"] for t in js["tiers"]] == [1.0, 1.5, 2.0, 2.5, 3.0]


def test_sweep_prunes_for_the_prefix_share_of_every_point():
    """A model built once serves every traffic point of its group, so its candidates are pruned for the range
    of working set per request/s the points take (200 GB over 10-40 req/s), not the first point's alone; an SLO
    vary moves no share."""
    from planner.sweep import sweep_shares

    base = read_yaml(LLAMA)
    lo, hi = sweep_shares(base, [Vary("workloads.chat.requests_per_s", (10.0, 40.0, 25.0)),
                                 Vary("workloads.chat.slo.tpot_ms", (30.0, 40.0))])["chat"]
    assert (lo, hi) == pytest.approx((200e9 / 40, 200e9 / 10))
    assert sweep_shares(base, [Vary("workloads.chat.slo.tpot_ms", (30.0, 40.0))]) is None
    # an extreme the schema refuses (-1 req/s, that point's own error): the range of the points that do exist
    assert sweep_shares(base, [Vary("workloads.chat.requests_per_s", (-1.0, 20.0, 30.0))])["chat"] == \
        pytest.approx((200e9 / 30, 200e9 / 20))
    assert sweep_shares(base, [Vary("workloads.chat.prefix_cache.working_set_gb", (100.0, 400.0))])["chat"] == \
        pytest.approx((100e9 / 50, 400e9 / 50))
