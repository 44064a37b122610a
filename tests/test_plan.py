"""`make_plan` and `planner plan`: monotone optimum, re-check, diagnosis, exit codes, files, and the
committed example plans."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from planner.catalog.scenario import Scenario, load_scenario, resolve_scenario
from planner.errors import InfeasibleError, SolverLimitError
from planner.options import PlanOptions
from planner.pipeline.plan import input_hash, make_plan
from planner.results import Plan, recheck
from tests.conftest import ROOT

QUICK = PlanOptions(analysis=False)


def _scenario(catalog, **over):
    base = {
        "name": "t", "model": "llama-3.1-8b", "weights": ["bf16", "fp8"], "kv_cache": ["bf16"],
        "hardware": ["h100-sxm", "h200-sxm"], "serving": ["aggregated", "disaggregated"],
        "workloads": [{"name": "chat", "requests_per_s": 40, "input_tokens": 1000, "output_tokens": 200,
                       "prefix_cache": {"hit_rate": 0.3, "working_set_gb": 50},
                       "slo": {"ttft_ms": 1000, "tpot_ms": 30}}],
    }
    for k, v in over.items():
        if k in ("requests_per_s", "slo"):
            base["workloads"][0][k] = v
        else:
            base[k] = v
    return resolve_scenario(Scenario.model_validate(base), catalog)


def _usd(rs, opts=QUICK) -> float:
    return make_plan(rs, opts).plan.objective.usd_per_hour


@pytest.fixture(scope="module")
def base_plan(catalog):
    return make_plan(_scenario(catalog), PlanOptions())


def test_plan_is_rechecked_and_consistent(base_plan):
    p = base_plan.plan
    assert p.status == "optimal" and p.recheck.ok, [c for c in p.recheck.checks if not c.ok]
    assert p.solver.mip_gap is not None and p.solver.mip_gap <= 1e-4
    assert sum(g.usd_per_hour for g in p.units) == pytest.approx(p.objective.usd_per_hour)
    assert sum(pl.usd_per_hour for pl in p.pools) == pytest.approx(p.objective.usd_per_hour)
    w = p.workloads[0]
    assert w.served_requests_per_s >= w.requests_per_s
    assert w.ttft_s <= w.slo_ttft_s and w.tpot_s <= w.slo_tpot_s
    # Input and output $/Mtok recombine into the overall figure.
    tin, tout = 40 * 1000, 40 * 200
    o = p.objective
    assert (o.usd_per_mtok_input * tin + o.usd_per_mtok_output * tout) == pytest.approx(o.usd_per_mtok * (tin + tout))
    assert any(b.name == "demand.chat" for b in p.binding_constraints)
    assert p.runner_up is not None and p.runner_up.excluded not in p.runner_up.hardware
    assert p.runner_up.usd_per_hour >= p.objective.usd_per_hour


def test_a_runner_up_not_proven_cheapest_says_so_with_its_floor(base_plan):
    from planner.export.plan import plan_markdown

    p = base_plan.plan.model_copy(deep=True)
    assert p.runner_up.status == "optimal" and "Not proven" not in plan_markdown(p)
    floor = p.runner_up.usd_per_hour * 0.95
    p.runner_up.status, p.runner_up.usd_per_hour_floor = "feasible", floor
    md = plan_markdown(p)
    assert "Not proven the cheapest" in md and f"${floor:,.2f}/h" in md and "ran out of time far" not in md
    # a runner-up found far above its floor (llama-70b-n1's was $1.15e9/h over a $24 floor) is called out
    p.runner_up.usd_per_hour_floor = p.runner_up.usd_per_hour / 1000
    assert "costs 1,000.0x that: the search ran out of time far from the cheapest" in plan_markdown(p)


def test_recheck_catches_a_tampered_plan(base_plan, catalog):
    rs = _scenario(catalog)
    bad = base_plan.plan.model_copy(deep=True)
    pool = max(bad.pools, key=lambda q: q.replicas)
    pool.replicas = 0
    names = {c.name for c in recheck(bad, rs).checks if not c.ok}
    assert "chat: demand" in names and "placement" in names
    bad = base_plan.plan.model_copy(deep=True)
    bad.pools[0].batch *= 4
    assert not recheck(bad, rs).ok
    bad = base_plan.plan.model_copy(deep=True)
    bad.objective.usd_per_hour *= 0.5
    assert "objective" in {c.name for c in recheck(bad, rs).checks if not c.ok}


def test_wider_choice_never_costs_more(catalog):
    base = _usd(_scenario(catalog))
    assert _usd(_scenario(catalog, hardware=["h100-sxm", "h200-sxm", "b200-sxm"])) <= base + 1e-9
    assert _usd(_scenario(catalog, slo={"ttft_ms": 2000, "tpot_ms": 60})) <= base + 1e-9
    assert _usd(_scenario(catalog, requests_per_s=20)) <= base + 1e-9
    assert _usd(_scenario(catalog, weights=["bf16"])) >= base - 1e-9


def test_power_limit_is_respected_or_diagnosed(catalog):
    hw = ["h100-sxm", "h200-sxm", "b200-sxm"]
    free = make_plan(_scenario(catalog, model="llama-3.1-70b", hardware=hw, requests_per_s=200), QUICK).plan
    kw = sum(g.kw for g in free.units)
    same = make_plan(_scenario(catalog, model="llama-3.1-70b", hardware=hw, requests_per_s=200, limits={"power_kw": kw}), QUICK).plan
    assert same.objective.usd_per_hour == pytest.approx(free.objective.usd_per_hour)
    try:
        tight = make_plan(
            _scenario(catalog, model="llama-3.1-70b", hardware=hw, requests_per_s=200, limits={"power_kw": kw * 0.9}), QUICK
        ).plan
    except InfeasibleError as err:
        assert "limits.power_kw: serving the demand needs" in str(err)
    else:
        assert sum(g.kw for g in tight.units) <= kw * 0.9 and tight.recheck.ok
        assert tight.objective.usd_per_hour >= free.objective.usd_per_hour


def test_diagnosis_names_the_limit(catalog):
    with pytest.raises(InfeasibleError, match=r"slo.tpot_ms 1 is below every layout's TPOT; the fastest is"):
        make_plan(_scenario(catalog, slo={"ttft_ms": 1000, "tpot_ms": 1}), QUICK)
    with pytest.raises(InfeasibleError, match=r"limits.power_kw: serving the demand needs 13.8 kW, the limit is 1.0 kW \(short by 12.8 kW\)"):
        make_plan(_scenario(catalog, limits={"power_kw": 1}), QUICK)
    with pytest.raises(InfeasibleError, match=r"limits.max_units.h100-sxm: needs \d+ nodes, 0 allowed"):
        make_plan(_scenario(catalog, hardware=["h100-sxm"], limits={"max_units": {"h100-sxm": 0}}), QUICK)


@pytest.mark.parametrize("slo", [{"ttft_ms": 1000, "tpot_ms": 1}, {"ttft_ms": 1, "tpot_ms": 30}])
def test_diagnosis_from_the_streamed_pool_is_the_whole_pools(catalog, slo):
    """The streamed pool keeps the fastest rows of each workload, role, prefix tier and hardware it filters, so an
    impossible TPOT or TTFT is diagnosed word for word as from every row evaluated (same row named, same bound)."""
    from planner.perf.candidates import evaluate_candidates, scenario_slos, select_candidates
    from planner.pipeline.diagnose import diagnose_candidates
    from planner.pipeline.plan import slo_levels

    rs = _scenario(catalog, slo=slo)
    slos = scenario_slos(rs.scenario.workloads)
    said = []
    for pool in (evaluate_candidates(rs), evaluate_candidates(rs, None, slo_levels(slos, True))):
        with pytest.raises(InfeasibleError) as err:
            diagnose_candidates(rs, pool, select_candidates(pool, slos))
        said.append(str(err.value))
    assert said[0] == said[1] and "the fastest" in said[0]


def test_diagnosis_of_a_model_too_large(catalog, monkeypatch):
    from planner.perf import grid

    monkeypatch.setattr(grid, "MAX_CHIPS_PER_REPLICA", 8)  # 405B in bf16 (810 GB) > 8 x 80 GB
    with pytest.raises(InfeasibleError, match=r"no layout of llama-3.1-405b fits in memory on h100-sxm"):
        make_plan(_scenario(catalog, model="llama-3.1-405b", hardware=["h100-sxm"], weights=["bf16"]), QUICK)


def test_solver_limit_without_a_plan_is_exit_3(catalog, monkeypatch):
    from planner.solve import SolveResult
    from tests.conftest import PIPELINE as planning

    monkeypatch.setattr(planning.Solver, "solve", lambda self, m, start=None, **kw: SolveResult("limit", "maxTimeLimit", None, None, None, 0.1))
    with pytest.raises(SolverLimitError) as err:
        make_plan(_scenario(catalog), QUICK)
    assert err.value.exit_code == 3


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, cwd=cwd)


def test_cli_plan_writes_files_and_refuses_to_overwrite(tmp_path):
    scen = ROOT / "catalogs" / "scenarios" / "llama-70b-chat.yaml"
    out = tmp_path / "p"
    r = _cli("plan", str(scen), "--out", str(out), "--json", "--no-analysis", "--lp", str(tmp_path / "m.lp"))
    assert r.returncode == 0, r.stderr
    assert "unit_packing" in (tmp_path / "m.lp").read_text()
    doc = json.loads(r.stdout)
    for key in ("schema_version", "scenario", "status", "objective", "solver", "units", "pools", "workloads", "binding_constraints"):
        assert key in doc
    assert set(doc["pools"][0]) >= {"role", "workload", "hardware", "replicas", "chips_per_replica", "layout", "batch",
                                    "weights_dtype", "kv_dtype", "kv_tier", "predicted", "memory_per_chip_bytes"}
    assert json.loads((out / "plan.json").read_text()) == doc
    assert (out / "plan.md").read_text().startswith("# Deployment plan: llama-70b-chat")
    before = (out / "plan.json").read_text()
    r = _cli("plan", str(scen), "--out", str(out), "--no-analysis")
    assert r.returncode == 1 and "--force" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert (out / "plan.json").read_text() == before


def test_cli_plan_bad_input_and_infeasible_exit_codes(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "catalogs" / "scenarios" / "llama-70b-chat.yaml").read_text().replace("requests_per_s: 50", "requests_per_s: -5"))
    r = _cli("plan", str(bad), "--out", str(tmp_path / "o"))
    assert r.returncode == 1 and "workloads.0.requests_per_s" in r.stderr and "Traceback" not in r.stderr
    tight = tmp_path / "tight.yaml"
    tight.write_text((ROOT / "catalogs" / "scenarios" / "llama-70b-chat.yaml").read_text().replace("tpot_ms: 40", "tpot_ms: 2"))
    r = _cli("plan", str(tight), "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "slo.tpot_ms" in r.stderr and "Traceback" not in r.stderr


EXAMPLES = sorted((ROOT / "catalogs" / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("scen", EXAMPLES, ids=lambda p: p.stem)
def test_committed_plans_parse_and_are_current(scen, catalog):
    folder = ROOT / "plans" / scen.stem
    plan = Plan.model_validate_json((folder / "plan.json").read_text())
    rs = resolve_scenario(load_scenario(scen), catalog, scen)
    assert plan.scenario["input_hash"] == input_hash(rs, rs.scenario.engine), (
        f"plans/{scen.stem} is stale: regenerate with the command in plans/README.md"
    )
    assert plan.recheck.ok and plan.status == "optimal"
    assert (folder / "plan.md").read_text().startswith(f"# Deployment plan: {rs.scenario.name}")


def test_committed_plan_reproduces(catalog):
    scen = ROOT / "catalogs" / "scenarios" / "llama-70b-chat.yaml"
    plan = Plan.model_validate_json((ROOT / "plans" / "llama-70b-chat" / "plan.json").read_text())
    again = make_plan(resolve_scenario(load_scenario(scen), catalog, scen), QUICK).plan
    assert again.objective.usd_per_hour == pytest.approx(plan.objective.usd_per_hour, rel=1e-9)
    assert [(g.hardware, g.count) for g in again.units] == [(g.hardware, g.count) for g in plan.units]


def test_force_removes_placement_maps_of_the_replaced_plan(tmp_path):
    """Replacing a plan with --force drops the expert maps only the old plan wrote; other files stay."""
    from planner.export.plan import write_plan

    plan = Plan.model_validate_json((ROOT / "plans" / "llama-70b-chat" / "plan.json").read_text())
    out = tmp_path / "p"
    write_plan(plan, out, files={"experts-ep16-r16.json": "{}\n"})
    (out / "notes.txt").write_text("mine")
    (out / "experts-ep4-r4.json").write_text("my own map")  # named like a plan's map, but the user's
    write_plan(plan, out, force=True, files={"experts-ep8-r0.json": "{}\n"})
    assert sorted(p.name for p in out.iterdir()) == [
        ".planner-manifest.json", "experts-ep4-r4.json", "experts-ep8-r0.json", "notes.txt", "plan.json", "plan.md"]
    assert (out / "experts-ep4-r4.json").read_text() == "my own map"
    manifest = json.loads((out / ".planner-manifest.json").read_text())
    assert manifest["files"] == ["experts-ep8-r0.json", "plan.json", "plan.md"]


def test_pools_name_their_engine_and_layout(base_plan, catalog):
    for p in base_plan.plan.pools:
        eng = catalog.engines[p.engine]
        assert eng.runs_on(catalog.hardware[p.hardware])
        assert p.layout.notation and p.chips_per_replica == p.layout.tp * p.layout.attn_dp * p.layout.pp
        assert 0 < p.predicted.utilisation <= 1.0
        if p.role != "decode":
            assert p.predicted.ttft_s <= p.predicted.ttft_at_capacity_s * (1 + 1e-9)


def test_engine_restriction_never_buys_hardware_it_cannot_run(catalog):
    rs = _scenario(catalog, hardware=["h100-sxm", "mi300x"], engine="trtllm")
    assert [h.id for h in rs.hardware] == ["h100-sxm"]
    plan = make_plan(rs, QUICK).plan
    assert {p.engine for p in plan.pools} == {"trtllm"} and {g.hardware for g in plan.units} == {"h100-sxm"}
    from planner.errors import InputError

    assert "left out, trtllm does not run on it: mi300x" in plan.assumptions
    with pytest.raises(InputError, match="field 'engine': atom runs on amd hardware and none of the candidate"):
        _scenario(catalog, hardware=["h100-sxm", "h200-sxm"], engine="atom")
    with pytest.raises(InputError, match="unknown engine id 'tensorflow'"):
        _scenario(catalog, engine="tensorflow")


def test_unvalidated_hardware_is_flagged_and_can_be_required_away(catalog):
    rs = _scenario(catalog, hardware=["h800-sxm"], prices={"h800-sxm": 2.0})
    plan = make_plan(rs, QUICK).plan
    assert all(p.unvalidated and "transferred from h100-sxm" in p.unvalidated for p in plan.pools)
    md = __import__("planner.export.plan", fromlist=["plan_markdown"]).plan_markdown(plan)
    assert "Unvalidated hardware" in md and "unvalidated: factors transferred from h100-sxm" in md
    kept = _scenario(catalog, hardware=["h100-sxm", "h800-sxm"], prices={"h800-sxm": 2.0}, require_validated=True)
    assert [h.id for h in kept.hardware] == ["h100-sxm"]
    from planner.errors import InputError

    with pytest.raises(InputError, match="require_validated"):
        _scenario(catalog, hardware=["h800-sxm"], prices={"h800-sxm": 2.0}, require_validated=True)


def test_a_plan_that_fails_its_recheck_is_an_error(catalog, monkeypatch):
    """Never a written plan whose headline says every target is met when the performance model disagrees."""
    from planner.errors import PlanCheckError
    from planner.results import Check, Recheck
    from tests.conftest import patch_pipeline

    patch_pipeline(monkeypatch, "recheck", lambda plan, rs: Recheck(ok=False, checks=[
        Check(name="chat-aggregated-1: tpot", ok=False, detail="61.0 ms <= 30 ms")]))
    with pytest.raises(PlanCheckError, match="fails 1 of 1 re-checks .*chat-aggregated-1: tpot: 61.0 ms <= 30 ms"):
        make_plan(_scenario(catalog), QUICK)


def test_packing_is_linear_in_replicas(catalog):
    """A million replicas of mixed sizes pack by count (runs of identical units compressed), every group
    whole inside one domain, no more units than the chips need."""
    import time
    from types import SimpleNamespace as NS

    from planner.results import pack

    hw = catalog.hardware["h200-sxm"]  # 8-GPU nodes, one domain each
    pools = [NS(id="a", hardware="h200-sxm", replicas=1_000_000, layout=NS(tp=4, attn_dp=1, pp=1)),
             NS(id="b", hardware="h200-sxm", replicas=333_333, layout=NS(tp=1, attn_dp=2, pp=3)),
             NS(id="c", hardware="h200-sxm", replicas=7, layout=NS(tp=1, attn_dp=16, pp=1))]
    t = time.perf_counter()
    placement, needed = pack(pools, {"h200-sxm": hw})
    assert time.perf_counter() - t < 5.0  # generous: it takes milliseconds; a per-replica loop takes hours
    assert len(placement) < 20
    chips = {}
    for up in placement:
        for dom in up.domains:
            assert sum(g.chips for g in dom) <= 8
            for g in dom:
                chips[g.pool] = chips.get(g.pool, 0) + g.chips * up.count
    assert chips == {"a": 4_000_000, "b": 333_333 * 2 * 3, "c": 7 * 16}
    need = (4_000_000 + 333_333 * 6 + 7 * 16) / 8
    assert needed["h200-sxm"] == sum(up.count for up in placement) and needed["h200-sxm"] <= int(need) + 2


def test_a_saving_not_proven_optimal_reads_as_a_lower_bound(catalog, monkeypatch):
    """An analysis re-solve that stops at its time limit with a plan gives a saving that is only a lower
    bound: the binding constraint says 'at least' and marks it unproven, never a plain 'saves'."""
    import dataclasses

    from tests.conftest import PIPELINE as planning
    from tests.conftest import patch_pipeline

    original = planning.solve_from

    def stopped(solver, m, start, *, heuristics=True, **kw):
        r = original(solver, m, start, heuristics=heuristics, **kw)
        # relaxations are the re-solves made without heuristics; pretend they ran out of time
        return r if heuristics else dataclasses.replace(r, status="feasible")

    patch_pipeline(monkeypatch, "solve_from", stopped)
    # 750 req/s: where 10% less traffic saves a whole replica ($13.12/h on the catalog of the fifth session of
    # 2026-12-07, where 550, 650 and 700 save nothing; 700 on the catalog of the fifth session of 2026-11-27, 750 on the
    # fourth's)
    p = make_plan(_scenario(catalog, requests_per_s=750), PlanOptions()).plan
    demand = next(b for b in p.binding_constraints if b.name == "demand.chat")
    assert demand.usd_per_hour_saved is not None and demand.usd_per_hour_saved > 0
    assert not demand.saving_proven and "saves at least $" in demand.detail
    patch_pipeline(monkeypatch, "solve_from", original)
    exact = next(b for b in make_plan(_scenario(catalog, requests_per_s=750), PlanOptions()).plan.binding_constraints
                 if b.name == "demand.chat")
    assert exact.saving_proven and "saves $" in exact.detail
    assert exact.usd_per_hour_saved == pytest.approx(demand.usd_per_hour_saved)


def test_an_analysis_cut_short_keeps_what_it_priced(catalog, monkeypatch):
    """When --time-limit runs out mid-analysis the binding constraints priced so far are kept and the plan
    says the analysis stopped; nothing is invented for the rest."""
    from tests.conftest import PIPELINE as planning

    calls = {"n": 0, "stop": None}
    original = planning.AnalysisContext._quick

    def quick(self, *, fresh=False):
        calls["n"] += 1
        if calls["stop"] is not None and calls["n"] >= calls["stop"]:
            raise planning.OutOfTime
        return original(self, fresh=fresh)

    monkeypatch.setattr(planning.AnalysisContext, "_quick", quick)
    # a power limit just above what the plan draws: priced before the workloads' questions
    kw = sum(g.kw for g in make_plan(_scenario(catalog, requests_per_s=700), QUICK).plan.units)
    rs = _scenario(catalog, requests_per_s=700, limits={"power_kw": kw * 1.01})
    calls["n"] = 0
    full = make_plan(rs, PlanOptions()).plan
    assert any(b.name == "limits.power_kw" for b in full.binding_constraints)
    # out of time at the last re-solve (the runner-up, the power limit, the SLO re-solves, then the demand)
    assert calls["n"] >= 3
    calls.update(stop=calls["n"], n=0)
    cut = make_plan(rs, PlanOptions()).plan
    assert 1 <= len(cut.binding_constraints) < len(full.binding_constraints) + 1
    assert any("analysis not completed" in a and "before the rest;" in a for a in cut.assumptions)
    # the runner-up is found first, so a cut analysis still has it
    assert cut.runner_up is not None and cut.runner_up.usd_per_hour == pytest.approx(full.runner_up.usd_per_hour)
    names = {b.name: b for b in full.binding_constraints}
    for b in cut.binding_constraints:
        assert b.name in names and b.usd_per_hour_saved == pytest.approx(names[b.name].usd_per_hour_saved)


def test_a_limit_the_time_limit_left_unpriced_is_not_said_to_save_nothing(catalog, monkeypatch):
    """A power limit near binding whose re-solve the time limit cut off is not listed as "saves $0.00/h" (proven):
    it was never priced. (A limit with more than a unit of slack is not re-solved and saves $0, proven.)"""
    from tests.conftest import PIPELINE as planning

    calls = {"n": 0}
    original = planning.AnalysisContext._quick

    def quick(self, *, fresh=False):
        calls["n"] += 1
        if calls["n"] >= 2:  # the runner-up is priced, then the time is spent: the power limit's re-solve is next
            raise planning.OutOfTime
        return original(self, fresh=fresh)

    kw = sum(g.kw for g in make_plan(_scenario(catalog, requests_per_s=700), QUICK).plan.units)
    monkeypatch.setattr(planning.AnalysisContext, "_quick", quick)
    cut = make_plan(_scenario(catalog, requests_per_s=700, limits={"power_kw": kw * 1.01}), PlanOptions()).plan
    assert cut.runner_up is not None and any("analysis not completed" in a for a in cut.assumptions)
    assert not any(b.name == "limits.power_kw" for b in cut.binding_constraints)


def test_a_looser_slo_that_changes_no_row_is_not_re_solved(catalog, monkeypatch):
    """Relaxing an SLO that admits no new row and raises no rate gives the same model: its saving is 0 without
    a rebuild; every table that does differ is built and solved."""
    from tests.conftest import PIPELINE as planning
    from tests.conftest import patch_pipeline

    tables, builds, first = [], [], {}
    sel, build = planning.select_candidates, planning.build_model

    def select(pool, slos, **kw):
        # Rows whose prefill queue is their limit gain a sliver of rate (1e-5) from any looser TTFT target; so
        # that the 10% looser TTFT admits nothing here, a table asked for at the base TPOT gets the base TTFT.
        first.setdefault("slos", slos)
        if {k: v[1] for k, v in slos.items()} == {k: v[1] for k, v in first["slos"].items()}:
            slos = first["slos"]
        t = sel(pool, slos, **kw)
        if kw.get("prune", True):  # the tables a model is made of (not the unpruned look-ahead of the gate)
            tables.append(tuple(zip(t.rows["pool_row"], t.rows["requests_per_s"], strict=True)))
        return t

    def built(data, **kw):
        builds.append(1)
        return build(data, **kw)

    patch_pipeline(monkeypatch, "select_candidates", select)
    patch_pipeline(monkeypatch, "build_model", built)
    patch_pipeline(monkeypatch, "together", list)  # each SLO asked alone (asked together, both are relaxed at once)
    # TPOT 8 ms binds (10% looser saves $13.52/h on the catalog of the fifth session of 2026-11-27; 20 ms bound on the
    # fourth's); the TTFT of 60 s does not
    p = make_plan(_scenario(catalog, requests_per_s=600, slo={"ttft_ms": 60000, "tpot_ms": 8}), PlanOptions()).plan
    base, relaxed = tables[0], tables[1:]
    assert relaxed and any(t == base for t in relaxed)  # the 10% looser TTFT changes nothing
    assert len(builds) == 1 + sum(t != base for t in relaxed)
    assert not any(b.name.startswith("slo.ttft") for b in p.binding_constraints)



def test_a_prefill_pool_keeps_the_micro_batch_overlap_it_was_priced_with(catalog, monkeypatch):
    """Candidate rows price two micro-batch overlap for prefill pools too; the plan must carry it. A pool that
    dropped it was re-checked without it and failed its own rate (the skewed DeepSeek plan on GB200 served by
    SGLang, whose prefill pools run attention-DP EP with overlap). Pipelined layouts are taken out of the grid so
    that the prefill pools are expert-parallel whatever the fitted factors make cheapest (since the refit of
    2026-12-07, fourth session, the plan prefills on four pipeline stages, where no overlap applies)."""
    import planner.perf.candidates as C

    grid = C.layout_tuples
    monkeypatch.setattr(C, "layout_tuples", lambda *a, **k: [t for t in grid(*a, **k) if t[2] == 1])
    path = ROOT / "catalogs" / "scenarios" / "deepseek-sglang-pd.yaml"
    plan = make_plan(resolve_scenario(load_scenario(path), catalog, path), PlanOptions(analysis=False)).plan
    assert all(p.layout.pp == 1 for p in plan.pools)
    assert plan.recheck.ok
    prefill = [p for p in plan.pools if p.role == "prefill"]
    assert prefill and any(p.two_batch_overlap for p in prefill)


def test_the_runner_up_floor_is_the_bound_less_the_tie_break_and_only_where_it_holds():
    from types import SimpleNamespace

    from planner.analysis.context import fleet_floor
    from planner.model.build import EPSILON
    from planner.solve import SolveResult

    stopped = SolveResult("feasible", "maxTimeLimit", 781.76, 760.0, 0.028, 5.0)
    plain, priced = SimpleNamespace(pool_type_usd_per_hour=0.0), SimpleNamespace(pool_type_usd_per_hour=5.0)
    assert fleet_floor(stopped, plain, 781.76) == pytest.approx(760.0 / (1 + EPSILON))
    assert fleet_floor(stopped, priced, 781.76) is None  # the objective holds pool-type dollars too
    assert fleet_floor(SolveResult("optimal", "ok", 781.76, 781.76, 0.0, 1.0), plain, 781.76) is None
    assert fleet_floor(SolveResult("feasible", "maxTimeLimit", 781.76, None, None, 5.0), plain, 781.76) is None


def test_a_plan_tells_its_stages_as_they_start(catalog):
    """``make_plan(progress=...)`` hears each stage in order (what the CLI's spinner shows on a terminal): the
    candidates, the solve, the runner-up before any relaxation, a relaxation per priced constraint, placement."""
    heard: list[str] = []
    make_plan(_scenario(catalog), PlanOptions(), progress=heard.append)
    assert heard[0].startswith("evaluating candidates for 1 workload(s) on 2 hardware")
    assert heard[1].startswith("solving the MILP over ")
    assert heard[2].startswith("analysis: the cheapest plan without ")
    assert "analysis: chat's demand 10% lower" in heard
    assert heard[-1] == "placing experts and re-checking the plan"
    heard.clear()
    quiet = make_plan(_scenario(catalog), PlanOptions(analysis=False), progress=heard.append)
    assert quiet.plan.runner_up is None and not any(h.startswith("analysis") for h in heard)
