"""Serving-economics insights (issue 6): identities, the committed document, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.catalog import load_catalog
from planner.export.insights import command, write
from planner.studies.insights import compute

ROOT = Path(__file__).resolve().parents[1]
DOC_PAIRS = [("deepseek-v3", "gb200-nvl72"), ("llama-3.1-70b", "h100-sxm")]


@pytest.fixture(scope="module")
def items():
    cat = load_catalog(None)
    return [compute(cat, m, h) for m, h in DOC_PAIRS]


LIFETIME_ARGS = ["--lifetime", "catalogs/scenarios/llama-70b-chat.yaml", "--lifetime-reference", "70.6e9,15e12",
                 "--lifetime-volumes", "1e8:1e13:log:6"]
LIFETIME_HEADING = "## How big a model to train, when serving costs what the planner says"


def test_committed_insights_are_current(items, tmp_path):
    """Everything before the lifetime section is regenerated here; that section (minutes of planning) is checked
    for its computed parts and its regeneration command in the document's first lines."""
    cmd = command(DOC_PAIRS, Path("docs"), 2048, LIFETIME_ARGS)
    md = write(items, tmp_path, cmd)
    fresh = md.read_text().split(LIFETIME_HEADING)[0]
    doc = (ROOT / "docs" / "insights.md").read_text()
    assert doc.split(LIFETIME_HEADING)[0] == fresh, "docs/insights.md is stale: regenerate with " + cmd
    lifetime = doc.split(LIFETIME_HEADING)[1]
    for must in ("llama3 (dense)", "qwen3-moe (MoE)", "How the answer moves", "sparsity: top-k of 512 experts",
                 "72-GPU NVLink racks", "insights/lifetime.png"):
        assert must in lifetime, must
    for p in (tmp_path / "insights").iterdir():
        assert (ROOT / "docs" / "insights" / p.name).exists()
    assert (ROOT / "docs" / "insights" / "lifetime.png").exists()


def test_insights_lifetime_section_is_computed(tmp_path, monkeypatch):
    """``--lifetime`` runs the dense and the MoE sweep with their variants and writes the section and its plot."""
    from planner.pipeline import lifetime as lt
    from tests.test_brownfield import _run

    monkeypatch.setattr(lt, "GRID_POINTS", 3)
    monkeypatch.setattr(lt, "VARIANTS", lt.VARIANTS[:2])
    monkeypatch.setattr(lt, "EXPERT_VARIANTS", (512,))
    code = _run(["insights", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--out", tmp_path / "o",
                 "--lifetime", ROOT / "catalogs" / "scenarios" / "llama-70b-chat.yaml", "--lifetime-reference",
                 "8e9,15e12", "--lifetime-volumes", "1e9,1e13"])
    assert code == 0
    md = (tmp_path / "o" / "insights.md").read_text()
    section = md.split(LIFETIME_HEADING)[1]
    assert "llama3 (dense):" in section and "qwen3-moe (MoE):" in section
    assert "faster tier" in section and "sparsity: top-k of 512 experts" in section
    assert "--lifetime-reference 8e9,15e12" in md.splitlines()[2]
    assert (tmp_path / "o" / "insights" / "lifetime.png").stat().st_size > 1000


def test_economics_identities(items):
    ds, llama = items
    for ins in items:
        b = ins.batch
        # the rule: FLOP/byte x bytes per weight / 2 x total/active
        assert b["balance_batch_rule"] == pytest.approx(
            b["machine_balance_flop_per_byte"] * b["bytes_per_weight"] / 2 * b["sparsity"])
        assert b["unbatched_to_best_cost_ratio"] > 10
        # pipelining: weights per chip fall as 1/pp; KV per chip stays (the batch grows with the stages)
        p1 = ins.pipeline[0]
        for p in ins.pipeline[1:]:
            assert p["weight_bytes_per_chip"] == pytest.approx(p1["weight_bytes_per_chip"] / p["pp"], rel=1e-9)
            assert p["kv_bytes_per_chip"] == pytest.approx(p1["kv_bytes_per_chip"], rel=1e-9)
            assert p["tpot_s"] >= p1["tpot_s"]
        # cached input is cheaper the faster the tier
        h = ins.ratios["cache_hit_to_prefill_cost_ratio"]
        assert h["hbm"] < h["host_dram"] < h["nvme"]
        # cost per token grows with context once KV limits the batch
        c = [x for x in ins.long_context["usd_per_mtok_output"] if x == x]
        assert c[-1] > c[0]
    # MLA's cache is smaller than GQA's, so its crossover comes later; a sliding window never crosses
    v = ds.kv["variants"]
    assert v["MLA (512 latent + 64 RoPE)"]["crossover_context"] > v["GQA (8 KV heads x 128)"]["crossover_context"]
    assert v["sliding window 4,096 (GQA 8 x 128)"]["crossover_context"] is None
    # the all-to-all leaving the scale-up domain costs more than inside it
    rows = ds.expert_parallel["rows"]
    inside = max(r["a2a_s"] for r in rows if r["domain"] == "inside")
    assert all(r["a2a_s"] > inside for r in rows if r["domain"] == "across")
    assert llama.expert_parallel == {}


def test_cli_insights_json(tmp_path):
    p = subprocess.run([sys.executable, "-m", "planner", "insights", "--model", "llama-3.1-8b", "--hardware", "h100-sxm",
                        "--out", str(tmp_path), "--json"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    js = json.loads(p.stdout)
    for k in ("unbatched_to_best_cost_ratio", "balance_batch", "balance_batch_rule", "latency_floor_s",
              "kv_crossover_context", "output_to_input_cost_ratio", "cache_hit_to_prefill_cost_ratio", "pipeline"):
        assert k in js
    assert set(js["cache_hit_to_prefill_cost_ratio"]) == {"hbm", "host_dram", "nvme"}
    assert {"pp", "weight_bytes_per_chip", "kv_bytes_per_chip", "tpot_s"} <= set(js["pipeline"][0])
    assert (tmp_path / "insights.md").exists()
    again = subprocess.run([sys.executable, "-m", "planner", "insights", "--model", "llama-3.1-8b", "--hardware",
                            "h100-sxm", "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert again.returncode == 1 and "--force" in again.stderr
    bad = subprocess.run([sys.executable, "-m", "planner", "insights", "--model", "llama-3.1-8b", "--out", str(tmp_path / "x"),
                          "--hardware", "h100-sxm", "--hardware", "h200-sxm"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 1 and "pairs" in bad.stderr
