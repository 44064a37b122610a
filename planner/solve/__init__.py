"""Solve a Pyomo model with HiGHS (through highspy, Pyomo's persistent interface): status, termination,
objective, bound, MIP gap and wall time, always.

Knows nothing of the physics; a :class:`Solver` keeps the HiGHS instance so that re-solves after a
change of mutable parameters (sweeps, sensitivities) update the model instead of rebuilding it.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import pyomo.core as pyo
from pyomo.contrib.solver.common.results import SolutionStatus, TerminationCondition
from pyomo.contrib.solver.solvers.highs import Highs

from planner.errors import PlannerError
from planner.options import DEFAULT_MIP_GAP, DEFAULT_TIME_LIMIT_S
from planner.solve.structure import structure_of

NO_UPDATES = {k: False for k in (
    "check_for_new_or_removed_constraints", "check_for_new_or_removed_vars", "check_for_new_or_removed_params",
    "check_for_new_objective", "update_constraints", "update_vars", "update_parameters", "update_named_expressions",
    "update_objective")}
"""Pyomo's persistent-solver change scan switched off, for a solve right after :meth:`Solver.load` (nothing changed)."""

SMALL_MODEL_COLUMNS = 1500
"""Models up to this many columns are solved on one HiGHS thread (see :meth:`Solver.threads_for`)."""

RESTART_MIN_COLUMNS = 500
"""Models with fewer columns are solved without HiGHS's restarts (a restart re-presolves the model and solves the
root again after fixing the columns the root found inactive). On the plans' MILPs below it (one to three workloads,
150-300 columns) they cost more than they save: replaying every MILP of a plan (`bench/bench_highs.py --best-of 3`),
the 3-workload fleet's took 5.40 s without them against 7.74 s with, at demand x0.8 / x1.25 / x1.45 3.10 / 7.31 /
9.14 s against 4.62 / 7.62 / 10.74, multi-workload.yaml's 2.62 against 3.07, deepseek-chat's 0.06 against 0.16,
same optima. On the 10-workload fleet's (over 600 columns) they save time (`bench/bench_highs.py 10`: 57.7 s with,
60.5 without), so they stay on above it (docs/formulation.md section 3).

RINS (the heuristic a re-solve keeps, ``INCUMBENT_HEURISTIC``) is likewise run only on models of this size: below
it every solve proves its optimum sooner without it, same answers (`bench/bench_highs.py --best-of 3 --options '{}'
--options '{"mip_heuristic_run_rins": false}'`: multi-workload.yaml 2.59 -> 2.04 s, the 3-workload fleet 5.32 ->
5.05 s, at demand x0.8 / x1.25 / x1.45 2.98 / 7.30 / 9.21 -> 2.46 / 6.68 / 9.45 s, the last one's runner-up
proven where it was cut at its 5 s limit, three-models 0.26 -> 0.18, llama-70b-n1 0.30 -> 0.18); on the
10-workload fleet's it finds the savings its re-solves cut at 5 s report (57.6 s either way, four answers worse
without it)."""

MASTER_SHARE = 0.6
"""Most share of a solve's time limit the master over the blocks' slot vectors may take (the rest is HiGHS's, where
the master proves nothing)."""

MASTER_MIN_COLUMNS = 500
"""The master is tried on models of at least this many columns. Below it HiGHS's own search proves a plan of a few
workloads in about as long as the master takes, and sooner where the windows must be wide (runner-ups from a greedy
start). `python bench/bench_analysis.py SCENARIO [--master-min-columns 0]` (one process): multi-workload.yaml's
analysis 1.80 s without the master, 2.40 s with; the 3-workload fleet's (`--fleet 3`) 4.48 s against 6.13 s; the
10-workload fleet's (643 columns; `--fleet 10 [--master-min-columns 1000000000]`) 14.5 s with it, all 21 questions
proven, against 58.2 s without, five stopped at their 5 s limit."""

_scheduler_threads: list[int | None] = [None]
"""The thread count HiGHS's process-wide task scheduler was started with (``None``: not yet started)."""

HEURISTICS = tuple(f"mip_heuristic_run_{h}" for h in ("rins", "rens", "root_reduced_cost", "zi_round", "shifting",
                                                        "feasibility_jump"))


INCUMBENT_HEURISTIC = "mip_heuristic_run_rins"
"""The heuristic kept with ``heuristics=False``: RINS searches around the incumbent, the plan a re-solve starts from
(on models of at least ``RESTART_MIN_COLUMNS`` columns; below, it is off in every solve)."""


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
                 heuristics: bool = True, floors: bool = True):
        self.floors = floors
        """Whether a model that declares blocks gets their floor rows (:mod:`planner.solve.floors`) and, in a solve
        from a known plan, the master over their slot vectors (:mod:`planner.solve.master`); ``False`` only to
        measure what they are worth."""
        self.time_limit_s = time_limit_s
        self.mip_gap = mip_gap
        self.threads = threads
        """HiGHS threads; ``None``: :meth:`threads_for` the model."""
        self.heuristics = heuristics
        """HiGHS's primal heuristics (RINS, RENS, shifting, ...): worth their time while no good plan is known.
        ``False`` for a re-solve that starts from one (a relaxation of a solved plan): it proves its optimum several
        times faster without them, all but RINS (on models of at least ``RESTART_MIN_COLUMNS`` columns), which searches the neighbourhood of that very plan (where the
        relaxation's optimum lies when it moves: on the 10-workload fleet's re-solves it found savings of
        $15.20-16.48/h where the search without it had found $8.16-8.32/h at the 5 s limit, in the same total time;
        docs/formulation.md section 3). Only the speed changes, and what a re-solve cut short by its limit has found."""
        self._opt = Highs()  # the class Pyomo's solver factory names "highs" (pyomo.environ's plugins not loaded)
        if not self._opt.available():
            raise PlannerError("HiGHS is not available: install highspy (pip install highspy)")

    def _options(self, *, large: bool) -> dict:
        """The HiGHS options this solve sets: the primal heuristics ``heuristics`` asks for, RINS only on a large
        model (below ``RESTART_MIN_COLUMNS`` columns it costs more than it finds), restarts only on a large model."""
        return {**{k: (self.heuristics or k == INCUMBENT_HEURISTIC) and (large or k != INCUMBENT_HEURISTIC)
                   for k in HEURISTICS},
                "mip_allow_restart": large}

    def limited(self, *, time_limit_s: float, mip_gap: float, heuristics: bool | None = None) -> Solver:
        """This solver with other limits, sharing its persistent HiGHS instance: a re-solve of the model it
        holds sends HiGHS only what changed (parameters, fixed variables, deactivated constraints) instead
        of reloading the whole model."""
        other = object.__new__(Solver)
        other.time_limit_s, other.mip_gap, other.threads, other._opt = time_limit_s, mip_gap, self.threads, self._opt
        other.heuristics = self.heuristics if heuristics is None else heuristics
        other.floors = self.floors
        return other

    def solve(self, model: pyo.ConcreteModel, start: dict | None = None, *, caps: dict | None = None,
              loaded: bool = False, cutoff: float | None = None) -> SolveResult:
        """Solve ``model`` (:meth:`solve_once`); where the model declares lazy constraints
        (:attr:`~planner.solve.structure.Structure.lazy`) and the solution breaks some, they are switched on and the
        model solved again, without ``start``, ``caps`` and ``cutoff`` (they were for the model without them: a
        plan they allow may be dearer than the start's)."""
        t0 = time.perf_counter()
        res = self.solve_once(model, start, caps=caps, loaded=loaded, cutoff=cutoff)
        declared = structure_of(model)
        while declared.lazy is not None and res.has_solution and declared.lazy():
            left = self.time_limit_s - (time.perf_counter() - t0)
            sv = self.limited(time_limit_s=max(left, 0.05), mip_gap=self.mip_gap, heuristics=True)
            sv.load(model)
            # the start may break what was switched on: the model's own restart (a plan that meets it) where it has one
            again_start = start if start is not None and sv.start_objective(start) is not None else \
                (declared.restart() if declared.restart is not None else None)
            cost = sv.start_objective(again_start) if again_start is not None else None
            again = sv.solve_once(model, again_start if cost is not None else None, loaded=True, cutoff=cost)
            res = dataclasses.replace(again, wall_s=time.perf_counter() - t0)
        return res

    def solve_once(self, model: pyo.ConcreteModel, start: dict | None = None, *, caps: dict | None = None,
                   loaded: bool = False, cutoff: float | None = None) -> SolveResult:
        """Solve ``model``; ``start`` maps Pyomo variables to a feasible assignment handed to HiGHS
        as its first incumbent (a MIP start); ``caps`` maps variables to upper bounds for this solve only, set on
        the HiGHS columns (the model's own bounds are untouched and come back in HiGHS after it). ``loaded``: the
        caller has just called :meth:`load` and changed nothing since (Pyomo's change scan is skipped).
        ``cutoff``: the objective of a known plan (``start``'s), so no plan worth finding costs more. A model that
        declares blocks gets their floors for this solve (:mod:`planner.solve.floors`)."""
        t0 = time.perf_counter()
        if not loaded:
            self.load(model)
        threads = self.threads_for()
        _use_scheduler(threads)
        floors, start, cutoff = self._add_floors(model, start, cutoff)
        if start is not None and len(start):
            self._with_start(start)
        undo = self._cap(caps) if caps else None
        try:
            with _ctrl_c_stops(self._opt._solver_model):
                res = self._opt.solve(
                    model,
                    load_solutions=False,
                    raise_exception_on_nonoptimal_result=False,
                    time_limit=max(0.05, self.time_limit_s - (time.perf_counter() - t0)),  # the floors' time counts
                    rel_gap=self.mip_gap,
                    threads=threads,
                    auto_updates=NO_UPDATES,
                    # set every time: a persistent HiGHS instance keeps options from one solve to the next
                    solver_options=self._options(large=self._opt._solver_model.getNumCol() >= RESTART_MIN_COLUMNS),
                )
        finally:
            if undo is not None:
                undo()
            if floors:
                import numpy as np

                h = self._opt._solver_model
                h.deleteRows(floors, np.arange(h.getNumRow() - floors, h.getNumRow(), dtype=np.int32))
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

    def floor_rows(self, model: pyo.ConcreteModel, cutoff: float | None = None) -> list | None:
        """The floor rows of ``model``'s blocks on the model HiGHS holds (call :meth:`load` first):
        ``(lower, upper, columns, coefficients)`` per block (:meth:`planner.solve.floors.Floors.rows`); ``None`` where
        the model declares no blocks, has fewer than ``FLOOR_MIN_BLOCKS``, or one of them has no plan."""
        found = self._block_floors(model)
        if found is None:
            return None
        return found[0].rows(cutoff, structure_of(model).objective_covers_blocks)

    def _block_floors(self, model: pyo.ConcreteModel):
        """``(Floors, the blocks' column indices)`` of ``model`` on HiGHS's copy, or ``None`` (see :meth:`floor_rows`)."""
        import numpy as np

        from planner.solve.floors import FLOOR_MIN_BLOCKS, block_floors

        blocks = structure_of(model).blocks
        if blocks is None:
            return None
        declared = blocks()
        if len(declared) < FLOOR_MIN_BLOCKS:  # a one-workload plan: nothing to map
            return None
        cols = self._opt._pyomo_var_to_solver_var_map
        listed = []
        for variables, coefs in declared:
            pairs = [(cols[id(v)], c) for v, c in zip(variables, coefs, strict=True) if id(v) in cols]
            if pairs:
                listed.append((np.array([j for j, _ in pairs], dtype=np.int64), np.array([c for _, c in pairs])))
        if len(listed) < FLOOR_MIN_BLOCKS:
            return None
        threads = self.threads_for()
        _use_scheduler(threads)  # the blocks' MILPs run on HiGHS's process-wide scheduler too
        found = block_floors(self._opt._solver_model, listed, threads=threads)
        return None if found is None else (found, [idx for idx, _ in listed])

    def _add_floors(self, model: pyo.ConcreteModel, start, cutoff: float | None):
        """Add the floor rows of ``model``'s blocks to HiGHS's copy of the model, after its own rows, for one solve
        (:meth:`solve` removes them after it, so Pyomo's rows keep their indices); first, where a plan ``start`` is
        given, look for a cheaper one among its blocks' moves to their optima (:func:`planner.solve.floors.improve`).
        Returns how many rows, and the start and cutoff to solve from."""
        if not self.floors:
            return 0, start, cutoff
        found = self._block_floors(model)
        if found is None:
            return 0, start, cutoff
        import highspy
        import numpy as np

        from planner.solve.floors import improve

        floors, blocks = found
        h = self._opt._solver_model
        covered = structure_of(model).objective_covers_blocks
        proof = None
        if start is not None and cutoff is not None:
            x = self._column_values(start)
            better = improve(floors.lp, x, blocks, floors.optima, threads=self.threads_for())
            if better is not None:
                x, cutoff = better
            start = x
            if covered:
                proof = self._prove(model, floors, x, cutoff)
                if proof is not None and proof.value < cutoff:
                    start, cutoff = proof.x, proof.value
        rows = floors.rows(cutoff, covered)
        if proof is not None:  # every plan's objective is at least the master's bound: one dense row
            lp = floors.lp
            nz = np.flatnonzero(lp.cost)
            lo = proof.bound - lp.offset - 1e-7 * max(1.0, abs(proof.bound))
            rows.append((lo, np.inf, nz, lp.cost[nz]))
        if not rows:
            return 0, start, cutoff
        lower = np.array([r[0] for r in rows])
        upper = np.array([r[1] for r in rows])
        upper = np.where(np.isfinite(upper), upper, highspy.kHighsInf)
        index = np.concatenate([r[2] for r in rows]).astype(np.int32)
        value = np.concatenate([r[3] for r in rows]).astype(float)
        starts = np.cumsum([0] + [len(r[2]) for r in rows[:-1]]).astype(np.int32)
        h.addRows(len(rows), lower, upper, len(index), starts, index, value)
        return len(rows), start, cutoff

    def _prove(self, model: pyo.ConcreteModel, floors, start, cutoff: float):
        """The master over the blocks' slot vectors (:func:`planner.solve.master.prove`) from the plan ``start`` (a
        vector over HiGHS's columns) of objective ``cutoff``, where the model has at least ``MASTER_MIN_COLUMNS``
        columns and declares its blocks as covers; else ``None``."""
        if floors.lp.ncol < MASTER_MIN_COLUMNS:
            return None
        covers = self._covers(model, floors)
        if covers is None:
            return None
        from planner.solve.master import TOTAL_TIME_LIMIT_S, prove

        return prove(floors, covers, start, cutoff, threads=self.threads_for(), mip_gap=self.mip_gap,
                     time_limit_s=min(TOTAL_TIME_LIMIT_S, MASTER_SHARE * self.time_limit_s))

    def _covers(self, model: pyo.ConcreteModel, floors) -> list | None:
        """Per block of ``floors`` (:class:`planner.solve.floors.Floors`), its cover (:class:`planner.solve.master.Cover`)
        in HiGHS's indices, as the model declares them (:attr:`Structure.covers`: per block, its demand constraint
        and per stream its variable and stage constraints); ``None`` where it declares none."""
        declared = structure_of(model).covers
        if declared is None:
            return None
        from planner.solve.master import Cover

        cons, cols = self._opt._pyomo_con_to_solver_con_map, self._opt._pyomo_var_to_solver_var_map
        by_column = {}
        for demand, streams in declared():
            if demand not in cons:
                return None
            cover = Cover(cons[demand], [(cols[id(s)], [cons[c] for c in rows]) for s, rows in streams
                                         if id(s) in cols and all(c in cons for c in rows)])
            for s, _ in cover.streams:
                by_column[s] = cover
        # each floor's block by one of its stream columns (a block's columns are its own)
        return [next((by_column[j] for j in idx.tolist() if j in by_column), None) for _, idx, _ in floors.floors]

    def threads_for(self) -> int:
        """HiGHS threads for the model loaded: ``threads`` where set; else one for a model of at most
        :data:`SMALL_MODEL_COLUMNS` columns (a deployment MILP of one to a few workloads proves its optimum in a
        few nodes, where HiGHS's other workers only wait: the whole deepseek-chat plan takes 0.2-0.3 s less
        CPU, the 3-workload fleet a quarter less, wall unchanged), HiGHS's default (0: its own choice) above."""
        if self.threads is not None:
            return self.threads
        return 1 if self._opt._solver_model.getNumCol() <= SMALL_MODEL_COLUMNS else 0

    def load(self, model: pyo.ConcreteModel) -> None:
        """Bring the persistent HiGHS instance up to date with ``model`` (load it, or send what changed since the
        last solve: parameters, fixed variables, bounds, deactivated constraints)."""
        opt = self._opt
        refresh = structure_of(model).refresh  # bounds the model derives from its parameters
        if refresh is not None:
            refresh()
        opt._active_config = opt.config  # the defaults: every change is looked for
        if opt._model is not model:
            opt.set_instance(model)
        else:
            opt.update()

    def digest(self) -> bytes:
        """A digest of the MILP HiGHS holds (call :meth:`load` first): its columns (costs, bounds, integrality) and
        its rows (bounds and coefficients), whatever the order Pyomo's changes left the rows in. Two models with the
        same digest are the same problem, so a solve of one answers the other (an analysis question whose
        re-selected candidates and parameters come to the model another question has just re-solved)."""
        import hashlib

        import numpy as np

        h = self._opt._solver_model
        h.ensureColwise()  # HiGHS may hold the matrix row-wise or column-wise, depending on the changes it was sent
        lp = h.getLp()
        a = lp.a_matrix_
        start, index, value = np.asarray(a.start_), np.asarray(a.index_), np.asarray(a.value_, dtype=float)
        cols = np.repeat(np.arange(len(start) - 1), np.diff(start))
        order = np.lexsort((cols, index))  # by row, then column
        ends = np.cumsum(np.bincount(index, minlength=lp.num_row_))
        lo, hi = np.asarray(lp.row_lower_, dtype=float), np.asarray(lp.row_upper_, dtype=float)
        rows = sorted(np.array([lo[i], hi[i]]).tobytes() + cols[k].tobytes() + value[k].tobytes()
                      for i, k in enumerate(np.split(order, ends[:-1])))
        d = hashlib.blake2b(digest_size=16)
        for arr in (lp.col_cost_, lp.col_lower_, lp.col_upper_, [int(t) for t in lp.integrality_],
                    [lp.offset_, int(lp.sense_)]):
            d.update(np.asarray(arr, dtype=float).tobytes())
            d.update(b"|")
        for r in rows:
            d.update(len(r).to_bytes(8, "little"))
            d.update(r)
        return d.digest()

    def start_objective(self, start: dict, tol: float = 1e-6) -> float | None:
        """The objective of ``start`` (a map of Pyomo variables to values, missing ones 0) in the model HiGHS
        holds (call :meth:`load` first), or ``None`` where it breaks a row or column bound (relative tolerance
        ``tol``) or is fractional where a column is integer. Fixed variables count at their fixed value. Vectorised
        over HiGHS's copy of the model: the same verdict as evaluating every Pyomo constraint, in a fraction of
        the time."""
        from planner.solve.floors import Lp, objective_of

        return objective_of(Lp(self._opt._solver_model), self._column_values(start), tol)

    def _column_values(self, values: dict):
        """``values`` as a vector over HiGHS's columns (variables it has no column for are left out; fixed ones at
        their fixed value)."""
        import numpy as np

        cols = self._opt._pyomo_var_to_solver_var_map
        x = np.zeros(self._opt._solver_model.getNumCol())
        for v, val in values.items():
            j = cols.get(id(v))
            if j is not None:
                x[j] = v.value if v.fixed else float(val)
        return x

    def _cap(self, caps: dict):
        """Set upper bounds ``caps`` (Pyomo variable -> bound) on the HiGHS columns; returns the undo."""
        import numpy as np

        h = self._opt._solver_model
        cols = self._opt._pyomo_var_to_solver_var_map
        lp = h.getLp()
        idx = np.array([cols[id(v)] for v in caps if id(v) in cols], dtype=np.int32)
        if not idx.size:
            return lambda: None
        lo, hi = np.asarray(lp.col_lower_)[idx], np.asarray(lp.col_upper_)[idx]
        new = np.array([float(b) for v, b in caps.items() if id(v) in cols])
        new = np.maximum(np.minimum(hi, new), lo)
        h.changeColsBounds(idx.size, idx, lo, new)
        return lambda: h.changeColsBounds(idx.size, idx, lo, hi)

    def _with_start(self, start) -> None:
        """Set the MIP start just before HiGHS runs (after Pyomo has loaded the model): the same column vector
        :meth:`start_objective` checks (``start``: a map of Pyomo variables to values, or that vector)."""
        import highspy
        import numpy as np

        opt = self._opt
        original = opt._solve

        def solve_with_start():
            sol = highspy.HighsSolution()
            sol.col_value = list(start if isinstance(start, np.ndarray) else self._column_values(start))
            sol.value_valid = True
            opt._solver_model.setSolution(sol)
            opt._solve = original
            return original()

        opt._solve = solve_with_start


@contextmanager
def _ctrl_c_stops(h):
    """Ctrl-C during a solve stops HiGHS cleanly and raises ``KeyboardInterrupt`` after it returns.

    Left to itself, Python raises the interrupt inside the Python callback HiGHS polls for interrupts, HiGHS reads
    that as a solver error and returns, and the run reads as a solve that stopped short: an analysis re-solve cut
    short that way said "no feasible plan without" a hardware where one exists, and the command went on. So while
    HiGHS runs, the signal asks it to stop (highspy's ``cancelSolve``), and the interrupt is raised once it has.
    Only where Ctrl-C raises ``KeyboardInterrupt`` now, in the main thread: a worker that ignores it keeps ignoring it."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    hit = []

    def stop(_sig, _frame):
        hit.append(True)
        h.cancelSolve()

    previous = signal.signal(signal.SIGINT, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if hit:
        raise KeyboardInterrupt


def _use_scheduler(threads: int) -> None:
    """Make HiGHS's process-wide task scheduler run ``threads`` threads: HiGHS starts it at its first solve and
    refuses a later solve that asks for another count (the solve then ends without a result), so where the count
    changes the scheduler is restarted (between solves; the planner never runs two HiGHS solves at once in one
    process with different counts: sweep workers all ask for one)."""
    if _scheduler_threads[0] is not None and _scheduler_threads[0] != threads:
        import highspy

        highspy.Highs.resetGlobalScheduler(True)
    _scheduler_threads[0] = threads
