"""The analysis's context: the plan, its model and solver, and the re-solves of relaxed models that price each
question (:class:`AnalysisContext`), with the helpers that carry a solution from one model to another.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyomo.core as pyo
from pyomo.common.collections import ComponentMap

from planner.catalog.scenario import ResolvedScenario
from planner.model import PlanData, build_model, prepare
from planner.model.bounds import greedy_start, route_streams, snapshot, solve_from
from planner.model.build import EPSILON
from planner.model.families import (
    BY_NAME,
    RELAX,
    prefix_bounds_move,
)
from planner.options import PlanOptions
from planner.perf.candidates import (
    CandidatePool,
    CandidateTable,
    scenario_slos,
    select_candidates,
)
from planner.results import (
    Plan,
    RunnerUp,
)
from planner.solve import Solver, SolveResult

SENSITIVITY_TIME_LIMIT_S = 5.0


def relaxed_slos(slos: dict[str, tuple[float, float]], workload: str, k: int) -> dict[str, tuple[float, float]]:
    """``slos`` with ``workload``'s TTFT (``k = 0``) or TPOT (``k = 1``) limit ``RELAX`` looser."""
    out = dict(slos)
    lim = list(out[workload])
    lim[k] *= 1 + RELAX
    out[workload] = tuple(lim)
    return out


class OutOfTime(Exception):
    """The command's --time-limit is spent: the analysis stops (the plan itself is complete)."""


@dataclass
class AnalysisContext:
    rs: ResolvedScenario
    pool: CandidatePool
    data: PlanData
    model: pyo.ConcreteModel
    solver: Solver
    res: SolveResult
    plan: Plan
    opts: PlanOptions
    deadline: float = float("inf")
    base: ComponentMap | None = None
    """The plan's solution (every variable of the model), the start of the re-solves of relaxations."""
    proven: bool = True
    """Whether the last re-solve proved its optimum (else a saving found is a lower bound)."""
    say: Callable[[str], None] = lambda _msg: None
    """Told what the analysis re-solves next (see :func:`make_plan`'s ``progress``)."""
    found: tuple | None = None
    """The last :meth:`cost_relaxed` re-solve's model, solution and fleet $/h (``None``: it found no plan)."""
    solved: dict = field(default_factory=dict)
    """What each model :meth:`cost_relaxed` re-solved came to (fleet $/h, proven, :attr:`found`), by its digest
    (:meth:`Solver.digest`): a question whose model is one already re-solved is answered without a re-solve (a
    workload's TPOT question where the TTFT and working-set relaxations asked together with it change nothing)."""

    @property
    def cost(self) -> float:
        return self.plan.objective.usd_per_hour

    def resolve_with(self, param, value, workload: str | None = None, moves: Callable[[], bool] | None = None) -> float | None:
        """Fleet $/h with one mutable parameter changed (then restored); each change the analysis makes (less
        demand, a smaller working set, a higher limit) relaxes the model. ``workload``: the one the parameter is
        of, re-served from scratch in the start where the change leaves the plan infeasible (less demand gives
        each prefix-caching replica a larger share of the prefixes to hold). ``moves``: asked with the parameter
        changed, whether the model changes at all; where not, the plan's cost is the answer (no re-solve)."""
        old = pyo.value(param)
        param.set_value(value)
        try:
            if moves is not None and not moves():
                self.proven = True
                return self.cost
            r = self.solve_relaxed(workload)
            self.proven = r.status == "optimal"
            return fleet_cost(self.model, self.data) if r.has_solution else None
        finally:
            param.set_value(old)

    def solve_relaxed(self, workload: str | None = None) -> SolveResult:
        """Re-solve the plan's model after a change that relaxes it: where the plan stays feasible it is the
        first incumbent and its cost bounds the units and replicas (:func:`planner.model.bounds.solve_from`);
        else the plan with ``workload`` re-served greedily is."""
        starts = [self.base]
        if workload is not None and self.base is not None:
            starts.append(lambda: greedy_start(self.model, self.base, {workload}, check=False))
        return solve_from(self._quick(), self.model, starts, heuristics=False)

    def _quick(self, *, fresh: bool = False) -> Solver:
        """A solver for one analysis re-solve within what is left of the time limit: the main solve's persistent
        instance (only the changes reach HiGHS) for the plan's own model, a fresh one (``fresh``) for another."""
        left = self.deadline - time.perf_counter()
        if left < 0.05:
            raise OutOfTime
        limit, gap = min(left, SENSITIVITY_TIME_LIMIT_S), max(self.opts.mip_gap, 1e-4)
        if fresh:
            return Solver(time_limit_s=limit, mip_gap=gap)
        return self.solver.limited(time_limit_s=limit, mip_gap=gap)

    def admits_cheaper(self, workload: str, slo: tuple[float, float]) -> bool:
        """Whether a looser SLO admits a row cheaper per request/s than the dearest pool of that
        workload and role in the plan (if not, re-solving cannot pay off and is skipped)."""
        slos = dict(scenario_slos(self.rs.scenario.workloads))
        slos[workload] = slo
        r = select_candidates(CandidatePool(self.pool.rows[self.pool.rows["workload"] == workload], 0, 0,
                                            self.pool.utilisation_cap), slos, prune=False).rows
        for p in self.plan.pools:
            if p.workload != workload:
                continue
            per = p.usd_per_hour / max(p.predicted.requests_per_s, 1e-12)
            cand = r[r["role"] == p.role]
            if len(cand) and (cand["usd_per_rps"] < per * (1 - 1e-9)).any():
                return True
        return False

    def cost_relaxed(self, workload: str, which: tuple[str, ...] = (), working_set_gb: float | None = None,
                     known: tuple | None = None) -> float | None:
        """Fleet $/h with ``workload``'s SLOs named in ``which`` (``tpot``, ``ttft``) ``RELAX`` looser, and with its
        prefix working set ``working_set_gb`` where given: candidates re-selected from the pool at those SLOs, a
        model built on them and re-solved from the plan. ``known``: a proven optimum (model, solution, fleet $/h;
        :attr:`found`) of a relaxation of this question: where it is a plan of this question's model too, it is
        that model's optimum, without a re-solve."""
        slos = scenario_slos(self.rs.scenario.workloads)
        for k in which:
            slos = relaxed_slos(slos, workload, 1 if k == "tpot" else 0)
        table = select_candidates(self.pool, slos, keep=None if self.rs.fleet is None else self.rs.fleet.keys())
        if table.rows.empty:
            return None
        mine = self.data.rows
        same = len(table.rows) == len(mine) and all(
            np.array_equal(table.rows[c].to_numpy(), mine[c].to_numpy()) for c in ("pool_row", "requests_per_s"))
        if same:
            # the looser SLOs admit no row and raise no rate: the plan's own model, with the working set changed
            if working_set_gb is None:
                self.proven = True
                return self.cost
            m = self.model
            return self.resolve_with(m.working_set_gb[workload], working_set_gb, workload,
                                     moves=lambda: prefix_bounds_move(m, workload))
        # Looser SLOs only relax the plan: its rows are admitted with at least their rate, so it bounds the cost
        # and, mapped onto the new rows, is the first incumbent. A plan row the looser level's pruning drops (a
        # row it admits dominates it at the new rates) is put back, so that the plan maps; so is a row of the known
        # optimum of a relaxation (``known``), so that it maps where this level admits its rows.
        used = pool_rows_used(self.model, self.base) if self.base is not None else set()
        if known is not None:
            used |= pool_rows_used(*known[:2])
        missing = used - set(table.rows["pool_row"].to_numpy())
        if missing:
            full = select_candidates(self.pool, slos, prune=False).rows
            table = CandidateTable(pd.concat([table.rows, full[full["pool_row"].isin(missing)]], ignore_index=True),
                                   table.dropped, table.evaluated)
        data = prepare(self.rs, table)
        m = build_model(data)
        if working_set_gb is not None:
            m.working_set_gb[workload] = working_set_gb  # a smaller working set only relaxes: the plan stays feasible
        solver = self._quick(fresh=True)
        solver.load(m)
        digest = solver.digest()
        if digest in self.solved:
            cost, self.proven, self.found = self.solved[digest]
            return cost
        if known is not None:
            old, values, cost = known
            start = solution_on(old, values, m)
            if start is not None:
                route_streams(m, start)
            if start is not None and solver.start_objective(start) is not None:
                self.proven = True  # optimal for a relaxation of this model, and a plan of it
                return cost
        r = solve_from(solver, m, [self._base_on(m), lambda: greedy_start(m, check=False)], heuristics=False,
                       loaded=True)
        self.proven = r.status == "optimal"
        self.found = (m, snapshot(m), fleet_cost(m, data)) if r.has_solution else None
        cost = fleet_cost(m, data) if r.has_solution else None
        self.solved[digest] = (cost, self.proven, self.found)
        return cost

    def base_rows(self) -> list[int]:
        """Rows of the plan's model that the plan uses."""
        if self.base is None:
            return []
        m = self.model
        return [i for i in m.R if any(self.base[m.x[i, t]] > 0.5 for t in m.T)]

    def _base_on(self, m) -> ComponentMap | None:
        """The plan's solution on the model ``m`` of another candidate table of the same pool (rows matched by
        their pool position), or ``None`` where a row of the plan is not in it."""
        if self.base is None:
            return None
        return solution_on(self.model, self.base, m)


def pool_rows_used(m, values: ComponentMap) -> set[int]:
    """The pool positions of the rows of model ``m`` that its solution ``values`` uses."""
    pos = m._data.rows["pool_row"].to_numpy()
    return {int(pos[i]) for i in m.R if any(values[m.x[i, t]] > 0.5 for t in m.T)}


def solution_on(old, values: ComponentMap, m) -> ComponentMap | None:
    """A solution ``values`` of model ``old`` on the model ``m`` of another candidate table of the same pool (rows
    matched by their pool position), or ``None`` where a row it uses is not in ``m``."""
    where = {int(p): j for j, p in enumerate(m._data.rows["pool_row"].to_numpy())}
    pos = old._data.rows["pool_row"].to_numpy()
    start = ComponentMap()
    for i, t in old.x:
        n = values[old.x[i, t]]
        if n > 0.5:
            j = where.get(int(pos[i]))
            if j is None:
                return None
            start[m.x[j, t]] = n
    for mine in m.component_objects(pyo.Var, descend_into=False):  # units, streams and the families' indicators
        theirs = old.component(mine.local_name)
        if mine.local_name in ("x", "row_used") or theirs is None:
            continue
        for k in mine:
            if k in theirs:
                start[mine[k]] = values[theirs[k]]
    if hasattr(m, "row_used"):
        for i in m.R:
            start[m.row_used[i]] = float(any(start.get(m.x[i, t], 0.0) > 0.5 for t in m.T))
    return start


def fleet_cost(m, data: PlanData) -> float:
    """The solved fleet's $/h: its units at the price, or, from a deployed fleet, what the horizon's units and
    changes cost per hour (:mod:`planner.model.brownfield`)."""
    if hasattr(m, "bf_keep"):
        from planner.model.brownfield import change_usd
        from planner.model.terms import fleet_usd_per_hour

        return float(pyo.value(fleet_usd_per_hour(m, 0) + change_usd(m)))
    return float(sum(round(pyo.value(m.u[h])) * data.hardware[h].usd_per_unit_hour for h in m.H))


def fleet_floor(r: SolveResult, data: PlanData, usd: float) -> float | None:
    """A lower bound on the fleet $/h of the optimum of a solve that stopped short of it: the objective's bound
    less the tie-break term (at most ``EPSILON`` times the fleet's dollars: replicas occupy no more chips than
    the units hold). ``None`` where the solve proved its optimum, has no bound, or pool types are priced."""
    if r.status == "optimal" or r.bound is None or data.pool_type_usd_per_hour:
        return None
    return min(usd, r.bound / (1 + EPSILON))


def saved_by(base: float, new: float | None) -> float | None:
    if new is None:
        return None
    return max(base - new, 0.0)


@dataclass(frozen=True)
class Question:
    """One re-solve of the analysis: what is relaxed and how far. Plain data, so that a worker process can be
    handed it (:mod:`planner.analysis.workers`)."""

    kind: str
    """``runner_up`` (``target``: the hardware left out), ``limit`` (``which``: the constraint family, ``target``:
    its index where it has one, ``value``: the raised limit; :func:`planner.model.families.limit_relaxations`),
    ``slo`` (``target``: the workload, ``which``: ``tpot`` or ``ttft``), ``demand`` or ``prefix`` (``target``:
    the workload), ``resilience`` (the N+k rows dropped); ``together`` (``members``: one workload's SLO and prefix
    questions, answered by one re-solve where it proves none of them saves anything, see :func:`together`)."""
    target: str | None = None
    which: str | None = None
    value: float | None = None
    """The relaxed parameter's value: kW, units, requests/s or GB of prefixes."""
    members: tuple[Question, ...] = ()

    @property
    def label(self) -> str:
        """What the progress line says while it is re-solved."""
        if self.kind == "limit":
            return f"{BY_NAME[self.which].path} relaxed to {self.value:g}" + (f" ({self.target})" if self.target else "")
        return {
            "runner_up": f"the cheapest plan without {self.target}",
            "slo": f"{self.target}'s {(self.which or '').upper()} {RELAX:.0%} looser",
            "demand": f"{self.target}'s demand {RELAX:.0%} lower",
            "prefix": f"{self.target}'s prefix working set {RELAX:.0%} smaller",
            "resilience": "the plan without its N+k headroom",
            "together": " and ".join(m.label if k == 0 else m.label.removeprefix(f"{self.target}'s ")
                                     for k, m in enumerate(self.members)),
        }[self.kind]


@dataclass(frozen=True)
class Answer:
    """What a question's re-solve found: the fleet $/h of the relaxed optimum (``None``: no plan within the
    limit) and whether it is proven; the runner-up's description for that question; for a ``together`` question,
    its members' answers (``parts``) and whether the time limit stopped it before every member was answered
    (``cut``)."""

    cost: float | None
    proven: bool
    runner_up: RunnerUp | None = None
    parts: tuple[tuple[Question, Answer], ...] = ()
    cut: bool = False


def spend_by_workload(plan: Plan) -> dict[str, float]:
    """$/h of each workload's pools."""
    spend: dict[str, float] = {}
    for p in plan.pools:
        spend[p.workload] = spend.get(p.workload, 0.0) + p.usd_per_hour
    return spend
