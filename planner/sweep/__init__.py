"""Sensitivity sweeps: re-solve a scenario over the Cartesian product of varied inputs.

Points are grouped so that work is shared:

- the evaluated candidate pool (the expensive part) depends on the scenario without its SLOs and
  without the inputs that are mutable parameters of the MILP; one evaluation per such group;
- the candidate table and the Pyomo model depend on the SLOs too; one build per group;
- demand, prefix working sets, prices, unit limits, power and budget are mutable parameters: the
  model is updated in place (:func:`planner.model.build.update_parameters`) and the persistent HiGHS
  instance re-solves it.

Workers (``jobs``) take contiguous chunks of the sorted points, so each builds every group once.

Modules: :mod:`~planner.sweep.points` (the points and their grouping keys), :mod:`~planner.sweep.runner`
(solving them here, in worker processes or on Dask, :mod:`~planner.sweep.dask`), :mod:`~planner.sweep.store`
(parts on disk for resuming), :mod:`~planner.sweep.tornado`.
"""

from planner.sweep.points import (
    MAX_POINTS,
    MUTABLE,
    Vary,
    count_points,
    iter_points,
    keys_of,
    parse_values,
    parse_vary,
    point_scenarios,
    set_path,
    sweep_shares,
    validate_point,
)
from planner.sweep.runner import check_sweep, iter_sweep, own_solver_lock, run_sweep, sweep_frame
from planner.sweep.solving import solve_point
from planner.sweep.tornado import tornado, tornado_inputs

__all__ = [
    "MAX_POINTS", "MUTABLE", "Vary", "check_sweep", "count_points", "iter_points", "iter_sweep", "keys_of",
    "own_solver_lock", "parse_values", "parse_vary", "point_scenarios", "run_sweep", "set_path", "solve_point",
    "sweep_frame", "sweep_shares", "tornado", "tornado_inputs", "validate_point",
]
