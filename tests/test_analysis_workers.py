"""The analysis's re-solves on several processes (``planner plan --jobs N``, planner/analysis_workers.py): the same
answers as one process, a worker that dies costs no answer, an error in a worker is raised, and the time limit
binds every process."""

from __future__ import annotations

import sys
import textwrap
import time

import pytest

from planner.catalog.scenario import load_scenario, resolve_scenario
from planner.options import PlanOptions
from planner.pipeline.plan import make_plan
from tests.conftest import ROOT

SCENARIO = ROOT / "catalogs" / "scenarios" / "three-models.yaml"


@pytest.fixture(scope="module")
def rs(catalog):
    return resolve_scenario(load_scenario(SCENARIO), catalog, SCENARIO)


@pytest.fixture(scope="module")
def tight(catalog):
    """three-models with chat's TPOT at 26 ms, where it binds: 10% looser saves $13.52/h (agents' TPOT $4.40/h) on the
    catalog of the fifth session of 2026-12-07, where 24, 28, 30, 32 and 34 ms save nothing (28 ms on the catalog of
    the fourteenth session of 2026-11-28; 30 ms before its MoE and attention refit, where 26, 30 and 32 ms saved
    nothing: whole nodes absorb the 10%; 34 ms until the candidates got rows at the batch that meets the TPOT target;
    36 ms on the catalog of 2026-11-26; at the bundled 40 ms whole nodes absorb every 10% relaxation and no SLO
    question saves)."""
    from planner.catalog.scenario import Scenario

    d = load_scenario(SCENARIO).model_dump(mode="json", exclude_unset=True)
    d["workloads"][0]["slo"]["tpot_ms"] = 26.0
    return resolve_scenario(Scenario.model_validate(d), catalog, SCENARIO)


@pytest.fixture(scope="module")
def alone(rs):
    """The plan with its analysis answered in this process."""
    return make_plan(rs, PlanOptions(jobs=1)).plan


def _analysis(plan) -> tuple:
    ru = plan.runner_up
    return ([(b.name, b.detail, b.usd_per_hour_saved, b.saving_proven) for b in plan.binding_constraints],
            None if ru is None else (ru.excluded, ru.usd_per_hour, ru.status, ru.summary))


def test_workers_answer_as_one_process(rs, alone):
    """Three processes (this one and two workers) give the analysis one process gives, word for word."""
    assert len(alone.binding_constraints) >= 3 and alone.runner_up is not None
    many = make_plan(rs, PlanOptions(jobs=3)).plan
    assert _analysis(many) == _analysis(alone)
    assert many.objective.usd_per_hour == alone.objective.usd_per_hour
    assert not any("analysis not completed" in a for a in many.assumptions)


def _fake_worker(monkeypatch, tmp_path, body: str) -> None:
    """Workers that run ``body`` once they have said they are ready, with ``i`` the first question they are handed
    (recorded in ``tmp_path / 'asked'``); the planning process starts its own first question only once a worker
    has taken one (so that one is taken, however slowly the worker starts)."""
    import subprocess

    from planner.analysis import workers as analysis_workers
    from tests.conftest import PIPELINE as planning
    from tests.conftest import patch_pipeline

    code = textwrap.dedent(f"""
        import pickle, sys
        from planner.analysis.workers import READY, _send
        pickle.load(sys.stdin.buffer)
        out = sys.stdout.buffer
        _send(out, READY)
        i = pickle.load(sys.stdin.buffer)
        with open({str(tmp_path / 'asked.tmp')!r}, "w") as f:
            f.write(str(i))
        import os
        os.replace({str(tmp_path / 'asked.tmp')!r}, {str(tmp_path / 'asked')!r})
    """) + textwrap.dedent(body)

    def start():
        return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                cwd=ROOT)

    original = planning.ask
    first = [True]

    def slow_ask(ctx, q, *rest):
        if first[0]:
            first[0] = False
            t0 = time.perf_counter()
            while not (tmp_path / "asked").exists() and time.perf_counter() - t0 < 120:
                time.sleep(0.05)
        return original(ctx, q, *rest)

    monkeypatch.setattr(analysis_workers, "_start_worker", start)
    patch_pipeline(monkeypatch, "ask", slow_ask)
    # these fakes speak the analysis's part of the protocol only: the candidates are evaluated here
    patch_pipeline(monkeypatch, "_evaluate", lambda _workers, *a: planning.evaluate_candidates(*a))


def test_a_worker_that_dies_costs_no_answer(rs, alone, monkeypatch, tmp_path):
    """A worker that dies holding a question (killed, out of memory): the question is re-solved in the planning
    process and the analysis is whole."""
    _fake_worker(monkeypatch, tmp_path, "sys.exit(1)\n")
    plan = make_plan(rs, PlanOptions(jobs=2)).plan
    assert (tmp_path / "asked").read_text().isdigit()  # the worker did take a question before it died
    assert _analysis(plan) == _analysis(alone)


def test_an_error_in_a_worker_is_raised(rs, monkeypatch, tmp_path):
    """An exception in a worker (a bug, bad input) is raised by the planning process, as one process raises it (one
    that cannot cross the pipe kills the worker instead, and the planning process re-solves the question itself)."""
    _fake_worker(monkeypatch, tmp_path, """
        _send(out, ("error", ValueError("boom in a worker")))
        sys.stdin.buffer.read()
    """)
    with pytest.raises(ValueError, match="boom in a worker"):
        make_plan(rs, PlanOptions(jobs=2))


def test_the_time_limit_binds_every_process(rs, alone, monkeypatch):
    """Where the command's time limit is spent, no process re-solves (the deadline reaches the workers): the plan
    says the analysis stopped and lists nothing it did not price."""
    from tests.conftest import PIPELINE as planning
    from tests.conftest import patch_pipeline

    original = planning.answer_questions

    def spent(ctx, qs, jobs=1, workers=None):
        ctx.deadline = time.perf_counter() - 1.0
        return original(ctx, qs, 2, workers)

    patch_pipeline(monkeypatch, "answer_questions", spent)
    plan = make_plan(rs, PlanOptions(jobs=2)).plan
    assert plan.runner_up is None
    # questions answered without a re-solve (a looser SLO that admits no row) may be counted; none that re-solves
    assert any("analysis not completed" in a and "before the rest and the runner-up" in a for a in plan.assumptions)
    priced = {b.name for b in plan.binding_constraints}
    assert not any(n.startswith(("demand.", "slo.", "prefix_cache.")) for n in priced)
    assert priced <= {b.name for b in alone.binding_constraints}


def _market_split(m: int = 4, seed: int = 3):
    """A market-split instance (Cornuéjols and Dawande): a few equality rows over 10 (m - 1) binaries, tiny and
    far beyond branch and bound in a second."""
    import numpy as np
    import pyomo.core as pyo

    rng = np.random.default_rng(seed)
    n = 10 * (m - 1)
    a = rng.integers(0, 100, size=(m, n))
    mdl = pyo.ConcreteModel()
    mdl.x = pyo.Var(range(n), within=pyo.Binary)
    mdl.s = pyo.Var(range(m), within=pyo.NonNegativeReals)
    mdl.rows = pyo.Constraint(range(m), rule=lambda mdl, i: sum(int(a[i, j]) * mdl.x[j] for j in range(n))
                              + mdl.s[i] == int(a[i].sum()) // 2)
    mdl.cost = pyo.Objective(expr=sum(mdl.s[i] for i in range(m)))
    return mdl


def test_ctrl_c_stops_a_solve_and_is_raised():
    """Ctrl-C during a HiGHS solve stops it and raises KeyboardInterrupt: read as a solver limit, an analysis
    re-solve cut short said "no feasible plan without" a hardware where one exists, and the plan went on."""
    import os
    import signal
    import threading

    from planner.solve import Solver

    mdl = _market_split(5)  # 40 binaries: never solved before the signal (HiGHS 1.11 proved m = 4 in < 1 s at times)
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    t0 = time.perf_counter()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            Solver(time_limit_s=60, mip_gap=0.0, threads=1).solve(mdl)
    finally:
        timer.cancel()
    assert time.perf_counter() - t0 < 30
    # the handler is put back: Ctrl-C raises at once again outside a solve
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_runner_up_not_found_in_time_is_not_called_impossible(rs, monkeypatch):
    """A runner-up re-solve that stops at its time limit without a plan says so; only a proven infeasible one
    reads "no feasible plan"."""
    from planner.solve import SolveResult
    from tests.conftest import PIPELINE as planning
    from tests.conftest import patch_pipeline

    original = planning.solve_from

    def limit(solver, m, starts, **kw):
        if any(m.u[h].fixed for h in m.H):  # the runner-up: its main hardware fixed at 0 units
            return SolveResult("limit", "maxTimeLimit", None, None, None, 5.0)
        return original(solver, m, starts, **kw)

    patch_pipeline(monkeypatch, "solve_from", limit)
    ru = make_plan(rs, PlanOptions(jobs=1)).plan.runner_up
    assert ru.status == "limit" and "no feasible plan" not in ru.summary
    assert f"no plan without {ru.excluded} found within" in ru.summary


def test_workers_started_ahead_are_stopped_when_unused(rs, alone, monkeypatch):
    """Workers start before the candidates (their start-up runs beside them); where the analysis then runs in one
    process they are stopped; a plan without analysis starts one for its candidates (asked with ``--jobs``, or by
    default for many workloads), stopped after them."""
    from planner.analysis import workers as analysis_workers
    from tests.conftest import patch_pipeline

    started = []
    original = analysis_workers._start_worker

    def start():
        p = original()
        started.append(p)
        return p

    monkeypatch.setattr(analysis_workers, "_start_worker", start)
    patch_pipeline(monkeypatch, "analysis_jobs", lambda *a: 1)  # as where the analysis has one question
    plan = make_plan(rs, PlanOptions(jobs=3)).plan
    assert len(started) == 2 and all(p.poll() is not None for p in started)
    assert _analysis(plan) == _analysis(alone)
    started.clear()
    make_plan(rs, PlanOptions(jobs=3, analysis=False))
    assert len(started) == 1 and started[0].poll() is not None
    started.clear()
    make_plan(rs, PlanOptions(jobs=1, analysis=False))
    assert not started
    # by default, without the analysis: one for the candidates of a scenario of many workloads, else none
    patch_pipeline(monkeypatch, "available_cores", lambda: 4)
    patch_pipeline(monkeypatch, "PRESTART_MIN_WORKLOADS", 1)
    make_plan(rs, PlanOptions(analysis=False))
    assert not started
    patch_pipeline(monkeypatch, "CANDIDATE_WORKER_MIN_WORKLOADS", len(rs.scenario.workloads))
    make_plan(rs, PlanOptions(analysis=False))
    assert len(started) == 1 and started[0].poll() is not None


def test_the_runner_up_searches_with_heuristics_and_relaxations_without(rs, monkeypatch):
    """The runner-up starts from a greedy re-serve (feasible, a few percent dear), so HiGHS's primal heuristics
    stay on for it (on the 10-workload fleet of bench/bench_fleet.py they find it at $925.04/h within its 5 s
    where the search without them stopped at $974.00); the relaxations start from the plan itself, optimal
    before the change, and search without them."""
    from tests.conftest import PIPELINE as planning
    from tests.conftest import patch_pipeline

    calls = []
    original = planning.solve_from

    def record(solver, m, starts, *, heuristics=True, **kw):
        calls.append(("runner_up" if any(m.u[h].fixed for h in m.H) else "other", heuristics))
        return original(solver, m, starts, heuristics=heuristics, **kw)

    patch_pipeline(monkeypatch, "solve_from", record)
    make_plan(rs, PlanOptions(jobs=1))
    assert ("runner_up", True) in calls and ("runner_up", False) not in calls
    relaxations = [h for kind, h in calls[1:] if kind == "other"]  # calls[0] is the plan's own solve
    assert relaxations and not any(relaxations)


def test_together_groups_each_workloads_slo_and_prefix_questions():
    """Each workload's SLO and prefix questions (two or more) become one, at the first one's place; the others, and
    a workload's lone SLO question, stay as they are."""
    from planner.analysis.context import Question
    from planner.analysis.questions import together

    qs = [Question("runner_up", "h100"), Question("slo", "a", "tpot"), Question("slo", "a", "ttft"),
          Question("demand", "a", value=9.0), Question("prefix", "a", value=45.0), Question("slo", "b", "ttft"),
          Question("demand", "b", value=1.0)]
    got = together(qs)
    assert [q.kind for q in got] == ["runner_up", "together", "demand", "slo", "demand"]
    assert got[1].members == (qs[1], qs[2], qs[4]) and got[1].target == "a"
    assert got[3] is qs[5]
    assert got[1].label == "a's TPOT 10% looser and TTFT 10% looser and prefix working set 10% smaller"


@pytest.mark.parametrize("slo", [None, {"ttft_ms": 300, "tpot_ms": 7.5}])
def test_questions_asked_together_get_the_answers_asked_alone(catalog, tight, monkeypatch, slo):
    """A workload's SLO and prefix questions asked as one give each the answer it gets alone. On three-models with
    chat's TPOT at 26 ms (the ``tight`` fixture) the workloads' re-solves together that find savings (chat's looser TPOT; since the catalog of
    the thirteenth session of 2026-11-28 agents' as well) have their two SLOs asked alone after, unless the optimum found
    together already sits at one looser SLO alone (the catalog of the fifth session of 2026-11-27), which answers that
    question without a re-solve; the others' together prove the plan stays cheapest: 3 + 1 or 2 per workload with
    savings (asking together pays off while at most one of three workloads' SLOs bind). At 26 ms on the catalog of 2026-12-07 (fifth session), as at 28 ms on the catalog of
    the fourteenth session only chat's TPOT and agents' TPOT admit cheaper rows, each a question of its own, and
    classify's two are asked together: 3 re-solves together, 4 alone. On a llama-8b chat whose TPOT binds (7 ms; 10% looser saves $0.40/h on the catalog of
    2026-11-26; 7.5 ms since the catalog of 2026-11-29 with at most 8 factors per pair, where 7 ms no longer binds: the
    plan at 7 ms is the plan at 7.7 ms) the optimum found together is a plan at the looser TPOT alone, so it answers that question without a
    re-solve: asking together costs no re-solve more than asking alone."""
    from tests.conftest import PIPELINE as planning
    from tests.conftest import patch_pipeline
    from tests.test_plan import _scenario

    rs = tight if slo is None else _scenario(catalog, requests_per_s=600, slo=slo)
    solves, relaxed = [], []
    solve_from, cost_relaxed = planning.solve_from, planning.AnalysisContext.cost_relaxed

    def counted_solve(*a, **kw):
        solves.append(1)
        return solve_from(*a, **kw)

    def counted_relaxed(self, *a, **kw):
        relaxed.append(a)
        return cost_relaxed(self, *a, **kw)

    patch_pipeline(monkeypatch, "solve_from", counted_solve)
    monkeypatch.setattr(planning.AnalysisContext, "cost_relaxed", counted_relaxed)
    asked_together = make_plan(rs, PlanOptions(jobs=1)).plan
    together = (len(solves), len(relaxed))
    solves[:], relaxed[:] = [], []
    patch_pipeline(monkeypatch, "together", list)
    asked_alone = make_plan(rs, PlanOptions(jobs=1)).plan
    assert _analysis(asked_together) == _analysis(asked_alone)
    assert any(b.name == "slo.tpot.chat" and b.usd_per_hour_saved > 0 for b in asked_together.binding_constraints)
    if slo is None:
        # each workload's SLOs asked together once; a workload whose together re-solve finds savings then has its two
        # SLOs asked alone (or one, where the optimum found together sits at one looser SLO alone). Alone: one each
        # (a workload with one SLO question and no prefix one asks it as it is: nothing to ask again). Asked alone,
        # every SLO question is one re-solve; together costs at most one more per workload whose re-solve saves.
        saving = {b.name.rsplit(".", 1)[1] for b in asked_together.binding_constraints
                  if b.name.startswith("slo.") and b.usd_per_hour_saved > 0}
        assert "chat" in saving
        assert 3 <= together[1] <= len(relaxed) + len(saving)
        assert len(relaxed) >= 3
    else:
        assert together[0] == len(solves)


def test_how_many_processes_answer_the_analysis(monkeypatch):
    """``--jobs`` where given; else one per core (up to the cap) after a slow solve, one after a fast one, and after a
    fairly fast one the workers already started (their start-up paid) but no more."""
    from planner.analysis.workers import analysis_jobs
    from planner.options import PlanOptions
    from tests.conftest import PIPELINE as planning
    from tests.conftest import patch_pipeline

    patch_pipeline(monkeypatch, "PARALLEL_MIN_SOLVE_S", 0.5)
    patch_pipeline(monkeypatch, "available_cores", lambda: 8)
    assert analysis_jobs(PlanOptions(jobs=3), 10, 0.01) == 3
    assert analysis_jobs(PlanOptions(jobs=3), 2, 9.0) == 2
    assert analysis_jobs(PlanOptions(), 1, 9.0) == 1
    assert analysis_jobs(PlanOptions(), 10, 0.6) == planning.MAX_ANALYSIS_JOBS
    assert analysis_jobs(PlanOptions(), 10, 0.3) == 1
    assert analysis_jobs(PlanOptions(), 10, 0.3, started=1) == 2
    assert analysis_jobs(PlanOptions(), 10, 0.1, started=1) == 1


def _pool_args(rs):
    from planner.perf.candidates import scenario_slos
    from planner.pipeline.plan import analysis_shares, slo_levels

    return rs, None, slo_levels(scenario_slos(rs.scenario.workloads), True), analysis_shares(rs, PlanOptions())


def _slow_here(monkeypatch) -> list:
    """This process's candidate evaluation made slow (0.5 s a call, a worker's not), so that a worker takes some
    hardware; the hardware evaluated here are recorded."""
    from planner.perf import candidates

    here, original = [], candidates.evaluate_candidates

    def slow(*a, hardware=None, **kw):
        if hardware is not None:
            here.extend(hardware)
            time.sleep(0.5)
        return original(*a, hardware=hardware, **kw)

    monkeypatch.setattr(candidates, "evaluate_candidates", slow)
    return here


def test_a_worker_evaluates_part_of_the_candidates(rs, monkeypatch):
    """Hardware by hardware, here from the first and on a worker from the last: the pool is the one evaluated
    whole, row for row, and the worker then answers the analysis's questions."""
    import pandas as pd

    from planner.analysis.workers import Workers, evaluate_beside
    from planner.perf.candidates import evaluate_candidates

    whole = evaluate_candidates(*_pool_args(rs))
    here = _slow_here(monkeypatch)
    workers = Workers(1)
    try:
        pool = evaluate_beside(workers, *_pool_args(rs))
        assert 1 <= len(here) < len(rs.hardware)
        took = workers.pending
        workers.take(1)
        assert took is not None and not took.is_alive()
    finally:
        workers.close()
    pd.testing.assert_frame_equal(pool.rows, whole.rows)
    assert (pool.evaluated, pool.dropped_memory, pool.fit, pool.base_slo_drops) == \
        (whole.evaluated, whole.dropped_memory, whole.fit, whole.base_slo_drops)


@pytest.mark.parametrize("how", ["dies", "fails"])
def test_a_worker_that_dies_or_fails_on_its_candidates(rs, tmp_path, monkeypatch, how):
    """A worker that dies holding a hardware costs nothing (it is evaluated here); one whose evaluation raises has
    the planning process raise it."""
    import subprocess

    import pandas as pd

    from planner.analysis import workers as analysis_workers
    from planner.analysis.workers import Workers, evaluate_beside
    from planner.perf.candidates import evaluate_candidates

    reply = "sys.exit(1)" if how == "dies" else '_send(out, ("error", ValueError("boom on a worker")))'
    code = textwrap.dedent(f"""
        import pickle, sys
        from planner.analysis.workers import READY, _send
        out = sys.stdout.buffer
        pickle.load(sys.stdin.buffer)
        _send(out, READY)
        pickle.load(sys.stdin.buffer)
        {reply}
        sys.stdin.buffer.read()
    """)
    monkeypatch.setattr(analysis_workers, "_start_worker", lambda: subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT))
    whole = evaluate_candidates(*_pool_args(rs))
    here = _slow_here(monkeypatch)
    workers = Workers(1)
    try:
        time.sleep(1)  # started up: it takes the last hardware at once
        if how == "fails":
            with pytest.raises(ValueError, match="boom on a worker"):
                evaluate_beside(workers, *_pool_args(rs))
            return
        pool = evaluate_beside(workers, *_pool_args(rs))
    finally:
        workers.close()
    assert len(here) == len(rs.hardware)  # the hardware it took, and the rest
    pd.testing.assert_frame_equal(pool.rows, whole.rows)


def test_a_model_already_re_solved_is_answered_without_a_re_solve(tight, monkeypatch):
    """A re-selection that comes to a model the analysis has re-solved (a workload's TPOT question where the
    relaxations asked together with it change nothing) gets that re-solve's answer, cost and proof, without a
    solve; a question whose model differs is re-solved."""
    from tests.conftest import PIPELINE as planning
    from tests.conftest import patch_pipeline

    ctxs = []
    answer = planning.answer_questions

    def keep(ctx, qs, jobs=1, workers=None):
        ctxs.append(ctx)
        return answer(ctx, qs, jobs, workers)

    patch_pipeline(monkeypatch, "answer_questions", keep)
    make_plan(tight, PlanOptions(jobs=1))
    ctx = ctxs[0]
    ctx.deadline = time.perf_counter() + 60.0
    solves = []
    solve_from = planning.solve_from
    patch_pipeline(monkeypatch, "solve_from", lambda *a, **kw: solves.append(1) or solve_from(*a, **kw))
    ctx.solved.clear()
    first = ctx.cost_relaxed("chat", ("tpot",)), ctx.proven
    assert len(solves) == 1 and first[0] < ctx.cost and first[1]  # chat's looser TPOT saves ($13.52/h)
    again = ctx.cost_relaxed("chat", ("tpot",)), ctx.proven
    assert again == first and len(solves) == 1
    ctx.cost_relaxed("chat", ("tpot", "ttft"))
    assert len(solves) == 2  # the looser TTFT admits other rows: another model


def test_a_worker_imports_this_planner_package(monkeypatch):
    """A worker is started on this very package (planner/__init__.py), not on the module's own folder: started on
    planner/analysis/ it imported whatever planner the path held (another checkout, an installed copy)."""
    import subprocess as sp
    from pathlib import Path

    import planner
    from planner.analysis import workers as analysis_workers

    seen = []
    monkeypatch.setattr(sp, "Popen", lambda args, **kw: seen.append(args))
    analysis_workers._start_worker()
    (args,) = seen
    assert repr(str(Path(planner.__file__).resolve())) in args[-1]
