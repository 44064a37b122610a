"""Solve a Pyomo model with HiGHS (through highspy, Pyomo's persistent interface): status, termination,
objective, bound, MIP gap and wall time, always.

Knows nothing of the physics; a :class:`Solver` keeps the HiGHS instance so that re-solves after a
change of mutable parameters (sweeps, sensitivities) update the model instead of rebuilding it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import pyomo.environ as pyo
from pyomo.contrib.solver.common.factory import SolverFactory
from pyomo.contrib.solver.common.results import SolutionStatus, TerminationCondition

from planner.errors import PlannerError

DEFAULT_MIP_GAP = 1e-4
DEFAULT_TIME_LIMIT_S = 60.0


HEURISTICS = tuple(f"mip_heuristic_run_{h}" for h in ("rins", "rens", "root_reduced_cost", "zi_round", "shifting",
                                                        "feasibility_jump"))


@dataclass(frozen=True)
class SolveResult:
    status: str
    """``optimal``, ``feasible`` (a plan, gap not closed), ``infeasible`` or ``limit`` (no plan yet)."""
    termination: str
    objective: float | None
    bound: float | None
    mip_gap: float | None
    wall_s: float

    @property
    def has_solution(self) -> bool:
        return self.status in ("optimal", "feasible")


class Solver:
    def __init__(self, *, time_limit_s: float = DEFAULT_TIME_LIMIT_S, mip_gap: float = DEFAULT_MIP_GAP, threads: int | None = None,
                 heuristics: bool = True):
        self.time_limit_s = time_limit_s
        self.mip_gap = mip_gap
        self.threads = threads
        self.heuristics = heuristics
        """HiGHS's primal heuristics (RINS, RENS, shifting, ...): worth their time while no good plan is known;
        a re-solve that starts from one (a relaxation of a solved plan) proves its optimum several times faster
        without them. Only the speed changes, never the answer."""
        self._opt = SolverFactory("highs")
        if not self._opt.available():
            raise PlannerError("HiGHS is not available: install highspy (pip install highspy)")

    def limited(self, *, time_limit_s: float, mip_gap: float, heuristics: bool | None = None) -> Solver:
        """This solver with other limits, sharing its persistent HiGHS instance: a re-solve of the model it
        holds sends HiGHS only what changed (parameters, fixed variables, deactivated constraints) instead
        of reloading the whole model."""
        other = object.__new__(Solver)
        other.time_limit_s, other.mip_gap, other.threads, other._opt = time_limit_s, mip_gap, self.threads, self._opt
        other.heuristics = self.heuristics if heuristics is None else heuristics
        return other

    def solve(self, model: pyo.ConcreteModel, start: dict | None = None) -> SolveResult:
        """Solve ``model``; ``start`` maps Pyomo variables to a feasible assignment handed to HiGHS
        as its first incumbent (a MIP start)."""
        t0 = time.perf_counter()
        if start:
            self._with_start(start)
        res = self._opt.solve(
            model,
            load_solutions=False,
            raise_exception_on_nonoptimal_result=False,
            time_limit=self.time_limit_s,
            rel_gap=self.mip_gap,
            threads=self.threads,
            # set every time: a persistent HiGHS instance keeps options from one solve to the next
            solver_options={k: self.heuristics for k in HEURISTICS},
        )
        wall = time.perf_counter() - t0
        term = res.termination_condition
        sol = res.solution_status
        has = sol in (SolutionStatus.optimal, SolutionStatus.feasible)
        if has:
            res.solution_loader.load_vars()
        obj = res.incumbent_objective if has else None
        bound = res.objective_bound
        bound = None if bound is None or not math.isfinite(bound) else float(bound)
        gap = None
        if obj is not None and bound is not None:
            gap = abs(obj - bound) / max(abs(obj), 1e-9)
        if term in (TerminationCondition.provenInfeasible, TerminationCondition.locallyInfeasible,
                    TerminationCondition.infeasibleOrUnbounded):
            status = "infeasible"
        elif has and term == TerminationCondition.convergenceCriteriaSatisfied:
            status = "optimal"
        elif has:
            status = "feasible"
        else:
            status = "limit"
        return SolveResult(status, term.name, None if obj is None else float(obj), bound, gap, wall)

    def _with_start(self, start: dict) -> None:
        """Set the MIP start just before HiGHS runs (after Pyomo has loaded the model)."""
        import highspy
        import numpy as np

        opt = self._opt
        original = opt._solve

        def solve_with_start():
            cols = opt._pyomo_var_to_solver_var_map
            # variables HiGHS was not given (fixed, or in no active constraint) have no column
            known = [(cols[id(v)], float(x)) for v, x in start.items() if id(v) in cols]
            idx = np.array([i for i, _ in known], dtype=np.int32)
            val = np.array([x for _, x in known], dtype=np.double)
            sol = highspy.HighsSolution()
            n = opt._solver_model.getNumCol()
            values = np.zeros(n)
            values[idx] = val
            sol.col_value = list(values)
            sol.value_valid = True
            opt._solver_model.setSolution(sol)
            opt._solve = original
            return original()

        opt._solve = solve_with_start

