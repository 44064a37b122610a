"""Candidate table (groundwork of the plan issue): filters hold and pruning loses nothing."""

from __future__ import annotations

import numpy as np
import pytest

from planner.catalog.scenario import load_scenario, resolve_scenario
from planner.perf.candidates import build_candidates, layouts
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def llama(catalog):
    p = ROOT / "catalogs" / "scenarios" / "llama-70b-chat.yaml"
    return resolve_scenario(load_scenario(p), catalog, p)


def test_rows_meet_slo_and_memory(llama):
    ct = build_candidates(llama)
    r = ct.rows
    assert len(r) > 0 and ct.evaluated > len(r)
    w = llama.scenario.workloads[0]
    assert (r["tpot_s"] <= w.slo.tpot_ms / 1e3 + 1e-12).all()
    assert (r["ttft_s"] <= w.slo.ttft_ms / 1e3 + 1e-12).all()
    used = r["weight_bytes_per_chip"] + r["kv_bytes_per_chip"] + r["other_bytes_per_chip"]
    assert (used <= r["hbm_bytes_per_chip"]).all()
    assert set(r["role"]) == {"aggregated", "prefill", "decode"}
    assert sum(ct.dropped.values()) + len(r) == ct.evaluated


def test_pruning_keeps_a_row_at_least_as_good_as_every_feasible_row(llama):
    full = build_candidates(llama, prune=False).rows
    kept = build_candidates(llama).rows
    for (wl, role, hw), g in full.groupby(["workload", "role", "hardware"]):
        k = kept[(kept.workload == wl) & (kept.role == role) & (kept.hardware == hw)]
        chips = k["chips"].to_numpy()
        cost = k["usd_per_rps"].to_numpy()
        for c, u in zip(g["chips"].to_numpy(), g["usd_per_rps"].to_numpy(), strict=True):
            assert np.any((chips <= c) & (cost <= u * (1 + 1e-12)))


def test_layouts_respect_the_model(catalog):
    lay = layouts(catalog.models["deepseek-v3"], catalog.hardware["gb200-nvl72"])
    stage = lay["tp"] * lay["dp"]
    assert ((lay["ep"] == 1) | (lay["ep"] == stage)).all()
    assert (256 % lay["ep"] == 0).all() and (128 % lay["tp"] == 0).all()
    dense = layouts(catalog.models["llama-3.1-70b"], catalog.hardware["h100-sxm"])
    assert (dense["ep"] == 1).all() and (dense["dp"] == 1).all()
