"""Expert placement (issue 4): greedy EPLB baseline, exact MILP vs brute force, search, CLI."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from planner.catalog.expert_loads import read_expert_loads
from planner.errors import InputError
from planner.perf.experts import (
    even_split_loads,
    greedy_pack,
    greedy_replicas,
    imbalance,
    parse_skew,
    swap_descent,
    zipf_loads,
)
from planner.pipeline.experts import (
    balanced_imbalance,
    check_shape,
    choose_redundant,
    place_experts,
    place_layers,
    placement_map,
    redundancy_options,
)

ROOT = Path(__file__).resolve().parents[1]


def test_greedy_replication_follows_eplb():
    load = np.array([8.0, 4.0, 2.0, 2.0])
    # copies go to the largest load per copy: 8 -> 8/2=4 -> tie 4 vs 4 (first) -> ...
    assert greedy_replicas(load, 1).tolist() == [2, 1, 1, 1]
    assert greedy_replicas(load, 3).tolist() == [3, 2, 1, 1]
    placement = greedy_pack(load, greedy_replicas(load, 4), 4)
    assert sorted(len(h) for h in placement) == [2, 2, 2, 2]
    assert all(len(set(h)) == len(h) for h in placement)


def test_imbalance_under_both_routings():
    load = np.array([3.0, 1.0, 1.0, 1.0])
    placement = [[0, 1], [0, 2], [3, 1]]  # expert 0 twice, expert 1 twice
    # even split: GPU loads 1.5+0.5, 1.5+1, 1+0.5 -> max 2.5 / mean 2
    assert imbalance(even_split_loads(load, placement)) == pytest.approx(2.5 / 2.0)
    # a balancing router can equalise: every GPU 2
    assert balanced_imbalance(load, placement) == pytest.approx(1.0, abs=1e-9)


def brute_force(load: np.ndarray, gpus: int, slots: int) -> float:
    """Every placement: each GPU a set of ``slots`` distinct experts, every expert at least once."""
    E = len(load)
    best = np.inf
    sets = list(itertools.combinations(range(E), slots))
    for combo in itertools.combinations_with_replacement(sets, gpus):
        counts = np.bincount([e for s in combo for e in s], minlength=E)
        if (counts == 0).any():
            continue
        best = min(best, imbalance(even_split_loads(load, [list(s) for s in combo])))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_exact_milp_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    E, G, R = 6, 3, 3
    load = rng.lognormal(0.0, 1.0, E)
    r = place_experts(load, G, R, time_limit_s=30)
    assert r.solver["status"] == "optimal"
    assert r.imbalance == pytest.approx(brute_force(load, G, (E + R) // G), abs=1e-6)
    assert r.imbalance <= r.greedy_imbalance + 1e-12


@pytest.mark.parametrize("seed", range(3))
def test_search_beats_greedy_and_keeps_a_valid_placement(seed):
    load = zipf_loads(64, 1.2, seed)
    r = place_experts(load, 16, 16, time_limit_s=3, seed=seed)
    assert r.imbalance <= r.greedy_imbalance + 1e-12
    assert all(len(h) == 5 and len(set(h)) == 5 for h in r.placement)
    assert (r.replicas >= 1).all() and r.replicas.sum() == 80
    assert r.solver["bound"] <= r.imbalance + 1e-12
    assert r.solver["mip_gap"] == pytest.approx((r.imbalance - r.solver["bound"]) / r.imbalance)
    assert imbalance(even_split_loads(load, r.placement)) == pytest.approx(r.imbalance)


def test_swap_descent_never_worsens_and_keeps_copies():
    load = zipf_loads(32, 1.0, 3)
    n = greedy_replicas(load, 8)
    start = greedy_pack(load, n, 8)
    w = load / load.sum() * 8
    after = swap_descent(w / n, start)
    assert imbalance(even_split_loads(load, after)) <= imbalance(even_split_loads(load, start)) + 1e-12
    assert sorted(e for h in after for e in h) == sorted(e for h in start for e in h)
    assert all(len(set(h)) == len(h) for h in after)


def test_bad_shapes_are_input_errors():
    with pytest.raises(InputError, match="does not divide"):
        check_shape(256, 64, 32)
    assert check_shape(256, 32, 32) == 9
    assert redundancy_options(256, 72) == [32, 104, 176, 248]
    with pytest.raises(ValueError, match="zipf"):
        parse_skew("pareto:2")


def test_auto_redundancy_picks_the_knee():
    loads = {0: zipf_loads(64, 1.0, 0)}
    ch = choose_redundant(loads, 16, time_limit_s=4)
    rs = [c["redundant_experts"] for c in ch.curve]
    assert rs == [0, 16, 32, 48]
    best = min(c["imbalance"] for c in ch.curve)
    assert ch.chosen.results[0].redundant == next(c["redundant_experts"] for c in ch.curve if c["imbalance"] <= best * 1.01)
    assert ch.curve[0]["imbalance"] > ch.curve[-1]["imbalance"]  # redundancy buys balance


def test_placement_map_inverts(tmp_path):
    lp = place_layers({0: zipf_loads(16, 1.0, 1)}, 4, 4, time_limit_s=2)
    doc = placement_map(lp, model_id="x", moe_layers=3)
    assert len(doc["physical_to_logical_map"]) == 3 and len(doc["physical_to_logical_map"][0]) == 20
    p2l = doc["physical_to_logical_map"][0]
    for e, phys in enumerate(doc["logical_to_physical_map"][0]):
        assert [p2l[p] for p in phys] == [e] * len(phys)
        assert doc["logical_replica_count"][0][e] == len(phys)


@pytest.mark.parametrize(
    "text,msg",
    [
        ("expert,load\n0,1\n1,-2\n", "must be a finite number >= 0"),
        ("expert,load\n0,1\n1,abc\n", "is not a number"),
        ("expert,load\n0,1\n99,2\n", "expert 99 does not exist"),
        ("expert,weight\n0,1\n", "expected columns"),
        ("layer,expert,load\n0,0,1\n0,0,2\n", "appears twice"),
        ("expert,load\n0,0\n", "no load at all"),
    ],
)
def test_bad_load_files(tmp_path, text, msg):
    f = tmp_path / "load.csv"
    f.write_text(text)
    with pytest.raises(InputError, match=msg):
        read_expert_loads(f, 8)


def test_multi_layer_loads(tmp_path):
    f = tmp_path / "load.csv"
    f.write_text("layer,expert,load\n" + "".join(f"{layer},{e},{(e + 1) * (layer + 1)}\n" for layer in (3, 5) for e in range(8)))
    loads = read_expert_loads(f, 8)
    assert list(loads) == [3, 5]
    lp = place_layers(loads, 4, 4, time_limit_s=2)
    js = lp.to_json()
    assert js["layers_placed"] == "one placement per layer" and [x["layer"] for x in js["layers"]] == [3, 5]
    assert js["imbalance"] == pytest.approx(np.mean([x["imbalance"] for x in js["layers"]]))
    merged = place_layers(loads, 4, 4, time_limit_s=2, merge=True)
    assert merged.shared and len(merged.results) == 1


def run(*args):
    p = subprocess.run([sys.executable, "-m", "planner", "experts", *args], capture_output=True, text=True, cwd=ROOT)
    return p.returncode, p.stdout, p.stderr


def test_cli_experts_json(tmp_path):
    mp = tmp_path / "map.json"
    code, out, err = run("--model", "mixtral-8x7b", "--gpus", "4", "--redundant", "4", "--skew", "zipf:1.2",
                         "--time-limit", "2", "--map", str(mp), "--json")
    assert code == 0, err
    js = json.loads(out)
    for key in ("imbalance", "greedy_imbalance", "placement", "replicas", "solver"):
        assert key in js
    assert {"status", "mip_gap", "wall_s"} <= set(js["solver"])
    assert js["imbalance"] <= js["greedy_imbalance"] + 1e-12
    assert json.loads(mp.read_text())["num_physical_experts"] == 12


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--model", "mixtral-8x7b", "--gpus", "3", "--redundant", "0"], "does not divide"),
        (["--model", "llama-3.1-8b", "--gpus", "2"], "dense model"),
        (["--model", "deepseek-v3", "--gpus", "8", "--redundant", "248", "--hardware", "h100-sxm"], "GB of weights per GPU"),
        (["--model", "mixtral-8x7b", "--gpus", "4", "--skew", "zipf:x"], "--skew"),
        (["--model", "mixtral-8x7b", "--gpus", "4", "--redundant", "lots"], "--redundant"),
    ],
)
def test_cli_experts_bad_input(args, msg):
    code, out, err = run(*args)
    assert code == 1 and msg in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cli_experts_refuses_to_overwrite_map(tmp_path):
    mp = tmp_path / "map.json"
    mp.write_text("{}")
    code, _, err = run("--model", "mixtral-8x7b", "--gpus", "4", "--redundant", "4", "--map", str(mp))
    assert code == 1 and "--force" in err and mp.read_text() == "{}"


# --- integration with the performance model and the planner ----------------------------------------


def _setup(model_id="deepseek-v3", hw_id="gb200-nvl72", **kw):
    from planner.catalog import load_catalog
    from planner.perf.roofline import Setup

    cat = load_catalog(None)
    return Setup.make(cat.get_model(model_id), cat.get_hardware(hw_id), weights="fp8", **kw)


def test_exchange_bytes_ep_vs_expert_tp():
    """Per MoE layer, EP moves tokens/G x top_k x hidden x (dispatch + combine bytes) per chip; expert TP across
    attention-DP ranks all-gathers every token and reduce-scatters every output, tokens x hidden x 2 bytes each
    way: equal at G = top_k x (1 + 2) / 4 (FP8 dispatch)."""
    from planner.perf.roofline import moe_exchange_time

    s = _setup()
    k = s.stats.top_k
    g_eq = k * 3 / 4  # dispatch 1 byte (fp8) + combine 2 bytes, over 2 x 2 bytes a token
    a2a = moe_exchange_time(s, g_eq, g_eq, g_eq, 4096.0, 1.0, 0.0)
    etp = moe_exchange_time(s, 1, g_eq, g_eq, 4096.0, 1.0, 0.0)
    assert float(a2a) == pytest.approx(float(etp), rel=1e-9)
    assert float(moe_exchange_time(s, 64, 64, 64, 4096.0, 1.0, 0.0)) < float(moe_exchange_time(s, 1, 64, 64, 4096.0, 1.0, 0.0))


def test_imbalance_and_copies_enter_step_and_memory():
    from planner.perf.layout import weight_bytes_per_chip
    from planner.perf.roofline import decode_step

    base = _setup()
    skew = _setup(moe_imbalance=2.0)
    a = decode_step(base, 1, 64, 1, 64, 64 * 256, 2000)
    b = decode_step(skew, 1, 64, 1, 64, 64 * 256, 2000)
    assert float(b.gemm_compute_s) > float(a.gemm_compute_s)
    w0 = weight_bytes_per_chip(base.wb, 1, 64, 1, 64)
    w1 = weight_bytes_per_chip(base.wb, 1, 64, 1, 64, 1.25)
    assert float(w1 - w0) == pytest.approx(0.25 * base.wb.expert / 64, rel=1e-12)


def test_skewed_plan_buys_redundancy_and_rechecks(tmp_path):
    from planner.catalog import load_catalog
    from planner.catalog.scenario import load_scenario, resolve_scenario
    from planner.options import PlanOptions
    from planner.pipeline.plan import make_plan

    path = ROOT / "catalogs" / "scenarios" / "deepseek-skewed.yaml"
    rs = resolve_scenario(load_scenario(path), load_catalog(None), path)
    res = make_plan(rs, PlanOptions(analysis=False, expert_time_limit_s=2))
    ep_pools = [p for p in res.plan.pools if p.expert_placement is not None]
    assert ep_pools and any(p.expert_placement.redundant_experts > 0 for p in ep_pools)
    for p in ep_pools:
        xp = p.expert_placement
        assert xp.placement_imbalance <= xp.imbalance + 1e-9
        doc = json.loads(res.files[xp.map_file])
        assert doc["ep_size"] == p.layout.tp * p.layout.attn_dp
        assert doc["num_redundant_experts"] == xp.redundant_experts
    assert res.plan.recheck.ok
